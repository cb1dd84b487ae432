/*
 * sched_mem.c - the symbolic memory of the schedule checker: element values,
 * each rank's memory as sorted runs of equal values, and the hash-consed
 * expression trees that record how every element was computed.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_sim.h"

/* ---- element values ----------------------------------------------------------- */

uint64_t rank_key(int r)
{
    uint64_t z = (uint64_t)(uint32_t)r * 0x9e3779b97f4a7c15ull + 0x6a09e667f3bcc909ull;
    z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ z >> 27) * 0x94d049bb133111ebull;
    return z ^ z >> 31;
}

struct rset rset_one(int r)
{
    return (struct rset){ r < 64 ? 1ull << r : 0, rank_key(r), 1 };
}

struct rset rset_add(struct rset a, struct rset b)
{
    return (struct rset){ a.low | b.low, a.sum + b.sum, a.n + b.n };
}

bool rset_eq(struct rset a, struct rset b)
{
    return a.low == b.low && a.sum == b.sum && a.n == b.n;
}

const char *rset_format(struct rset s, int p, char *buf, size_t len)
{
    if (p <= 64)
        snprintf(buf, len, "0x%llx", (unsigned long long)s.low);
    else
        snprintf(buf, len, "{%u contributions, ranks<64 0x%llx, key sum 0x%016llx}", s.n,
                 (unsigned long long)s.low, (unsigned long long)s.sum);
    return buf;
}

bool val_eq(const struct val *a, const struct val *b)
{
    return rset_eq(a->ranks, b->ranks) && a->delta == b->delta && a->origin == b->origin &&
           a->flags == b->flags && a->expr == b->expr;
}

void runs_push(struct runs *rs, size_t off, struct val v)
{
    if (rs->n && val_eq(&rs->r[rs->n - 1].v, &v))
        return; /* same value continues */
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? rs->cap * 2 : 16;
        rs->r = realloc(rs->r, rs->cap * sizeof(*rs->r));
        cr_assert(rs->r);
    }
    rs->r[rs->n].off = off;
    rs->r[rs->n].v = v;
    rs->n++;
}

static size_t seg_find(const struct segmap *m, size_t addr)
{
    size_t lo = 0, hi = m->n; /* last run with start <= addr */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (m->s[mid].off <= addr)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static void seg_reserve(struct segmap *m, size_t extra)
{
    if (m->n + extra <= m->cap)
        return;
    while (m->n + extra > m->cap)
        m->cap = m->cap ? m->cap * 2 : 16;
    m->s = realloc(m->s, m->cap * sizeof(*m->s));
    cr_assert(m->s);
}

static void seg_split(struct segmap *m, size_t addr)
{
    if (addr == 0 || addr >= m->size)
        return;
    size_t i = seg_find(m, addr);
    if (m->s[i].off == addr)
        return;
    seg_reserve(m, 1);
    memmove(&m->s[i + 2], &m->s[i + 1], (m->n - i - 1) * sizeof(*m->s));
    m->s[i + 1].off = addr;
    m->s[i + 1].v = m->s[i].v; /* delta is per address: a split keeps it */
    m->n++;
}

void seg_init(struct segmap *m, size_t size)
{
    memset(m, 0, sizeof(*m));
    m->size = size;
    seg_reserve(m, 1);
    m->s[0].off = 0;
    m->s[0].v = (struct val){ { 0, 0, 0 }, 0, -1, V_UNINIT, -1 };
    m->n = 1;
}

void seg_read(const struct segmap *m, size_t addr, size_t len, struct runs *out)
{
    out->n = 0;
    if (len == 0)
        return;
    for (size_t i = seg_find(m, addr); i < m->n && m->s[i].off < addr + len; i++) {
        size_t start = WEFT_MAX(m->s[i].off, addr);
        struct val v = m->s[i].v;
        v.delta += (int64_t)addr;
        runs_push(out, start - addr, v);
    }
}

void seg_write(struct segmap *m, size_t addr, size_t len, const struct runs *in)
{
    seg_split(m, addr);
    seg_split(m, addr + len);
    size_t i0 = seg_find(m, addr);
    size_t i1 = i0;
    while (i1 < m->n && m->s[i1].off < addr + len)
        i1++;
    seg_reserve(m, in->n);
    memmove(&m->s[i0 + in->n], &m->s[i1], (m->n - i1) * sizeof(*m->s));
    m->n = m->n - (i1 - i0) + in->n;
    for (size_t k = 0; k < in->n; k++) {
        m->s[i0 + k].off = addr + in->r[k].off;
        m->s[i0 + k].v = in->r[k].v;
        m->s[i0 + k].v.delta -= (int64_t)addr;
    }
    /* Merge equal neighbours at the two seams so maps stay short. */
    size_t lo = i0 ? i0 - 1 : 0, hi = WEFT_MIN(i0 + in->n + 1, m->n);
    size_t w = lo;
    for (size_t k = lo + 1; k < hi; k++) {
        if (val_eq(&m->s[w].v, &m->s[k].v))
            continue;
        m->s[++w] = m->s[k];
    }
    size_t removed = hi - (w + 1);
    if (removed) {
        memmove(&m->s[w + 1], &m->s[hi], (m->n - hi) * sizeof(*m->s));
        m->n -= removed;
    }
}

static uint64_t expr_hash(int32_t l, int32_t r)
{
    uint64_t h = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) * 0x9e3779b97f4a7c15ull;
    return h ^ h >> 29;
}

static void expr_rehash(struct exprs *e, size_t hcap)
{
    free(e->slot);
    e->hcap = hcap;
    e->slot = malloc(hcap * sizeof(int32_t));
    cr_assert(e->slot);
    memset(e->slot, 0xff, hcap * sizeof(int32_t));
    for (size_t i = 0; i < e->n; i++) {
        size_t h = expr_hash(e->node[i][0], e->node[i][1]) & (hcap - 1);
        while (e->slot[h] >= 0)
            h = (h + 1) & (hcap - 1);
        e->slot[h] = (int32_t)i;
    }
}

/* The id of (l op r). */
int32_t expr_node(struct exprs *e, int32_t l, int32_t r)
{
    if (2 * (e->n + 1) > e->hcap)
        expr_rehash(e, e->hcap ? 2 * e->hcap : 1024);
    size_t h = expr_hash(l, r) & (e->hcap - 1);
    for (; e->slot[h] >= 0; h = (h + 1) & (e->hcap - 1)) {
        const int32_t *nd = e->node[e->slot[h]];
        if (nd[0] == l && nd[1] == r)
            return e->base + e->slot[h];
    }
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 1024;
        e->node = realloc(e->node, e->cap * sizeof(*e->node));
        cr_assert(e->node);
    }
    e->node[e->n][0] = l;
    e->node[e->n][1] = r;
    e->slot[h] = (int32_t)e->n;
    cr_assert(e->n < (size_t)(INT32_MAX - e->base), "expression table full");
    return e->base + (int32_t)e->n++;
}

/* Writes expression id as text, "(x0 x1)" for x0 op x1; returns the
 * length it wanted (like snprintf), truncating at len. */
size_t expr_format(const struct exprs *e, int32_t id, char *out, size_t len, size_t at)
{
    char leaf[16];
    if (id < e->base) {
        snprintf(leaf, sizeof(leaf), id < 0 ? "?" : "x%d", id);
        for (const char *c = leaf; *c; c++, at++)
            if (at + 1 < len)
                out[at] = *c, out[at + 1] = '\0';
        return at;
    }
    const int32_t *nd = e->node[id - e->base];
    if (at + 1 < len)
        out[at] = '(', out[at + 1] = '\0';
    at = expr_format(e, nd[0], out, len, at + 1);
    if (at + 1 < len)
        out[at] = ' ', out[at + 1] = '\0';
    at = expr_format(e, nd[1], out, len, at + 1);
    if (at + 1 < len)
        out[at] = ')', out[at + 1] = '\0';
    return at + 1;
}
