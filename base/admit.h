/*
 * admit.h - the door of a listener that strangers may flood: the bootstrap
 * root's and the tcp transport's.  Accepted sockets wait in a bounded table
 * until they prove the job secret (base/auth.h); only sockets with news are
 * read, and when the table is full the oldest stranger goes first.
 */
#ifndef WEFT_ADMIT_H
#define WEFT_ADMIT_H

#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/auth.h"
#include "base/internal.h"

#define WEFT_ADMIT_MAX 256       /* connections before their proof: well under 1024 fds */
#define WEFT_ADMIT_HELLO_MS 1000 /* from accept to a HELLO of this job */
#define WEFT_ADMIT_BATCH 256     /* accepts per turn: handshakes in flight are served between */

/* One accepted connection; ~230 bytes until the owner adds its own (priv). */
struct weft_admit_conn {
    struct weft_auth_acceptor acc;
    uint64_t since; /* ns: accepted, or its HELLO answered; the older goes first */
    bool hello;     /* sent a HELLO of this job: a rank, or someone who knows the job */
    bool authed;    /* proved the secret: never dropped to make room */
    bool ready;     /* news (or its deadline passed, or just accepted): step it */
    void *priv;     /* the owner's, free()d with the connection */
    union {         /* the peer, from accept: no call of its own */
        struct sockaddr sa;
        struct sockaddr_in in;
        struct sockaddr_in6 in6;
    } from;
};

/*
 * Owner: whoever owns the listener; the listener itself stays theirs.
 * conn[0, n) in no order: a connection that leaves takes the last one's
 * place, so its index changes.  pfd is weft_admit_poll's.
 */
struct weft_admit {
    struct weft_admit_conn *conn; /* (WEFT_ADMIT_MAX) */
    struct pollfd *pfd;           /* (WEFT_ADMIT_MAX + 1) */
    int n;
    uint64_t handshake_ns;        /* from a HELLO to the proof */
    uint64_t rest_until;          /* ns: the listener is not polled before (table full) */
    unsigned long accepted;       /* connections accepted in all */
    unsigned long dropped;        /* for the rate limit of the logs and the summary */
    struct weft_errsink *err;     /* where poll and memory failures are recorded */
    uint32_t subsys;              /* WEFT_SUB_* of the logs */
    char who[40];                 /* "bootstrap", "rank 3: tcp": starts each log line */
};

/* Steps conn[i] (the owner's step): *kept false once it left the table
 * (weft_admit_drop or weft_admit_take); an error stops the serving. */
typedef weft_status_t (*weft_admit_step_fn)(void *arg, int i, bool *kept);

weft_status_t weft_admit_init(struct weft_admit *a, struct weft_errsink *err, uint32_t subsys,
                              const char *who, uint64_t handshake_ns) WEFT_HIDDEN;
/* Drops what is left (logged at TRACE), says how many were dropped in all
 * if the logs stopped naming them; accepts a zeroed or finished table. */
void weft_admit_fini(struct weft_admit *a) WEFT_HIDDEN;
/* Closes conn[i]; with a reset once its HELLO was answered, so that a
 * connector dropped then fails its next send instead of waiting. */
void weft_admit_drop(struct weft_admit *a, int i, const char *why) WEFT_HIDDEN;
/* Takes conn[i]'s socket out of the table (its priv is freed). */
int weft_admit_take(struct weft_admit *a, int i) WEFT_HIDDEN;
/* Moves the handshake of conn[i] on: WEFT_INPROGRESS, WEFT_OK once it
 * proved the secret (acc.hello holds what it claims; it stays in the table,
 * authed, until taken or dropped), or an error with *why (drop it). */
weft_status_t weft_admit_step(struct weft_admit *a, int i, const uint8_t *secret, uint64_t job,
                              const char **why) WEFT_HIDDEN;
/* "1.2.3.4:5678" of conn[i] into buf; returns buf. */
const char *weft_admit_from(const struct weft_admit *a, int i, char *buf, size_t len) WEFT_HIDDEN;

/* Polling inside the owner's own poll set: fill writes n + 1 entries,
 * conn[0, n) and then lfd (-1 while it rests); mark reads their revents
 * into `ready` (news, or a passed deadline) and says whether the listener
 * has connections waiting. */
int weft_admit_fill(const struct weft_admit *a, int lfd, struct pollfd *pfd) WEFT_HIDDEN;
bool weft_admit_mark(struct weft_admit *a, const struct pollfd *pfd) WEFT_HIDDEN;
/* Polling alone: the same with pfd, up to timeout_ms. */
weft_status_t weft_admit_poll(struct weft_admit *a, int lfd, int timeout_ms, bool *incoming)
    WEFT_HIDDEN;
/* Runs step on every ready connection. */
weft_status_t weft_admit_serve(struct weft_admit *a, weft_admit_step_fn step, void *arg)
    WEFT_HIDDEN;
/* Accepts up to WEFT_ADMIT_BATCH queued connections (untuned: a socket is
 * worth its setsockopt calls once it proved the secret), making room by
 * dropping the oldest stranger, then steps them: a rank's HELLO is usually
 * there already.  A table full of handshakes that may not be cut rests the
 * listener for 5 ms. */
weft_status_t weft_admit_accept(struct weft_admit *a, int lfd, weft_admit_step_fn step, void *arg)
    WEFT_HIDDEN;

#endif /* WEFT_ADMIT_H */
