/* state_redis.c - see state_redis.h.
 *
 * Two hiredis asynchronous connections per process, driven by the loop
 * (hiredis calls our hooks to watch its socket): `main` for the scripts and
 * `sub` subscribed to the wake channel. A process is DOWN, JOINING (both
 * connecting, authenticating, the scripts loaded, subscribed) or UP.
 *
 * Rules that keep the teardown simple: a connection is never freed from
 * inside one of hiredis' callbacks (a failure seen there only marks the
 * process down and arms `teardown`, a timer at once); every operation gets
 * its callback exactly once from hiredis, with a reply or with NULL when its
 * connection is freed, and an operation that dies with its connection
 * answers STATE_REDIS_DOWN from there. Waiting operations are kept oldest
 * first (Redis answers in order): the oldest one's age, counted from when
 * its bytes were handed to the socket (state_redis_conn.c), is the one
 * timer that says "slower than 100 ms". */
#include "state_redis_private.h"
#include "state_redis_msg.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/time.h>
#include <netdb.h>

#include "budget.h"
#include "log.h"
#include "rules.h"
#include "state_redis_check.h"
#include "state_redis_name.h"
#include "util.h"

/* ---- ids and keys ---- */

bool state_redis_key_id(const struct state_redis *r, const char *secret, struct state_redis_id *out)
{
    return r != NULL && state_redis_name(secret, out);
}

bool state_redis_client_id(const struct state_redis *r, const char *addr, struct state_redis_client *out)
{
    if (r == NULL)
        return false;
    /* SipHash under a fixed key, so every host names a client alike: the
     * address is not stored in clear, though whoever reads Redis can test
     * a guessed one (as when the key was a salt kept in Redis itself) */
    struct state_client c;
    static const uint8_t zero[16];
    uint8_t s2[16];
    memcpy(s2, r->salt, 16);
    s2[5] ^= 0x3c; /* not the key ids' hash */
    state_client_hash(s2, addr, &c);
    memset(out, 0, sizeof *out);
    ids_hex(c.b, 16, out->tier[0].hex);
    out->n = 1;
    /* an IPv6 address's /56 and /48 (both or neither) */
    for (int t = 1; t < STATE_CLIENT_TIERS && memcmp(c.wide[t - 1], zero, 16) != 0; t++)
        ids_hex(c.wide[t - 1], 16, out->tier[out->n++].hex);
    return true;
}

static void waits_csv(const struct pace_schedule *s, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < s->n && n + 24 < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", i ? "," : "", (long long)s->wait_ms[i]);
}

static void claim_verdict(const redisReply *x, struct state_redis_claim *c)
{
    memset(c, 0, sizeof *c);
    c->v = STATE_REDIS_DOWN;
    if (!reply_is(x, REDIS_REPLY_ARRAY) || x->elements < 2 || !reply_is(x->element[0], REDIS_REPLY_STRING))
        return;
    enum state_redis_word v = state_redis_word_of(x->element[0]->str, x->element[0]->len);
    int64_t n = reply_int(x->element[1]);
    if (n < 0)
        n = 0;
    /* a wait, bounded as a published one is (the callers add it to now) */
    c->ms = n > STATE_REDIS_MSG_MAX_MS ? STATE_REDIS_MSG_MAX_MS : n;
    /* the third element: the final status's word, or why it waits */
    const redisReply *third = x->elements >= 3 && reply_is(x->element[2], REDIS_REPLY_STRING) ? x->element[2] : NULL;
    static const enum state_wait why_wait[SRW_N] = {
        [SRW_PACE] = WAIT_PACE,     [SRW_RETRY] = WAIT_RETRY, [SRW_KEY] = WAIT_KEY_PAUSE, [SRW_BUDGET] = WAIT_BUDGET,
        [SRW_PLAN] = WAIT_BUDGET,   [SRW_SEED] = WAIT_BUDGET, [SRW_CLIENT] = WAIT_CLIENT,
    };
    switch (v) {
    case SRW_GO:
        c->v = STATE_REDIS_GO;
        c->serial = (uint64_t)n;
        c->ms = 0;
        break;
    case SRW_FINAL:
        if (third != NULL && ids_valid_word(third->str, third->len)) {
            c->v = STATE_REDIS_FINAL;
            util_copy(c->word, sizeof c->word, third->str);
        }
        break;
    case SRW_NOT_FOUND: c->v = STATE_REDIS_NOT_FOUND; break;
    case SRW_BUSY: c->v = STATE_REDIS_BUSY; break;
    case SRW_BLOCKED: c->v = STATE_REDIS_BLOCKED; break;
    case SRW_WAIT:
        if (third != NULL) {
            enum state_redis_word why = state_redis_word_of(third->str, third->len);
            c->v = STATE_REDIS_WAIT;
            c->why = why < SRW_N && why_wait[why] != WAIT_NONE ? why_wait[why] : WAIT_PACE;
        }
        break;
    default: break;
    }
}

static void on_sub_reply(struct state_redis *r, const redisReply *x)
{
    if (!reply_is(x, REDIS_REPLY_ARRAY) || x->elements < 3 || !reply_is(x->element[0], REDIS_REPLY_STRING))
        return;
    const char *type = x->element[0]->str;
    if (strcmp(type, "subscribe") == 0) {
        if (r->phase == PH_JOINING)
            state_redis_join_step_done(r);
        return;
    }
    if (strcmp(type, "message") != 0 || !reply_is(x->element[2], REDIS_REPLY_STRING))
        return;
    struct state_redis_msg m;
    if (r->phase == PH_UP && state_redis_msg_parse(x->element[2]->str, x->element[2]->len, &m)) {
        r->m.messages++;
        r->on_msg(r->ctx, &m);
    }
}


/* ---- a reply handler per operation: x the reply (NULL when the
 * connection dropped it), failed when there is none or it is an error
 * (Redis is then left already), r NULL when the connection is not r's
 * any more ---- */

typedef void reply_fn(struct state_redis *r, struct state_redis_op *op, const redisReply *x, bool failed);

static void reply_claim(struct state_redis *r, struct state_redis_op *op, const redisReply *x, bool failed)
{
    if (op->fn == NULL)
        return; /* cancelled */
    struct state_redis_claim c;
    claim_verdict(failed ? NULL : x, &c);
    if (c.v == STATE_REDIS_DOWN && r != NULL && !failed)
        state_redis_went_down(r, "a claim's answer makes no sense");
    op->r->m.granted += c.v == STATE_REDIS_GO;
    op->fn(op->data, &c);
}

static void reply_tell(struct state_redis *r, struct state_redis_op *op, const redisReply *x, bool failed)
{
    if (op->told_fn == NULL)
        return;
    struct state_redis_told t = {.down = true};
    if (!failed && reply_is(x, REDIS_REPLY_STRING) && x->len == 0) {
        t.down = false;
    } else if (!failed && reply_is(x, REDIS_REPLY_STRING) && ids_valid_word(x->str, x->len)) {
        t.down = false;
        t.kept = true;
        util_copy(t.word, sizeof t.word, x->str);
    } else if (r != NULL && !failed) {
        state_redis_went_down(r, "a told status's answer makes no sense");
    }
    op->told_fn(op->data, &t);
}

static void reply_held(struct state_redis *r, struct state_redis_op *op, const redisReply *x, bool failed)
{
    if (op->held_fn == NULL)
        return;
    struct state_redis_held h = {.down = true};
    if (!failed && reply_is(x, REDIS_REPLY_INTEGER)) {
        h.down = false;
        h.reserved = x->integer >= 0;
        h.resv_ms = x->integer >= 0 ? x->integer : 0;
    } else if (r != NULL && !failed) {
        state_redis_went_down(r, "a hold's answer makes no sense");
    }
    op->held_fn(op->data, &h);
}

static void writeback_done(struct state_redis *r, uint64_t seq);

/* a script whose answer matters only for a write-back (answered: it is
 * written) and for a finish that charged a client (1: its client's block
 * started) */
static void reply_fire(struct state_redis *r, struct state_redis_op *op, const redisReply *x, bool failed)
{
    if (op->wb_seq != 0 && !failed && r != NULL && !reply_is(x, REDIS_REPLY_ERROR))
        writeback_done(r, op->wb_seq); /* written: else kept for the next join */
    if (op->charge && !failed && r != NULL && r->on_blocked != NULL && reply_is(x, REDIS_REPLY_INTEGER) &&
        x->integer == 1)
        r->on_blocked(r->ctx, op->shop, op->id);
}

static void reply_join_other(struct state_redis *r, struct state_redis_op *op, const redisReply *x, bool failed)
{
    (void)op;
    (void)x;
    if (!failed && r != NULL && r->phase == PH_JOINING)
        state_redis_join_step_done(r);
}

static void reply_join_role(struct state_redis *r, struct state_redis_op *op, const redisReply *x, bool failed)
{
    (void)op;
    if (failed || r == NULL || r->phase != PH_JOINING)
        return;
    if (reply_is(x, REDIS_REPLY_ARRAY) && x->elements >= 1 && reply_is(x->element[0], REDIS_REPLY_STRING) &&
        strcmp(x->element[0]->str, "master") == 0)
        state_redis_join_step_done(r);
    else
        state_redis_not_a_master(r, x);
}

static void reply_join_script(struct state_redis *r, struct state_redis_op *op, const redisReply *x, bool failed)
{
    if (failed || r == NULL || r->phase != PH_JOINING)
        return;
    if (!reply_is(x, REDIS_REPLY_STRING) || x->len != 40) {
        state_redis_went_down(r, "SCRIPT LOAD gave no digest");
    } else {
        memcpy(r->sha[op->script], x->str, 41);
        state_redis_join_step_done(r);
    }
}

/* a PING's answer matters only by coming (the slow timer) */
static void reply_none(struct state_redis *r, struct state_redis_op *op, const redisReply *x, bool failed)
{
    (void)r;
    (void)op;
    (void)x;
    (void)failed;
}

/* OP_S_AUTH, OP_S_ASK (the Sentinel's) and OP_SUBSCRIBE are answered
 * before these (state_redis_on_reply). */
static reply_fn *const reply_of[] = {
    [OP_CLAIM] = reply_claim,
    [OP_TELL] = reply_tell,
    [OP_HELD] = reply_held,
    [OP_FIRE] = reply_fire,
    [OP_PING] = reply_none,
    [OP_JOIN_SCRIPT] = reply_join_script,
    [OP_JOIN_OTHER] = reply_join_other,
    [OP_JOIN_ROLE] = reply_join_role,
    [OP_SUBSCRIBE] = reply_none,
    [OP_S_AUTH] = reply_none,
    [OP_S_ASK] = reply_none,
};
_Static_assert(sizeof reply_of / sizeof reply_of[0] == OP_N, "a reply handler for every operation");

/* Every reply, and every operation dropped with its connection (reply NULL). */
void state_redis_on_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct state_redis_op *op = privdata;
    struct rconn *rc = ac->data;
    struct state_redis *r = rc != NULL ? rc->r : NULL; /* NULL: not r's connection any more */
    const redisReply *x = reply;
    if (op->kind == OP_S_AUTH || op->kind == OP_S_ASK) {
        if (r != NULL && r->sconn == rc)
            state_redis_sentinel_reply(r, op->kind, x, ac->errstr);
        free(op);
        return;
    }
    if (op->kind == OP_SUBSCRIBE) {
        if (r != NULL && x != NULL) {
            on_sub_reply(r, x);
            return; /* the subscription's callback stays for every message */
        }
        if (r != NULL)
            state_redis_went_down(r, ac->errstr[0] ? ac->errstr : "subscription lost");
        free(op);
        return;
    }
    state_redis_op_unqueue(op);
    bool failed = x == NULL || x->type == REDIS_REPLY_ERROR;
    if (r != NULL && failed) {
        char why[160];
        snprintf(why, sizeof why, "%s", x != NULL ? x->str : ac->errstr[0] ? ac->errstr : "connection lost");
        if (op->kind == OP_JOIN_OTHER && x != NULL && strncmp(x->str, "WRONGPASS", 9) == 0)
            snprintf(why, sizeof why, "the password is refused (redis_password_file)");
        state_redis_went_down(r, why);
    }
    if (reply_of[op->kind] != NULL) /* every kind has one (the table is complete) */
        reply_of[op->kind](r, op, x, failed);
    free(op);
}

/* The oldest operation may be slower than STATE_REDIS_SLOW_MS. Only
 * Redis's slowness counts: replies that came while this process could not
 * run (a starved machine) are read first, and when the timer itself fired
 * late the operations waiting get a fresh STATE_REDIS_SLOW_MS. One that
 * has not gone out yet (its socket's turn did not come: more sockets ready
 * than one turn takes) goes out now, and its 100 ms start there. */
static void on_slow_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    int64_t now = util_mono_ms(), late = now - t->at;
    (void)l;
    struct rconn *rc = r->main;
    if (rc != NULL && !rc->freeing && r->head != NULL && !r->head->out) {
        state_redis_rc_write(rc); /* it re-arms this timer */
        return;
    }
    if (rc != NULL && !rc->freeing && r->head != NULL) {
        rc->busy++;
        redisAsyncHandleRead(rc->ac); /* non-blocking: nothing there is nothing */
        if (--rc->busy == 0 && rc->dead)
            free(rc);
    }
    if (r->head != NULL && late > STATE_REDIS_SLOW_MS / 2) {
        for (struct state_redis_op *op = r->head; op; op = op->next)
            op->sent = now;
    } else if (r->head != NULL && r->head->sent + STATE_REDIS_SLOW_MS <= now) {
        state_redis_went_down(r, "slower than 100 ms");
        return;
    }
    state_redis_arm_slow(r);
}

/* ---- the interface ---- */

struct state_redis *state_redis_new(struct loop *l, const struct config_redis *cfg, state_redis_msg_fn *on_msg,
                                    state_redis_blocked_fn *on_blocked, state_redis_seed_fn *on_seed,
                                    void *ctx, char *err, size_t errlen)
{
    struct state_redis *r = calloc(1, sizeof *r);
    if (r == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->loop = l;
    r->cfg = *cfg;
    r->cfg.password = cfg->password ? strdup(cfg->password) : NULL;
    if (cfg->password && r->cfg.password == NULL) {
        free(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (int i = 0; i < SCRIPT_N; i++) {
        r->text[i] = state_redis_script_text(i);
        if (r->text[i] == NULL) {
            for (int j = 0; j < i; j++)
                free(r->text[j]);
            free(r->cfg.password);
            free(r);
            snprintf(err, errlen, "out of memory");
            return NULL;
        }
    }
    r->on_msg = on_msg;
    r->on_blocked = on_blocked;
    r->on_seed = on_seed;
    r->ctx = ctx;
    memcpy(r->salt, STATE_REDIS_NAME_LABEL, sizeof r->salt);
    state_redis_prefix(r->vprefix, sizeof r->vprefix, cfg->prefix, cfg->schema); /* fits: see its size */
    snprintf(r->channel, sizeof r->channel, "%swake", r->vprefix);
    loop_timer_init(&r->slow_timer, on_slow_timer, r);
    state_redis_timers_init(r);
    r->port = cfg->port;
    r->m.sentinel = cfg->sentinel ? 1 : 0;
    r->sasking = -1;
    r->snamed = r->snamed_next = -1;
    struct in6_addr a6;
    r->literal = cfg->sentinel;
    for (int i = 0; i < cfg->nsentinels; i++) { /* once, before the loop runs, as below */
        const char *h = cfg->sentinels[i].host;
        r->order[i] = i;
        r->sip_ok[i] = state_redis_resolve_now(h, r->sip[i]);
        r->literal = r->literal && (inet_pton(AF_INET, h, &a6) == 1 || inet_pton(AF_INET6, h, &a6) == 1);
    }
    if (cfg->sentinel) {
        r->cfg.sentinel_password = cfg->sentinel_password ? strdup(cfg->sentinel_password) : NULL;
        if (cfg->sentinel_password && r->cfg.sentinel_password == NULL) {
            for (int i = 0; i < SCRIPT_N; i++)
                free(r->text[i]);
            free(r->cfg.password);
            free(r);
            snprintf(err, errlen, "out of memory");
            return NULL;
        }
    } else if (!cfg->unix_socket) {
        r->literal = inet_pton(AF_INET, cfg->host, &a6) == 1 || inet_pton(AF_INET6, cfg->host, &a6) == 1;
        if (r->literal) {
            util_copy(r->ip, sizeof r->ip, cfg->host);
            r->ip_ok = true;
        } else { /* once, before the loop runs; later lookups are in the background */
            r->ip_ok = state_redis_resolve_now(cfg->host, r->ip);
        }
    }
    state_redis_join(r);
    return r;
}

static void writeback_clear(struct writeback *w)
{
    if (w->secret) {
        explicit_bzero(w->secret, strlen(w->secret));
        free(w->secret);
        w->secret = NULL;
    }
}

void state_redis_free(struct state_redis *r)
{
    if (r == NULL)
        return;
    r->stopping = true;
    r->phase = PH_DOWN;
    r->m.up = 0;
    state_redis_teardown(r);
    /* operations of connections hiredis could not free yet (none: we are
     * never inside its callbacks here) */
    loop_timer_stop(r->loop, &r->slow_timer);
    loop_timer_stop(r->loop, &r->retry_timer);
    loop_timer_stop(r->loop, &r->teardown_timer);
    loop_timer_stop(r->loop, &r->join_timer);
    loop_timer_stop(r->loop, &r->ping_timer);
    loop_timer_stop(r->loop, &r->sentinel_timer);
    loop_timer_stop(r->loop, &r->scheck_timer);
    state_redis_sentinel_close(r);
    for (size_t i = 0; i < r->nwb; i++)
        writeback_clear(&r->wb[i]);
    if (r->lookup != NULL) {
        int running = LOOKUP_RUNNING;
        if (atomic_compare_exchange_strong(&r->lookup->state, &running, LOOKUP_ABANDONED))
            r->lookup = NULL; /* its thread frees it when its lookup ends */
        else
            free(r->lookup);
    }
    char *pws[] = {r->cfg.password, r->cfg.sentinel_password};
    for (size_t i = 0; i < ARRAY_LEN(pws); i++)
        if (pws[i] != NULL) {
            explicit_bzero(pws[i], strlen(pws[i]));
            free(pws[i]);
        }
    for (int i = 0; i < SCRIPT_N; i++)
        free(r->text[i]);
    free(r);
}

bool state_redis_up(const struct state_redis *r)
{
    return r != NULL && r->phase == PH_UP;
}

bool state_redis_joining(const struct state_redis *r)
{
    return r != NULL && r->phase == PH_JOINING && !r->ever_up;
}

int state_redis_budget(const struct state_redis *r, int budget)
{
    if (r == NULL || r->phase == PH_UP)
        return budget_share(budget, 1, true);
    return budget_share(budget, r->cfg.hosts, false);
}

/* The client rule's numbers, as the scripts take them (state.h's): the
 * allowance of each tier ("5,10,20") and the window. */
static void client_args(char *limit, size_t limitlen, char *window, size_t windowlen)
{
    size_t n = 0;
    limit[0] = '\0';
    for (int t = 0; t < STATE_CLIENT_TIERS && n < limitlen; t++)
        n += (size_t)snprintf(limit + n, limitlen - n, "%s%d", t ? "," : "", STATE_CLIENT_404S_AT(t));
    snprintf(window, windowlen, "%lld", (long long)STATE_CLIENT_WINDOW_MS);
}

/* The command line of `cmd` (EVALSHA or EVAL) for script `script` (ref:
 * its SHA or its text) with the keys it takes for (k, id, client) under
 * vprefix (state_redis_script_keys: named in keys[], counted in snkeys),
 * then args[0..nargs), into argv (room for 3 + STATE_REDIS_SCRIPT_KEYS_MAX
 * + nargs); returns its length. */
static int script_argv(const char *cmd, const char *ref, int script, const char *vprefix,
                       const struct state_redis_id *k, const char *id, const struct state_redis_client *client,
                       const char *const *args, int nargs, char keys[][STATE_REDIS_KEY_MAX], char snkeys[8],
                       const char **argv)
{
    int nkeys = state_redis_script_keys(script, vprefix, k, id, client, keys);
    snprintf(snkeys, 8, "%d", nkeys);
    int n = 0;
    argv[n++] = cmd;
    argv[n++] = ref;
    argv[n++] = snkeys;
    for (int i = 0; i < nkeys; i++)
        argv[n++] = keys[i];
    for (int i = 0; i < nargs; i++)
        argv[n++] = args[i];
    return n;
}

/* EVALSHA script `script` with the keys it takes for (k, id, client)
 * (script_argv) and args[0..nargs), as op. false when it could not be
 * sent (op is freed then). */
static bool send_script(struct state_redis *r, int script, const struct state_redis_id *k, const char *id,
                        const struct state_redis_client *client, const char *const *args, int nargs,
                        struct state_redis_op *op)
{
    char keys[STATE_REDIS_SCRIPT_KEYS_MAX][STATE_REDIS_KEY_MAX], snkeys[8];
    int cap = 3 + STATE_REDIS_SCRIPT_KEYS_MAX + nargs;
    const char **argv = calloc((size_t)cap, sizeof *argv);
    size_t *lens = calloc((size_t)cap, sizeof *lens);
    bool ok = false;
    if (argv != NULL && lens != NULL) {
        int argc = script_argv("EVALSHA", r->sha[script], script, r->vprefix, k, id, client, args, nargs, keys,
                               snkeys, argv);
        for (int i = 0; i < argc; i++)
            lens[i] = strlen(argv[i]);
        ok = state_redis_op_send(r->main, op, argc, argv, lens);
        op = NULL; /* sent or freed */
    }
    free(op);
    free(argv);
    free(lens);
    return ok;
}

/* The tell script's ARGV (lua_tell) for `word` (final: a final status,
 * cached ttl_ms) about id of key k, the others' next read paced by sched
 * (NULL: the floor), published on channel; ttl and waits hold their
 * text. */
#define TELL_ARGS 7
static void tell_args(const char *args[TELL_ARGS], const char *word, bool final, int64_t ttl_ms,
                      const struct pace_schedule *sched, const char *id, const char *channel,
                      const struct state_redis_id *k, char ttl[24], char waits[PACE_MAX_STEPS * 12])
{
    snprintf(ttl, 24, "%lld", (long long)ttl_ms);
    if (sched != NULL) /* the others' next read, by the pace the reads made */
        waits_csv(sched, waits, PACE_MAX_STEPS * 12);
    else
        snprintf(waits, PACE_MAX_STEPS * 12, "0,%d", PACE_MIN_WAIT_MS);
    const char *a[TELL_ARGS] = {word, final ? "1" : "0", ttl, waits, id, channel, k->hex};
    memcpy(args, a, sizeof a);
}

struct state_redis_op *state_redis_claim(struct state_redis *r, const char *secret, const char *id,
                                         const struct pace_schedule *s, int budget, int64_t lease_ms,
                                         const struct state_redis_client *client, const struct state_redis_plan *plan,
                                         const struct state_redis_count *count, state_redis_claim_fn *fn, void *data)
{
    struct state_redis_id k;
    if (!state_redis_up(r) || !state_redis_name(secret, &k))
        return NULL; /* decided on this host */
    char waits[PACE_MAX_STEPS * 12], sb[16], sl[24], climit[48], cwin[24], crecheck[24], shold[24], scap[16],
        sreads[16], sgrace[24], snf[16];
    snprintf(sgrace, sizeof sgrace, "%lld", (long long)budget_grace_ms(r->cfg.sentinel));
    client_args(climit, sizeof climit, cwin, sizeof cwin);
    snprintf(crecheck, sizeof crecheck, "%lld", (long long)STATE_CLIENT_RECHECK_MS);
    snprintf(shold, sizeof shold, "%lld", (long long)rules_hold_ms(s));
    snprintf(scap, sizeof scap, "%d", STATE_WAITING_MAX);
    snprintf(sreads, sizeof sreads, "%d", plan->schedule_reads);
    waits_csv(s, waits, sizeof waits);
    snprintf(sb, sizeof sb, "%d", budget > 0 ? budget : 1);
    snprintf(snf, sizeof snf, "%d", rules_not_found_cap(budget > 0 ? budget : 1));
    snprintf(sl, sizeof sl, "%lld", (long long)(lease_ms > 0 ? lease_ms : 1000));
    const char *args[] = {waits, sb, sl, client ? "1" : "0", id, plan->plans ? "1" : "0", scap,
                          climit, cwin, crecheck, shold, sreads, count->member, r->channel, k.hex,
                          count->lost ? "1" : "0", sgrace, snf};
    struct state_redis_op *op = state_redis_op_new(r, OP_CLAIM);
    if (op == NULL)
        return NULL;
    op->fn = fn;
    op->data = data;
    if (!send_script(r, SCRIPT_CLAIM, &k, id, client, args, (int)(sizeof args / sizeof args[0]), op))
        return NULL;
    r->m.claims++;
    return op;
}

struct state_redis_op *state_redis_held(struct state_redis *r, const char *secret, const char *id, int budget,
                                        int64_t deadline_ms, uint64_t stamp,
                                        const struct state_redis_id *host, const struct state_redis_plan *plan,
                                        state_redis_held_fn *fn, void *data)
{
    struct state_redis_id k;
    if (!state_redis_up(r) || !state_redis_name(secret, &k))
        return NULL; /* decided on this host */
    char sdl[24], sb[16], scap[16], sarr[16], sstamp[24];
    snprintf(sdl, sizeof sdl, "%lld", (long long)(deadline_ms > 0 ? deadline_ms : 0));
    snprintf(sb, sizeof sb, "%d", budget > 0 ? budget : 1);
    snprintf(scap, sizeof scap, "%d", STATE_WAITING_MAX);
    snprintf(sarr, sizeof sarr, "%d", STATE_ARRIVALS);
    snprintf(sstamp, sizeof sstamp, "%llu", (unsigned long long)stamp);
    const char *args[] = {host->hex, sdl, id, sb, plan->plans ? "1" : "0", scap, sarr, sstamp};
    struct state_redis_op *op = state_redis_op_new(r, OP_HELD);
    if (op == NULL)
        return NULL;
    op->held_fn = fn;
    op->data = data;
    if (!send_script(r, SCRIPT_HELD, &k, id, NULL, args, (int)(sizeof args / sizeof args[0]), op))
        return NULL;
    return op;
}

void state_redis_cancel(struct state_redis_op *op)
{
    if (op != NULL) {
        op->fn = NULL;
        op->told_fn = NULL;
        op->held_fn = NULL;
    }
}

#define ARGC(a) ((int)(sizeof(a) / sizeof((a)[0])))

void state_redis_left(struct state_redis *r, const char *secret, const char *id, const struct state_redis_id *host,
                      uint64_t stamp)
{
    struct state_redis_id k;
    if (!state_redis_up(r) || !state_redis_name(secret, &k))
        return;
    char sstamp[24];
    snprintf(sstamp, sizeof sstamp, "%llu", (unsigned long long)stamp);
    const char *args[] = {host->hex, id, sstamp};
    struct state_redis_op *op = state_redis_op_new(r, OP_FIRE);
    if (op != NULL)
        send_script(r, SCRIPT_LEFT, &k, id, NULL, args, ARGC(args), op);
}

/* EVALSHA the tell script for (key k, id) as op (NULL: fire and forget).
 * false when it could not be sent (op is freed then). */
static bool send_tell_op(struct state_redis *r, const struct state_redis_id *k, const char *id, const char *word,
                         bool final, const struct pace_schedule *sched, int64_t ttl_ms, struct state_redis_op *op)
{
    char ttl[24], waits[PACE_MAX_STEPS * 12];
    const char *args[TELL_ARGS];
    tell_args(args, word, final, ttl_ms, sched, id, r->channel, k, ttl, waits);
    if (op == NULL && (op = state_redis_op_new(r, OP_FIRE)) == NULL)
        return false;
    return send_script(r, SCRIPT_TELL, k, id, NULL, args, TELL_ARGS, op);
}

static void send_tell(struct state_redis *r, const char *secret, const char *id, const char *word, bool final,
                      const struct pace_schedule *sched, int64_t ttl_ms)
{
    struct state_redis_id k;
    if (state_redis_name(secret, &k))
        send_tell_op(r, &k, id, word, final, sched, ttl_ms, NULL);
}

/* Keep (secret, id)'s final status for the write-back: its latest word
 * where it is kept already; else a new entry while the queue, and the key's
 * share of it, have room (the oldest are kept: Redis's own TTLs would have
 * dropped the rest first; a key's share keeps one tenant's flood of told
 * statuses from crowding out every other key's). */
static void writeback_add(struct state_redis *r, const char *secret, const char *id, const char *word)
{
    int64_t now = util_mono_ms();
    size_t mine = 0;
    for (size_t i = 0; i < r->nwb; i++) {
        if (strcmp(r->wb[i].secret, secret) != 0)
            continue;
        if (strcmp(r->wb[i].id, id) == 0) {
            util_copy(r->wb[i].word, sizeof r->wb[i].word, word);
            r->wb[i].at = now;
            r->wb[i].seq = ++r->wb_seq;
            return;
        }
        mine++;
    }
    if (r->nwb >= STATE_REDIS_WRITEBACK_MAX || mine >= STATE_REDIS_WRITEBACK_PER_KEY)
        return;
    struct writeback *w = &r->wb[r->nwb];
    w->secret = strdup(secret);
    if (w->secret == NULL)
        return;
    util_copy(w->id, sizeof w->id, id);
    util_copy(w->word, sizeof w->word, word);
    w->at = now;
    w->seq = ++r->wb_seq;
    r->nwb++;
}

/* Entry i of the write-back leaves it (the last takes its place). */
static void writeback_drop(struct state_redis *r, size_t i)
{
    writeback_clear(&r->wb[i]);
    r->wb[i] = r->wb[--r->nwb];
    memset(&r->wb[r->nwb], 0, sizeof r->wb[r->nwb]);
}

/* The tell of write-back version `seq` was answered: that version is in
 * Redis (a newer one of the same status, told since, stays queued). */
static void writeback_done(struct state_redis *r, uint64_t seq)
{
    for (size_t i = 0; i < r->nwb; i++)
        if (r->wb[i].seq == seq) {
            writeback_drop(r, i);
            r->m.written_back++;
            return;
        }
}

void state_redis_writeback_flush(struct state_redis *r)
{
    int64_t now = util_mono_ms();
    for (size_t i = 0; i < r->nwb;) {
        /* cached only for what is left of its time, counted from when it
         * was read or told: an old expired must not outlive Kasera's word */
        int64_t left = rules_ttl_left(tx_status_parse(r->wb[i].word), r->wb[i].at, now);
        struct state_redis_id k;
        if (left <= 0 || !state_redis_name(r->wb[i].secret, &k)) {
            writeback_drop(r, i);
            continue;
        }
        /* kept until its tell is answered: a connection lost before
         * (Redis slower than 100 ms, gone again) sends it at the next join */
        struct state_redis_op *op = state_redis_op_new(r, OP_FIRE);
        if (op != NULL) {
            op->wb_seq = r->wb[i].seq;
            send_tell_op(r, &k, r->wb[i].id, r->wb[i].word, true, NULL, left, op);
        }
        i++;
    }
}

void state_redis_seed(struct state_redis *r, const struct state_redis_id *rkey, const struct state_redis_id *host,
                      const int64_t *at, int n, int64_t now)
{
    if (!state_redis_up(r) || n <= 0)
        return;
    if (n > STATE_BUDGET_MAX)
        n = STATE_BUDGET_MAX;
    int idx[STATE_BUDGET_MAX];
    int64_t ago[STATE_BUDGET_MAX];
    int m = budget_seed(at, n, now, idx, ago);
    if (m == 0)
        return;
    int nargs = 1 + 2 * m;
    const char **args = calloc((size_t)nargs, sizeof *args);
    char (*names)[BUDGET_MEMBER_MAX] = calloc((size_t)m, sizeof *names);
    char (*ages)[24] = calloc((size_t)m, sizeof *ages);
    struct state_redis_op *op = args && names && ages ? state_redis_op_new(r, OP_FIRE) : NULL;
    if (op != NULL) {
        char grace[24];
        snprintf(grace, sizeof grace, "%lld", (long long)budget_grace_ms(r->cfg.sentinel));
        args[0] = grace;
        for (int i = 0; i < m; i++) {
            budget_member(names[i], sizeof names[i], host->hex, at[idx[i]]);
            snprintf(ages[i], sizeof ages[i], "%lld", (long long)ago[i]);
            args[1 + 2 * i] = names[i];
            args[2 + 2 * i] = ages[i];
        }
        if (send_script(r, SCRIPT_SEED, rkey, NULL, NULL, args, nargs, op))
            r->m.seeded += m;
    }
    free(args);
    free(names);
    free(ages);
}

void state_redis_finish(struct state_redis *r, const char *secret, const char *id,
                        const struct state_redis_outcome *o)
{
    if (r == NULL)
        return;
    if (!state_redis_up(r)) {
        if (o->word != NULL && o->final)
            writeback_add(r, secret, id, o->word);
        return;
    }
    struct state_redis_id k;
    if (!state_redis_name(secret, &k))
        return; /* as if Redis were down for this read: the others read it themselves */
    char ser[24], sent[24], ttl[24], nfttl[24], rw[24], kw[24], climit[48], cwin[24], cblock[24],
        cl[STATE_CLIENT_TIERS * 33 + 1] = "-";
    char waits[PACE_MAX_STEPS * 12];
    if (o->has_client) /* the tiers' names, for the blocks' messages */
        for (int t = 0, n = 0; t < o->client.n && t < STATE_CLIENT_TIERS; t++)
            n += snprintf(cl + n, sizeof cl - (size_t)n, "%s%s", t ? "," : "", o->client.tier[t].hex);
    client_args(climit, sizeof climit, cwin, sizeof cwin);
    snprintf(cblock, sizeof cblock, "%lld", (long long)STATE_CLIENT_BLOCK_MS);
    snprintf(ser, sizeof ser, "%llu", (unsigned long long)o->serial);
    snprintf(sent, sizeof sent, "%lld", (long long)(o->sent_ms > 0 && o->sent_ms < PACE_EPISODE_MS ? o->sent_ms : 0));
    snprintf(ttl, sizeof ttl, "%lld", (long long)(o->ttl_ms > 0 ? o->ttl_ms : 1));
    snprintf(nfttl, sizeof nfttl, "%lld", (long long)(o->ttl_ms > 0 ? o->ttl_ms : 1));
    snprintf(rw, sizeof rw, "%lld", (long long)(o->retry_ms > 0 ? o->retry_ms : 0));
    snprintf(kw, sizeof kw, "%lld", (long long)(o->key_pause_ms > 0 ? o->key_pause_ms : 0));
    /* the schedule tells the others when the next read may start */
    if (o->sched != NULL)
        waits_csv(o->sched, waits, sizeof waits);
    else
        snprintf(waits, sizeof waits, "0,%d", PACE_MIN_WAIT_MS);
    const char *args[] = {ser, sent, o->word ? o->word : "", o->final ? "1" : "0", ttl,
                          o->not_found ? "1" : "0", nfttl, o->charge && o->has_client ? "1" : "0", rw,
                          kw, waits, id, r->channel, k.hex, cl, climit, cwin, cblock};
    struct state_redis_op *op = state_redis_op_new(r, OP_FIRE);
    if (op == NULL)
        return;
    if (o->charge && o->has_client) { /* a reply of 1: its block started */
        op->charge = true;
        util_copy(op->shop, sizeof op->shop, o->shop_id);
        util_copy(op->id, sizeof op->id, id);
    }
    send_script(r, SCRIPT_FINISH, &k, id, o->has_client ? &o->client : NULL, args, ARGC(args), op);
}

void state_redis_tell(struct state_redis *r, const char *secret, const char *id, const char *word, bool final,
                      const struct pace_schedule *sched)
{
    if (r == NULL)
        return;
    if (!state_redis_up(r)) {
        if (final)
            writeback_add(r, secret, id, word);
        return;
    }
    send_tell(r, secret, id, word, final, sched, rules_status_ttl(tx_status_parse(word)));
}

struct state_redis_op *state_redis_tell_ask(struct state_redis *r, const char *secret, const char *id,
                                            const char *word, bool final, const struct pace_schedule *sched,
                                            state_redis_told_fn *fn, void *data)
{
    struct state_redis_id k;
    if (!state_redis_up(r) || !state_redis_name(secret, &k))
        return NULL;
    struct state_redis_op *op = state_redis_op_new(r, OP_TELL);
    if (op == NULL)
        return NULL;
    op->told_fn = fn;
    op->data = data;
    return send_tell_op(r, &k, id, word, final, sched, rules_status_ttl(tx_status_parse(word)), op) ? op : NULL;
}

void state_redis_metrics(const struct state_redis *r, struct state_redis_metrics *out)
{
    if (r == NULL) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = r->m;
}

/* ---- the blocking one, for --notify ---- */

static redisReply *sync_cmd(redisContext *c, int argc, const char **argv, char *err, size_t errlen)
{
    size_t lens[16];
    if (argc > 16) {
        snprintf(err, errlen, "too many arguments");
        return NULL;
    }
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    redisReply *x = redisCommandArgv(c, argc, argv, lens);
    if (x == NULL) {
        snprintf(err, errlen, "%s", c->errstr[0] ? c->errstr : "no answer");
        return NULL;
    }
    if (x->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "%s", strncmp(x->str, "WRONGPASS", 9) == 0 ? "the password is refused" : x->str);
        freeReplyObject(x);
        return NULL;
    }
    return x;
}

/* Connect to host:port (or cfg's Unix socket), authenticate, select, and
 * with `want_master` check that ROLE says master; then record the told
 * status as state_redis_tell() does. 0; -1 with a reason; 1 when the
 * server is not a master (nothing was written). */
static int tell_at(const struct config_redis *cfg, const char *host, int port, bool want_master, const char *secret,
                   const char *id, const char *word, bool final, int timeout_ms, char *err, size_t errlen)
{
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    redisContext *c = cfg->unix_socket && !cfg->sentinel ? redisConnectUnixWithTimeout(cfg->path, tv)
                                                         : redisConnectWithTimeout(host, port, tv);
    if (c == NULL || c->err) {
        snprintf(err, errlen, "cannot connect: %s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return -1;
    }
    redisSetTimeout(c, tv);
    int rc = -1;
    redisReply *x = NULL;
    char db[16], ttl[24], waits[PACE_MAX_STEPS * 12], channel[STATE_REDIS_VPREFIX_MAX + 8],
        vprefix[STATE_REDIS_VPREFIX_MAX];
    snprintf(db, sizeof db, "%d", cfg->db);
    if (cfg->password && (x = sync_cmd(c, 2, (const char *[]){"AUTH", cfg->password}, err, errlen)) == NULL)
        goto out;
    freeReplyObject(x);
    x = NULL; /* not freed again below when db is 0 */
    if (cfg->db != 0 && (x = sync_cmd(c, 2, (const char *[]){"SELECT", db}, err, errlen)) == NULL)
        goto out;
    freeReplyObject(x);
    x = NULL;
    if (want_master) { /* as the daemon's join: an address a Sentinel named must be a master */
        if ((x = sync_cmd(c, 1, (const char *[]){"ROLE"}, err, errlen)) == NULL)
            goto out;
        if (!reply_is(x, REDIS_REPLY_ARRAY) || x->elements < 1 || !reply_is(x->element[0], REDIS_REPLY_STRING) ||
            strcmp(x->element[0]->str, "master") != 0) {
            snprintf(err, errlen, "%s:%d is not a master (ROLE says %s)", host, port,
                     reply_is(x, REDIS_REPLY_ARRAY) && x->elements >= 1 && reply_is(x->element[0], REDIS_REPLY_STRING)
                         ? x->element[0]->str
                         : "something else");
            rc = 1;
            goto out;
        }
        freeReplyObject(x);
        x = NULL;
    }
    struct state_redis_id k;
    if (!state_redis_name(secret, &k)) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    state_redis_prefix(vprefix, sizeof vprefix, cfg->prefix, cfg->schema);
    snprintf(channel, sizeof channel, "%swake", vprefix);
    char *text = state_redis_script_text(SCRIPT_TELL);
    if (text == NULL) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    const char *args[TELL_ARGS], *argv[3 + STATE_REDIS_SCRIPT_KEYS_MAX + TELL_ARGS];
    tell_args(args, word, final, rules_status_ttl(tx_status_parse(word)), NULL, id, channel, &k, ttl, waits);
    char keys[STATE_REDIS_SCRIPT_KEYS_MAX][STATE_REDIS_KEY_MAX], snkeys[8];
    int argc = script_argv("EVAL", text, SCRIPT_TELL, vprefix, &k, id, NULL, args, TELL_ARGS, keys, snkeys, argv);
    x = sync_cmd(c, argc, argv, err, errlen);
    free(text);
    if (x == NULL)
        goto out;
    rc = 0;
out:
    if (x)
        freeReplyObject(x);
    redisFree(c);
    return rc;
}

int state_redis_tell_once(const struct config_redis *cfg, const char *secret, const char *id, const char *word,
                          bool final, int timeout_ms, char *err, size_t errlen)
{
    if (!cfg->sentinel)
        return tell_at(cfg, cfg->host, cfg->port, false, secret, id, word, final, timeout_ms, err, errlen) == 0 ? 0
                                                                                                               : -1;
    /* each Sentinel in turn, as the daemon asks them: the first whose
     * master answers ROLE master takes it (one that names a replica, after
     * a failover it has not seen yet, is passed over) */
    char why[600] = "";
    for (int i = 0; i < cfg->nsentinels; i++) {
        struct config_redis one = *cfg;
        one.sentinels[0] = cfg->sentinels[i];
        one.nsentinels = 1;
        char mip[INET6_ADDRSTRLEN + 1];
        int port = 0, which = -1;
        state_redis_sentinel_master(&one, timeout_ms, mip, sizeof mip, &port, &which, NULL, why, sizeof why);
        if (which < 0)
            continue;
        if (tell_at(cfg, mip, port, true, secret, id, word, final, timeout_ms, why, sizeof why) == 0)
            return 0; /* else (not a master, not reachable): the next Sentinel, with why kept */
    }
    snprintf(err, errlen, "%s", why[0] ? why : "no Sentinel names a master");
    return -1;
}
