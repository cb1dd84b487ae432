/*
 * bootstrap.h - the unique id and the authenticated TCP rendezvous.
 *
 * The id (128 bytes) holds the root's address, a protocol version, a job
 * number and the 128-bit job secret.  Rank 0 is the root: every rank
 * connects to it, proves knowledge of the secret, sends its info; the root
 * answers with the table of every rank's info.  The connections stay open
 * and carry out-of-band allgather and barrier afterwards.
 */
#ifndef WEFT_BOOTSTRAP_H
#define WEFT_BOOTSTRAP_H

#include "base/auth.h"
#include "base/internal.h"
#include "base/sock.h"

/* A launcher that already bound the root's listening socket hands it to
 * rank 0 through this variable (the fd number, inherited across exec). */
#define WEFT_ROOT_FD_ENV "WEFT_ROOT_FD"

struct weft_uid {
    union weft_sockaddr root;
    uint8_t secret[WEFT_SECRET_BYTES];
    uint64_t job;
};

/* Builds an id for root; secret NULL draws a random one. */
weft_status_t weft_uid_make(weft_unique_id_t *id, const union weft_sockaddr *root,
                            const uint8_t *secret) WEFT_HIDDEN;
weft_status_t weft_uid_encode(weft_unique_id_t *id, const struct weft_uid *uid) WEFT_HIDDEN;
/* The id of a fixed rendezvous at root ("host:port", WEFT_ROOT or its
 * alias NCCL_COMM_ID) with the secret hashed from WEFT_SECRET: the same in
 * every process that asks.  Warns once when there is no secret. */
weft_status_t weft_uid_from_root(const char *root, struct weft_uid *out) WEFT_HIDDEN;
weft_status_t weft_uid_parse(const weft_unique_id_t *id, struct weft_uid *out) WEFT_HIDDEN;
/* 2 * WEFT_UNIQUE_ID_BYTES hex digits + NUL. */
#define WEFT_UID_HEX_LEN (2 * WEFT_UNIQUE_ID_BYTES + 1)
void weft_uid_to_hex(const weft_unique_id_t *id, char *hex) WEFT_HIDDEN;
weft_status_t weft_uid_from_hex(const char *hex, weft_unique_id_t *id) WEFT_HIDDEN;

/* weft_get_unique_id keeps the listener it opened for the id's job; rank 0
 * of that job takes it over here.  Returns the fd, or -1 when none is held. */
int weft_uid_take_listener(uint64_t job) WEFT_HIDDEN;
/* Keeps fd as the listener of job until its rank 0 takes it (the oldest
 * held listener is closed when the table is full). */
void weft_uid_hold_listener(uint64_t job, int fd) WEFT_HIDDEN;

/* ---- checks on bytes from the network --------------------------------------
 * Pure functions split from the socket code, so that the fuzz targets
 * (tests/fuzz) and their regression test run exactly what the bootstrap
 * runs.  On refusal each writes the reason (no "bootstrap:" prefix) into
 * why, NUL-terminated within whylen bytes. */
#define WEFT_BS_HDR_LEN 8        /* u32 magic, u32 payload bytes */
#define WEFT_BS_REPORT_MAX 400   /* payload bytes of a root's failure report */

/* What a message header announces. */
struct weft_bs_hdr {
    bool report; /* the root gave up: its failure report follows, not data */
    size_t len;  /* payload bytes that follow (<= WEFT_BS_REPORT_MAX for a report) */
};
/* The header (WEFT_BS_HDR_LEN bytes) of a message expected to carry expect
 * bytes: WEFT_OK and *out, or WEFT_ERR_REMOTE for anything else. */
weft_status_t weft_bs_check_header(const uint8_t *hdr, size_t expect, struct weft_bs_hdr *out,
                                   char *why, size_t whylen) WEFT_HIDDEN;
/* A root's failure report (n bytes: i32 status, then text): returns the
 * status the bootstrap ends with (TIMEOUT or INVALID_ARG as sent, else
 * REMOTE) and writes the text, non-printable bytes as '?', into text. */
weft_status_t weft_bs_parse_report(const uint8_t *msg, size_t n, char *text, size_t textlen)
    WEFT_HIDDEN;
/* Root, after a handshake: may this hello join a bootstrap of nranks?
 * WEFT_ERR_REMOTE: not a bootstrap connection, drop it; WEFT_ERR_INVALID_ARG:
 * a rank of this job started with another nranks, the job cannot go on. */
weft_status_t weft_bs_check_hello(const struct weft_auth_hello *h, int nranks, char *why,
                                  size_t whylen) WEFT_HIDDEN;
/* Root: the info record (WEFT_BS_HDR_LEN + info_len bytes) of authenticated
 * rank, given fds[r] >= 0 for the ranks that joined already (fds[0] is the
 * root).  WEFT_ERR_REMOTE: malformed, drop it; WEFT_ERR_INVALID_ARG: a second
 * process for one rank. */
weft_status_t weft_bs_check_info(const uint8_t *rec, size_t info_len, uint32_t rank, int nranks,
                                 const int *fds, char *why, size_t whylen) WEFT_HIDDEN;

struct weft_bootstrap;
/* Rendezvous: every rank contributes info_len bytes and gets all ranks'
 * (all: nranks * info_len, rank order).  Bounded by deadline_ns; a rank
 * that never arrives is named in the error. */
weft_status_t weft_bootstrap_init(struct weft_comm *comm, const struct weft_uid *uid, int rank,
                                  int nranks, const void *info, size_t info_len, void *all,
                                  uint64_t deadline_ns, struct weft_bootstrap **out) WEFT_HIDDEN;
weft_status_t weft_bootstrap_allgather(struct weft_bootstrap *bs, const void *mine, void *all,
                                       size_t len, uint64_t deadline_ns) WEFT_HIDDEN;
weft_status_t weft_bootstrap_barrier(struct weft_bootstrap *bs, uint64_t deadline_ns) WEFT_HIDDEN;
void weft_bootstrap_close(struct weft_bootstrap *bs) WEFT_HIDDEN; /* NULL ok */

#endif /* WEFT_BOOTSTRAP_H */
