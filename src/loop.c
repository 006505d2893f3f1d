/* loop.c - see loop.h.
 *
 * Timers are a binary min-heap of pointers ordered by `at`; each timer
 * knows its slot, so stopping or moving one is O(log n). The epoll events
 * of one turn are kept in the loop: when a callback removes an io from the
 * set, its entry in the rest of the turn's batch is cleared, so a callback
 * may free another io (a connection closing a sibling) safely. */
#include "loop.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

#define LOOP_BATCH 256 /* more than the API client's sockets (KASERA_READS_MAX), and room for the rest */
#define LOOP_TIMER_SLICE_MS 2 /* the longest run of due timers before the sockets are looked at again */
#define LOOP_BULK_SLICE_MS 2  /* the longest run of bulk callbacks in a turn */

struct loop {
    int epfd;
    bool stop;
    int64_t now;
    struct loop_timer **heap;
    size_t nheap, capheap;
    struct epoll_event batch[LOOP_BATCH];
    int nbatch, ibatch;       /* the turn's events, and the one being run */
};

struct loop *loop_new(char *err, size_t errlen)
{
    struct loop *l = calloc(1, sizeof *l);
    if (l == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (l->epfd < 0) {
        snprintf(err, errlen, "epoll_create1: %s", strerror(errno));
        free(l);
        return NULL;
    }
    l->now = util_mono_ms();
    return l;
}

void loop_free(struct loop *l)
{
    if (l == NULL)
        return;
    close(l->epfd);
    free(l->heap);
    free(l);
}

void loop_io_init(struct loop_io *io, int fd, loop_io_fn *fn, void *data)
{
    io->fd = fd;
    io->fn = fn;
    io->data = data;
    io->events = 0;
    io->first = false;
    io->bulk = false;
}

int loop_io_set(struct loop *l, struct loop_io *io, uint32_t events)
{
    if (events == io->events)
        return 0;
    struct epoll_event ev = {.events = events, .data.ptr = io};
    int op = io->events == 0 ? EPOLL_CTL_ADD : events == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
    if (epoll_ctl(l->epfd, op, io->fd, &ev) != 0 && !(op == EPOLL_CTL_DEL && (errno == EBADF || errno == ENOENT)))
        return -1;
    io->events = events;
    if (events == 0) /* not to be called later in this turn (the urgent pass runs ahead of the rest) */
        for (int i = 0; i < l->nbatch; i++)
            if (l->batch[i].data.ptr == io)
                l->batch[i].data.ptr = NULL;
    return 0;
}

void loop_timer_init(struct loop_timer *t, loop_timer_fn *fn, void *data)
{
    t->at = 0;
    t->fn = fn;
    t->data = data;
    t->slot = SIZE_MAX;
}

bool loop_timer_armed(const struct loop_timer *t)
{
    return t->slot != SIZE_MAX;
}

static void heap_set(struct loop *l, size_t i, struct loop_timer *t)
{
    l->heap[i] = t;
    t->slot = i;
}

static void heap_up(struct loop *l, size_t i)
{
    struct loop_timer *t = l->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (l->heap[p]->at <= t->at)
            break;
        heap_set(l, i, l->heap[p]);
        i = p;
    }
    heap_set(l, i, t);
}

static void heap_down(struct loop *l, size_t i)
{
    struct loop_timer *t = l->heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= l->nheap)
            break;
        if (c + 1 < l->nheap && l->heap[c + 1]->at < l->heap[c]->at)
            c++;
        if (l->heap[c]->at >= t->at)
            break;
        heap_set(l, i, l->heap[c]);
        i = c;
    }
    heap_set(l, i, t);
}

int loop_timer_at(struct loop *l, struct loop_timer *t, int64_t at)
{
    if (loop_timer_armed(t)) {
        int64_t old = t->at;
        t->at = at;
        if (at < old)
            heap_up(l, t->slot);
        else
            heap_down(l, t->slot);
        return 0;
    }
    if (l->nheap == l->capheap) {
        size_t cap = l->capheap ? l->capheap * 2 : 64;
        struct loop_timer **h = realloc(l->heap, cap * sizeof *h);
        if (h == NULL)
            return -1;
        l->heap = h;
        l->capheap = cap;
    }
    t->at = at;
    heap_set(l, l->nheap++, t);
    heap_up(l, t->slot);
    return 0;
}

void loop_timer_stop(struct loop *l, struct loop_timer *t)
{
    if (!loop_timer_armed(t))
        return;
    size_t i = t->slot;
    t->slot = SIZE_MAX;
    l->nheap--;
    if (i == l->nheap)
        return;
    struct loop_timer *last = l->heap[l->nheap];
    heap_set(l, i, last);
    heap_up(l, i);
    heap_down(l, last->slot);
}

int64_t loop_now(const struct loop *l)
{
    return l->now;
}

void loop_stop(struct loop *l)
{
    l->stop = true;
}

int loop_turn(struct loop *l, int timeout_ms)
{
    l->now = util_mono_ms();
    if (l->nheap > 0) {
        int64_t left = l->heap[0]->at - l->now;
        if (left < 0)
            left = 0;
        if (left > 60000)
            left = 60000;
        if (timeout_ms < 0 || left < timeout_ms)
            timeout_ms = (int)left;
    }
    int n = epoll_wait(l->epfd, l->batch, LOOP_BATCH, timeout_ms);
    if (n < 0) {
        if (errno == EINTR)
            return 0;
        log_msg(LOG_LV_ERROR, "loop", strerror(errno));
        return -1;
    }
    l->now = util_mono_ms();
    l->nbatch = n;
    for (l->ibatch = 0; l->ibatch < l->nbatch; l->ibatch++) { /* the urgent ones first */
        struct loop_io *io = l->batch[l->ibatch].data.ptr;
        if (io != NULL && io->first) {
            l->batch[l->ibatch].data.ptr = NULL;
            io->fn(l, io, l->batch[l->ibatch].events);
        }
    }
    bool bulk = false;
    for (l->ibatch = 0; l->ibatch < l->nbatch; l->ibatch++) {
        struct loop_io *io = l->batch[l->ibatch].data.ptr;
        if (io != NULL && io->bulk) {
            bulk = true;
        } else if (io != NULL) {
            l->batch[l->ibatch].data.ptr = NULL; /* the bulk pass looks at bulk ones only */
            io->fn(l, io, l->batch[l->ibatch].events);
        }
    }
    /* the bulk ones, for a slice: one not run now is still ready, and the
     * next epoll_wait reports it again (after the others that are ready) */
    int64_t slice_end = util_mono_ms() + LOOP_BULK_SLICE_MS;
    for (l->ibatch = 0; bulk && l->ibatch < l->nbatch; l->ibatch++) {
        struct loop_io *io = l->batch[l->ibatch].data.ptr;
        if (io != NULL && io->bulk) {
            l->batch[l->ibatch].data.ptr = NULL;
            io->fn(l, io, l->batch[l->ibatch].events);
            if (util_mono_ms() >= slice_end)
                break;
        }
    }
    l->nbatch = l->ibatch = 0;
    /* timers due now, at most as many runs as there were timers (one that
     * a callback re-arms for `now` runs again next turn, not for ever), and
     * for at most LOOP_TIMER_SLICE_MS: thousands of held requests due at
     * once go on next turn, after a look at the sockets (a cached answer
     * waits behind a slice, not behind all of them) */
    slice_end = util_mono_ms() + LOOP_TIMER_SLICE_MS;
    for (size_t budget = l->nheap; budget > 0 && l->nheap > 0 && l->heap[0]->at <= l->now; budget--) {
        struct loop_timer *t = l->heap[0];
        loop_timer_stop(l, t);
        t->fn(l, t);
        if (util_mono_ms() >= slice_end)
            break;
    }
    return 0;
}

int loop_run(struct loop *l)
{
    l->stop = false;
    while (!l->stop)
        if (loop_turn(l, -1) != 0)
            return -1;
    return 0;
}
