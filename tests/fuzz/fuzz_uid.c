/*
 * fuzz_uid.c - the unique id: the 128 bytes of weft_uid_parse, the hex of
 * WEFT_UNIQUE_ID (weft_uid_from_hex) and the host:port of WEFT_ROOT
 * (weft_uid_from_root).  Whatever parses must encode and parse back to the
 * same thing; whatever is refused must say why.
 *
 * Input: one byte picks the parser (mod 3), the rest is its text or bytes.
 */
#include <arpa/inet.h>
#include <ctype.h>

#include "fuzz.h"
#include "src/bootstrap.h"
#include "src/comm.h"

enum { UID_BYTES, UID_HEX, UID_ROOT, UID_NMODES };

/* parse(encode(u)) == u, and encode(u) agrees with id wherever the format
 * puts something (id may be NULL: u came from elsewhere). */
static void round_trip(const struct weft_uid *u, const weft_unique_id_t *id)
{
    weft_unique_id_t again;
    struct weft_uid u2;
    FUZZ_CHECK(weft_uid_encode(&again, u) == WEFT_OK, "%s", weft_thread_last_error());
    FUZZ_CHECK(weft_uid_parse(&again, &u2) == WEFT_OK, "%s", weft_thread_last_error());
    FUZZ_CHECK(memcmp(u, &u2, sizeof(u2)) == 0, "parse(encode(u)) differs from u");
    if (id == NULL)
        return;
    /* magic, version, family, port+address, [scope], secret, job */
    size_t addr_end = u->root.sa.sa_family == AF_INET ? 14 : 30;
    FUZZ_CHECK(memcmp(again.internal, id->internal, addr_end) == 0, "header or address moved");
    FUZZ_CHECK(memcmp(again.internal + 32, id->internal + 32, 24) == 0, "secret or job moved");
}

static void fuzz_bytes(struct fuzz_in *in)
{
    weft_unique_id_t id;
    memset(&id, 0, sizeof(id));
    memcpy(id.internal, in->p, WEFT_MIN(in->n, sizeof(id.internal)));
    struct weft_uid u;
    weft_status_t st = weft_uid_parse(&id, &u);
    if (st == WEFT_OK) {
        FUZZ_CHECK(u.root.sa.sa_family == AF_INET || u.root.sa.sa_family == AF_INET6,
                   "family %d accepted", u.root.sa.sa_family);
        round_trip(&u, &id);
    } else {
        const char *why = weft_thread_last_error();
        FUZZ_CHECK(st == WEFT_ERR_INVALID_ARG, "status %d", st);
        FUZZ_CHECK(strstr(why, "unique id") != NULL, "message '%s'", why);
    }
    /* Any 128 bytes survive hex and back. */
    char hex[WEFT_UID_HEX_LEN];
    weft_unique_id_t back;
    weft_uid_to_hex(&id, hex);
    FUZZ_CHECK(strlen(hex) == WEFT_UID_HEX_LEN - 1, "hex of %zu characters", strlen(hex));
    FUZZ_CHECK(weft_uid_from_hex(hex, &back) == WEFT_OK, "%s", weft_thread_last_error());
    FUZZ_CHECK(memcmp(&back, &id, sizeof(id)) == 0, "hex round trip changed the id");
}

static void fuzz_hex(struct fuzz_in *in)
{
    char *text = fuzz_str(in);
    weft_unique_id_t id;
    weft_status_t st = weft_uid_from_hex(text, &id);
    if (st == WEFT_OK) {
        char hex[WEFT_UID_HEX_LEN];
        weft_uid_to_hex(&id, hex);
        FUZZ_CHECK(strlen(text) == WEFT_UID_HEX_LEN - 1, "accepted %zu characters", strlen(text));
        for (size_t i = 0; i < WEFT_UID_HEX_LEN - 1; i++)
            FUZZ_CHECK(hex[i] == tolower((unsigned char)text[i]), "digit %zu changed", i);
    } else {
        const char *why = weft_thread_last_error();
        FUZZ_CHECK(st == WEFT_ERR_INVALID_ARG, "status %d", st);
        FUZZ_CHECK(strncmp(why, "WEFT_UNIQUE_ID", 14) == 0, "message '%s'", why);
        FUZZ_CHECK(fuzz_text_ok(why, WEFT_ERRMSG_LEN), "message not printable: '%s'", why);
    }
    free(text);
}

/* Would weft_sock_parse ask a name server about this?  Only numeric hosts
 * (and localhost, from /etc/hosts) may reach getaddrinfo: a fuzzer must
 * not send DNS queries.  Bracketed hosts are resolved numerically only. */
static bool resolves_locally(const char *text)
{
    if (text[0] == '[')
        return true;
    const char *colon = strrchr(text, ':');
    if (colon == NULL || memchr(text, ':', (size_t)(colon - text)) != NULL)
        return true; /* refused before any lookup */
    size_t n = (size_t)(colon - text);
    char host[256];
    if (n == 0 || n >= sizeof(host))
        return true;
    memcpy(host, text, n);
    host[n] = '\0';
    struct in_addr a;
    return inet_pton(AF_INET, host, &a) == 1 || strcmp(host, "localhost") == 0;
}

static void fuzz_root(struct fuzz_in *in)
{
    char *text = fuzz_str(in);
    struct weft_uid u, u2;
    if (!resolves_locally(text)) {
        free(text);
        return;
    }
    weft_status_t st = weft_uid_from_root(text, &u);
    if (st == WEFT_OK) {
        FUZZ_CHECK(u.root.sa.sa_family == AF_INET || u.root.sa.sa_family == AF_INET6,
                   "family %d", u.root.sa.sa_family);
        in_port_t port = u.root.sa.sa_family == AF_INET ? u.root.in.sin_port : u.root.in6.sin6_port;
        FUZZ_CHECK(port != 0, "port 0 accepted from '%s'", text);
        round_trip(&u, NULL);
        /* Every process that asks must get the same id. */
        FUZZ_CHECK(weft_uid_from_root(text, &u2) == WEFT_OK, "second call failed");
        FUZZ_CHECK(memcmp(&u, &u2, sizeof(u)) == 0, "two calls gave two ids");
    } else {
        const char *why = weft_thread_last_error();
        FUZZ_CHECK(st == WEFT_ERR_INVALID_ARG, "status %d", st);
        FUZZ_CHECK(strstr(why, "socket address") != NULL, "message '%s'", why);
    }
    free(text);
}

int weft_fuzz_uid(const uint8_t *data, size_t size)
{
    static const fuzz_mode_t modes[UID_NMODES] = {
        [UID_BYTES] = fuzz_bytes, [UID_HEX] = fuzz_hex, [UID_ROOT] = fuzz_root};
    return fuzz_modes(data, size, modes, UID_NMODES);
}

WEFT_FUZZ_ENTRY(weft_fuzz_uid)
