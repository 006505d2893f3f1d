/* turnset.h - a process's transactions the budget's plan holds back,
 * grouped by key: whose turn it may be.
 *
 * A transaction the plan withholds (state_fact.withheld) can only be let
 * through by a change of its key as a whole (state_plan_open: a read
 * leaving the spans, a reservation, the rush thinning) or by its own
 * reservation's time. The resolver puts its watch in its key's turn
 * instead of looking at it on its own every RULES_PLAN_RECHECK_MS: the
 * key is looked at once (one timer per key, when each member would have
 * looked), and only when it may let one through are its members stepped,
 * one at a time in the order they joined. So a withheld transaction costs nothing while
 * its key stays shut, however many others wait with it.
 *
 * Plain code: no I/O, no clock. A turn is allocated when its first member
 * joins and freed by turnset_drop() (the caller's, once it is empty and
 * its timer stopped). One thread. */
#ifndef KEMBALI_TURNSET_H
#define KEMBALI_TURNSET_H

#include <stdbool.h>
#include <stddef.h>

#include "loop.h"
#include "state.h"

#define TURNSET_BUCKETS 1024

struct turnset_turn;

struct turnset_node {
    /* private */
    struct turnset_turn *turn;            /* NULL: in no turn */
    struct turnset_node *prev, *next;     /* its turn's members, in joining order */
};

struct turnset_turn {
    struct state_key key;
    size_t n;                             /* members */
    struct loop_timer timer;              /* the caller's: when to look at the key again */
    /* private */
    struct turnset_node *head, *tail;
    struct turnset_turn *hnext;           /* its bucket's chain */
    struct turnset_turn *prev, *next;     /* every turn */
};

struct turnset {
    struct turnset_turn *by_key[TURNSET_BUCKETS];
    struct turnset_turn *all;
};

/* An empty set. Can't fail. */
void turnset_init(struct turnset *ts);

/* Put n (in no turn) last in the turn of `key`, made when there is none
 * (its timer zeroed: the caller inits it; *made says so). Returns the
 * turn, or NULL when out of memory (n stays in none). */
struct turnset_turn *turnset_join(struct turnset *ts, struct turnset_node *n, const struct state_key *key,
                                  bool *made);

/* Take n out of its turn (none: nothing). Returns the turn it left (kept,
 * maybe empty), or NULL. Can't fail. */
struct turnset_turn *turnset_leave(struct turnset_node *n);

/* The first member of t, taken out of it, or NULL when t is empty. */
struct turnset_node *turnset_take(struct turnset_turn *t);

/* The turn of `key`, or NULL. */
struct turnset_turn *turnset_find(const struct turnset *ts, const struct state_key *key);

/* Free turn t (empty, its timer stopped by the caller). Can't fail. */
void turnset_drop(struct turnset *ts, struct turnset_turn *t);

/* Every turn: the first (NULL: none). */
struct turnset_turn *turnset_first(const struct turnset *ts);

#endif
