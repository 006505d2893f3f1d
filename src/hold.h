/* hold.h - who of a transaction's held requests is answered, whether a read
 * starts, and when to look again: the pace's decisions as plain code.
 *
 * hold_plan() is pure: it takes what the state knows about a transaction
 * (struct state_fact), whether this process's own read of it is in flight,
 * the requests waiting for it and `now`, and returns a plan. hold_step()
 * applies it against a state: a lookup, the plan, and when the plan says so
 * the claim of a read (state_claim), re-planned once if another process got
 * there first. Neither does I/O or reads a clock; the resolver calls them
 * with the loop's time, and the tests with a fake one.
 *
 * The rules (docs/answers.md, "What the answer says", and
 * docs/operations.md, "Several processes"):
 *   - a final status or a remembered 404 answers everybody at once;
 *   - a request whose deadline has come is answered, whatever is in flight;
 *     no read starts for it (a late timer never reads for the late);
 *   - while a read of the transaction is in flight (here or in another
 *     process) everybody else waits for it; our own read is in flight until
 *     it ends, whatever its lease in the state says;
 *   - otherwise a read is claimed when the state allows one now and some
 *     waiter can use it: an HTML request before its deadline, or a JSON one
 *     that has not had its read yet;
 *   - a JSON request is answered once a read it waited for has ended, or at
 *     once when no read can start now;
 *   - an HTML request is answered as soon as no read is in flight and none
 *     can start before its deadline (the pace, a pause, the budget, a
 *     Retry-After past it), or when the state has no room for it. */
#ifndef KEMBALI_HOLD_H
#define KEMBALI_HOLD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pace.h"
#include "state.h"

#define HOLD_NEVER INT64_MAX

struct hold_waiter {
    int64_t deadline;  /* answer by then at the latest */
    bool json;
    bool wants_read;   /* JSON: a read started for it; answered when it ends */
};

struct hold_plan {
    bool claim;        /* start a read now (hold_step claims it) */
    int64_t wake;      /* look again then; HOLD_NEVER: only an event (a read's end) */
    size_t nanswer;    /* how many answer[] are true */
};

/* Decide for the n waiters `w` of one transaction at `now`, given the fact
 * `f` and whether our own read of it is in flight (`ours`). Sets answer[i]
 * for every waiter to answer now, and *plan. When `stopping`, no read is
 * claimed and everybody is answered with what is known. This function
 * can't fail. */
void hold_plan(const struct state_fact *f, bool ours, bool stopping, const struct hold_waiter *w,
               size_t n, int64_t now, bool *answer, struct hold_plan *plan);

/* What hold_step() did. */
struct hold_result {
    struct state_fact fact;    /* the state's view the answers are made from */
    bool claimed;              /* a read was claimed: *ticket is valid */
    struct hold_plan plan;
};

/* Look up (key, id) in st at `now` (a read the budget's plan holds back
 * from these waiters is recorded: state_lookup_held), plan (see hold_plan),
 * and claim a read when the plan says so (a read made with `timeout_ms`: its lease, see
 * state_claim_client, for `client`, who a 404 is charged to: NULL for
 * nobody). When the claim succeeds, every kept JSON waiter gets wants_read
 * (the caller must make the read and state_finish() the ticket), and the
 * wake is the earliest deadline. When it fails (another process claimed it,
 * or the facts moved), the plan is made again from the fact the claim saw,
 * without claiming. answer[] as hold_plan(). This function can't fail. */
void hold_step(struct state *st, const struct state_key *key, const char *id,
               const struct pace_schedule *sched, int budget, int64_t timeout_ms,
               const struct state_client *client, bool ours, bool stopping,
               struct hold_waiter *w, size_t n, int64_t now, bool *answer,
               struct state_ticket *ticket, struct hold_result *out);

#endif
