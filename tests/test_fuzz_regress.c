/*
 * test_fuzz_regress.c - the fuzz targets of tests/fuzz in the regular
 * suite: every input of every seed corpus (inputs that once broke a target
 * are kept there as regress-*) goes through the same entry point and the
 * same invariants as under libFuzzer, and each bug the fuzzers found is
 * pinned down by its own test of the parser's answer and message.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "src/bootstrap.h"
#include "src/comm.h"
#include "select/topo.h"
#include "transports/tcp/tcp.h"

#ifndef FUZZ_CORPUS_DIR
#define FUZZ_CORPUS_DIR "tests/fuzz/corpus"
#endif

/* The input being replayed, for the failure message. */
static char current[PATH_MAX + NAME_MAX + 2];

_Noreturn void weft_fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    cr_assert_fail("%s: %s:%d: %s: %s", current, file, line, cond, msg);
    abort(); /* cr_assert_fail does not return */
}

/* Runs every file of corpus/<target> through fn; returns how many. */
static int replay(const char *target, int (*fn)(const uint8_t *, size_t))
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/%s", FUZZ_CORPUS_DIR, target);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s: %s", dir, strerror(errno));
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(current, sizeof(current), "%s/%s", dir, e->d_name);
        FILE *f = fopen(current, "rb");
        cr_assert_not_null(f, "%s: %s", current, strerror(errno));
        static uint8_t buf[1 << 16];
        size_t len = fread(buf, 1, sizeof(buf), f);
        cr_assert(feof(f) && !ferror(f), "%s: unreadable or over 64 KiB", current);
        fclose(f);
        /* Exactly len bytes, so that a sanitizer build sees overreads. */
        uint8_t *data = malloc(len ? len : 1);
        cr_assert_not_null(data);
        memcpy(data, buf, len);
        fn(data, len);
        free(data);
        n++;
    }
    closedir(d);
    return n;
}

Test(fuzz_corpus, uid) { cr_assert_geq(replay("uid", weft_fuzz_uid), 10); }
Test(fuzz_corpus, bs_msg) { cr_assert_geq(replay("bs_msg", weft_fuzz_bs_msg), 10); }
Test(fuzz_corpus, auth, .timeout = 60) { cr_assert_geq(replay("auth", weft_fuzz_auth), 10); }
Test(fuzz_corpus, tcp, .timeout = 60) { cr_assert_geq(replay("tcp", weft_fuzz_tcp), 10); }
Test(fuzz_corpus, param) { cr_assert_geq(replay("param", weft_fuzz_param), 10); }
Test(fuzz_corpus, topo) { cr_assert_geq(replay("topo", weft_fuzz_topo), 10); }

/* ---- bugs the fuzzers found ------------------------------------------------ */

/* fuzz_param, regress-mask-entry-past-255: weft_parse_mask copied the list
 * into 256 bytes and parsed the copy, so a WEFT_TRANSPORT, WEFT_ALGO or
 * WEFT_DEBUG_SUBSYS longer than that lost its tail silently: an unknown
 * name there was accepted, an excluded one not excluded. */
Test(fuzz_regress, mask_reads_the_whole_list)
{
    static const char *const names[] = {"shm", "tcp"};
    char spec[512] = "";
    for (int i = 0; i < 64; i++)
        strcat(spec, "tcp,");
    strcat(spec, "bogus");
    unsigned mask = 0;
    char bad[64] = "";
    cr_assert_not(weft_parse_mask(spec, names, 2, &mask, bad, sizeof(bad)),
                  "an unknown name after 256 characters was accepted (mask %#x)", mask);
    cr_assert_str_eq(bad, "bogus");

    /* An exclusion past the old end counts. */
    strcpy(spec, "^");
    for (int i = 0; i < 64; i++)
        strcat(spec, "tcp,");
    strcat(spec, "shm");
    cr_assert(weft_parse_mask(spec, names, 2, &mask, bad, sizeof(bad)));
    cr_assert_eq(mask, 0u, "mask %#x: shm was not excluded", mask);
    char err[256];
    unsigned allowed;
    strcat(spec, ",verbs"); /* the transports' list has a third name */
    cr_assert_eq(weft_topo_parse_transports(spec, &allowed, err, sizeof(err)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(err, "leaves no transport"), "%s", err);

    /* The name reported is the whole entry, not the part that fitted. */
    char longname[300];
    memset(longname, 'd', 280);
    strcpy(longname + 280, "cp");
    snprintf(spec, sizeof(spec), "tcp,shm,t%s", longname);
    cr_assert_not(weft_parse_mask(spec, names, 2, &mask, bad, sizeof(bad)));
    cr_assert_eq(strlen(bad), sizeof(bad) - 1, "'%s'", bad);
    cr_assert(strncmp(bad, "tddd", 4) == 0, "'%s'", bad);
}

/* fuzz_uid, regress-hex-control-byte: a bad WEFT_UNIQUE_ID digit went into
 * the message as it was, control bytes included. */
Test(fuzz_regress, uid_hex_message_is_printable)
{
    char hex[WEFT_UID_HEX_LEN];
    memset(hex, 'a', sizeof(hex) - 1);
    hex[sizeof(hex) - 1] = '\0';
    hex[79] = '\x17';
    weft_unique_id_t id;
    cr_assert_eq(weft_uid_from_hex(hex, &id), WEFT_ERR_INVALID_ARG);
    cr_assert_str_eq(weft_thread_last_error(), "WEFT_UNIQUE_ID: 'a\\x17' at offset 78 is not hex");
    hex[79] = 'a';
    hex[200] = 'g';
    cr_assert_eq(weft_uid_from_hex(hex, &id), WEFT_ERR_INVALID_ARG);
    cr_assert_str_eq(weft_thread_last_error(), "WEFT_UNIQUE_ID: 'ga' at offset 200 is not hex");
}

/* ---- the checks split out for the fuzzers say what the I/O code said ------- */

Test(fuzz_regress, bootstrap_checks_and_messages)
{
    char why[160];
    struct weft_bs_hdr h;
    const uint8_t table[8] = {0x46, 0x57, 0x42, 0x53, 0x20, 0x03, 0, 0}; /* "WFBS", 800 */
    cr_assert_eq(weft_bs_check_header(table, 800, &h, why, sizeof(why)), WEFT_OK);
    cr_assert(!h.report && h.len == 800);
    cr_assert_eq(weft_bs_check_header(table, 801, &h, why, sizeof(why)), WEFT_ERR_REMOTE);
    cr_assert_str_eq(why, "magic 53425746, 800 bytes, expected 801");
    const uint8_t report[8] = {0x57, 0x46, 0x45, 0x52, 0x90, 0x01, 0, 0}; /* "WFER", 400 */
    cr_assert_eq(weft_bs_check_header(report, 801, &h, why, sizeof(why)), WEFT_OK);
    cr_assert(h.report && h.len == WEFT_BS_REPORT_MAX);
    const uint8_t too_long[8] = {0x57, 0x46, 0x45, 0x52, 0x91, 0x01, 0, 0}; /* 401 */
    cr_assert_eq(weft_bs_check_header(too_long, 801, &h, why, sizeof(why)), WEFT_ERR_REMOTE);

    uint8_t msg[12] = {0};
    int32_t code = WEFT_ERR_TIMEOUT;
    memcpy(msg, &code, 4); /* little endian hosts only, as the wire is */
    memcpy(msg + 4, "late\x01\xff!!", 8);
    char text[8];
    cr_assert_eq(weft_bs_parse_report(msg, sizeof(msg), text, sizeof(text)), WEFT_ERR_TIMEOUT);
    cr_assert_str_eq(text, "late?" "?!"); /* cut to the buffer, bytes made printable */
    code = WEFT_ERR_SYSTEM;
    memcpy(msg, &code, 4);
    cr_assert_eq(weft_bs_parse_report(msg, sizeof(msg), text, sizeof(text)), WEFT_ERR_REMOTE);

    struct weft_auth_hello hello = {.kind = WEFT_AUTH_BOOTSTRAP, .rank = 2, .nranks = 4};
    cr_assert_eq(weft_bs_check_hello(&hello, 4, why, sizeof(why)), WEFT_OK);
    cr_assert_eq(weft_bs_check_hello(&hello, 3, why, sizeof(why)), WEFT_ERR_INVALID_ARG);
    cr_assert_str_eq(why, "rank 2 was started with nranks 4, rank 0 with 3");
    hello.kind = WEFT_AUTH_DATA;
    cr_assert_eq(weft_bs_check_hello(&hello, 4, why, sizeof(why)), WEFT_ERR_REMOTE);
    cr_assert_str_eq(why, "not a bootstrap connection (kind 2)");

    uint8_t rec[8 + 4] = {0x46, 0x57, 0x42, 0x53, 4, 0, 0, 0};
    int fds[4] = {-1, 5, -1, -1};
    cr_assert_eq(weft_bs_check_info(rec, 4, 2, 4, fds, why, sizeof(why)), WEFT_OK);
    cr_assert_eq(weft_bs_check_info(rec, 4, 1, 4, fds, why, sizeof(why)), WEFT_ERR_INVALID_ARG);
    cr_assert_str_eq(why, "two processes joined as rank 1");
    cr_assert_eq(weft_bs_check_info(rec, 4, 0, 4, fds, why, sizeof(why)), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_bs_check_info(rec, 5, 2, 4, fds, why, sizeof(why)), WEFT_ERR_REMOTE);
    cr_assert_str_eq(why, "rank 2 sent a malformed info record (magic 53425746, 4 bytes, "
                          "expected 5)");
}

Test(fuzz_regress, tcp_checks_and_messages)
{
    struct tcp_ctx *ctx = calloc(1, sizeof(*ctx));
    cr_assert_not_null(ctx);
    ctx->rank = 0;
    ctx->nranks = 2;
    ctx->nstreams = 2;
    ctx->lfd = ctx->efd = -1;
    ctx->conns = calloc(2, sizeof(*ctx->conns));
    struct tcp_conn *c = tcp_conn_get(ctx, 1);
    cr_assert_not_null(c);
    snprintf(c->addrstr, sizeof(c->addrstr), "10.0.0.2:4000");

    uint8_t hdr[TCP_HDR_LEN] = {0x57, 0x46, 0x44, 0x31, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0,
                                0, 4, 0, 0, 0, 0, 0, 0}; /* "WFD1", seq 3, 1024 bytes */
    char why[TCP_ERRMSG_LEN];
    size_t len = 0;
    cr_assert_eq(tcp_frame_parse(&c->recv[1], hdr, 3, 1024, &len, why, sizeof(why)), WEFT_OK);
    cr_assert_eq(len, 1024);
    cr_assert_eq(tcp_frame_parse(&c->recv[1], hdr, 3, 1023, &len, why, sizeof(why)),
                 WEFT_ERR_REMOTE);
    cr_assert_str_eq(why, "rank 0: rank 1 sent 1024 bytes but the receive posted holds 1023 "
                          "(stream 1, message 3)");
    cr_assert_eq(tcp_frame_parse(&c->recv[1], hdr, 4, 1024, &len, why, sizeof(why)),
                 WEFT_ERR_REMOTE);
    cr_assert_str_eq(why, "rank 0: bad frame from rank 1 on stream 1 (seq 3, expected 4; magic "
                          "0x31444657, reserved 0) from 10.0.0.2:4000");

    struct weft_auth_hello h = {.kind = WEFT_AUTH_DATA, .rank = 1, .nranks = 2, .index = 1};
    cr_assert_eq(tcp_hello_check(ctx, &h, why, sizeof(why)), WEFT_OK);
    h.index = 2;
    cr_assert_eq(tcp_hello_check(ctx, &h, why, sizeof(why)), WEFT_ERR_REMOTE);
    cr_assert_str_eq(why, "stream 2, but WEFT_SOCKET_NSTREAMS is 2");
    h.index = 0;
    h.rank = 0;
    cr_assert_eq(tcp_hello_check(ctx, &h, why, sizeof(why)), WEFT_ERR_REMOTE);
    cr_assert_str_eq(why, "it claims rank 0");

    union weft_sockaddr a = {.in = {.sin_family = AF_INET}}, out;
    cr_assert_eq(tcp_addr_parse(ctx, 1, &a, sizeof(a), &out, why, sizeof(why)), WEFT_OK);
    cr_assert_eq(tcp_addr_parse(ctx, 1, &a, sizeof(a) - 1, &out, why, sizeof(why)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(why, "tcp address of rank 1 has 127 bytes"), "%s", why);
    a.sa.sa_family = AF_UNIX;
    cr_assert_eq(tcp_addr_parse(ctx, 1, &a, sizeof(a), &out, why, sizeof(why)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert_str_eq(why, "rank 0: tcp address of rank 1 has address family 1");
    tcp_finalize(ctx);
}
