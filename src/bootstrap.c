/*
 * bootstrap.c - the unique id and the rendezvous.  Rank 0 listens at the
 * id's address, authenticates every connection (base/auth.h), collects one
 * info record per rank and sends back the table.  The star of connections
 * stays open for out-of-band allgather and barrier.  Strangers, silent
 * connections and bad handshakes are dropped and logged; the job goes on.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/admit.h"
#include "bootstrap.h"
#include "comm.h"

#define UID_MAGIC 0x44494657u /* "WFID" little endian */
#define UID_VERSION 1
#define BS_MAGIC 0x53425746u       /* "WFBS": header of every bootstrap message */
#define BS_ERROR 0x52454657u       /* "WFER": the root failed; the text follows */

/*
 * Owner: the communicator.  fds[i] (root only) is the authenticated
 * connection to rank i; a non-root rank has only root_fd.
 */
struct weft_bootstrap {
    struct weft_comm *comm;
    int rank, nranks;
    int root_fd;  /* non-root: connection to rank 0 */
    int *fds;     /* root: (nranks), fds[0] = -1 */
};

/* ---- the id --------------------------------------------------------------- */

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

weft_status_t weft_uid_encode(weft_unique_id_t *id, const struct weft_uid *uid)
{
    const union weft_sockaddr *root = &uid->root;
    uint8_t *p = (uint8_t *)id->internal;
    memset(id, 0, sizeof(*id));
    put32(p, UID_MAGIC);
    put16(p + 4, UID_VERSION);
    put16(p + 6, (uint16_t)root->sa.sa_family);
    if (root->sa.sa_family == AF_INET) {
        memcpy(p + 8, &root->in.sin_port, 2);
        memcpy(p + 10, &root->in.sin_addr, 4);
    } else if (root->sa.sa_family == AF_INET6) {
        memcpy(p + 8, &root->in6.sin6_port, 2);
        memcpy(p + 10, &root->in6.sin6_addr, 16);
        put32(p + 26, root->in6.sin6_scope_id);
    } else {
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "unique id: address family %d unsupported",
                          root->sa.sa_family);
    }
    memcpy(p + 32, uid->secret, WEFT_SECRET_BYTES);
    put64(p + 48, uid->job);
    return WEFT_OK;
}

weft_status_t weft_uid_make(weft_unique_id_t *id, const union weft_sockaddr *root,
                            const uint8_t *secret)
{
    struct weft_uid uid = {.root = *root};
    if (secret)
        memcpy(uid.secret, secret, WEFT_SECRET_BYTES);
    else
        WEFT_CHECK(weft_random_bytes(uid.secret, WEFT_SECRET_BYTES));
    WEFT_CHECK(weft_random_bytes(&uid.job, sizeof(uid.job)));
    return weft_uid_encode(id, &uid);
}

weft_status_t weft_uid_from_root(const char *root, struct weft_uid *out)
{
    memset(out, 0, sizeof(*out));
    WEFT_CHECK(weft_sock_parse(root, &out->root));
    const char *secret = weft_param_str("WEFT_SECRET");
    static _Atomic int warned;
    if (*secret == '\0' && !atomic_exchange(&warned, 1))
        WEFT_WARN(WEFT_SUB_INIT, "%s=%s without WEFT_SECRET: this job is unauthenticated; anyone "
                                 "who can reach %s can join it",
                  weft_param_source("WEFT_ROOT") ? weft_param_source("WEFT_ROOT") : "root", root,
                  root);
    uint8_t digest[32];
    weft_sha256(secret, strlen(secret), digest);
    memcpy(out->secret, digest, sizeof(out->secret));
    /* The job number is derived so every rank agrees without talking. */
    char jobsrc[160];
    int n = snprintf(jobsrc, sizeof(jobsrc), "weft-job|%s|", root);
    n = WEFT_MIN(n, (int)sizeof(jobsrc) - 16);
    memcpy(jobsrc + n, digest, 16);
    weft_sha256(jobsrc, (size_t)n + 16, digest);
    memcpy(&out->job, digest, sizeof(out->job));
    return WEFT_OK;
}

weft_status_t weft_uid_parse(const weft_unique_id_t *id, struct weft_uid *out)
{
    const uint8_t *p = (const uint8_t *)id->internal;
    if (get32(p) != UID_MAGIC)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "not a weft unique id (bad magic; was it made by weft_get_unique_id?)");
    if (get16(p + 4) != UID_VERSION)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "unique id version %u, this library speaks %u", get16(p + 4),
                                UID_VERSION);
    memset(out, 0, sizeof(*out));
    uint16_t fam = get16(p + 6);
    if (fam == AF_INET) {
        out->root.in.sin_family = AF_INET;
        memcpy(&out->root.in.sin_port, p + 8, 2);
        memcpy(&out->root.in.sin_addr, p + 10, 4);
    } else if (fam == AF_INET6) {
        out->root.in6.sin6_family = AF_INET6;
        memcpy(&out->root.in6.sin6_port, p + 8, 2);
        memcpy(&out->root.in6.sin6_addr, p + 10, 16);
        out->root.in6.sin6_scope_id = get32(p + 26);
    } else {
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "unique id: bad address family %u", fam);
    }
    memcpy(out->secret, p + 32, WEFT_SECRET_BYTES);
    out->job = get64(p + 48);
    return WEFT_OK;
}

void weft_uid_to_hex(const weft_unique_id_t *id, char *hex)
{
    static const char digits[] = "0123456789abcdef";
    const uint8_t *p = (const uint8_t *)id->internal;
    for (size_t i = 0; i < WEFT_UNIQUE_ID_BYTES; i++) {
        hex[2 * i] = digits[p[i] >> 4];
        hex[2 * i + 1] = digits[p[i] & 15];
    }
    hex[2 * WEFT_UNIQUE_ID_BYTES] = '\0';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* c for a message: itself when printable, else \xNN (the variable may
 * hold anything, and a message must not carry terminal controls). */
static const char *char_str(char c, char buf[5])
{
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, 5, "%c", c);
    else
        snprintf(buf, 5, "\\x%02x", (unsigned char)c);
    return buf;
}

weft_status_t weft_uid_from_hex(const char *hex, weft_unique_id_t *id)
{
    size_t n = strlen(hex);
    if (n != 2 * WEFT_UNIQUE_ID_BYTES)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "WEFT_UNIQUE_ID has %zu characters, expected %d hex digits", n,
                                2 * WEFT_UNIQUE_ID_BYTES);
    for (size_t i = 0; i < WEFT_UNIQUE_ID_BYTES; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        char a[5], b[5];
        if (hi < 0 || lo < 0)
            return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                    "WEFT_UNIQUE_ID: '%s%s' at offset %zu is not hex",
                                    char_str(hex[2 * i], a), char_str(hex[2 * i + 1], b), 2 * i);
        id->internal[i] = (char)(hi << 4 | lo);
    }
    return WEFT_OK;
}

/* A listener bound elsewhere (weft_sock_listen, a launcher) gets the deep
 * queue too: a full queue drops a rank's SYN, and TCP retries it after 1 s. */
static void widen_backlog(int fd)
{
    if (listen(fd, WEFT_LISTEN_BACKLOG) != 0)
        WEFT_TRACE(WEFT_SUB_BOOT, "listen backlog %d on fd %d: %s", WEFT_LISTEN_BACKLOG, fd,
                   strerror(errno));
}

/* Listeners opened by weft_get_unique_id, until rank 0 takes them. */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { uint64_t job; int fd; } held[16];

int weft_uid_take_listener(uint64_t job)
{
    int fd = -1;
    pthread_mutex_lock(&held_mu);
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(held); i++)
        if (held[i].fd > 0 && held[i].job == job) {
            fd = held[i].fd;
            held[i].fd = 0;
        }
    pthread_mutex_unlock(&held_mu);
    return fd;
}

void weft_uid_hold_listener(uint64_t job, int fd)
{
    pthread_mutex_lock(&held_mu);
    size_t slot = 0;
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(held); i++)
        if (held[i].fd <= 0) {
            slot = i;
            break;
        } else if (i == WEFT_ARRAY_SIZE(held) - 1) {
            close(held[0].fd); /* the oldest unused id loses its listener */
        }
    held[slot].job = job;
    held[slot].fd = fd;
    pthread_mutex_unlock(&held_mu);
}

weft_status_t weft_get_unique_id(weft_unique_id_t *id)
{
    weft_log_init();
    if (id == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "weft_get_unique_id: id is NULL");
    const char *root = weft_param_str("WEFT_ROOT");
    if (*root) {
        /* A fixed rendezvous: every process that asks gets the same id, and
         * rank 0 binds the address at init. */
        struct weft_uid uid;
        WEFT_CHECK(weft_uid_from_root(root, &uid));
        return weft_uid_encode(id, &uid);
    }
    union weft_sockaddr addr;
    char ifname[64];
    WEFT_CHECK(weft_sock_pick_iface(NULL, &addr, ifname, sizeof(ifname)));
    int fd;
    WEFT_CHECK(weft_sock_listen(&addr, &fd));
    widen_backlog(fd);
    weft_status_t st = weft_uid_make(id, &addr, NULL);
    struct weft_uid uid;
    if (st == WEFT_OK)
        st = weft_uid_parse(id, &uid);
    if (st != WEFT_OK) {
        close(fd);
        return st;
    }
    weft_uid_hold_listener(uid.job, fd);
    char buf[96];
    WEFT_INFO(WEFT_SUB_BOOT, "unique id: root %s on %s", weft_sock_str(&addr, buf, sizeof(buf)),
              ifname);
    return WEFT_OK;
}

/* ---- framed messages on the star ------------------------------------------ */

/* A socket failure on the star, said with who was at the other end. */
static weft_status_t star_error(const struct weft_bootstrap *bs, weft_status_t st, bool sending,
                                int peer)
{
    char why[WEFT_ERRMSG_LEN];
    snprintf(why, sizeof(why), "%s", weft_thread_last_error());
    return weft_error(weft_comm_err(bs->comm), st, "rank %d: bootstrap: %s rank %d%s: %s", bs->rank,
                      sending ? "sending to" : "receiving from", peer,
                      peer == 0 ? " (the root)" : "", why);
}

static weft_status_t msg_send(const struct weft_bootstrap *bs, int fd, int peer, const void *buf,
                              size_t len, uint64_t deadline)
{
    uint8_t hdr[8];
    put32(hdr, BS_MAGIC);
    put32(hdr + 4, (uint32_t)len);
    weft_status_t st = weft_sock_send_all(fd, hdr, sizeof(hdr), deadline);
    if (st == WEFT_OK)
        st = weft_sock_send_all(fd, buf, len, deadline);
    return st == WEFT_OK ? st : star_error(bs, st, true, peer);
}

/* ---- checks on what peers send (bootstrap.h) ------------------------------ */

weft_status_t weft_bs_check_header(const uint8_t *hdr, size_t expect, struct weft_bs_hdr *out,
                                   char *why, size_t whylen)
{
    uint32_t magic = get32(hdr), len = get32(hdr + 4);
    if (magic == BS_ERROR && len <= WEFT_BS_REPORT_MAX) {
        *out = (struct weft_bs_hdr){.report = true, .len = len};
        return WEFT_OK;
    }
    if (magic != BS_MAGIC || len != expect) {
        snprintf(why, whylen, "magic %08x, %u bytes, expected %zu", magic, len, expect);
        return WEFT_ERR_REMOTE;
    }
    *out = (struct weft_bs_hdr){.report = false, .len = len};
    return WEFT_OK;
}

weft_status_t weft_bs_parse_report(const uint8_t *msg, size_t n, char *text, size_t textlen)
{
    size_t k = 0;
    for (size_t i = 4; i < n && k + 1 < textlen; i++)
        text[k++] = msg[i] < 32 || msg[i] > 126 ? '?' : (char)msg[i];
    if (textlen > 0)
        text[k] = '\0';
    /* Its status when it is one a bootstrap can end with, else REMOTE. */
    int32_t code = n >= 4 ? (int32_t)get32(msg) : WEFT_ERR_REMOTE;
    return code == WEFT_ERR_TIMEOUT || code == WEFT_ERR_INVALID_ARG ? code : WEFT_ERR_REMOTE;
}

weft_status_t weft_bs_check_hello(const struct weft_auth_hello *h, int nranks, char *why,
                                  size_t whylen)
{
    if (h->kind != WEFT_AUTH_BOOTSTRAP) {
        snprintf(why, whylen, "not a bootstrap connection (kind %u)", (unsigned)h->kind);
        return WEFT_ERR_REMOTE;
    }
    if (h->nranks != (uint32_t)nranks) {
        snprintf(why, whylen, "rank %u was started with nranks %u, rank 0 with %d", h->rank,
                 h->nranks, nranks);
        return WEFT_ERR_INVALID_ARG;
    }
    /* The handshake refuses rank >= nranks already; the table index
     * depends on it, so say it here too. */
    if (h->rank >= (uint32_t)nranks) {
        snprintf(why, whylen, "rank %u of %d ranks is out of range", h->rank, nranks);
        return WEFT_ERR_REMOTE;
    }
    return WEFT_OK;
}

weft_status_t weft_bs_check_info(const uint8_t *rec, size_t info_len, uint32_t rank, int nranks,
                                 const int *fds, char *why, size_t whylen)
{
    struct weft_bs_hdr h = {0};
    char bad[96];
    if (weft_bs_check_header(rec, info_len, &h, bad, sizeof(bad)) != WEFT_OK || h.report) {
        if (h.report) /* a rank has no business sending the root's reports */
            snprintf(bad, sizeof(bad), "a failure report of %zu bytes", h.len);
        snprintf(why, whylen, "rank %u sent a malformed info record (%s)", rank, bad);
        return WEFT_ERR_REMOTE;
    }
    if (rank >= (uint32_t)nranks) {
        snprintf(why, whylen, "rank %u of %d ranks is out of range", rank, nranks);
        return WEFT_ERR_REMOTE;
    }
    if (rank == 0 || fds[rank] >= 0) {
        snprintf(why, whylen, "two processes joined as rank %u", rank);
        return WEFT_ERR_INVALID_ARG;
    }
    return WEFT_OK;
}

/* Receives exactly len bytes of payload; a header that disagrees is an
 * error before any payload byte is read. */
static weft_status_t msg_recv(const struct weft_bootstrap *bs, int fd, int peer, void *buf,
                              size_t len, uint64_t deadline)
{
    struct weft_comm *comm = bs->comm;
    uint8_t hdr[WEFT_BS_HDR_LEN];
    struct weft_bs_hdr h;
    char why[96];
    weft_status_t st = weft_sock_recv_all(fd, hdr, sizeof(hdr), deadline);
    if (st != WEFT_OK)
        return star_error(bs, st, false, peer);
    if (weft_bs_check_header(hdr, len, &h, why, sizeof(why)) != WEFT_OK)
        return weft_error(weft_comm_err(comm), WEFT_ERR_REMOTE, "bootstrap: bad message from rank %d (%s)", peer,
                          why);
    if (h.report) {
        /* The root gave up (a rank never came, ...): pass on its reason. */
        uint8_t msg[WEFT_BS_REPORT_MAX];
        char text[WEFT_BS_REPORT_MAX];
        if (h.len < 4 || weft_sock_recv_all(fd, msg, h.len, deadline) != WEFT_OK)
            return weft_error(weft_comm_err(comm), WEFT_ERR_REMOTE, "rank %d failed the bootstrap", peer);
        st = weft_bs_parse_report(msg, h.len, text, sizeof(text));
        return weft_error(weft_comm_err(comm), st, "rank %d failed the bootstrap: %s", peer, text);
    }
    st = weft_sock_recv_all(fd, buf, len, deadline);
    return st == WEFT_OK ? st : star_error(bs, st, false, peer);
}

/* ---- root ------------------------------------------------------------------ */

/*
 * A flood of strangers at the root must not keep a rank out: the door is
 * base/admit.h's.  A connection that proved the secret gets a buffer for
 * its record and HANDSHAKE_MS to send it.
 */
#define HANDSHAKE_MS 10000 /* from a HELLO to the whole record */

/* Owner: root_gather.  A connection's record, from its proof on (its priv). */
struct record {
    size_t have;    /* bytes of hdr+info read */
    uint8_t buf[];  /* (WEFT_BS_HDR_LEN + info_len) */
};

struct gather {
    struct weft_bootstrap *bs;
    const struct weft_uid *uid;
    size_t info_len;
    void *all;              /* (nranks * info_len) */
    struct weft_admit door;
    int joined;
};

/* Moves conn i on: the handshake, then the record.  *kept is false when
 * it left the table (dropped, or joined as its rank). */
static weft_status_t gather_step(void *arg, int i, bool *kept)
{
    struct gather *g = arg;
    struct weft_admit_conn *p = &g->door.conn[i];
    struct weft_bootstrap *bs = g->bs;
    struct weft_comm *comm = bs->comm;
    size_t want = WEFT_BS_HDR_LEN + g->info_len;
    char bad[160];
    *kept = false;
    if (p->priv == NULL) {
        const char *why = NULL;
        weft_status_t a = weft_admit_step(&g->door, i, g->uid->secret, g->uid->job, &why);
        if (a == WEFT_INPROGRESS) {
            *kept = true;
            return WEFT_OK;
        }
        weft_status_t chk = a == WEFT_OK
                                ? weft_bs_check_hello(&p->acc.hello, bs->nranks, bad, sizeof(bad))
                                : WEFT_ERR_REMOTE;
        if (chk == WEFT_ERR_REMOTE) {
            weft_admit_drop(&g->door, i, a == WEFT_OK ? bad : why ? why : "handshake failed");
            return WEFT_OK;
        }
        if (chk != WEFT_OK)
            return weft_error(weft_comm_err(comm), chk, "bootstrap: %s", bad);
        struct record *rec = malloc(sizeof(*rec) + want);
        if (rec == NULL)
            return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "bootstrap: out of memory");
        rec->have = 0;
        p->priv = rec;
        weft_sock_tune(p->acc.fd, 0);
        p->acc.deadline_ns = weft_now_ns() + (uint64_t)HANDSHAKE_MS * 1000000;
    }
    struct record *rec = p->priv;
    ssize_t n = recv(p->acc.fd, rec->buf + rec->have, want - rec->have, MSG_DONTWAIT);
    if (n > 0)
        rec->have += (size_t)n;
    bool stale = weft_now_ns() > p->acc.deadline_ns;
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) || stale) {
        snprintf(bad, sizeof(bad), "rank %u %s before sending its info", p->acc.hello.rank,
                 stale ? "timed out" : "disconnected");
        weft_admit_drop(&g->door, i, bad);
        return WEFT_OK;
    }
    if (rec->have < want) {
        *kept = true;
        return WEFT_OK;
    }
    uint32_t r = p->acc.hello.rank;
    weft_status_t chk = weft_bs_check_info(rec->buf, g->info_len, r, bs->nranks, bs->fds, bad,
                                           sizeof(bad));
    if (chk == WEFT_ERR_REMOTE) {
        weft_admit_drop(&g->door, i, bad);
        return WEFT_OK;
    }
    if (chk != WEFT_OK)
        return weft_error(weft_comm_err(comm), chk, "bootstrap: %s", bad);
    memcpy((char *)g->all + (size_t)r * g->info_len, rec->buf + WEFT_BS_HDR_LEN, g->info_len);
    bs->fds[r] = weft_admit_take(&g->door, i);
    g->joined++;
    return WEFT_OK;
}

static int root_listener(const struct weft_uid *uid, union weft_sockaddr *addr, int *lfd)
{
    const char *env = getenv(WEFT_ROOT_FD_ENV);
    if (env && *env) {
        char *end;
        long fd = strtol(env, &end, 10);
        union weft_sockaddr bound;
        socklen_t blen = sizeof(bound);
        unsetenv(WEFT_ROOT_FD_ENV); /* children of this rank must not adopt it */
        if (*end == '\0' && fd >= 0 && fd < 65536 &&
            getsockname((int)fd, &bound.sa, &blen) == 0 && bound.sa.sa_family == uid->root.sa.sa_family &&
            (bound.sa.sa_family == AF_INET ? bound.in.sin_port == uid->root.in.sin_port
                                           : bound.in6.sin6_port == uid->root.in6.sin6_port)) {
            *lfd = (int)fd;
            *addr = bound;
            widen_backlog(*lfd);
            return WEFT_OK;
        }
        WEFT_INFO(WEFT_SUB_BOOT, "%s=%s is not the id's listener; binding the address instead",
                  WEFT_ROOT_FD_ENV, env);
    }
    int held = weft_uid_take_listener(uid->job);
    if (held >= 0) {
        *lfd = held;
        *addr = uid->root;
        widen_backlog(*lfd);
        return WEFT_OK;
    }
    *addr = uid->root;
    WEFT_CHECK(weft_sock_listen(addr, lfd));
    widen_backlog(*lfd);
    return WEFT_OK;
}

static weft_status_t root_gather(struct weft_bootstrap *bs, const struct weft_uid *uid, int lfd,
                                 const void *info, size_t info_len, void *all, uint64_t deadline)
{
    struct weft_comm *comm = bs->comm;
    struct gather g = {.bs = bs, .uid = uid, .info_len = info_len, .all = all, .joined = 1};
    uint64_t t0 = weft_now_ns();
    memcpy(all, info, info_len);
    weft_status_t st = weft_admit_init(&g.door, weft_comm_err(comm), WEFT_SUB_BOOT, "bootstrap",
                                       (uint64_t)HANDSHAKE_MS * 1000000);
    if (st != WEFT_OK)
        goto out;
    while (g.joined < bs->nranks) {
        int left = weft_ms_left(deadline);
        if (left == 0) {
            char missing[256];
            size_t o = 0;
            for (int r = 1; r < bs->nranks && o + 16 < sizeof(missing); r++)
                if (bs->fds[r] < 0)
                    o += (size_t)snprintf(missing + o, sizeof(missing) - o, "%s%d", o ? ", " : "", r);
            st = weft_error(weft_comm_err(comm), WEFT_ERR_TIMEOUT,
                            "bootstrap: %d of %d ranks joined before the deadline; missing rank%s %s",
                            g.joined, bs->nranks, g.joined + 1 < bs->nranks ? "s" : "", missing);
            goto out;
        }
        /* Short enough that a resting listener and the deadlines of
         * silent connections are looked at again soon. */
        bool incoming;
        WEFT_CHECK_GOTO(weft_admit_poll(&g.door, lfd, left < 0 || left > 50 ? 50 : left,
                                        &incoming), st, out);
        WEFT_CHECK_GOTO(weft_admit_serve(&g.door, gather_step, &g), st, out);
        if (incoming)
            WEFT_CHECK_GOTO(weft_admit_accept(&g.door, lfd, gather_step, &g), st, out);
    }
    /* Everyone is here: hand out the table. */
    uint64_t t_all = weft_now_ns();
    for (int r = 1; r < bs->nranks && st == WEFT_OK; r++)
        st = msg_send(bs, bs->fds[r], r, all, (size_t)bs->nranks * info_len, deadline);
    WEFT_INFO(WEFT_SUB_BOOT, "bootstrap: %d ranks joined in %.1f ms, table of %zu bytes sent to "
              "each in %.1f ms; %lu connections dropped", bs->nranks, (double)(t_all - t0) / 1e6,
              (size_t)bs->nranks * info_len, (double)(weft_now_ns() - t_all) / 1e6,
              g.door.dropped);
out:
    weft_admit_fini(&g.door);
    if (st != WEFT_OK) {
        /* Tell the ranks that did join why, instead of leaving them to
         * their own deadline. */
        char text[WEFT_ERRMSG_LEN];
        put32((uint8_t *)text, (uint32_t)st);
        weft_comm_last_error_copy(comm, text + 4, sizeof(text) - 4);
        uint8_t hdr[8];
        size_t n = WEFT_MIN(4 + strlen(text + 4), (size_t)WEFT_BS_REPORT_MAX);
        put32(hdr, BS_ERROR);
        put32(hdr + 4, (uint32_t)n);
        uint64_t soon = weft_now_ns() + 1000000000ull;
        for (int r = 1; r < bs->nranks; r++)
            if (bs->fds[r] >= 0 && weft_sock_send_all(bs->fds[r], hdr, sizeof(hdr), soon) == WEFT_OK)
                weft_sock_send_all(bs->fds[r], text, n, soon);
    }
    return st;
}

/* ---- other ranks ----------------------------------------------------------- */

/* One connect to the root given window_ms: 0 connected (*fd), 1 refused
 * or unreachable (nobody listens yet), 2 no answer in the window, else
 * errno. */
static int root_try(const union weft_sockaddr *root, int window_ms, int *fd)
{
    int s = socket(root->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return errno;
    int err = 0;
    socklen_t len = sizeof(err);
    struct pollfd p = {.fd = s, .events = POLLOUT};
    if (connect(s, &root->sa, weft_sock_len(root)) != 0) {
        if (errno != EINPROGRESS && errno != EINTR)
            err = errno;
        else if (poll(&p, 1, window_ms) <= 0)
            err = -1;
        else if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
    }
    if (err == 0) {
        weft_sock_tune(s, 0);
        *fd = s;
        return 0;
    }
    close(s);
    if (err == -1)
        return 2;
    return err == ECONNREFUSED || err == ETIMEDOUT || err == EHOSTUNREACH ? 1 : err;
}

/* Connects to the root.  A root's full listen queue drops our SYN without
 * a word, and TCP sends it again only after 1 s, while a root that drains
 * a flood of strangers has room again within milliseconds: a connect with
 * no answer is started afresh after 20 ms, then 40, ... up to 1.3 s (for
 * long round trips). */
static weft_status_t root_connect(struct weft_comm *comm, int rank,
                                  const union weft_sockaddr *root, uint64_t deadline, int *fd)
{
    char name[96];
    int nap_ms = 1, unanswered = 0;
    for (int tries = 0;; tries++) {
        int left = weft_ms_left(deadline), window = weft_sock_connect_window_ms(unanswered);
        int rc = root_try(root, left < 0 ? window : WEFT_MIN(left, window), fd);
        if (rc == 0) {
            if (tries > 0)
                WEFT_INFO(WEFT_SUB_BOOT, "bootstrap: connected to root %s at try %d",
                          weft_sock_str(root, name, sizeof(name)), tries + 1);
            return WEFT_OK;
        }
        if (rc > 2)
            return weft_error(weft_comm_err(comm), weft_errno_status(rc),
                              "bootstrap: rank %d: connect to root %s: %s", rank,
                              weft_sock_str(root, name, sizeof(name)), strerror(rc));
        left = weft_ms_left(deadline);
        if (left == 0)
            return weft_error(weft_comm_err(comm), WEFT_ERR_TIMEOUT,
                              "bootstrap: rank %d: connect to root %s: deadline passed (%s)",
                              rank, weft_sock_str(root, name, sizeof(name)),
                              rc == 1 ? "refused or unreachable" : "no answer");
        unanswered += rc == 2;
        if (rc == 1) {
            /* Rank 0 may not listen (or be reachable) yet: wait a little,
             * more each time. */
            struct timespec nap = {0, (long)(left < 0 ? nap_ms : WEFT_MIN(nap_ms, left)) * 1000000};
            nanosleep(&nap, NULL);
            nap_ms = WEFT_MIN(nap_ms * 2, 100);
        }
    }
}

weft_status_t weft_bootstrap_init(struct weft_comm *comm, const struct weft_uid *uid, int rank,
                                  int nranks, const void *info, size_t info_len, void *all,
                                  uint64_t deadline, struct weft_bootstrap **out)
{
    weft_status_t st = WEFT_OK;
    struct weft_bootstrap *bs = calloc(1, sizeof(*bs));
    if (bs == NULL)
        return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "bootstrap: out of memory");
    bs->comm = comm;
    bs->rank = rank;
    bs->nranks = nranks;
    bs->root_fd = -1;
    char addr[96];
    if (rank == 0) {
        bs->fds = malloc((size_t)nranks * sizeof(int));
        if (bs->fds == NULL) {
            free(bs);
            return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "bootstrap: out of memory");
        }
        for (int i = 0; i < nranks; i++)
            bs->fds[i] = -1;
        union weft_sockaddr bound;
        int lfd = -1;
        if (nranks > 1) {
            WEFT_CHECK_GOTO(root_listener(uid, &bound, &lfd), st, fail);
            WEFT_INFO(WEFT_SUB_BOOT, "bootstrap: root listening on %s for %d ranks",
                      weft_sock_str(&bound, addr, sizeof(addr)), nranks);
        } else {
            /* Alone, nobody joins: the listener weft_get_unique_id or a
             * split's leader holds for this id would otherwise stay open. */
            int held = weft_uid_take_listener(uid->job);
            if (held >= 0)
                close(held);
        }
        st = root_gather(bs, uid, lfd, info, info_len, all, deadline);
        if (lfd >= 0)
            close(lfd); /* nobody else may join: later strangers are refused */
        if (st != WEFT_OK)
            goto fail;
    } else {
        struct weft_auth_hello hello = {.kind = WEFT_AUTH_BOOTSTRAP, .job = uid->job,
                                        .rank = (uint32_t)rank, .nranks = (uint32_t)nranks};
        const char *why = NULL;
        for (int tries = 0;; tries++) {
            WEFT_CHECK_GOTO(root_connect(comm, rank, &uid->root, deadline, &bs->root_fd), st, fail);
            st = weft_auth_connect(bs->root_fd, uid->secret, &hello, deadline, &why);
            /* Our record goes with the handshake: a root busy with a flood
             * of strangers may drop us before it has seen our proof. */
            if (st == WEFT_OK && msg_send(bs, bs->root_fd, 0, info, info_len, deadline) != WEFT_OK) {
                st = WEFT_ERR_REMOTE;
                why = "closed before it took our record";
            }
            /* Try again while time is left.  A root that fails our check of
             * its secret is not retried. */
            if (st != WEFT_ERR_REMOTE || weft_ms_left(deadline) == 0 ||
                (why && strstr(why, "secret")))
                break;
            close(bs->root_fd);
            bs->root_fd = -1;
            WEFT_INFO(WEFT_SUB_BOOT, "bootstrap: root dropped our handshake (%s); retrying",
                      why ? why : "?");
            struct timespec pause = {0, 10000000L << (tries < 5 ? tries : 5)};
            nanosleep(&pause, NULL);
        }
        if (st != WEFT_OK) {
            st = weft_error(weft_comm_err(comm), st,
                            "bootstrap: rank %d: handshake with root %s failed: %s", rank,
                            weft_sock_str(&uid->root, addr, sizeof(addr)), why ? why : "?");
            goto fail;
        }
        st = msg_recv(bs, bs->root_fd, 0, all, (size_t)nranks * info_len, deadline);
        if (st != WEFT_OK) {
            char why2[WEFT_ERRMSG_LEN];
            st = weft_error(weft_comm_err(comm), st,
                            "bootstrap: rank %d: waiting for the rank table from root %s: %s", rank,
                            weft_sock_str(&uid->root, addr, sizeof(addr)),
                            weft_comm_last_error_copy(comm, why2, sizeof(why2)));
            goto fail;
        }
    }
    *out = bs;
    return WEFT_OK;
fail:
    weft_bootstrap_close(bs);
    return st;
}

weft_status_t weft_bootstrap_allgather(struct weft_bootstrap *bs, const void *mine, void *all,
                                       size_t len, uint64_t deadline)
{
    if (bs->rank != 0) {
        WEFT_CHECK(msg_send(bs, bs->root_fd, 0, mine, len, deadline));
        return msg_recv(bs, bs->root_fd, 0, all, (size_t)bs->nranks * len, deadline);
    }
    memcpy(all, mine, len);
    for (int r = 1; r < bs->nranks; r++)
        WEFT_CHECK(msg_recv(bs, bs->fds[r], r, (char *)all + (size_t)r * len, len, deadline));
    for (int r = 1; r < bs->nranks; r++)
        WEFT_CHECK(msg_send(bs, bs->fds[r], r, all, (size_t)bs->nranks * len, deadline));
    return WEFT_OK;
}

weft_status_t weft_bootstrap_barrier(struct weft_bootstrap *bs, uint64_t deadline)
{
    uint8_t one = 1;
    uint8_t *all = malloc((size_t)bs->nranks);
    if (all == NULL)
        return weft_error(weft_comm_err(bs->comm), WEFT_ERR_NO_MEMORY, "bootstrap: out of memory");
    weft_status_t st = weft_bootstrap_allgather(bs, &one, all, 1, deadline);
    free(all);
    return st;
}

void weft_bootstrap_close(struct weft_bootstrap *bs)
{
    if (bs == NULL)
        return;
    if (bs->root_fd >= 0)
        close(bs->root_fd);
    if (bs->fds)
        for (int i = 0; i < bs->nranks; i++)
            if (bs->fds[i] >= 0)
                close(bs->fds[i]);
    free(bs->fds);
    free(bs);
}
