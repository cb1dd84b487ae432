/* Shared between the halves of the NCCL ABI test: abi_values.c and abi_sig.c
 * are each compiled twice, once against NVIDIA's nccl.h (-DABI_SIDE=nv) and
 * once against weft's (-DABI_SIDE=own); test_nccl_abi.c compares the two.
 * Must not include nccl.h: it is included by C files on both sides. */
#ifndef WEFT_TESTS_NCCL_ABI_H
#define WEFT_TESTS_NCCL_ABI_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One measured fact about a header: an enum value, a macro value, a size,
 * an offset, a field's type code or an initializer's field.  name is a
 * string literal; value is the fact as a number. */
struct abi_entry {
    const char *name;
    long long value;
};

/* Upper bound on entries per table; abi_values_* returns the real count,
 * which the caller checks against this. */
#define ABI_MAX_ENTRIES 512

/* Number of functions (nccl* plus pnccl*) declared by NCCL 2.28.9. */
#define ABI_NCCL_FUNCTIONS 82

/* Fill out[0..cap) with the side's table; return the full entry count (more
 * than cap means out was too small and holds only the first cap). */
size_t abi_values_nv(struct abi_entry *out, size_t cap);
size_t abi_values_own(struct abi_entry *out, size_t cap);

/* Number of functions whose address was taken through a pointer of the
 * hand-written NCCL 2.28.9 type and came out non-NULL. */
int abi_sig_nv(void);
int abi_sig_own(void);

#ifdef __cplusplus
}
#endif

/* ABI_SIDE_ID is 1 for -DABI_SIDE=nv, 2 for -DABI_SIDE=own, 0 otherwise. */
#define ABI_SIDE_ID_nv 1
#define ABI_SIDE_ID_own 2
#define ABI_SIDE_ID_PASTE_(s) ABI_SIDE_ID_##s
#define ABI_SIDE_ID_EXPAND_(s) ABI_SIDE_ID_PASTE_(s)
#ifdef ABI_SIDE
#define ABI_SIDE_ID ABI_SIDE_ID_EXPAND_(ABI_SIDE)
#else
#define ABI_SIDE_ID 0
#endif

#endif /* WEFT_TESTS_NCCL_ABI_H */
