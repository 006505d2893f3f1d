/* watchset.c - see watchset.h. Two chained hash tables of node pointers
 * (FNV-1a: the ids come from our own buyers' URLs, validated, and a long
 * chain costs only this process a little time) and two doubly linked
 * lists, every node's and the marked ones'. */
#include "watchset.h"

#include <stdint.h>
#include <string.h>

static uint32_t fnv(uint32_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

static uint32_t id_bucket(const char *id)
{
    return fnv(2166136261u, (const uint8_t *)id, strlen(id)) % WATCHSET_BUCKETS;
}

static uint32_t tx_bucket(const struct state_key *key, const char *id)
{
    uint32_t h = fnv(2166136261u, key->b, sizeof key->b);
    return fnv(h, (const uint8_t *)id, strlen(id)) % WATCHSET_BUCKETS;
}

void watchset_init(struct watchset *ws)
{
    memset(ws, 0, sizeof *ws);
}

void watchset_add(struct watchset *ws, struct watchset_node *n, const struct state_key *key, const char *id)
{
    n->key = *key;
    size_t len = strnlen(id, STATE_ID_MAX);
    memcpy(n->id, id, len);
    n->id[len] = '\0';
    n->marked = false;
    n->mprev = n->mnext = NULL;
    uint32_t t = tx_bucket(key, n->id), i = id_bucket(n->id);
    n->tnext = ws->by_tx[t];
    ws->by_tx[t] = n;
    n->inext = ws->by_id[i];
    ws->by_id[i] = n;
    n->prev = NULL;
    n->next = ws->all;
    if (ws->all)
        ws->all->prev = n;
    ws->all = n;
    ws->n++;
}

static void unmark(struct watchset *ws, struct watchset_node *n)
{
    if (!n->marked)
        return;
    if (n->mprev)
        n->mprev->mnext = n->mnext;
    else
        ws->marked = n->mnext;
    if (n->mnext)
        n->mnext->mprev = n->mprev;
    n->mprev = n->mnext = NULL;
    n->marked = false;
}

void watchset_remove(struct watchset *ws, struct watchset_node *n)
{
    unmark(ws, n);
    struct watchset_node **pp = &ws->by_tx[tx_bucket(&n->key, n->id)];
    while (*pp != NULL && *pp != n)
        pp = &(*pp)->tnext;
    if (*pp == n)
        *pp = n->tnext;
    pp = &ws->by_id[id_bucket(n->id)];
    while (*pp != NULL && *pp != n)
        pp = &(*pp)->inext;
    if (*pp == n)
        *pp = n->inext;
    if (n->prev)
        n->prev->next = n->next;
    else
        ws->all = n->next;
    if (n->next)
        n->next->prev = n->prev;
    n->prev = n->next = n->tnext = n->inext = NULL;
    ws->n--;
}

struct watchset_node *watchset_find(const struct watchset *ws, const struct state_key *key, const char *id)
{
    for (struct watchset_node *n = ws->by_tx[tx_bucket(key, id)]; n; n = n->tnext)
        if (memcmp(n->key.b, key->b, sizeof key->b) == 0 && strcmp(n->id, id) == 0)
            return n;
    return NULL;
}

static struct watchset_node *id_from(struct watchset_node *n, const char *id)
{
    while (n != NULL && strcmp(n->id, id) != 0)
        n = n->inext;
    return n;
}

struct watchset_node *watchset_id_first(const struct watchset *ws, const char *id)
{
    return id_from(ws->by_id[id_bucket(id)], id);
}

struct watchset_node *watchset_id_next(const struct watchset_node *from, const char *id)
{
    return id_from(from->inext, id);
}

struct watchset_node *watchset_first(const struct watchset *ws)
{
    return ws->all;
}

struct watchset_node *watchset_next(const struct watchset_node *n)
{
    return n->next;
}

void watchset_mark(struct watchset *ws, struct watchset_node *n)
{
    if (n->marked)
        return;
    n->marked = true;
    n->mprev = NULL;
    n->mnext = ws->marked;
    if (ws->marked)
        ws->marked->mprev = n;
    ws->marked = n;
}

size_t watchset_mark_change(struct watchset *ws, const struct state_change *c)
{
    size_t marked = 0;
    if (c->kind == STATE_CHANGE_TX) {
        struct watchset_node *n = watchset_find(ws, &c->key, c->id);
        if (n != NULL && !n->marked) {
            watchset_mark(ws, n);
            marked++;
        }
        return marked;
    }
    /* a key's or the host's: rare (a pause), so a walk of every node; only
     * the ones it concerns are marked */
    for (struct watchset_node *n = ws->all; n; n = n->next)
        if (!n->marked &&
            (c->kind == STATE_CHANGE_HOST || memcmp(n->key.b, c->key.b, sizeof c->key.b) == 0)) {
            watchset_mark(ws, n);
            marked++;
        }
    return marked;
}

void watchset_mark_all(struct watchset *ws)
{
    for (struct watchset_node *n = ws->all; n; n = n->next)
        watchset_mark(ws, n);
}

struct watchset_node *watchset_pop(struct watchset *ws)
{
    struct watchset_node *n = ws->marked;
    if (n != NULL)
        unmark(ws, n);
    return n;
}

size_t watchset_size(const struct watchset *ws)
{
    return ws->n;
}
