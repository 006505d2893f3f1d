/* watchset.h - which of a process's held transactions a change concerns.
 *
 * The resolver keeps one watch per transaction it holds requests for; this
 * module indexes them (by key and id, by id alone, and all of them) and
 * turns the changes the state logs (state.h, "What changed") into a set of
 * marked watches to look at again: a change of one transaction marks its
 * watch only, a key's change the watches of that key, the host's (or a log
 * read too late, `lost`) every watch. However many transactions are held,
 * a read's end costs the look at its own.
 *
 * Plain code: no I/O, no clock, no allocation (the caller embeds a node in
 * each watch and owns it). One thread. */
#ifndef KEMBALI_WATCHSET_H
#define KEMBALI_WATCHSET_H

#include <stdbool.h>
#include <stddef.h>

#include "state.h"

#define WATCHSET_BUCKETS 16384

struct watchset_node {
    struct state_key key;
    char id[STATE_ID_MAX + 1];
    /* private */
    bool marked;
    struct watchset_node *tnext;          /* chain of its (key, id) bucket */
    struct watchset_node *inext;          /* chain of its id's bucket */
    struct watchset_node *prev, *next;    /* every node */
    struct watchset_node *mprev, *mnext;  /* the marked ones */
};

struct watchset {
    struct watchset_node *by_tx[WATCHSET_BUCKETS];
    struct watchset_node *by_id[WATCHSET_BUCKETS];
    struct watchset_node *all;
    struct watchset_node *marked;
    size_t n;
};

/* An empty set. Can't fail. */
void watchset_init(struct watchset *ws);

/* Add node n for (key, id) (a valid id; no node of ws has both). Can't fail. */
void watchset_add(struct watchset *ws, struct watchset_node *n, const struct state_key *key, const char *id);

/* Take n out of ws (and out of the marked ones). Can't fail. */
void watchset_remove(struct watchset *ws, struct watchset_node *n);

/* The node of (key, id), or NULL. */
struct watchset_node *watchset_find(const struct watchset *ws, const struct state_key *key, const char *id);

/* The nodes of `id`, whatever their key: the first, then each next one
 * after `from`; NULL when there is no more. */
struct watchset_node *watchset_id_first(const struct watchset *ws, const char *id);
struct watchset_node *watchset_id_next(const struct watchset_node *from, const char *id);

/* Every node, in no particular order: the first, then the next. */
struct watchset_node *watchset_first(const struct watchset *ws);
struct watchset_node *watchset_next(const struct watchset_node *n);

/* Mark n (once; marking a marked node changes nothing). Can't fail. */
void watchset_mark(struct watchset *ws, struct watchset_node *n);

/* Mark the nodes change c concerns: STATE_CHANGE_TX its (key, id)'s,
 * STATE_CHANGE_KEY every node of its key, STATE_CHANGE_HOST every node.
 * Returns how many it newly marked. Can't fail. */
size_t watchset_mark_change(struct watchset *ws, const struct state_change *c);

/* Mark every node (the change log was read too late: state_changes'
 * `lost`). Can't fail. */
void watchset_mark_all(struct watchset *ws);

/* A marked node, no longer marked, or NULL when none is: the caller looks
 * at it (and may remove any node meanwhile). */
struct watchset_node *watchset_pop(struct watchset *ws);

/* How many nodes ws holds. */
size_t watchset_size(const struct watchset *ws);

#endif
