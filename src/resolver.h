/* resolver.h - held requests and the API reads they wait on, in the loop.
 *
 * A held request is a struct resolver_waiter embedded in the caller's own
 * request. The resolver groups waiters by transaction (a watch), asks
 * hold_step() what to do at each turn that concerns a watch (a waiter
 * arrived or left, a timer, a read's end here, a read's end in another
 * process), starts the reads it claims through the API client, records
 * their outcomes in the state, and hands every waiter whose answer is due
 * back to the caller's answer callback with the fact to answer from.
 *
 * It runs on the loop's thread; one helper thread waits on the state's
 * futex generation (a read ended in some process) and turns it into an
 * eventfd on the loop, since a futex cannot be polled. No lock is held
 * across I/O. */
#ifndef KEMBALI_RESOLVER_H
#define KEMBALI_RESOLVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "app.h"
#include "config.h"
#include "hold.h"
#include "loop.h"
#include "state.h"
#include "state_redis.h"

struct resolver;
struct resolver_watch;

struct resolver_waiter {
    /* set by the caller before resolver_hold() */
    struct config *cfg;          /* schedule, api_base, timeout: the caller keeps the reference */
    const struct shop *shop;     /* in cfg: key, secret, budget */
    const char *id;              /* validated; owned by the caller */
    struct hold_waiter h;        /* deadline, json */
    struct state_client client;  /* who asked (REMOTE_ADDR, of this shop's key): a 404 its read gets
                                  * is charged there, and its read is in flight for it */
    struct state_redis_client rclient; /* the address, as Redis knows clients (has_rclient) */
    bool has_rclient;
    /* optional (NULL: none): called after each look at the transaction
     * that leaves w held, with the fact it was decided from (the streamed
     * page learns there that a read came back undecided). It must neither
     * answer nor drop w (arm a timer instead). */
    void (*note)(struct resolver_waiter *w, const struct state_fact *f);
    /* private */
    bool registered;             /* state_hold() counted it */
    struct resolver_watch *w;
    struct resolver_waiter *prev, *next;
};

/* Called with a waiter whose answer is due and the fact to answer from;
 * the waiter is no longer held when it is called (the callee may free it). */
typedef void resolver_answer_fn(void *ctx, struct resolver_waiter *w, const struct state_fact *f);

/* Create the resolver on loop l, with its API client and its wake thread.
 * NULL with a reason in err. */
struct resolver *resolver_new(struct app *a, struct loop *l, resolver_answer_fn *answer, void *ctx,
                              char *err, size_t errlen);

/* Hold w until its answer is due; the answer callback may run before this
 * returns (a final status found at once, a deadline already past). */
void resolver_hold(struct resolver *rs, struct resolver_waiter *w);

/* Something was recorded about (key, id) in this process (a told status):
 * look at its held requests now, without waiting for the state's wake
 * (which still tells the other processes). Can't fail. */
void resolver_poke(struct resolver *rs, const struct state_key *key, const char *id);

/* Forget w without answering (its client went away). A read it started
 * goes on for the others and for the cache. Can't fail. */
void resolver_drop(struct resolver *rs, struct resolver_waiter *w);

/* Stopping: start no more reads and answer every held request with what is
 * known now. Reads in flight are abandoned (recorded as reads without
 * answer). Requests held after this are answered at once. */
void resolver_stop(struct resolver *rs);

/* Quiet (on): start no more reads, as when stopping, but leave the reads
 * in flight to end and be recorded (a successor waits for them through
 * the state); requests still held are answered with what is known at
 * their next look. Off again: as before (a handover that failed). Can't
 * fail. */
void resolver_quiet(struct resolver *rs, bool on);

/* Reads of this process in flight right now (claimed or under way). */
size_t resolver_reading(const struct resolver *rs);

/* Requests held right now. */
size_t resolver_held(const struct resolver *rs);

/* Stop the wake thread and free everything; nothing may be held. */
void resolver_free(struct resolver *rs);

#endif
