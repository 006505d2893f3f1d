/* turnset.c - see turnset.h. A chained hash table of turns by key
 * (FNV-1a of the key's identity) and a list of every turn; each turn a
 * doubly linked list of its members. */
#include "turnset.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint32_t key_bucket(const struct state_key *key)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof key->b; i++)
        h = (h ^ key->b[i]) * 16777619u;
    return h % TURNSET_BUCKETS;
}

void turnset_init(struct turnset *ts)
{
    memset(ts, 0, sizeof *ts);
}

struct turnset_turn *turnset_find(const struct turnset *ts, const struct state_key *key)
{
    for (struct turnset_turn *t = ts->by_key[key_bucket(key)]; t; t = t->hnext)
        if (memcmp(t->key.b, key->b, sizeof key->b) == 0)
            return t;
    return NULL;
}

struct turnset_turn *turnset_join(struct turnset *ts, struct turnset_node *n, const struct state_key *key,
                                  bool *made)
{
    struct turnset_turn *t = turnset_find(ts, key);
    *made = false;
    if (t == NULL) {
        t = calloc(1, sizeof *t);
        if (t == NULL)
            return NULL;
        *made = true;
        t->key = *key;
        uint32_t b = key_bucket(key);
        t->hnext = ts->by_key[b];
        ts->by_key[b] = t;
        t->next = ts->all;
        if (ts->all)
            ts->all->prev = t;
        ts->all = t;
    }
    n->turn = t;
    n->next = NULL;
    n->prev = t->tail;
    if (t->tail)
        t->tail->next = n;
    else
        t->head = n;
    t->tail = n;
    t->n++;
    return t;
}

struct turnset_turn *turnset_leave(struct turnset_node *n)
{
    struct turnset_turn *t = n->turn;
    if (t == NULL)
        return NULL;
    if (n->prev)
        n->prev->next = n->next;
    else
        t->head = n->next;
    if (n->next)
        n->next->prev = n->prev;
    else
        t->tail = n->prev;
    n->prev = n->next = NULL;
    n->turn = NULL;
    t->n--;
    return t;
}

struct turnset_node *turnset_take(struct turnset_turn *t)
{
    struct turnset_node *n = t->head;
    if (n != NULL)
        turnset_leave(n);
    return n;
}

void turnset_drop(struct turnset *ts, struct turnset_turn *t)
{
    while (t->head)
        turnset_leave(t->head);
    struct turnset_turn **pp = &ts->by_key[key_bucket(&t->key)];
    while (*pp != t)
        pp = &(*pp)->hnext;
    *pp = t->hnext;
    if (t->prev)
        t->prev->next = t->next;
    else
        ts->all = t->next;
    if (t->next)
        t->next->prev = t->prev;
    free(t);
}

struct turnset_turn *turnset_first(const struct turnset *ts)
{
    return ts->all;
}
