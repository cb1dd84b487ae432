/*
 * fuzz_auth.c - the handshake every bootstrap and data connection passes
 * (base/auth.c), driven over a socketpair exactly as the sockets drive it:
 * a stranger's bytes to the acceptor, a hostile acceptor's bytes to the
 * connector, and a real connector against a real acceptor with any hello.
 * Nobody without the secret gets in, the reason for a refusal is the right
 * one, and an accepted hello then goes through the checks the bootstrap
 * root (weft_bs_check_hello) and the tcp listener (tcp_hello_check) apply.
 *
 * Input: mode (mod 3), then
 *   0, 1  the bytes the other side sends
 *   2     kind u16, job u8 (0: the right one), rank u32, nranks u32,
 *         index u32, other secret u8 (odd: wrong), root nranks u8,
 *         tcp rank u8, tcp nranks u8, tcp nstreams u8
 */
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "base/auth.h"
#include "src/bootstrap.h"
#include "transports/tcp/tcp.h"

#define JOB 0x0123456789abcdefull
#define HELLO_LEN WEFT_AUTH_HELLO_LEN

static const uint8_t secret[WEFT_SECRET_BYTES] = "fuzz secret 16b";
static const uint8_t wrong[WEFT_SECRET_BYTES] = "not the secret!";

static uint64_t le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* What the acceptor must say about a hello it decodes (NULL: acceptable);
 * the checks of auth.h in their order, written out independently. */
static const char *hello_verdict(const uint8_t *p, uint64_t job, char *buf, size_t len)
{
    if (memcmp(p, "WEFT", 4) != 0)
        return "bad magic";
    if (le(p + 4, 2) != WEFT_AUTH_VERSION) {
        snprintf(buf, len, "protocol version %u, expected %u", (unsigned)le(p + 4, 2),
                 (unsigned)WEFT_AUTH_VERSION);
        return buf;
    }
    uint64_t kind = le(p + 6, 2), rank = le(p + 16, 4), nranks = le(p + 20, 4);
    if (kind != WEFT_AUTH_BOOTSTRAP && kind != WEFT_AUTH_DATA)
        return "bad connection kind";
    if (le(p + 8, 8) != job)
        return "wrong job";
    if (nranks == 0)
        return "zero ranks";
    if (rank >= nranks)
        return "rank out of range";
    return NULL;
}

static void pair(int sv[2])
{
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
}

/* Everything the other side says, then its end of the stream. */
static void say_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            break; /* the input is small: the buffer holds it */
        p += k;
        n -= (size_t)k;
    }
    shutdown(fd, SHUT_WR);
}

static bool closed_reason(const char *why)
{
    return strcmp(why, "peer closed during handshake") == 0 ||
           strcmp(why, "connection reset during handshake") == 0;
}

static void stranger_to_acceptor(struct fuzz_in *in)
{
    int sv[2];
    pair(sv);
    say_all(sv[1], in->p, in->n);
    struct weft_auth_acceptor a;
    weft_auth_accept_begin(&a, sv[0], 0);
    const char *why = NULL;
    weft_status_t st = WEFT_INPROGRESS;
    for (int i = 0; i < 4 && st == WEFT_INPROGRESS; i++)
        st = weft_auth_accept_step(&a, secret, JOB, &why);
    FUZZ_CHECK(st != WEFT_OK, "a stranger was accepted");
    FUZZ_CHECK(st != WEFT_INPROGRESS, "the acceptor waits on a closed stream");
    FUZZ_CHECK(why != NULL, "no reason for status %d", st);
    char buf[64];
    const char *want = in->n < HELLO_LEN ? NULL : hello_verdict(in->p, JOB, buf, sizeof(buf));
    if (in->n < HELLO_LEN || (want == NULL && in->n < HELLO_LEN + WEFT_AUTH_PROOF_LEN))
        FUZZ_CHECK(closed_reason(why), "reason '%s' for %zu bytes", why, in->n);
    else if (want == NULL)
        FUZZ_CHECK(strcmp(why, "connector does not know the job secret") == 0, "reason '%s'",
                   why);
    else
        FUZZ_CHECK(strcmp(why, want) == 0, "reason '%s', expected '%s'", why, want);
    close(sv[0]);
    close(sv[1]);
}

static void acceptor_to_connector(struct fuzz_in *in)
{
    int sv[2];
    pair(sv);
    say_all(sv[1], in->p, in->n);
    struct weft_auth_hello h = {.kind = WEFT_AUTH_DATA, .job = JOB, .rank = 1, .nranks = 2};
    struct weft_auth_connector c;
    weft_auth_connect_begin(&c, sv[0], &h, 0);
    const char *why = NULL;
    weft_status_t st = WEFT_INPROGRESS;
    for (int i = 0; i < 4 && st == WEFT_INPROGRESS; i++)
        st = weft_auth_connect_step(&c, secret, &why);
    FUZZ_CHECK(st != WEFT_OK, "a hostile acceptor was believed");
    FUZZ_CHECK(st != WEFT_INPROGRESS, "the connector waits on a closed stream");
    FUZZ_CHECK(why != NULL, "no reason for status %d", st);
    if (in->n < WEFT_AUTH_CHALLENGE_LEN)
        FUZZ_CHECK(closed_reason(why), "reason '%s' for %zu bytes", why, in->n);
    else
        FUZZ_CHECK(strcmp(why, "acceptor does not know the job secret") == 0, "reason '%s'", why);
    close(sv[0]);
    close(sv[1]);
}

/* What the root and the tcp listener make of an authenticated hello. */
static void after_handshake(struct fuzz_in *in, const struct weft_auth_hello *h)
{
    char why[160];
    int root_nranks = 1 + fuzz_u8(in) % 8;
    weft_status_t st = weft_bs_check_hello(h, root_nranks, why, sizeof(why));
    bool ok = h->kind == WEFT_AUTH_BOOTSTRAP && h->nranks == (uint32_t)root_nranks &&
              h->rank < (uint32_t)root_nranks;
    FUZZ_CHECK((st == WEFT_OK) == ok, "root: status %d for kind %u rank %u nranks %u", st,
               h->kind, h->rank, h->nranks);
    FUZZ_CHECK(st == WEFT_OK || fuzz_text_ok(why, sizeof(why)), "root: reason unreadable");

    static struct tcp_ctx ctx; /* tcp_hello_check reads rank, nranks, nstreams */
    ctx.rank = fuzz_u8(in) % 8;
    ctx.nranks = ctx.rank + 1 + fuzz_u8(in) % 8;
    ctx.nstreams = 1 + fuzz_u8(in) % TCP_MAX_STREAMS;
    st = tcp_hello_check(&ctx, h, why, sizeof(why));
    ok = h->kind == WEFT_AUTH_DATA && h->nranks == (uint32_t)ctx.nranks &&
         h->rank < (uint32_t)ctx.nranks && h->rank != (uint32_t)ctx.rank &&
         h->index < (uint32_t)ctx.nstreams;
    FUZZ_CHECK((st == WEFT_OK) == ok, "tcp: status %d for kind %u rank %u nranks %u index %u",
               st, h->kind, h->rank, h->nranks, h->index);
    FUZZ_CHECK(st == WEFT_OK || fuzz_text_ok(why, sizeof(why)), "tcp: reason unreadable");
}

static void connector_to_acceptor(struct fuzz_in *in)
{
    struct weft_auth_hello h = {.kind = (uint16_t)fuzz_le(in, 2)};
    uint8_t job = fuzz_u8(in);
    h.job = JOB + job;
    h.rank = (uint32_t)fuzz_le(in, 4);
    h.nranks = (uint32_t)fuzz_le(in, 4);
    h.index = (uint32_t)fuzz_le(in, 4);
    bool same_secret = (fuzz_u8(in) & 1) == 0;

    int sv[2];
    pair(sv);
    struct weft_auth_connector c;
    struct weft_auth_acceptor a;
    weft_auth_connect_begin(&c, sv[0], &h, 0);
    weft_auth_accept_begin(&a, sv[1], 0);
    const char *cwhy = NULL, *awhy = NULL;
    weft_status_t cst = WEFT_INPROGRESS, ast = WEFT_INPROGRESS;
    for (int i = 0; i < 8 && (cst == WEFT_INPROGRESS || ast == WEFT_INPROGRESS); i++) {
        const uint8_t *csecret = same_secret ? secret : wrong;
        if (cst == WEFT_INPROGRESS && (cst = weft_auth_connect_step(&c, csecret, &cwhy)) < 0)
            shutdown(sv[0], SHUT_RDWR); /* as the caller's close would */
        if (ast == WEFT_INPROGRESS && (ast = weft_auth_accept_step(&a, secret, JOB, &awhy)) < 0)
            shutdown(sv[1], SHUT_RDWR);
    }
    FUZZ_CHECK(cst != WEFT_INPROGRESS && ast != WEFT_INPROGRESS, "handshake stuck (%d, %d)", cst,
               ast);
    uint8_t raw[HELLO_LEN] = "WEFT";
    raw[4] = WEFT_AUTH_VERSION;
    for (int i = 0; i < 2; i++)
        raw[6 + i] = (uint8_t)(h.kind >> (8 * i));
    for (int i = 0; i < 8; i++)
        raw[8 + i] = (uint8_t)(h.job >> (8 * i));
    for (int i = 0; i < 4; i++) {
        raw[16 + i] = (uint8_t)(h.rank >> (8 * i));
        raw[20 + i] = (uint8_t)(h.nranks >> (8 * i));
    }
    char buf[64];
    const char *want = hello_verdict(raw, JOB, buf, sizeof(buf));
    if (want != NULL) {
        FUZZ_CHECK(ast < 0 && awhy && strcmp(awhy, want) == 0, "acceptor: %d '%s', expected '%s'",
                   ast, awhy ? awhy : "", want);
        FUZZ_CHECK(cst < 0 && cwhy && closed_reason(cwhy), "connector: %d '%s'", cst,
                   cwhy ? cwhy : "");
    } else if (!same_secret) {
        FUZZ_CHECK(cst < 0 && cwhy && strcmp(cwhy, "acceptor does not know the job secret") == 0,
                   "connector: %d '%s'", cst, cwhy ? cwhy : "");
        FUZZ_CHECK(ast < 0 && awhy && closed_reason(awhy), "acceptor: %d '%s'", ast,
                   awhy ? awhy : "");
    } else {
        FUZZ_CHECK(cst == WEFT_OK && ast == WEFT_OK, "good handshake failed: %s / %s",
                   cwhy ? cwhy : "", awhy ? awhy : "");
        FUZZ_CHECK(a.hello.kind == h.kind && a.hello.job == h.job && a.hello.rank == h.rank &&
                       a.hello.nranks == h.nranks && a.hello.index == h.index,
                   "the acceptor heard another hello");
        after_handshake(in, &a.hello);
    }
    close(sv[0]);
    close(sv[1]);
}

int weft_fuzz_auth(const uint8_t *data, size_t size)
{
    static const fuzz_mode_t modes[] = {stranger_to_acceptor, acceptor_to_connector,
                                        connector_to_acceptor};
    return fuzz_modes(data, size, modes, WEFT_ARRAY_SIZE(modes));
}

WEFT_FUZZ_ENTRY(weft_fuzz_auth)
