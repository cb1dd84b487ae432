/*
 * fuzz_bs_msg.c - the bootstrap's framed messages (src/bootstrap.c): the
 * header and failure report a rank reads from the root (msg_recv), the
 * info record and hello the root reads from a rank (root_gather).  Each is
 * accepted with the lengths the caller expects or refused with a reason.
 *
 * Input: mode (mod 3), nranks (1 + b % 8), info_len (b, 0 meaning 200: the
 * size of the real record), the size of the reason buffer, then per mode:
 *   0  header[8] report...         what a rank reads from the root
 *   1  rank u32, joined u8, record[8 + info_len]   what the root reads
 *   2  kind u16, rank u32, nranks u32               an authenticated hello
 */
#include "fuzz.h"
#include "src/bootstrap.h"

#define BS_MAGIC 0x53425746u
#define BS_ERROR 0x52454657u

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void check_why(const char *why, size_t whylen, const char *must)
{
    if (whylen == 0)
        return;
    FUZZ_CHECK(fuzz_text_ok(why, whylen), "reason not printable or not terminated");
    FUZZ_CHECK(why[0] != '\0' || whylen == 1, "empty reason");
    /* A reason cut short still starts as it should. */
    FUZZ_CHECK(strncmp(why, must, WEFT_MIN(strlen(must), whylen - 1)) == 0, "'%s' lacks '%s'",
               why, must);
}

static void from_root(struct fuzz_in *in, size_t expect, char *why, size_t whylen)
{
    uint8_t hdr[WEFT_BS_HDR_LEN];
    for (size_t i = 0; i < sizeof(hdr); i++)
        hdr[i] = fuzz_u8(in);
    struct weft_bs_hdr h = {.report = true, .len = 12345};
    weft_status_t st = weft_bs_check_header(hdr, expect, &h, why, whylen);
    if (st != WEFT_OK) {
        FUZZ_CHECK(st == WEFT_ERR_REMOTE, "status %d", st);
        FUZZ_CHECK(le32(hdr) != BS_MAGIC || le32(hdr + 4) != expect, "good header refused");
        check_why(why, whylen, "magic ");
        return;
    }
    if (!h.report) {
        FUZZ_CHECK(le32(hdr) == BS_MAGIC && h.len == expect && le32(hdr + 4) == expect,
                   "data of %zu bytes accepted, expected %zu", h.len, expect);
        return;
    }
    FUZZ_CHECK(le32(hdr) == BS_ERROR && h.len <= WEFT_BS_REPORT_MAX && h.len == le32(hdr + 4),
               "report of %zu bytes", h.len);
    /* msg_recv reads a report only when it has at least the status. */
    if (h.len < 4 || in->n < h.len)
        return;
    size_t textlen = whylen; /* any size: msg_recv's is WEFT_BS_REPORT_MAX */
    char *text = malloc(textlen ? textlen : 1);
    if (text == NULL)
        abort();
    st = weft_bs_parse_report(in->p, h.len, text, textlen);
    int32_t code = (int32_t)le32(in->p);
    FUZZ_CHECK(st == (code == WEFT_ERR_TIMEOUT || code == WEFT_ERR_INVALID_ARG ? code
                                                                               : WEFT_ERR_REMOTE),
               "status %d from code %d", st, code);
    if (textlen > 0) {
        FUZZ_CHECK(fuzz_text_ok(text, textlen), "report text not printable or not terminated");
        FUZZ_CHECK(strlen(text) == WEFT_MIN(h.len - 4, textlen - 1), "report text of %zu bytes",
                   strlen(text));
    }
    free(text);
}

static void from_rank(struct fuzz_in *in, int nranks, size_t info_len, char *why, size_t whylen)
{
    uint32_t rank = (uint32_t)fuzz_le(in, 4);
    uint8_t joined = fuzz_u8(in);
    int fds[8];
    for (int r = 0; r < nranks; r++)
        fds[r] = r > 0 && (joined >> r & 1) ? 100 + r : -1; /* the root's own is -1 */
    uint8_t *rec = calloc(1, WEFT_BS_HDR_LEN + info_len);
    if (rec == NULL)
        abort();
    memcpy(rec, in->p, WEFT_MIN(in->n, WEFT_BS_HDR_LEN + info_len));
    weft_status_t st = weft_bs_check_info(rec, info_len, rank, nranks, fds, why, whylen);
    bool framed = le32(rec) == BS_MAGIC && le32(rec + 4) == info_len;
    if (st == WEFT_OK) {
        FUZZ_CHECK(framed, "malformed record accepted");
        FUZZ_CHECK(rank > 0 && rank < (uint32_t)nranks && fds[rank] < 0, "rank %u accepted",
                   rank);
    } else if (st == WEFT_ERR_INVALID_ARG) {
        FUZZ_CHECK(framed && rank < (uint32_t)nranks && (rank == 0 || fds[rank] >= 0),
                   "rank %u called a duplicate", rank);
        check_why(why, whylen, "two processes joined as rank ");
    } else {
        FUZZ_CHECK(st == WEFT_ERR_REMOTE, "status %d", st);
        FUZZ_CHECK(!framed || rank >= (uint32_t)nranks, "good record of rank %u refused", rank);
        check_why(why, whylen, "rank ");
    }
    free(rec);
}

static void hello(struct fuzz_in *in, int nranks, char *why, size_t whylen)
{
    struct weft_auth_hello h = {.kind = (uint16_t)fuzz_le(in, 2),
                                .job = 7,
                                .rank = (uint32_t)fuzz_le(in, 4),
                                .nranks = (uint32_t)fuzz_le(in, 4)};
    weft_status_t st = weft_bs_check_hello(&h, nranks, why, whylen);
    if (st == WEFT_OK) {
        FUZZ_CHECK(h.kind == WEFT_AUTH_BOOTSTRAP && h.nranks == (uint32_t)nranks &&
                       h.rank < (uint32_t)nranks,
                   "hello kind %u rank %u nranks %u accepted", h.kind, h.rank, h.nranks);
    } else if (st == WEFT_ERR_INVALID_ARG) {
        FUZZ_CHECK(h.kind == WEFT_AUTH_BOOTSTRAP && h.nranks != (uint32_t)nranks,
                   "nranks %u called a mismatch", h.nranks);
        check_why(why, whylen, "rank ");
    } else {
        FUZZ_CHECK(st == WEFT_ERR_REMOTE, "status %d", st);
        FUZZ_CHECK(h.kind != WEFT_AUTH_BOOTSTRAP || h.rank >= (uint32_t)nranks,
                   "good hello refused");
        check_why(why, whylen, h.kind != WEFT_AUTH_BOOTSTRAP ? "not a bootstrap" : "rank ");
    }
}

int weft_fuzz_bs_msg(const uint8_t *data, size_t size)
{
    weft_fuzz_setup();
    struct fuzz_in in = {data, size};
    int mode = fuzz_u8(&in) % 3;
    int nranks = 1 + fuzz_u8(&in) % 8;
    size_t info_len = fuzz_u8(&in);
    if (info_len == 0)
        info_len = 200;
    size_t whylen = fuzz_u8(&in) % 200;
    /* Exactly whylen bytes, so ASan sees any write past them. */
    char *why = malloc(whylen ? whylen : 1);
    if (why == NULL)
        abort();
    switch (mode) {
    case 0: from_root(&in, (size_t)nranks * info_len, why, whylen); break;
    case 1: from_rank(&in, nranks, info_len, why, whylen); break;
    default: hello(&in, nranks, why, whylen); break;
    }
    free(why);
    return 0;
}

WEFT_FUZZ_ENTRY(weft_fuzz_bs_msg)
