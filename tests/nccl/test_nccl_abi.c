/* weft's compat/nccl/nccl.h against NVIDIA's NCCL 2.28.9 header: the same
 * numbers (abi_values.c, built once per header) and the same function
 * signatures (abi_sig.c, checked when it compiles; counted here). */
#include <criterion/criterion.h>
#include <string.h>

#include "nccl.h"

#include "abi.h"

#ifndef WEFT_NCCL_COMPAT
#error "test_nccl_abi.c must see weft's nccl.h; add -I compat/nccl first"
#endif

Test(nccl_abi, values_match)
{
    static struct abi_entry nv[ABI_MAX_ENTRIES], own[ABI_MAX_ENTRIES];
    size_t n_nv = abi_values_nv(nv, ABI_MAX_ENTRIES);
    size_t n_own = abi_values_own(own, ABI_MAX_ENTRIES);

    cr_assert_leq(n_nv, ABI_MAX_ENTRIES, "raise ABI_MAX_ENTRIES to %zu", n_nv);
    cr_assert_leq(n_own, ABI_MAX_ENTRIES, "raise ABI_MAX_ENTRIES to %zu",
                  n_own);
    cr_assert_gt(n_nv, 0);
    cr_expect_eq(n_nv, n_own, "NVIDIA's table has %zu entries, weft's %zu",
                 n_nv, n_own);

    size_t n = n_nv < n_own ? n_nv : n_own;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(nv[i].name, own[i].name) != 0) {
            cr_expect_fail("entry %zu: NVIDIA's is %s, weft's is %s", i,
                           nv[i].name, own[i].name);
            bad++;
        } else if (nv[i].value != own[i].value) {
            cr_expect_fail("%s: NVIDIA %lld, weft %lld", nv[i].name,
                           nv[i].value, own[i].value);
            bad++;
        }
    }
    cr_expect_eq(bad, 0, "%zu of %zu ABI entries differ", bad, n);
}

Test(nccl_abi, signatures_match)
{
    int nv = abi_sig_nv();
    int own = abi_sig_own();

    cr_expect_eq(nv, ABI_NCCL_FUNCTIONS,
                 "NVIDIA side took %d function addresses, expected %d", nv,
                 ABI_NCCL_FUNCTIONS);
    cr_expect_eq(own, ABI_NCCL_FUNCTIONS,
                 "weft side took %d function addresses, expected %d", own,
                 ABI_NCCL_FUNCTIONS);
    cr_expect_eq(nv, own);
}

Test(nccl_abi, config_initializer)
{
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;

    cr_expect_eq(c.size, sizeof(ncclConfig_t));
    cr_expect_eq(c.magic, 0xcafebeefu, "magic is %#x", c.magic);
    cr_expect_eq(c.version, NCCL_VERSION_CODE);
    cr_expect_eq(c.blocking, INT_MIN);
    cr_expect_null(c.netName);
    cr_expect_null(c.commName);
    cr_expect_eq(c.nvlinkCentricSched, INT_MIN);
    cr_expect_eq(s.size, sizeof(ncclSimInfo_t));
    cr_expect_eq(s.magic, 0x74685283u, "magic is %#x", s.magic);
    cr_expect_eq(s.version, 22809u);
    cr_expect(s.estimatedTime == -1.0f);
}
