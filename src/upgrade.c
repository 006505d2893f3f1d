/* upgrade.c - see upgrade.h. */
#include "upgrade.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fdstore.h"
#include "log.h"
#include "util.h"

extern char **environ;

#define UPGRADE_MSG_MAX (HANDOVER_REC_MAX + FRONT_HANDOVER_OUT_MAX + 1)
#define UPGRADE_SNDBUF (4 << 20)
#define UPGRADE_CAP_COMMIT 0x01 /* 'R' byte 8: this successor takes a batch only on 'C' */
#define UPGRADE_ADOPT_SLICE 256 /* connections a successor adopts per turn of its loop: new requests in between */

enum upgrade_state {
    UP_IDLE,        /* serving; no successor */
    UP_STARTING,    /* a successor is starting: waiting for its 'R' or 'F' */
    UP_DRAINING,    /* handed over: what is left goes in later batches, then exit */
    UP_SUCCESSOR,   /* this process is the successor: taking batches */
};

/* A record taken by the successor, until its batch ends. */
struct pending {
    int fd;
    struct handover_rec rec;
    uint8_t *out;      /* rec.out, copied */
};

struct upgrade {
    struct loop *loop;
    struct front *front;
    struct serve *serve;
    long facts;               /* successor: cached finals taken in (HANDOVER_FACT) */
    int peer_format;          /* the successor's newest record format ('R'; 1: a release before it said) */
    int peer_layout;          /* its state layout (0: not said) */
    bool peer_commit;         /* it waits for 'C' before it touches a batch (UPGRADE_CAP_COMMIT) */
    bool await_commit;        /* successor: a batch confirmed ('A'), waiting for the old one's 'C' */
    bool late_ack;            /* tests: a later batch's 'A' taken as come too late (upgrade_test_late_ack) */
    const char *prog;
    char *const *argv;
    int listen_fd;
    enum upgrade_state st;
    pid_t child;
    int chan;
    struct loop_io chan_io;
    struct loop_timer timer;
    int64_t began;          /* the handover began (UP_DRAINING) */
    long handed;            /* connections handed over so far */
    bool gave_up;           /* a later batch failed: no more batches */
    long from;              /* UP_SUCCESSOR: the old process */
    struct pending *pend;
    size_t npend, cappend;
    struct pending *adopting; /* successor: the batch given ('C'), adopted a slice per turn */
    size_t nadopting, iadopting, capadopting;
    long adopt_held, adopt_failed;
    int64_t adopt_t0;
    struct loop_timer adopt_timer;
    uint8_t buf[UPGRADE_MSG_MAX];
};

static void adopt_some(struct upgrade *u, size_t max);

/* ---- the environment ---- */

static bool env_num(const char *name, long *out)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0' || strspn(v, "0123456789") != strlen(v) || strlen(v) > 9)
        return false;
    *out = strtol(v, NULL, 10);
    return true;
}

bool upgrade_env_take(struct upgrade_env *e)
{
    long chan, lfd, from;
    bool ok = env_num("KEMBALI_UPGRADE_FD", &chan) && env_num("KEMBALI_UPGRADE_LISTEN", &lfd) &&
              env_num("KEMBALI_UPGRADE_FROM", &from) && fcntl((int)chan, F_GETFD) >= 0 &&
              fcntl((int)lfd, F_GETFD) >= 0;
    unsetenv("KEMBALI_UPGRADE_FD");
    unsetenv("KEMBALI_UPGRADE_LISTEN");
    unsetenv("KEMBALI_UPGRADE_FROM");
    if (!ok)
        return false;
    e->chan = (int)chan;
    e->listen_fd = (int)lfd;
    e->from = from;
    fcntl(e->chan, F_SETFD, FD_CLOEXEC);
    fcntl(e->listen_fd, F_SETFD, FD_CLOEXEC);
    return true;
}

/* ---- messages ---- */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Send one message (with fd attached when fd >= 0), waiting for room
 * until `until` (monotonic ms; 0: do not wait). 0, or -1 with errno. */
static int msg_send(int chan, const void *b, size_t n, int fd, int64_t until)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    for (;;) {
        struct iovec iov = {(void *)b, n};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
        if (fd >= 0) {
            memset(&ctl, 0, sizeof ctl);
            m.msg_control = ctl.b;
            m.msg_controllen = sizeof ctl.b;
            struct cmsghdr *c = CMSG_FIRSTHDR(&m);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(c), &fd, sizeof fd);
        }
        ssize_t w = sendmsg(chan, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w == (ssize_t)n)
            return 0;
        if (w >= 0) {
            errno = EMSGSIZE;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN || until == 0)
            return -1;
        int64_t left = until - util_mono_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = chan, .events = POLLOUT};
        poll(&p, 1, (int)left);
    }
}

/* Receive one message into b (cap bytes) and the descriptor with it (*fd,
 * -1 when none). Returns its length, 0 when the other side is gone, -1
 * with errno (EAGAIN: nothing now). */
static ssize_t msg_recv(int chan, uint8_t *b, size_t cap, int *fd)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int) * 4)];
    } ctl;
    struct iovec iov = {b, cap};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
    *fd = -1;
    ssize_t r;
    do
        r = recvmsg(chan, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int got;
            memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
            if (*fd < 0)
                *fd = got;
            else
                close(got); /* one per message: never more */
        }
    }
    if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) && r > 0) {
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        errno = EMSGSIZE;
        return -1;
    }
    return r;
}

/* Wait for one message until `until`; as msg_recv, -1 with ETIMEDOUT. */
static ssize_t msg_wait(int chan, uint8_t *b, size_t cap, int *fd, int64_t until)
{
    for (;;) {
        ssize_t r = msg_recv(chan, b, cap, fd);
        if (r >= 0 || errno != EAGAIN)
            return r;
        int64_t left = until - util_mono_ms();
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd p = {.fd = chan, .events = POLLIN};
        poll(&p, 1, (int)left);
    }
}

void upgrade_refuse(int chan, const char *why)
{
    char b[4096];
    b[0] = 'F';
    size_t n = strlen(why);
    if (n > sizeof b - 1)
        n = sizeof b - 1;
    memcpy(b + 1, why, n);
    msg_send(chan, b, n + 1, -1, util_mono_ms() + 1000);
}

/* ---- the old process ---- */

static void upgrade_log(enum log_level level, const struct upgrade *u, const char *msg, const char *why)
{
    struct log_line l;
    log_begin(&l, level, "upgrade");
    if (u->child > 0)
        log_int(&l, "new_pid", u->child);
    log_str(&l, "prog", u->prog);
    log_str(&l, "msg", msg);
    if (why != NULL && *why)
        log_str(&l, "errors", why);
    log_end(&l);
}

/* The successor failed (or is being given up): kill it, wait until it is
 * gone (so it can touch nothing it was sent), close the channel. */
static void child_end(struct upgrade *u, bool kill_it)
{
    if (u->chan >= 0) {
        loop_io_set(u->loop, &u->chan_io, 0);
        close(u->chan);
        u->chan = -1;
    }
    loop_timer_stop(u->loop, &u->timer);
    if (u->child <= 0)
        return;
    if (kill_it)
        kill(u->child, SIGKILL);
    /* it exits by itself after a refusal, at once after SIGKILL */
    for (int64_t until = util_mono_ms() + 2000; util_mono_ms() < until;) {
        if (waitpid(u->child, NULL, WNOHANG) != 0)
            break;
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (!kill_it && util_mono_ms() + 1000 > until) { /* a refusal that does not exit: end it */
            kill(u->child, SIGKILL);
            kill_it = true;
        }
    }
    u->child = 0;
}

/* front_handover's emit: one 'H' message with the connection. */
static int emit(void *ctx, int fd, const struct handover_rec *rec)
{
    struct upgrade *u = ctx;
    u->buf[0] = 'H';
    size_t n = handover_encode_as(rec, u->peer_format, u->buf + 1, sizeof u->buf - 1);
    if (n == 0)
        return -1;
    return msg_send(u->chan, u->buf, n + 1, fd, u->began + UPGRADE_EXIT_MS);
}

/* serve_facts' emit: one 'K' message, no connection. */
static int emit_fact(void *ctx, const struct handover_rec *rec)
{
    struct upgrade *u = ctx;
    u->buf[0] = 'K';
    size_t n = handover_encode_as(rec, u->peer_format, u->buf + 1, sizeof u->buf - 1);
    if (n == 0)
        return -1;
    return msg_send(u->chan, u->buf, n + 1, -1, u->began + UPGRADE_ACK_MS);
}

/* One batch: everything that can go now, then 'E', then the successor's
 * 'A'. Returns the connections handed over (0: none could go), or -1
 * when the successor did not take them (they are ours again). */
static long batch(struct upgrade *u, char *why, size_t whylen)
{
    long n = front_handover(u->front, emit, u);
    if (n == 0)
        return 0;
    /* 'E', u32 count; with a sixth byte (1) to a successor that waits
     * for 'C': the batch is its only once this process has seen its 'A'
     * and said so, so a late 'A' never leaves a connection with both */
    uint8_t end[6] = {'E', 0, 0, 0, 0, 1};
    put_u32(end + 1, (uint32_t)(n < 0 ? 0 : n));
    int fd = -1;
    ssize_t r = -1;
    if (n > 0 && msg_send(u->chan, end, u->peer_commit ? 6 : 5, -1, util_mono_ms() + UPGRADE_ACK_MS) == 0)
        r = msg_wait(u->chan, u->buf, sizeof u->buf, &fd, util_mono_ms() + UPGRADE_ACK_MS);
    if (fd >= 0) /* the successor's answer carries none: never keep one */
        close(fd);
    bool acked = n > 0 && r == 5 && u->buf[0] == 'A' && get_u32(u->buf + 1) == (uint32_t)n;
    if (acked && u->late_ack && u->st == UP_DRAINING) { /* tests: a later batch's, as if just after the wait */
        acked = false;
        r = -1;
        errno = ETIMEDOUT;
    }
    uint8_t commit = 'C';
    if (acked && (!u->peer_commit || msg_send(u->chan, &commit, 1, -1, util_mono_ms() + UPGRADE_ACK_MS) == 0)) {
        front_handover_commit(u->front);
        return n;
    }
    bool closed = r == 0 || (r < 0 && (errno == EPIPE || errno == ECONNRESET)) ||
                  (acked && (errno == EPIPE || errno == ECONNRESET));
    snprintf(why, whylen, "%s", n < 0 ? "a connection could not be sent"
                                : acked ? "the new process's confirmation could not be answered"
                                : r == 0 ? "the new process closed its end"
                                : r < 0 ? strerror(errno) : "the new process answered something else");
    /* It must not take them after we do: a new process that has nothing
     * yet is killed; one that serves earlier batches has its channel shut,
     * so that it drops the batch it has not confirmed (it confirms before
     * it touches any). */
    if (u->st == UP_STARTING)
        child_end(u, true);
    else if (!closed)
        shutdown(u->chan, SHUT_RDWR);
    if (n > 0)
        front_handover_rollback(u->front);
    return -1;
}

/* The successor accepts: hand over the first batch. */
static void handover_begin(struct upgrade *u)
{
    u->began = util_mono_ms();
    front_pause_accepting(u->front); /* the successor accepts on the same socket */
    serve_handing(u->serve, true);   /* no read starts here from now on */
    /* the cached finals, for a successor of another layout (its own state
     * file): facts, taken as they come, whatever becomes of the batch */
    long facts = u->peer_format >= 2 && u->peer_layout != serve_layout(u->serve) ? serve_facts(u->serve, emit_fact, u)
                                                                                 : 0;
    char why[256];
    long n = batch(u, why, sizeof why);
    if (n < 0) {
        serve_handing(u->serve, false);
        front_resume_accepting(u->front);
        upgrade_log(LOG_LV_ERROR, u, "the new process did not take the requests in hand; the old one keeps serving",
                    why);
        u->st = UP_IDLE;
        return;
    }
    u->handed = n;
    u->st = UP_DRAINING;
    char mainpid[48];
    snprintf(mainpid, sizeof mainpid, "MAINPID=%ld", (long)u->child);
    fdstore_notify(mainpid); /* under systemd: the new process is the service's main one now */
    struct log_line l;
    log_begin(&l, LOG_LV_INFO, "upgrade");
    log_int(&l, "new_pid", u->child);
    log_int(&l, "handed", n);
    log_int(&l, "facts", facts);
    log_int(&l, "ms", (long long)(util_mono_ms() - u->began));
    log_str(&l, "msg", "handed over to the new process; this one exits once its reads have ended");
    log_end(&l);
}

/* The channel while the successor starts: 'R', 'F', or its end. */
static void on_chan_starting(struct loop *l, struct loop_io *io, uint32_t events)
{
    struct upgrade *u = io->data;
    (void)l, (void)events;
    int fd;
    ssize_t r = msg_recv(u->chan, u->buf, sizeof u->buf - 1, &fd);
    if (fd >= 0)
        close(fd);
    if (r < 0 && errno == EAGAIN)
        return;
    if (r >= 5 && u->buf[0] == 'R') {
        /* since format 2: u8 its newest record format, u16 its state layout */
        u->peer_format = r >= 8 && u->buf[5] >= HANDOVER_FORMAT ? HANDOVER_FORMAT : 1;
        u->peer_layout = r >= 8 ? (int)(u->buf[6] | (unsigned)u->buf[7] << 8) : 0;
        u->peer_commit = r >= 9 && (u->buf[8] & UPGRADE_CAP_COMMIT); /* a release before waits for no 'C' */
        loop_io_set(u->loop, &u->chan_io, 0); /* from here on, read in turn with what we send */
        loop_timer_stop(u->loop, &u->timer);
        handover_begin(u);
        return;
    }
    char why[4096];
    if (r > 0 && u->buf[0] == 'F') {
        u->buf[r] = '\0';
        util_copy(why, sizeof why, (const char *)u->buf + 1);
    } else {
        snprintf(why, sizeof why, "%s", r == 0 ? "it exited before it was ready" : "it said something else");
    }
    child_end(u, r != 0 && !(r > 0 && u->buf[0] == 'F'));
    upgrade_log(LOG_LV_ERROR, u, "the new process refused to start; the old one keeps serving", why);
    u->st = UP_IDLE;
}

static void on_ready_timeout(struct loop *l, struct loop_timer *t)
{
    struct upgrade *u = t->data;
    (void)l;
    child_end(u, true);
    upgrade_log(LOG_LV_ERROR, u, "the new process was not ready in time; it was killed and the old one keeps serving",
                NULL);
    u->st = UP_IDLE;
}

/* The environment of the successor: ours, less what named our own start
 * (systemd's LISTEN_*, an earlier upgrade's), plus the upgrade's. NULL
 * when out of memory. */
static char **child_env(int chan, int listen_fd)
{
    size_t n = 0;
    while (environ[n] != NULL)
        n++;
    char **env = calloc(n + 4, sizeof *env);
    if (env == NULL)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "LISTEN_", 7) != 0 && strncmp(environ[i], "KEMBALI_UPGRADE_", 16) != 0)
            env[k++] = environ[i];
    char *a = malloc(48), *b = malloc(48), *c = malloc(48);
    if (a == NULL || b == NULL || c == NULL) {
        free(a), free(b), free(c), free(env);
        return NULL;
    }
    snprintf(a, 48, "KEMBALI_UPGRADE_FD=%d", chan);
    snprintf(b, 48, "KEMBALI_UPGRADE_LISTEN=%d", listen_fd);
    snprintf(c, 48, "KEMBALI_UPGRADE_FROM=%ld", (long)getpid());
    env[k++] = a;
    env[k++] = b;
    env[k++] = c;
    env[k] = NULL;
    return env;
}

static void child_env_free(char **env)
{
    if (env == NULL)
        return;
    size_t k = 0;
    while (env[k] != NULL)
        k++;
    for (size_t i = k - 3; i < k; i++)
        free(env[i]);
    free(env);
}

int upgrade_start(struct upgrade *u, char *err, size_t errlen)
{
    if (u->st != UP_IDLE) {
        snprintf(err, errlen, "an upgrade is already under way");
        return -1;
    }
    if (u->iadopting < u->nadopting)
        adopt_some(u, SIZE_MAX); /* what this process took over last time, all of it, before it hands over */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(err, errlen, "socketpair: %s", strerror(errno));
        return -1;
    }
    int big = UPGRADE_SNDBUF;
    if (setsockopt(sv[0], SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big) != 0)
        setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    if (setsockopt(sv[1], SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) != 0)
        setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    char **env = child_env(sv[1], u->listen_fd);
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    /* dup2 onto itself clears close-on-exec in the child only */
    posix_spawn_file_actions_adddup2(&fa, sv[1], sv[1]);
    posix_spawn_file_actions_adddup2(&fa, u->listen_fd, u->listen_fd);
    sigset_t none, def;
    sigemptyset(&none);
    sigemptyset(&def);
    int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGPIPE};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaddset(&def, sigs[i]);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &def);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid = 0;
    int e = env == NULL ? ENOMEM : posix_spawn(&pid, u->prog, &fa, &at, u->argv, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    child_env_free(env);
    close(sv[1]);
    if (e != 0) {
        close(sv[0]);
        snprintf(err, errlen, "cannot start %s: %s", u->prog, strerror(e));
        return -1;
    }
    u->child = pid;
    u->chan = sv[0];
    u->st = UP_STARTING;
    loop_io_init(&u->chan_io, u->chan, on_chan_starting, u);
    loop_timer_init(&u->timer, on_ready_timeout, u);
    if (loop_io_set(u->loop, &u->chan_io, EPOLLIN) != 0 ||
        loop_timer_at(u->loop, &u->timer, util_mono_ms() + UPGRADE_READY_MS) != 0) {
        snprintf(err, errlen, "epoll: %s", strerror(errno));
        child_end(u, true);
        u->st = UP_IDLE;
        return -1;
    }
    upgrade_log(LOG_LV_INFO, u, "starting the new process", NULL);
    return 0;
}

bool upgrade_tick(struct upgrade *u)
{
    if (u == NULL || u->st != UP_DRAINING)
        return false;
    int64_t now = util_mono_ms();
    if (now - u->began >= UPGRADE_EXIT_MS)
        return true;
    if (u->chan >= 0 && !u->gave_up) {
        char why[256];
        long n = batch(u, why, sizeof why);
        if (n > 0) {
            u->handed += n;
        } else if (n < 0) {
            /* those stay here, answered with what is known (no read starts here) */
            serve_handing_quiet(u->serve, false, true); /* the successor reads; this one never again */
            u->gave_up = true;
            upgrade_log(LOG_LV_ERROR, u, "the new process did not take a later batch; answering those here", why);
        }
    }
    return front_connections(u->front) == 0 && serve_reading(u->serve) == 0;
}

pid_t upgrade_successor_pid(const struct upgrade *u)
{
    return u != NULL && u->st == UP_DRAINING ? u->child : 0;
}

/* ---- the new process ---- */

static void pending_clear(struct upgrade *u, bool close_fds)
{
    for (size_t i = 0; i < u->npend; i++) {
        if (close_fds)
            close(u->pend[i].fd); /* the old process still has it: never a shutdown */
        free(u->pend[i].out);
    }
    u->npend = 0;
}

static void successor_end(struct upgrade *u)
{
    loop_io_set(u->loop, &u->chan_io, 0);
    close(u->chan);
    u->chan = -1;
    if (u->await_commit)
        log_msg(LOG_LV_ERROR, "upgrade", "the old process did not say a confirmed batch is ours; it keeps those requests");
    u->await_commit = false;
    pending_clear(u, true);
    u->st = UP_IDLE; /* the old process is done with us: this one may be upgraded in turn */
}

/* A batch ended: confirm it ('A'). Returns 0, or -1 when it cannot be
 * (the channel is ended). */
static int successor_confirm(struct upgrade *u, uint32_t count)
{
    uint8_t ack[5] = {'A'};
    put_u32(ack + 1, (uint32_t)u->npend);
    if (count != u->npend || msg_send(u->chan, ack, sizeof ack, -1, util_mono_ms() + UPGRADE_ACK_MS) != 0) {
        log_msg(LOG_LV_ERROR, "upgrade", "a batch from the old process was incomplete or could not be confirmed; "
                                    "it keeps those requests");
        successor_end(u);
        return -1;
    }
    return 0;
}

/* Adopt up to `max` connections of the batch being adopted; the rest on
 * a later turn of the loop (new requests are served in between: 10,000
 * adopted at once kept the loop for 0.2 s). Logs the batch once done. */
static void adopt_some(struct upgrade *u, size_t max)
{
    size_t end = u->nadopting - u->iadopting > max ? u->iadopting + max : u->nadopting;
    for (; u->iadopting < end; u->iadopting++) {
        struct pending *p = &u->adopting[u->iadopting];
        struct front_req *fr;
        char err[128];
        if (front_adopt(u->front, p->fd, &p->rec, &fr, err, sizeof err) != 0)
            u->adopt_failed++;
        else if (fr != NULL && serve_adopt(u->serve, fr, &p->rec) == 0)
            u->adopt_held++;
        free(p->out);
        p->out = NULL;
    }
    if (u->iadopting < u->nadopting) {
        if (loop_timer_at(u->loop, &u->adopt_timer, util_mono_ms()) == 0)
            return;
        adopt_some(u, SIZE_MAX); /* no timer: the rest now */
        return;
    }
    struct log_line l;
    log_begin(&l, LOG_LV_INFO, "handover");
    log_int(&l, "from", u->from);
    log_int(&l, "connections", (long long)u->nadopting);
    log_int(&l, "held", u->adopt_held);
    if (u->facts > 0)
        log_int(&l, "facts", u->facts);
    if (u->adopt_failed > 0)
        log_int(&l, "failed", u->adopt_failed);
    log_int(&l, "ms", (long long)(util_mono_ms() - u->adopt_t0));
    log_end(&l);
    u->nadopting = u->iadopting = 0;
}

static void on_adopt_timer(struct loop *l, struct loop_timer *t)
{
    (void)l;
    adopt_some(t->data, UPGRADE_ADOPT_SLICE);
}

/* A confirmed batch is ours (the old one's 'C', or an old one of a
 * release before, which sends none): it is adopted, a slice per turn. */
static void successor_adopt(struct upgrade *u)
{
    if (u->iadopting < u->nadopting)
        adopt_some(u, SIZE_MAX); /* the batch before, whole first (later batches are small) */
    struct pending *spare = u->adopting;
    size_t spare_cap = u->capadopting;
    u->adopting = u->pend;
    u->capadopting = u->cappend;
    u->nadopting = u->npend;
    u->iadopting = 0;
    u->pend = spare;
    u->cappend = spare_cap;
    u->npend = 0;
    u->adopt_t0 = util_mono_ms();
    u->adopt_held = u->adopt_failed = 0;
    adopt_some(u, UPGRADE_ADOPT_SLICE);
}

static void on_chan_successor(struct loop *l, struct loop_io *io, uint32_t events)
{
    struct upgrade *u = io->data;
    (void)l, (void)events;
    for (int i = 0; i < 256 && u->chan >= 0; i++) {
        int fd;
        ssize_t r = msg_recv(u->chan, u->buf, sizeof u->buf, &fd);
        if (r < 0 && errno == EAGAIN)
            return;
        if (r <= 0) { /* the old process is done (or gone): nothing more comes */
            if (fd >= 0)
                close(fd);
            successor_end(u);
            return;
        }
        if (u->buf[0] == 'E' && (r == 5 || (r == 6 && u->buf[5] == 1)) && fd < 0 && !u->await_commit) {
            if (successor_confirm(u, get_u32(u->buf + 1)) != 0)
                return;
            if (r == 6) /* touched only once the old process says so */
                u->await_commit = true;
            else
                successor_adopt(u);
            continue;
        }
        if (u->buf[0] == 'C' && r == 1 && fd < 0 && u->await_commit) {
            u->await_commit = false;
            successor_adopt(u);
            continue;
        }
        char why[128];
        struct handover_rec rec;
        if (u->buf[0] == 'K' && fd < 0 && handover_decode(u->buf + 1, (size_t)r - 1, &rec, why, sizeof why) == 0 &&
            rec.kind == HANDOVER_FACT) {
            u->facts += serve_take_fact(u->serve, &rec);
            continue;
        }
        if (u->buf[0] != 'H' || fd < 0 || u->await_commit || handover_decode(u->buf + 1, (size_t)r - 1, &rec, why, sizeof why) != 0 ||
            rec.kind == HANDOVER_FACT) {
            if (fd >= 0)
                close(fd);
            log_msg(LOG_LV_ERROR, "upgrade", "a record from the old process could not be read; its batch is refused");
            successor_end(u);
            return;
        }
        if (u->npend == u->cappend) {
            size_t cap = u->cappend ? u->cappend * 2 : 256;
            struct pending *np = realloc(u->pend, cap * sizeof *np);
            if (np == NULL) {
                close(fd);
                successor_end(u);
                return;
            }
            u->pend = np;
            u->cappend = cap;
        }
        struct pending *p = &u->pend[u->npend];
        p->fd = fd;
        p->rec = rec;
        p->out = NULL;
        if (rec.out_len > 0) {
            p->out = malloc(rec.out_len);
            if (p->out == NULL) {
                close(fd);
                successor_end(u);
                return;
            }
            memcpy(p->out, rec.out, rec.out_len);
        }
        p->rec.out = p->out;
        u->npend++;
    }
}

int upgrade_successor(struct upgrade *u, const struct upgrade_env *e, char *err, size_t errlen)
{
    uint8_t ready[9] = {'R'};
    put_u32(ready + 1, (uint32_t)getpid());
    ready[5] = HANDOVER_FORMAT;
    int layout = serve_layout(u->serve);
    ready[6] = (uint8_t)layout;
    ready[7] = (uint8_t)(layout >> 8);
    ready[8] = UPGRADE_CAP_COMMIT;
    u->chan = e->chan;
    u->from = e->from;
    u->st = UP_SUCCESSOR;
    loop_io_init(&u->chan_io, u->chan, on_chan_successor, u);
    fcntl(u->chan, F_SETFL, fcntl(u->chan, F_GETFL) | O_NONBLOCK);
    if (loop_io_set(u->loop, &u->chan_io, EPOLLIN) != 0) {
        snprintf(err, errlen, "epoll: %s", strerror(errno));
        return -1;
    }
    if (msg_send(u->chan, ready, sizeof ready, -1, util_mono_ms() + 1000) != 0) {
        snprintf(err, errlen, "the old process is gone (%s)", strerror(errno));
        successor_end(u);
        return -1;
    }
    return 0;
}

struct upgrade *upgrade_new(struct loop *l, struct front *f, struct serve *s, const char *prog, char *const *argv,
                            int listen_fd)
{
    struct upgrade *u = calloc(1, sizeof *u);
    if (u == NULL)
        return NULL;
    u->loop = l;
    u->front = f;
    u->serve = s;
    u->prog = prog;
    u->argv = argv;
    u->listen_fd = listen_fd;
    u->chan = -1;
    loop_timer_init(&u->timer, on_ready_timeout, u);
    loop_timer_init(&u->adopt_timer, on_adopt_timer, u);
    return u;
}

void upgrade_test_late_ack(struct upgrade *u)
{
    u->late_ack = true;
}

void upgrade_free(struct upgrade *u)
{
    if (u == NULL)
        return;
    if (u->st == UP_STARTING)
        child_end(u, true);
    else if (u->chan >= 0) {
        loop_io_set(u->loop, &u->chan_io, 0);
        close(u->chan);
    }
    loop_timer_stop(u->loop, &u->timer);
    pending_clear(u, true);
    free(u->pend);
    loop_timer_stop(u->loop, &u->adopt_timer);
    for (size_t i = u->iadopting; i < u->nadopting; i++) { /* given, never adopted: ours to close */
        close(u->adopting[i].fd);
        free(u->adopting[i].out);
    }
    free(u->adopting);
    free(u);
}
