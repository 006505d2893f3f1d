/* state_redis_conn.c - the Redis store's connections (see state_redis.c):
 * hiredis' hooks on our loop, sending operations, joining and leaving.
 * The Sentinel client is state_redis_sentinel.c. */
#include "state_redis_private.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/time.h>

#include "log.h"
#include "state_redis_check.h"
#include "util.h"


/* ---- hiredis' hooks on our loop ---- */

static void rc_set(struct rconn *rc, uint32_t add, uint32_t del)
{
    uint32_t ev = (rc->io.events | add) & ~del;
    if (ev != rc->io.events && loop_io_set(rc->loop, &rc->io, ev) != 0 && rc->r != NULL)
        state_redis_went_down(rc->r, "epoll failed");
}

static void ev_add_read(void *p) { rc_set(p, EPOLLIN, 0); }
static void ev_del_read(void *p) { rc_set(p, 0, EPOLLIN); }
static void ev_add_write(void *p) { rc_set(p, EPOLLOUT, 0); }
static void ev_del_write(void *p) { rc_set(p, 0, EPOLLOUT); }

/* hiredis frees the context: this is the last we hear of it. */
static void ev_cleanup(void *p)
{
    struct rconn *rc = p;
    loop_io_set(rc->loop, &rc->io, 0);
    rc->ac->data = NULL;
    struct state_redis *r = rc->r;
    if (r != NULL && rc->sentinel) {
        if (r->sconn == rc)
            r->sconn = NULL;
        if (!rc->freeing)
            state_redis_sentinel_failed(r, rc->ac->errstr[0] ? rc->ac->errstr : "connection closed");
    } else if (r != NULL) {
        if (r->main == rc)
            r->main = NULL;
        if (r->sub == rc)
            r->sub = NULL;
        if (!rc->freeing)
            state_redis_went_down(r, rc->ac->errstr[0] ? rc->ac->errstr : "connection closed");
    }
    if (rc->busy > 0)
        rc->dead = true;
    else
        free(rc);
}

/* The waiting operations whose bytes go out now (on r->main, about to be
 * written) start their 100 ms here: a turn of the loop that ran long
 * between an operation's send and the write (a busy process) is this
 * process's slowness, not Redis's. Written ones stay as they were, so a
 * Redis that reads nothing (its socket full) is still slow from here. */
static void ops_go_out(struct rconn *rc)
{
    struct state_redis *r = rc->r;
    if (r == NULL || r->main != rc || r->tail == NULL || r->tail->out)
        return;
    int64_t now = util_mono_ms();
    struct state_redis_op *op = r->tail;
    for (; op != NULL && !op->out; op = op->prev) {
        op->out = true;
        op->sent = now;
    }
    if (op == NULL) /* the head among them */
        state_redis_arm_slow(r);
}

static void on_rc_io(struct loop *l, struct loop_io *io, uint32_t events)
{
    struct rconn *rc = io->data;
    (void)l;
    rc->busy++;
    if (events & EPOLLOUT)
        state_redis_rc_write(rc); /* busy: it frees nothing here */
    if (!rc->dead && (events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
        redisAsyncHandleRead(rc->ac);
    if (--rc->busy == 0 && rc->dead)
        free(rc);
}

/* A connection to ip:port (NULL: cfg's Unix socket) for r; hiredis gets
 * an address, never a name (it would resolve it on the loop). NULL with
 * the reason in r->why. */
struct rconn *state_redis_rc_open_at(struct state_redis *r, const char *ip, int port, bool sub, bool sentinel)
{
    struct rconn *rc = calloc(1, sizeof *rc);
    if (rc == NULL) {
        util_copy(r->why, sizeof r->why, "out of memory");
        return NULL;
    }
    redisAsyncContext *ac = ip == NULL ? redisAsyncConnectUnix(r->cfg.path) : redisAsyncConnect(ip, port);
    if (ac == NULL || ac->err) {
        snprintf(r->why, sizeof r->why, "cannot connect: %s", ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        free(rc);
        return NULL;
    }
    rc->r = r;
    rc->ac = ac;
    rc->loop = r->loop;
    rc->sub = sub;
    rc->sentinel = sentinel;
    ac->data = rc;
    loop_io_init(&rc->io, ac->c.fd, on_rc_io, rc);
    ac->ev.data = rc;
    ac->ev.addRead = ev_add_read;
    ac->ev.delRead = ev_del_read;
    ac->ev.addWrite = ev_add_write;
    ac->ev.delWrite = ev_del_write;
    ac->ev.cleanup = ev_cleanup;
    return rc;
}

static struct rconn *rc_open(struct state_redis *r, bool sub)
{
    return state_redis_rc_open_at(r, r->cfg.unix_socket ? NULL : r->ip, r->port, sub, false);
}

/* Free rc's connection (never from inside a hiredis callback: see top). */
void state_redis_rc_close(struct rconn *rc)
{
    if (rc == NULL || rc->freeing)
        return;
    rc->freeing = true;
    redisAsyncFree(rc->ac); /* its operations are answered with NULL, then ev_cleanup */
}

/* ---- operations ---- */

void state_redis_arm_slow(struct state_redis *r)
{
    if (r->head == NULL)
        loop_timer_stop(r->loop, &r->slow_timer);
    else
        loop_timer_at(r->loop, &r->slow_timer, r->head->sent + STATE_REDIS_SLOW_MS);
}

void state_redis_op_unqueue(struct state_redis_op *op)
{
    struct state_redis *r = op->r;
    if (!op->queued)
        return;
    op->queued = false;
    bool was_head = r->head == op;
    if (op->prev)
        op->prev->next = op->next;
    else
        r->head = op->next;
    if (op->next)
        op->next->prev = op->prev;
    else
        r->tail = op->prev;
    op->prev = op->next = NULL;
    if (was_head)
        state_redis_arm_slow(r);
}


/* Send argv on rc for op (queued for the slow timer unless a join step).
 * false when hiredis refused it (op is freed then). */
bool state_redis_op_send(struct rconn *rc, struct state_redis_op *op, int argc, const char **argv, const size_t *lens)
{
    struct state_redis *r = op->r;
    op->sent = util_mono_ms();
    if (rc == NULL || rc->freeing ||
        redisAsyncCommandArgv(rc->ac, state_redis_on_reply, op, argc, argv, lens) != REDIS_OK) {
        free(op);
        return false;
    }
    if (op->kind == OP_PING)
        r->m.pings++;
    else
        r->m.round_trips++;
    if (op->kind == OP_CLAIM || op->kind == OP_TELL || op->kind == OP_HELD || op->kind == OP_FIRE ||
        op->kind == OP_PING) {
        op->queued = true;
        op->prev = r->tail;
        if (r->tail)
            r->tail->next = op;
        else
            r->head = op;
        r->tail = op;
        if (r->head == op)
            state_redis_arm_slow(r);
    }
    /* a read's end goes out now, before the answer it allows: a request
     * that answer leads to (a notify on another host) then finds it in
     * Redis, as it would find it in the mapped file (not from inside
     * hiredis' own handlers: their write follows) */
    if (op->kind == OP_FIRE && rc->busy == 0)
        state_redis_rc_write(rc);
    return true;
}

void state_redis_rc_write(struct rconn *rc)
{
    rc->busy++;
    ops_go_out(rc);
    redisAsyncHandleWrite(rc->ac);
    if (--rc->busy == 0 && rc->dead)
        free(rc);
}

struct state_redis_op *state_redis_op_new(struct state_redis *r, enum op_kind kind)
{
    struct state_redis_op *op = calloc(1, sizeof *op);
    if (op != NULL) {
        op->r = r;
        op->kind = kind;
    }
    return op;
}

static bool send_join(struct state_redis *r, struct rconn *rc, enum op_kind kind, int script, int argc,
                      const char **argv)
{
    size_t lens[8];
    if (argc > 8)
        return false;
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    struct state_redis_op *op = state_redis_op_new(r, kind);
    if (op == NULL)
        return false;
    op->script = script;
    if (!state_redis_op_send(rc, op, argc, argv, lens))
        return false;
    r->join_left++;
    return true;
}

/* ---- joining and leaving ---- */

void state_redis_teardown(struct state_redis *r)
{
    struct rconn *m = r->main, *s = r->sub;
    r->main = r->sub = NULL;
    if (m)
        m->r = NULL;
    if (s)
        s->r = NULL;
    state_redis_rc_close(m); /* operations answer DOWN from on_reply */
    state_redis_rc_close(s);
}

static void on_teardown_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    if (r->phase != PH_UP)
        state_redis_teardown(r);
}

/* The Redis used or tried, into a log line: redis= and port= (with
 * Sentinels: the master's address, its name and the Sentinel that named
 * it; before any, the master's name alone). */
void state_redis_log_where(struct state_redis *r, struct log_line *l)
{
    if (r->cfg.sentinel) {
        if (r->snamed >= 0) {
            log_str(l, "redis", r->ip);
            log_int(l, "port", r->port);
        }
        log_str(l, "master", r->cfg.master);
        if (r->snamed >= 0) {
            char sn[300];
            snprintf(sn, sizeof sn, "%s:%d", r->cfg.sentinels[r->snamed].host, r->cfg.sentinels[r->snamed].port);
            log_str(l, "sentinel", sn);
        }
        return;
    }
    log_str(l, "redis", r->cfg.unix_socket ? r->cfg.path : r->cfg.host);
    if (!r->cfg.unix_socket)
        log_int(l, "port", r->cfg.port);
}

static void log_failure(struct state_redis *r, const char *event, const char *why)
{
    struct log_line l;
    log_begin(&l, LOG_LV_WARN, event);
    state_redis_log_where(r, &l);
    log_str(&l, "why", why);
    log_str(&l, "msg", "reads are decided by this host's own state with its share of each key's budget "
                       "until Redis answers again");
    log_end(&l);
}

/* Something failed: this process stops using Redis (at once), closes its
 * connections (soon, outside hiredis' callbacks) and tries again later.
 * Safe from anywhere, any number of times. */
void state_redis_went_down(struct state_redis *r, const char *why)
{
    if (r->phase == PH_UP) {
        r->m.leaves++;
        log_failure(r, "redis_left", why);
    } else if (r->phase == PH_JOINING && !r->unreachable_logged && !r->ever_up) {
        r->unreachable_logged = true;
        log_failure(r, "redis_unreachable", why);
    }
    if (r->phase != PH_DOWN) {
        r->phase = PH_DOWN;
        r->m.up = 0;
        loop_timer_stop(r->loop, &r->join_timer);
        loop_timer_stop(r->loop, &r->ping_timer);
        loop_timer_stop(r->loop, &r->scheck_timer);
        loop_timer_at(r->loop, &r->teardown_timer, loop_now(r->loop));
        if (!r->stopping)
            loop_timer_at(r->loop, &r->retry_timer, util_mono_ms() + STATE_REDIS_RETRY_MS);
    }
}


static void joined(struct state_redis *r)
{
    r->phase = PH_UP;
    r->m.up = 1;
    r->m.joins++;
    loop_timer_stop(r->loop, &r->join_timer);
    r->not_master[0] = '\0';
    struct log_line l;
    if (r->cfg.sentinel && (strcmp(r->master_ip, r->ip) != 0 || r->master_port != r->port)) {
        /* a new master (or the first): the metrics say which */
        if (r->master_ip[0] != '\0') {
            char from[INET6_ADDRSTRLEN + 8];
            snprintf(from, sizeof from, "%s:%d", r->master_ip, r->master_port);
            log_begin(&l, LOG_LV_INFO, "redis_master_changed");
            state_redis_log_where(r, &l);
            log_str(&l, "from", from);
            log_end(&l);
            r->m.master_changes++;
        }
        util_copy(r->master_ip, sizeof r->master_ip, r->ip);
        r->master_port = r->port;
        snprintf(r->m.master, sizeof r->m.master, "%s:%d", r->ip, r->port);
    }
    log_begin(&l, LOG_LV_INFO, r->ever_up ? "redis_rejoined" : "redis_joined");
    state_redis_log_where(r, &l);
    if (r->nwb > 0)
        log_int(&l, "written_back", (long long)r->nwb);
    log_end(&l);
    if (r->cfg.sentinel)
        loop_timer_at(r->loop, &r->scheck_timer, util_mono_ms() + STATE_REDIS_SENTINEL_CHECK_MS);
    r->ever_up = true;
    r->unreachable_logged = false;
    loop_timer_at(r->loop, &r->ping_timer, util_mono_ms() + STATE_REDIS_PING_MS);
    /* before anything is asked on this connection: the reads this host
     * made while away (or that an emptied Redis forgot) join the count */
    if (r->on_seed != NULL)
        r->on_seed(r->ctx, NULL);
    state_redis_writeback_flush(r);
}

/* While up: with nothing waiting (whose age the slow timer watches), a PING,
 * so that a Redis that stopped answering is noticed within
 * STATE_REDIS_PING_MS + STATE_REDIS_SLOW_MS by a process that asks nothing
 * of it (its held requests may wait on a read another host made). */
static void on_ping_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    if (r->phase != PH_UP || r->stopping)
        return;
    if (r->head == NULL) {
        const char *argv[] = {"PING"};
        const size_t lens[] = {4};
        struct state_redis_op *op = state_redis_op_new(r, OP_PING);
        if (op == NULL || !state_redis_op_send(r->main, op, 1, argv, lens)) {
            state_redis_went_down(r, "cannot send a PING");
            return;
        }
    }
    loop_timer_at(r->loop, &r->ping_timer, util_mono_ms() + STATE_REDIS_PING_MS);
}

void state_redis_join_step_done(struct state_redis *r)
{
    if (--r->join_left == 0 && r->phase == PH_JOINING)
        joined(r);
}

static void on_join_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    state_redis_went_down(r, "no answer within 1 s");
}

static void on_retry_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    if (r->phase == PH_DOWN && !r->stopping) {
        state_redis_teardown(r); /* what is left of the last attempt */
        state_redis_join(r);
    }
}

/* The first address of `host` as text into ip (INET6_ADDRSTRLEN); blocks. */
bool state_redis_resolve_now(const char *host, char *ip)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC}, *ai = NULL;
    bool ok = false;
    if (getaddrinfo(host, NULL, &hints, &ai) == 0 && ai != NULL) {
        const void *a = ai->ai_family == AF_INET6
                            ? (const void *)&((const struct sockaddr_in6 *)ai->ai_addr)->sin6_addr
                            : (const void *)&((const struct sockaddr_in *)ai->ai_addr)->sin_addr;
        ok = inet_ntop(ai->ai_family, a, ip, INET6_ADDRSTRLEN) != NULL;
    }
    if (ai != NULL)
        freeaddrinfo(ai);
    return ok;
}

static void *lookup_main(void *arg)
{
    struct lookup *j = arg;
    for (int i = 0; i < j->n; i++)
        j->ok[i] = state_redis_resolve_now(j->host[i], j->ip[i]);
    int running = LOOKUP_RUNNING;
    if (!atomic_compare_exchange_strong(&j->state, &running, LOOKUP_DONE))
        free(j); /* abandoned by state_redis_free */
    return NULL;
}

/* The address to connect to: a finished background lookup replaces the one
 * in use; then a new one starts (the next attempt may find the host moved). */
static void resolve_poll(struct state_redis *r)
{
    if (r->cfg.unix_socket || r->literal)
        return;
    if (r->lookup != NULL) {
        if (atomic_load(&r->lookup->state) == LOOKUP_RUNNING)
            return;
        for (int i = 0; i < r->lookup->n; i++) {
            if (!r->lookup->ok[i])
                continue;
            if (r->cfg.sentinel) {
                memcpy(r->sip[i], r->lookup->ip[i], sizeof r->sip[i]);
                r->sip_ok[i] = true;
            } else {
                memcpy(r->ip, r->lookup->ip[i], sizeof r->ip);
                r->ip_ok = true;
            }
        }
        free(r->lookup);
        r->lookup = NULL;
    }
    struct lookup *j = calloc(1, sizeof *j);
    if (j == NULL)
        return;
    j->n = r->cfg.sentinel ? r->cfg.nsentinels : 1;
    for (int i = 0; i < j->n; i++)
        util_copy(j->host[i], sizeof j->host[i], r->cfg.sentinel ? r->cfg.sentinels[i].host : r->cfg.host);
    atomic_init(&j->state, LOOKUP_RUNNING);
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, lookup_main, j) == 0)
        r->lookup = j;
    else
        free(j);
    pthread_attr_destroy(&at);
}


/* Connect to the Redis at r->ip / r->port (or the Unix socket) and join. */

void state_redis_join(struct state_redis *r)
{
    resolve_poll(r);
    if (r->cfg.sentinel) { /* the master first: state_redis_join_connect when a Sentinel names it */
        r->phase = PH_JOINING;
        r->join_left = 0;
        state_redis_sentinel_ask(r, true);
        return;
    }
    state_redis_join_connect(r);
}

void state_redis_join_connect(struct state_redis *r)
{
    if (!r->cfg.unix_socket && !r->ip_ok) {
        char why[300];
        snprintf(why, sizeof why, "cannot resolve %s", r->cfg.host);
        r->phase = PH_JOINING;
        state_redis_went_down(r, why);
        return;
    }
    r->phase = PH_JOINING;
    r->join_left = 0;
    loop_timer_at(r->loop, &r->join_timer, util_mono_ms() + STATE_REDIS_JOIN_MS);
    r->main = rc_open(r, false);
    r->sub = r->main ? rc_open(r, true) : NULL;
    if (r->main == NULL || r->sub == NULL) {
        char why[sizeof r->why];
        util_copy(why, sizeof why, r->why);
        state_redis_went_down(r, why);
        return;
    }
    char db[16];
    snprintf(db, sizeof db, "%d", r->cfg.db);
    bool ok = true;
    for (int c = 0; c < 2 && ok; c++) {
        struct rconn *rc = c == 0 ? r->main : r->sub;
        if (r->cfg.password != NULL)
            ok = ok && send_join(r, rc, OP_JOIN_OTHER, 0, 2, (const char *[]){"AUTH", r->cfg.password});
        if (c == 0 && r->cfg.db != 0)
            ok = ok && send_join(r, rc, OP_JOIN_OTHER, 0, 2, (const char *[]){"SELECT", db});
    }
    if (r->cfg.sentinel) /* the address a Sentinel named must be a master */
        ok = ok && send_join(r, r->main, OP_JOIN_ROLE, 0, 1, (const char *[]){"ROLE"});
    for (int i = 0; i < SCRIPT_N && ok; i++)
        ok = send_join(r, r->main, OP_JOIN_SCRIPT, i, 3, (const char *[]){"SCRIPT", "LOAD", r->text[i]});
    ok = ok && send_join(r, r->sub, OP_SUBSCRIBE, 0, 2, (const char *[]){"SUBSCRIBE", r->channel});
    if (!ok)
        state_redis_went_down(r, "cannot send to Redis");
}

void state_redis_timers_init(struct state_redis *r)
{
    loop_timer_init(&r->retry_timer, on_retry_timer, r);
    loop_timer_init(&r->teardown_timer, on_teardown_timer, r);
    loop_timer_init(&r->join_timer, on_join_timer, r);
    loop_timer_init(&r->ping_timer, on_ping_timer, r);
    state_redis_sentinel_timers_init(r);
}
