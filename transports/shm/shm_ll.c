/*
 * shm_ll.c - short messages beside the rings: two slots per direction of
 * each pair, a message's data and its number (the flag) written by one
 * store sequence and read once the flag shows, so a collective of one
 * exchange costs a cache line per peer instead of a ring slot, a request
 * and the engine (src/ll.c says when they are used).
 */
#include <string.h>

#include "transports/shm/shm.h"

size_t shm_ll_bytes(void *vconn)
{
    struct shm_conn *c = vconn;
    return WEFT_MIN(c->ll_tx_bytes, c->ll_rx_bytes);
}

/* Message k lives in slot k % 2: the peer took message k - 1 from the other
 * slot before it put its own k - 1st, which we took before this put, and
 * it took message k - 2 from this one before that. */
static struct shm_ll *ll_slot(char *base, size_t bytes, uint64_t k)
{
    return (struct shm_ll *)(base + (k & 1) * shm_ll_slot(bytes));
}

void shm_ll_put(void *vconn, const void *buf, size_t len)
{
    struct shm_conn *c = vconn;
    uint64_t k = ++c->ll_sent;
    struct shm_ll *m = ll_slot(c->ll_tx, c->ll_tx_bytes, k);
    if (len > 0)
        memcpy(m->data, buf, len);
    m->len = len;
    atomic_store_explicit(&m->flag, k, memory_order_release);
}

const void *shm_ll_get(void *vconn, size_t *len)
{
    struct shm_conn *c = vconn;
    uint64_t k = c->ll_got + 1;
    struct shm_ll *m = ll_slot(c->ll_rx, c->ll_rx_bytes, k);
    *len = 0;
    if (atomic_load_explicit(&m->flag, memory_order_acquire) != k)
        return NULL;
    /* The peer wrote it; a length past the slot is refused, not read. */
    uint64_t n = m->len;
    if (n > c->ll_rx_bytes) {
        *len = SIZE_MAX;
        return NULL;
    }
    c->ll_got = k;
    *len = (size_t)n;
    return m->data;
}

weft_status_t shm_ll_check(void *vconn)
{
    struct shm_conn *c = vconn;
    struct shm_ctx *ctx = c->ctx;
    if (atomic_load_explicit(&c->tx->failed, memory_order_acquire) != 0) {
        char msg[SHM_FAILURE_LEN];
        shm_peer_failure(c, msg, sizeof(msg));
        return weft_error(ctx->err, WEFT_ERR_REMOTE, "%s", msg);
    }
    if (shm_peer_dead(c))
        return weft_error(ctx->err, WEFT_ERR_REMOTE, "rank %d: rank %d (pid %d) exited",
                          ctx->rank, c->peer, (int)c->pid);
    return WEFT_OK;
}
