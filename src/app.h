/* app.h - what the parts of one kembali process share: the event loop's
 * thread, and the resolver's waker thread (which reads `state` only).
 *
 * One struct app per process, created in main and passed explicitly; there
 * are no other globals holding request data. The current configuration is
 * swapped under cfg_mu on SIGHUP; a request takes a reference to the one it
 * started with (app_config()). */
#ifndef KEMBALI_APP_H
#define KEMBALI_APP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "classify.h"
#include "config.h"
#include "render.h"
#include "state.h"
#include "word.h"

struct state_redis;
struct coord_keys;

struct app_metrics {
    atomic_long requests[W_COUNT];  /* answers by status word */
    atomic_long method_not_allowed;
    atomic_long reads[OUT_NO_ANSWER + 1]; /* reads by outcome kind */
    atomic_long reads_started;
    atomic_long connections;        /* new API connections opened */
    atomic_long held;               /* requests parked right now */
    atomic_long held_peak;
    atomic_long cache_answers;      /* answered without waiting */
    atomic_long probes_refused;     /* unknown ids from a blocked client: no read */
    atomic_long over_cap;           /* answered at once: max_held or max_held_per_shop reached */
    atomic_long notify_conflicts;   /* told statuses refused (409): another final status is known */
    atomic_long checking[WAIT_AUTH + 1]; /* held requests answered checking, by the fact's wait */
    atomic_long budget_waits;       /* held transactions whose read waited for the key's budget (once each) */
    atomic_long streamed;           /* streamed pages whose waiting top went out */
    atomic_long streamed_cut;       /* ... that ended without their result (it could not be built) */
    atomic_long json_answers;       /* answers in JSON (format=json or Accept) */
    atomic_long held_answered;      /* held requests answered (not gone) */
    atomic_long held_ms;            /* the milliseconds they were held, summed */
};

struct app {
    pthread_mutex_t cfg_mu;
    struct config *cfg;             /* current; guarded by cfg_mu */
    struct state *state;
    struct state_redis *redis;      /* with `redis`: made and freed by the resolver (loop thread only) */
    struct coord_keys *keys;        /* with `redis`: the keys used with it (coord.h), the resolver's */
    struct app_metrics m;
    int listen_fd;
};

/* A new reference to the current configuration. Can't fail. */
struct config *app_config(struct app *a);

/* Install a new configuration (takes over the caller's reference). */
void app_set_config(struct app *a, struct config *c);

#endif
