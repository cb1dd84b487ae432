/*
 * auth.h - SHA-256, HMAC-SHA256 and the connection handshake that every
 * bootstrap and data connection passes before any other byte is accepted.
 *
 * Handshake (all integers little endian):
 *   connector -> acceptor  HELLO     "WEFT" u16 version u16 kind u64 job
 *                                    u32 rank u32 nranks u32 index  nonce_c[16]
 *   acceptor  -> connector CHALLENGE nonce_a[16]  HMAC(secret, "weft-acc" HELLO nonce_a)
 *   connector -> acceptor  PROOF     HMAC(secret, "weft-con" HELLO nonce_a)
 * Each side proves knowledge of the job secret; fresh nonces on both sides
 * make a replayed handshake worthless.  The acceptor side is a non-blocking
 * state machine so a stranger that connects and stays silent never stalls
 * anyone; the connector side exists in both forms.
 */
#ifndef WEFT_AUTH_H
#define WEFT_AUTH_H

#include <stdbool.h>
#include <stdint.h>

#include "base/internal.h"

#define WEFT_SECRET_BYTES 16
#define WEFT_AUTH_VERSION 1
#define WEFT_AUTH_HELLO_LEN 44
#define WEFT_AUTH_CHALLENGE_LEN 48
#define WEFT_AUTH_PROOF_LEN 32

void weft_sha256(const void *data, size_t len, uint8_t out[32]) WEFT_HIDDEN;
void weft_hmac_sha256(const uint8_t *key, size_t keylen, const void *data, size_t len,
                      uint8_t out[32]) WEFT_HIDDEN;
bool weft_ct_equal(const void *a, const void *b, size_t n) WEFT_HIDDEN; /* constant time */
weft_status_t weft_random_bytes(void *buf, size_t n) WEFT_HIDDEN;        /* getrandom */

enum weft_auth_kind { WEFT_AUTH_BOOTSTRAP = 1, WEFT_AUTH_DATA = 2 };

/* What a connector announces; authenticated by the handshake. */
struct weft_auth_hello {
    uint16_t kind;   /* enum weft_auth_kind */
    uint64_t job;    /* communicator identity */
    uint32_t rank;   /* connector's rank */
    uint32_t nranks; /* connector's idea of the communicator size */
    uint32_t index;  /* stream number (data) or 0 */
};

/* Acceptor: owns nothing; the caller owns fd and closes it on error. */
struct weft_auth_acceptor {
    int fd;
    int state;                                 /* internal */
    uint64_t deadline_ns;                      /* handshake must finish by then */
    size_t have;                               /* bytes of the current message */
    uint8_t buf[WEFT_AUTH_CHALLENGE_LEN];      /* message being read or written */
    uint8_t hello_raw[WEFT_AUTH_HELLO_LEN];
    uint8_t nonce_a[16];
    struct weft_auth_hello hello;              /* valid once step() returned OK */
};
void weft_auth_accept_begin(struct weft_auth_acceptor *a, int fd, uint64_t deadline_ns) WEFT_HIDDEN;
/* Non-blocking: WEFT_INPROGRESS (wait for events() on fd, then call again),
 * WEFT_OK (authenticated, a->hello filled) or an error with a message in
 * *why (bad magic, wrong job, bad MAC, EOF, deadline passed). */
weft_status_t weft_auth_accept_step(struct weft_auth_acceptor *a, const uint8_t *secret,
                                    uint64_t job, const char **why) WEFT_HIDDEN;
short weft_auth_accept_events(const struct weft_auth_acceptor *a) WEFT_HIDDEN; /* POLLIN/POLLOUT */

/* Connector, non-blocking form; fd must be connected. */
struct weft_auth_connector {
    int fd;
    int state;
    uint64_t deadline_ns;
    size_t have;
    uint8_t buf[WEFT_AUTH_CHALLENGE_LEN];
    uint8_t hello_raw[WEFT_AUTH_HELLO_LEN];
};
void weft_auth_connect_begin(struct weft_auth_connector *c, int fd,
                             const struct weft_auth_hello *hello, uint64_t deadline_ns) WEFT_HIDDEN;
weft_status_t weft_auth_connect_step(struct weft_auth_connector *c, const uint8_t *secret,
                                     const char **why) WEFT_HIDDEN;
short weft_auth_connect_events(const struct weft_auth_connector *c) WEFT_HIDDEN;
/* Blocking form, bounded by deadline_ns. */
weft_status_t weft_auth_connect(int fd, const uint8_t *secret, const struct weft_auth_hello *hello,
                                uint64_t deadline_ns, const char **why) WEFT_HIDDEN;

#endif /* WEFT_AUTH_H */
