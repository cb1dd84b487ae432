/*
 * gen_corpus.c - writes the seed corpora of tests/fuzz (tools/fuzz.sh
 * --seed): a few valid inputs per target, made with the real encoders
 * where the library has one (unique ids, the handshake's hello, tcp frames
 * as the sender writes them), and a few near misses of each.  The input
 * layout of each target is described at the top of its fuzz_<name>.c.
 * The hello carries a fresh nonce, so a rerun rewrites those files with
 * other bytes.  Files named regress-* are inputs that once broke a target;
 * this program leaves them alone.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/auth.h"
#include "src/bootstrap.h"
#include "base/sock.h"
#include "transports/tcp/tcp.h"

static const char *root;

static _Noreturn void die(const char *what)
{
    fprintf(stderr, "gen_corpus: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void put(const char *target, const char *name, const void *data, size_t len)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", root, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        die(path);
    snprintf(path, sizeof(path), "%s/%s/%s", root, target, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0)
        die(path);
}

/* mode byte + text */
static void put_text(const char *target, const char *name, uint8_t mode, const char *text,
                     size_t len)
{
    uint8_t buf[4096];
    buf[0] = mode;
    memcpy(buf + 1, text, len);
    put(target, name, buf, len + 1);
}
#define PUT_TEXT(t, n, m, s) put_text(t, n, m, s, sizeof(s) - 1)

static void le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- fuzz_uid ------------------------------------------------------------ */

static void gen_uid(void)
{
    static const uint8_t secret[WEFT_SECRET_BYTES] = "seed secret 16b";
    union weft_sockaddr v4, v6;
    weft_unique_id_t id4, id6;
    uint8_t buf[1 + WEFT_UNIQUE_ID_BYTES];
    char hex[1 + WEFT_UID_HEX_LEN];
    struct weft_uid u = {.job = 0x1122334455667788ull};
    memcpy(u.secret, secret, sizeof(u.secret));
    if (weft_sock_parse("127.0.0.1:29500", &v4) != WEFT_OK ||
        weft_sock_parse("[::1]:29501", &v6) != WEFT_OK)
        die("unique id");
    u.root = v4;
    if (weft_uid_encode(&id4, &u) != WEFT_OK)
        die("unique id");
    u.root = v6;
    if (weft_uid_encode(&id6, &u) != WEFT_OK)
        die("unique id");
    buf[0] = 0;
    memcpy(buf + 1, id4.internal, WEFT_UNIQUE_ID_BYTES);
    put("uid", "id-v4", buf, sizeof(buf));
    buf[1 + 4] = 2; /* version 2 */
    put("uid", "id-version2", buf, sizeof(buf));
    memcpy(buf + 1, id6.internal, WEFT_UNIQUE_ID_BYTES);
    put("uid", "id-v6", buf, sizeof(buf));
    buf[1 + 6] = 99; /* address family 99 */
    put("uid", "id-family99", buf, sizeof(buf));
    buf[1] ^= 1; /* bad magic */
    put("uid", "id-badmagic", buf, sizeof(buf));

    hex[0] = 1;
    weft_uid_to_hex(&id4, hex + 1);
    put("uid", "hex-v4", hex, sizeof(hex) - 1);
    hex[1 + 100] = 'g';
    put("uid", "hex-notdigit", hex, sizeof(hex) - 1);
    put("uid", "hex-short", hex, 1 + 64);

    PUT_TEXT("uid", "root-v4", 2, "127.0.0.1:29500");
    PUT_TEXT("uid", "root-v6", 2, "[::1]:29500");
    PUT_TEXT("uid", "root-localhost", 2, "localhost:1234");
    PUT_TEXT("uid", "root-port0", 2, "10.1.2.3:0");
    PUT_TEXT("uid", "root-port-big", 2, "10.1.2.3:65536");
    PUT_TEXT("uid", "root-v6-nocolon", 2, "[fe80::1%lo]29500");
    PUT_TEXT("uid", "root-v6-unbracketed", 2, "::1:29500");
}

/* ---- fuzz_bs_msg ---------------------------------------------------------- */

static void gen_bs_msg(void)
{
    uint8_t b[512];
    /* mode 0: the table for 4 ranks of 200 bytes, as msg_send frames it */
    uint8_t m0[] = {0, 3, 0, 120, 0x46, 0x57, 0x42, 0x53, 0x20, 0x03, 0, 0};
    put("bs_msg", "table-4x200", m0, sizeof(m0));
    m0[8] = 0x21; /* one byte too many */
    put("bs_msg", "table-long", m0, sizeof(m0));
    /* a root's failure report: status TIMEOUT, then its text */
    const char text[] = "bootstrap: 2 of 4 ranks joined before the deadline; missing ranks 2, 3";
    size_t n = 4 + sizeof(text) - 1;
    memcpy(b, (uint8_t[]){0, 3, 0, 120, 0x57, 0x46, 0x45, 0x52}, 8);
    le(b + 8, n, 4);
    le(b + 12, (uint32_t)WEFT_ERR_TIMEOUT, 4);
    memcpy(b + 16, text, sizeof(text) - 1);
    put("bs_msg", "report-timeout", b, 12 + n);
    b[3] = 16; /* a reason buffer shorter than the text */
    b[20] = 0x07; /* and a control byte in it */
    put("bs_msg", "report-short-buffer", b, 12 + n);
    le(b + 8, 3, 4); /* a report too short to hold its status */
    put("bs_msg", "report-3-bytes", b, 12 + 3);
    le(b + 8, WEFT_BS_REPORT_MAX + 1, 4);
    put("bs_msg", "report-too-long", b, 12);

    /* mode 1: rank 2's info record of 200 bytes; ranks 1 and 3 are in */
    memset(b, 0, sizeof(b));
    memcpy(b, (uint8_t[]){1, 3, 0, 120, 2, 0, 0, 0, 0x0a, 0x46, 0x57, 0x42, 0x53, 200, 0, 0, 0},
           17);
    memcpy(b + 17, "node-a1", 7);
    put("bs_msg", "info-rank2", b, 17 + 200);
    b[4] = 3; /* rank 3 again */
    put("bs_msg", "info-duplicate", b, 17 + 200);
    b[4] = 9; /* out of range */
    put("bs_msg", "info-rank9", b, 17 + 200);
    b[4] = 2;
    b[13] = 199; /* length disagrees */
    put("bs_msg", "info-badlen", b, 17 + 200);

    /* mode 2: hellos after the handshake, for 4 ranks */
    put("bs_msg", "hello-ok", (uint8_t[]){2, 3, 0, 120, 1, 0, 3, 0, 0, 0, 4, 0, 0, 0}, 14);
    put("bs_msg", "hello-data", (uint8_t[]){2, 3, 0, 120, 2, 0, 3, 0, 0, 0, 4, 0, 0, 0}, 14);
    put("bs_msg", "hello-nranks5", (uint8_t[]){2, 3, 0, 120, 1, 0, 3, 0, 0, 0, 5, 0, 0, 0}, 14);
}

/* ---- fuzz_auth ------------------------------------------------------------ */

/* The hello a real connector sends. */
static void real_hello(const struct weft_auth_hello *h, uint8_t out[WEFT_AUTH_HELLO_LEN])
{
    static const uint8_t secret[WEFT_SECRET_BYTES] = "fuzz secret 16b";
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
        die("socketpair");
    struct weft_auth_connector c;
    const char *why;
    weft_auth_connect_begin(&c, sv[0], h, 0);
    if (weft_auth_connect_step(&c, secret, &why) != WEFT_INPROGRESS ||
        recv(sv[1], out, WEFT_AUTH_HELLO_LEN, 0) != WEFT_AUTH_HELLO_LEN)
        die("hello");
    close(sv[0]);
    close(sv[1]);
}

static void gen_auth(void)
{
    const uint64_t job = 0x0123456789abcdefull; /* fuzz_auth.c's */
    uint8_t b[1 + WEFT_AUTH_HELLO_LEN + WEFT_AUTH_PROOF_LEN] = {0};
    struct weft_auth_hello h = {.kind = WEFT_AUTH_BOOTSTRAP, .job = job, .rank = 1, .nranks = 4};
    real_hello(&h, b + 1);
    put("auth", "stranger-hello-badproof", b, sizeof(b));
    put("auth", "stranger-hello-only", b, 1 + WEFT_AUTH_HELLO_LEN);
    put("auth", "stranger-half-hello", b, 1 + 20);
    h.job = job + 1;
    real_hello(&h, b + 1);
    put("auth", "stranger-wrong-job", b, sizeof(b));
    h.job = job;
    h.rank = 4;
    real_hello(&h, b + 1);
    put("auth", "stranger-rank4of4", b, sizeof(b));
    h.rank = 1;
    h.kind = 3;
    real_hello(&h, b + 1);
    put("auth", "stranger-kind3", b, sizeof(b));
    memcpy(b + 1, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
    put("auth", "stranger-http", b, 1 + 27);

    uint8_t ch[1 + WEFT_AUTH_CHALLENGE_LEN];
    ch[0] = 1;
    for (size_t i = 1; i < sizeof(ch); i++)
        ch[i] = (uint8_t)(i * 37);
    put("auth", "acceptor-forged-challenge", ch, sizeof(ch));
    put("auth", "acceptor-short-challenge", ch, 1 + 16);

    /* mode 2: kind u16, job u8, rank u32, nranks u32, index u32, secret,
     * root nranks, tcp rank, tcp nranks, tcp nstreams */
    uint8_t m2[1 + 2 + 1 + 12 + 1 + 4] = {2, 1, 0, 0, 2, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0,
                                          0, 3, 0, 3, 1};
    put("auth", "pair-bootstrap-rank2of4", m2, sizeof(m2));
    m2[1] = 2;    /* a data hello for stream 1, to rank 0 of 4 with 2 streams */
    m2[12] = 1;
    put("auth", "pair-data-stream1", m2, sizeof(m2));
    m2[16] = 1; /* the connector's secret is another */
    put("auth", "pair-wrong-secret", m2, sizeof(m2));
    m2[16] = 0;
    m2[3] = 5; /* another job */
    put("auth", "pair-wrong-job", m2, sizeof(m2));
}

/* ---- fuzz_tcp ------------------------------------------------------------- */

/* The bytes a real tcp sender writes for messages of the given sizes. */
static size_t real_stream(const size_t *sizes, int n, uint8_t *out, size_t cap)
{
    struct tcp_ctx *ctx = calloc(1, sizeof(*ctx));
    int sv[2];
    if (ctx == NULL || (ctx->conns = calloc(2, sizeof(*ctx->conns))) == NULL ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
        die("tcp context");
    ctx->rank = 1;
    ctx->nranks = 2;
    ctx->nstreams = 1;
    ctx->lfd = ctx->efd = -1;
    struct tcp_conn *c = tcp_conn_get(ctx, 0);
    struct tcp_stream *st = &c->send[0];
    st->fd = sv[0];
    st->state = ST_READY;
    static uint8_t payload[1 << 16];
    for (size_t i = 0; i < sizeof(payload); i++)
        payload[i] = (uint8_t)(i * 131 + 7);
    void *req[16];
    for (int k = 0; k < n; k++)
        if (weft_tcp_ops.isend(c, payload, sizes[k], &req[k]) != WEFT_OK)
            die("isend");
    for (int i = 0; i < 100 && st->head; i++)
        weft_tcp_ops.progress(ctx, 0);
    ssize_t got = recv(sv[1], out, cap, 0);
    if (st->head || got <= 0)
        die("tcp stream");
    for (int k = 0; k < n; k++) {
        int done;
        weft_tcp_ops.test(req[k], &done, NULL);
    }
    close(sv[1]);
    tcp_finalize(ctx);
    return (size_t)got;
}

static void put_stream(const char *name, const size_t *sizes, int n, const size_t *posted,
                       int nposted, size_t cut)
{
    uint8_t b[8192];
    size_t o = 0;
    b[o++] = 2;
    b[o++] = (uint8_t)(nposted - 1);
    for (int k = 0; k < nposted; k++, o += 2)
        le(b + o, posted[k], 2);
    size_t len = real_stream(sizes, n, b + o, sizeof(b) - o);
    put("tcp", name, b, o + len - cut);
}

static void gen_tcp(void)
{
    size_t three[] = {100, 0, 1000}, posted3[] = {100, 16, 2048};
    put_stream("stream-3-messages", three, 3, posted3, 3, 0);
    put_stream("stream-cut-in-payload", three, 3, posted3, 3, 500);
    put_stream("stream-cut-in-header", three, 3, posted3, 3, 1010);
    size_t posted_short[] = {100, 16, 999};
    put_stream("stream-too-long", three, 3, posted_short, 3, 0);
    size_t one[] = {64}, posted_more[] = {64, 64};
    put_stream("stream-fewer-than-posted", one, 1, posted_more, 2, 0);
    size_t tiny[] = {1, 2, 3, 4, 5, 6, 7, 8}, posted8[] = {8, 8, 8, 8, 8, 8, 8, 8};
    put_stream("stream-8-tiny", tiny, 8, posted8, 8, 0);

    /* mode 0: frame 0 of 100 bytes (seq, posted, whylen, header) */
    uint8_t f[1 + 8 + 4 + 1 + 8192];
    f[0] = 0;
    le(f + 1, 0, 8);
    le(f + 9, 100, 4);
    f[13] = 200;
    size_t n100 = 100;
    real_stream(&n100, 1, f + 14, sizeof(f) - 14);
    put("tcp", "frame-ok", f, 14 + TCP_HDR_LEN);
    le(f + 9, 99, 4);
    put("tcp", "frame-too-long", f, 14 + TCP_HDR_LEN);
    le(f + 1, 1, 8);
    f[13] = 30; /* and a short reason buffer */
    put("tcp", "frame-bad-seq", f, 14 + TCP_HDR_LEN);

    /* mode 1: published addresses (rank, peer, strlen, bytes) */
    uint8_t a[3 + sizeof(union weft_sockaddr) + 1] = {1, 0, 64};
    union weft_sockaddr sa;
    if (weft_sock_parse("127.0.0.1:40000", &sa) != WEFT_OK)
        die("address");
    memcpy(a + 3, &sa, sizeof(sa));
    put("tcp", "addr-v4", a, 3 + sizeof(sa));
    a[2] = 10; /* a string buffer too small for it */
    put("tcp", "addr-v4-short-string", a, 3 + sizeof(sa));
    put("tcp", "addr-one-byte-more", a, sizeof(a));
    if (weft_sock_parse("[::1]:40000", &sa) != WEFT_OK)
        die("address");
    memcpy(a + 3, &sa, sizeof(sa));
    put("tcp", "addr-v6", a, 3 + sizeof(sa));
    a[3] = 1; /* AF_UNIX */
    a[4] = 0;
    put("tcp", "addr-unix", a, 3 + sizeof(sa));
}

/* ---- fuzz_param ----------------------------------------------------------- */

static void gen_param(void)
{
    PUT_TEXT("param", "size-4M", 0, "4M");
    PUT_TEXT("param", "size-hex-k", 0, "0x10k");
    PUT_TEXT("param", "size-negative", 0, "-1");
    PUT_TEXT("param", "size-max", 0, "9223372036854775807");
    PUT_TEXT("param", "size-8G-overflow", 0, "9000000000G");
    PUT_TEXT("param", "size-KB", 0, "512KB");
    PUT_TEXT("param", "size-junk", 0, "12x");
    PUT_TEXT("param", "subsys-list", 1, "INIT,NET");
    PUT_TEXT("param", "subsys-exclude", 1, "^coll,boot");
    PUT_TEXT("param", "subsys-unknown", 1, "INIT,GRAPH");
    PUT_TEXT("param", "algo-exclude", 2, "^rd");
    PUT_TEXT("param", "algo-empty-entries", 2, "ring,,rd,");
    PUT_TEXT("param", "transport-tcp", 3, "tcp");
    PUT_TEXT("param", "transport-long-list", 3,
             "tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,"
             "tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,"
             "tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm,tcp,shm");
    PUT_TEXT("param", "wrappers-none-left", 4, "^shm,tcp");
    PUT_TEXT("param", "wrappers-rhd-only", 5, "rhd");
    PUT_TEXT("param", "wrappers-unknown", 4, "nvls");
    PUT_TEXT("param", "ifname-prefixes", 5, "eth,ib\0eth0");
    PUT_TEXT("param", "ifname-exact-exclude", 5, "^=lo,docker0\0lo");
    PUT_TEXT("param", "ifname-empty-entry", 5, "eth,,\0wlan0");
}

/* ---- fuzz_topo ------------------------------------------------------------ */

static void put_topo(const char *name, uint8_t ranks, uint16_t hosts, uint8_t allowed,
                     const char *text)
{
    uint8_t b[4096];
    b[0] = ranks;
    le(b + 1, hosts, 2);
    b[3] = allowed;
    size_t n = strlen(text);
    memcpy(b + 4, text, n);
    put("topo", name, b, 4 + n);
}

static void gen_topo(void)
{
    /* 6 ranks: 0-2 on rackA-n1, 3-5 on rackB-n1 */
    const uint16_t two = 2u << 6 | 2u << 8 | 2u << 10;
    put_topo("good-file", 5, two, 0,
             "# two racks joined by a slow uplink (comments may say \xce\xb1)\n"
             "default shm alpha_us=1.5 gbps=10   # trailing comment\n"
             "default tcp\talpha_us=25 gbit=12\r\n"
             "\t  \n"
             "hosts rackA-* rackB-* alpha_us=40 gbit=10\n"
             "pair 0 3 tcp alpha_us=200 gbps=0.125\n"
             "pair 1 2 tcp\n"
             "pair 4 5 gbps=0.5\n"
             "hosts rack?-n1 rackB-n1 alpha_us=3");
    put_topo("tcp-only", 5, two, 1, "default tcp alpha_us=15 gbit=25\npair 0 1 gbps=2\n");
    put_topo("shm-across-hosts", 5, two, 0, "pair 0 3 shm\n");
    put_topo("shm-excluded", 5, two, 1, "pair 0 1 shm\n");
    put_topo("rank-out-of-range", 5, two, 0, "pair 0 6 tcp\n");
    put_topo("bad-number", 5, two, 0, "default tcp gbps=1e308\n");
    put_topo("control-byte", 5, two, 0, "default tcp alpha_us=1\x01\n");
    put_topo("unknown-directive", 5, two, 0, "link 0 1 tcp\n");
    put_topo("too-many-tokens", 5, two, 0,
             "pair 0 1 tcp alpha_us=1 a b c d e f g h i j k l m n o p\n");
    put_topo("one-rank-self", 0, 0, 0, "default self alpha_us=0.1 gbps=20\n");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    root = argv[1];
    if (mkdir(root, 0755) != 0 && errno != EEXIST)
        die(root);
    setenv("WEFT_DEBUG", "NONE", 1);
    gen_uid();
    gen_bs_msg();
    gen_auth();
    gen_tcp();
    gen_param();
    gen_topo();
    return 0;
}
