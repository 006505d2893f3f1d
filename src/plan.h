/* plan.h - a scarce read budget, planned so that buyers see their success.
 *
 * A key may make `budget` reads in any 60 s. When that cannot pay for the
 * schedule of every held request (a flash sale), first come first served
 * spends it on the first buyers' early reads, most of them before their
 * payment is done, and later buyers get no read at all. The plan instead:
 *
 *   1. reserves, as soon as a request is held, one last-chance read for its
 *      transaction, PLAN_LEAD_MS before the request's deadline (leaving
 *      time for the read to come back), as long as the reads of the last
 *      60 s plus the reservations fit the budget;
 *   2. lets an early read (any other) start only when it leaves room for
 *      the reservations, and for the reservations of the buyers that the
 *      current arrival rate says will come while this read still counts:
 *      the arrival rate (the higher of the last PLAN_RATE_MS's and the last
 *      PLAN_RATE_LONG_MS's, so that a rush is seen in its first second and
 *      a steady stream is not underestimated), projected over the span in
 *      which a later buyer's last-chance read shares a 60 s window with a
 *      read made now (60 s minus the hold minus the lead: 27.5 s by
 *      default);
 *   3. when not every transaction that may read now can, no transaction
 *      gets a second early read while another one waiting has had none;
 *      and one whose reads were held back takes no early read that would
 *      leave its reserved one no room before the deadline.
 *
 * With plenty of budget (the reads of the last 60 s, what the waiting
 * transactions' schedules still want, and the whole schedules of as many
 * buyers as came in the last second fit it) none of this applies and the
 * schedule is the seed's.
 * The schedule's waits, pauses, Retry-After and the budget itself are
 * enforced elsewhere (state.c); the plan only withholds early reads and
 * keeps the reserved ones. Pure: no clock, no I/O. */
#ifndef KEMBALI_PLAN_H
#define KEMBALI_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pace.h"

#define PLAN_LEAD_MS PACE_GRACE_MS   /* a last-chance read starts this long before the deadline */
#define PLAN_RATE_MS 1000            /* the arrival rate is measured over this span, */
#define PLAN_RATE_LONG_MS 10000      /* and over this one: the higher rate counts */
#define PLAN_BUDGET_SPAN_MS 60000
#define PLAN_DRIFT_MS 1000           /* reads this much later than the schedule have drifted */
#define PLAN_DEMAND_MAX 64           /* a waiting transaction's demand is counted up to this */

/* What the key's budget looks like now, from the state. "Spans" are the
 * 60 s spans of the budget; what they hold is reads already started and
 * reservations, each at its time (plan_busiest). */
struct plan_key {
    int budget;        /* reads per any 60 s */
    int recent;        /* reads started in the last 60 s */
    int schedule_reads; /* the reads of one whole schedule within a hold (pace_reads_within) */
    int demand;        /* reads the schedules of the waiting transactions (and the
                        * one asking) still want before their deadlines */
    int busiest;       /* the most in a span that holds `now` */
    int busiest_late;  /* the most in a span that holds `now` and the last-chance
                        * reads of buyers who come now (starts within the
                        * headroom's span before `now`) */
    int arrivals;      /* transactions first held in the last PLAN_RATE_MS */
    int arrivals_long; /* ... in the last PLAN_RATE_LONG_MS */
    int eligible;      /* waiting transactions whose pace allows a read now (this one included) */
    bool starved;      /* one of them, not this one, has had no early read yet */
    int64_t hold_ms;   /* how long a request is held (pace_hold_ms) */
};

/* The transaction asking to read. */
struct plan_tx {
    bool reserved;     /* it holds a reservation */
    int64_t resv_at;   /* from when its last-chance read may start */
    int64_t next_gap;  /* the schedule's wait after a read made now */
    bool drifted;      /* the plan held it back, and its reads now come later than
                        * its schedule */
    int early_reads;   /* reads of this episode other than last-chance ones */
};

enum plan_read {
    PLAN_NO,           /* not now: the budget is kept for others */
    PLAN_EARLY,        /* an early read */
    PLAN_LAST_CHANCE,  /* the reserved read */
};

/* Buyers the arrival rate says will come while a read made now still
 * shares a 60 s window with their last-chance reads. Can't fail. */
int plan_headroom(const struct plan_key *k);

/* The early reads the spans leave room for now: the least of the budget
 * less the busiest span that holds now, and the budget less the busiest
 * one that also holds the last-chance reads of buyers coming now, less
 * the headroom they need. May be 0 or less. Can't fail. */
int plan_room(const struct plan_key *k);

/* May the transaction start a read now, its pace allowing one? No read
 * when plan_room() is below 1; an early read is refused too to a
 * transaction that has had one (early_reads > 0) when plan_room() is below
 * `eligible` and another one is `starved` (the only place these two
 * count: a caller may count eligible only until it passes plan_room()). An early
 * read of a reserved transaction that the plan has held back off its
 * schedule is refused when the schedule's next wait would push its
 * last-chance read past the deadline. */
enum plan_read plan_may_read(const struct plan_key *k, const struct plan_tx *t, int64_t now);

/* May a newly held transaction reserve its last-chance read, `busiest`
 * being the most in a span that holds the reservation's time? */
bool plan_may_reserve(const struct plan_key *k, int busiest);

/* The most of the sorted times ev[0..n) in a 60 s span [w, w + 60 s) that
 * holds t, over the spans with w >= from (from <= t). Can't fail. */
int plan_busiest(const int64_t *ev, int n, int64_t t, int64_t from);

/* The span before `now` within which a span holding `now` also holds the
 * last-chance reads of buyers arriving now: 60 s minus (hold - lead). */
int64_t plan_late_span(const struct plan_key *k);

/* A waiting transaction as the plan counts it: the mapped-file store fills
 * it from its entry, the Redis claim script from the transaction's hash. */
struct plan_waiter {
    int reads;          /* reads so far (of an episode: pace_in_episode decides) */
    int64_t last_start; /* the last read's start */
    int64_t hold_until; /* its held requests' latest deadline (0: none holds it) */
    int64_t busy_until; /* a read of it is in flight until then */
    int64_t not_before; /* no read before then: Retry-After, the floor, another host's word */
};

/* A transaction as a store keeps it, for the plan's count of the waiting
 * ones: the mapped-file store fills it from its entry, Redis's scripts
 * from the transaction's hash (the same functions decide for both:
 * plan_lua.h). */
struct plan_facts {
    int holders;          /* holds of it (processes', or hosts') */
    int64_t hold_until;   /* their latest deadline */
    int64_t cached_until; /* a final status or a 404 is cached until then (0: none) */
    int reads;            /* reads so far */
    int64_t last_start;   /* the last read's start */
    int64_t floor_until;  /* no read before then: the floor after the last read's end (rules_floor) */
    int64_t busy_until;   /* a read of it is in flight until then */
    int64_t not_before;   /* no read before then: Retry-After, another host's word */
};

/* Does the transaction wait: a request for it held, its deadline not
 * passed, and no final status or 404 cached (those answer from the cache
 * from now on)? Can't fail. */
bool plan_waits(const struct plan_facts *x, int64_t now);

/* x as the plan counts a waiting transaction, into *w. Can't fail. */
void plan_waiter_of(const struct plan_facts *x, struct plan_waiter *w);

/* Reads the schedule s still wants for w from `now` to its deadline, at
 * most PLAN_DEMAND_MAX (one, for a transaction not held: the read asked
 * for). Can't fail. */
int plan_demand(const struct pace_schedule *s, const struct plan_waiter *w, int64_t now);

/* Would w's own pace and windows let it read now? Can't fail. */
bool plan_ready(const struct pace_schedule *s, const struct plan_waiter *w, int64_t now);

/* The schedule's wait after a read made now by a transaction that has made
 * `reads` reads of its episode (plan_tx.next_gap). Can't fail. */
int64_t plan_next_gap(const struct pace_schedule *s, int reads);

/* *t for a transaction whose reservation is at resv_at (0: none), that
 * has made `reads` reads of its episode (0 when its episode ended),
 * `early_reads` of them early, and that the plan held back during this
 * hold (withheld): a reservation counts while it waits (`waiting`,
 * plan_waits), drifted as plan_drifted() says. Both stores' claims fill
 * it so. Can't fail. */
void plan_tx_fill(const struct pace_schedule *s, bool waiting, int64_t resv_at, int reads, int early_reads,
                  bool withheld, int64_t now, struct plan_tx *t);

/* Does a hold at `now` start a new holding period of a transaction held
 * by `holders` hosts until hold_until (none, or the last deadline
 * passed)? Both stores' holds decide by it. Can't fail. */
bool plan_fresh_hold(int holders, int64_t hold_until, int64_t now);

/* The reservation a new holding period of a request held until `deadline`
 * asks for: its last-chance read, PLAN_LEAD_MS before the deadline; 0
 * when that time is not after now. Can't fail. */
int64_t plan_hold_chance(int64_t deadline, int64_t now);

/* After a last-chance read started now, the chance kept for the requests
 * held later (`holders` hosts, until hold_until): their last-chance time,
 * when it is at least the floor from now; 0 for none. Can't fail. */
int64_t plan_later_chance(int holders, int64_t hold_until, int64_t now);

/* plan_tx.drifted: the plan held the transaction back (withheld) and now
 * is more than PLAN_DRIFT_MS later than where the schedule, counted back
 * from its reservation at resv_at (its last read), puts its read number
 * reads + 1. Can't fail. */
bool plan_drifted(const struct pace_schedule *s, int64_t resv_at, int reads, bool withheld, int64_t now);

/* Count the arrivals (first holds) at times at[0..n), in any order, into
 * k->arrivals and k->arrivals_long at `now`; returns when the headroom
 * they give next shrinks (the first of them to leave its span), INT64_MAX
 * when none counts. Can't fail. */
int64_t plan_arrivals(struct plan_key *k, const int64_t *at, int n, int64_t now);

/* plan_arrivals() from what it counts: n_short arrivals in the last
 * PLAN_RATE_MS (the earliest at first_short) and n_long in the last
 * PLAN_RATE_LONG_MS (the earliest at first_long); a first_* matters only
 * when its count is above 0. Fills k->arrivals and k->arrivals_long,
 * returns plan_arrivals()'s answer. Can't fail. */
int64_t plan_arrival_rate(struct plan_key *k, int n_short, int64_t first_short, int n_long, int64_t first_long);

/* When a read plan_may_read() refused now may be allowed: a read leaving
 * the spans (ev[0..n) sorted, as for plan_busiest), t's reservation
 * coming, the rush thinning (`thins`, from plan_arrivals), or at the
 * latest `recheck` ms from now (another's turn). Always after now. */
int64_t plan_retry(const struct plan_tx *t, const int64_t *ev, int n, int64_t thins, int64_t recheck, int64_t now);

#endif
