/* loop.h - the event loop: one epoll set and a heap of timers.
 *
 * One struct loop per process, run by one thread. Everything that waits
 * (connections, the API client's sockets, the state's wake, signals) is a
 * loop_io on the epoll set or a loop_timer in the heap; callbacks run on the
 * loop's thread, one at a time, and must not block. Times are
 * CLOCK_MONOTONIC milliseconds (util_mono_ms). The loop holds no pointers
 * it did not get from its caller and frees none of them. */
#ifndef KEMBALI_LOOP_H
#define KEMBALI_LOOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct loop;
struct loop_io;
struct loop_timer;

/* Called with the epoll events (EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP...). */
typedef void loop_io_fn(struct loop *l, struct loop_io *io, uint32_t events);
typedef void loop_timer_fn(struct loop *l, struct loop_timer *t);

struct loop_io {
    int fd;
    loop_io_fn *fn;
    void *data;
    uint32_t events;   /* what is registered now; 0 when not on the set */
    bool first;        /* run before the others of its turn (signals: a SIGTERM that
                        * comes with a request is seen before that request) */
    bool bulk;         /* its work can wait a turn: run after the others of its turn,
                        * all such together for at most LOOP_BULK_SLICE_MS (2 ms; at
                        * least one), the rest reported again next turn (the set is
                        * level-triggered): the API client's sockets, whose read ends
                        * answer held requests in bursts, so that a cached answer
                        * waits behind a slice of them, not behind all. One waits at
                        * most a few turns (64 sockets, several a turn): a read whose
                        * answer came that close to its timeout may time out first */
};

struct loop_timer {
    int64_t at;        /* when it fires; meaningful while armed */
    loop_timer_fn *fn;
    void *data;
    size_t slot;       /* private: position in the heap, SIZE_MAX when not armed */
};

/* A new loop. NULL with a reason in err (epoll_create1 failed, no memory). */
struct loop *loop_new(char *err, size_t errlen);

/* Free the loop (the caller has removed what it registered). */
void loop_free(struct loop *l);

/* Prepare io for fd with callback fn; not yet on the set. Can't fail. */
void loop_io_init(struct loop_io *io, int fd, loop_io_fn *fn, void *data);

/* Watch io for `events` (EPOLLIN, EPOLLOUT or both; 0 removes it from the
 * set). Level-triggered. Returns 0, or -1 with errno (EPOLL_CTL failed). */
int loop_io_set(struct loop *l, struct loop_io *io, uint32_t events);

/* Prepare a timer with callback fn; not armed. Can't fail. */
void loop_timer_init(struct loop_timer *t, loop_timer_fn *fn, void *data);

/* Arm t to fire at `at` (re-arming moves it). Returns 0, or -1 when out of
 * memory (the timer is then not armed). */
int loop_timer_at(struct loop *l, struct loop_timer *t, int64_t at);

/* Disarm t; a timer that is not armed is left as it is. Can't fail. */
void loop_timer_stop(struct loop *l, struct loop_timer *t);

/* True when t is armed. */
bool loop_timer_armed(const struct loop_timer *t);

/* The loop's idea of now: the clock read once per turn, before callbacks
 * run. Use util_mono_ms() where a fresher reading matters. */
int64_t loop_now(const struct loop *l);

/* Run turns until loop_stop(): wait for the earliest timer or any event,
 * then run the due timers (in order of `at`) and the ready callbacks.
 * Returns 0 when stopped, -1 when epoll_wait failed for good (logged). */
int loop_run(struct loop *l);

/* Make loop_run() return after the current turn. Only from the loop's own
 * thread (its callbacks). */
void loop_stop(struct loop *l);

/* One turn: wait at most timeout_ms (-1: until the next timer or event,
 * 0: do not wait), run what is due: the ready callbacks (the first ones,
 * the others, then the bulk ones for at most LOOP_BULK_SLICE_MS), then the
 * due timers in order of `at` for at most LOOP_TIMER_SLICE_MS (2 ms; at
 * least one), the rest next turn (which then does not wait). Returns 0, -1
 * on a failed epoll_wait.
 * For callers that need to interleave their own checks (shutdown). */
int loop_turn(struct loop *l, int timeout_ms);

#endif
