/* state_redis_sentinel.c - the Redis store's Sentinel client (see
 * state_redis.c): which master the Sentinels name, asked on the loop, and
 * the ROLE check of the master joined. */
#include "state_redis_private.h"

#include <stdio.h>
#include <string.h>

#include "log.h"
#include "util.h"

/* ---- the Sentinels (the Sentinel client rules: redis.io's "Sentinel
 * client guidelines") ----
 *
 * A question (state_redis_sentinel_ask) goes to the Sentinels in `order`, one at a
 * time, each with STATE_REDIS_SENTINEL_MS to connect, authenticate and
 * answer SENTINEL get-master-addr-by-name; the first that names an address
 * ends it and goes to the front of `order`. Every step that leaves a
 * hiredis callback (an answer, a failure) arms sentinel_timer at once, and
 * its handler moves on: a connection is never freed inside a callback. */

void state_redis_sentinel_close(struct state_redis *r)
{
    struct rconn *rc = r->sconn;
    r->sconn = NULL;
    if (rc != NULL) {
        rc->r = NULL;
        state_redis_rc_close(rc);
    }
}

/* From a callback: the Sentinel asked failed (why), or answered (why NULL). */
void state_redis_sentinel_failed(struct state_redis *r, const char *why)
{
    if (r->sasking < 0 || r->sanswered || r->sfail[0] != '\0')
        return; /* not asking, or its end is already known */
    util_copy(r->sfail, sizeof r->sfail, why);
    loop_timer_at(r->loop, &r->sentinel_timer, loop_now(r->loop));
}

static void sentinel_send(struct state_redis *r, enum op_kind kind, int argc, const char **argv)
{
    size_t lens[4];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    struct state_redis_op *op = state_redis_op_new(r, kind);
    if (op == NULL || r->sconn == NULL ||
        redisAsyncCommandArgv(r->sconn->ac, state_redis_on_reply, op, argc, argv, lens) != REDIS_OK) {
        free(op);
        state_redis_sentinel_failed(r, "cannot send to the Sentinel");
    }
}

/* Ask the Sentinel at position r->sasking of order, or the next one that
 * can be tried; when none is left, the question ends unanswered. */
static void sentinel_answer(struct state_redis *r, bool ok);

/* The Sentinel asked (at r->sasking) failed, r->sfail says why: counted,
 * kept for the log line of a question no Sentinel answers, and logged
 * once until it answers again. */
static void sentinel_one_failed(struct state_redis *r)
{
    int i = r->order[r->sasking];
    r->m.sentinel_failures++;
    char where[300];
    snprintf(where, sizeof where, "%s:%d", r->cfg.sentinels[i].host, r->cfg.sentinels[i].port);
    snprintf(r->swhy, sizeof r->swhy, "%s: %s", where, r->sfail);
    if (!r->sfail_logged[i]) {
        r->sfail_logged[i] = true;
        struct log_line ll;
        log_begin(&ll, LOG_LV_WARN, "redis_sentinel_failed");
        log_str(&ll, "sentinel", where);
        log_str(&ll, "master", r->cfg.master);
        log_str(&ll, "why", r->sfail);
        log_str(&ll, "msg", "the other Sentinels are asked");
        log_end(&ll);
    }
}

static void sentinel_try(struct state_redis *r)
{
    for (; r->sasking < r->cfg.nsentinels; r->sasking++) {
        int i = r->order[r->sasking];
        r->sfail[0] = '\0';
        r->sanswered = false;
        r->m.sentinel_asks++;
        if (!r->sip_ok[i]) {
            snprintf(r->sfail, sizeof r->sfail, "cannot resolve %.100s", r->cfg.sentinels[i].host);
            sentinel_one_failed(r);
            continue;
        }
        r->sconn = state_redis_rc_open_at(r, r->sip[i], r->cfg.sentinels[i].port, false, true);
        if (r->sconn == NULL) {
            util_copy(r->sfail, sizeof r->sfail, r->why);
            sentinel_one_failed(r);
            continue;
        }
        if (r->cfg.sentinel_password != NULL)
            sentinel_send(r, OP_S_AUTH, 2, (const char *[]){"AUTH", r->cfg.sentinel_password});
        sentinel_send(r, OP_S_ASK, 3, (const char *[]){"SENTINEL", "get-master-addr-by-name", r->cfg.master});
        if (r->sfail[0] == '\0')
            loop_timer_at(r->loop, &r->sentinel_timer, util_mono_ms() + STATE_REDIS_SENTINEL_MS);
        return;
    }
    sentinel_answer(r, false);
}

void state_redis_sentinel_ask(struct state_redis *r, bool for_join)
{
    if (r->sasking >= 0) { /* a question under way: its answer serves */
        r->sfor_join = r->sfor_join || for_join;
        return;
    }
    r->sfor_join = for_join;
    r->sasking = 0;
    r->swhy[0] = '\0';
    sentinel_try(r);
}

/* A Sentinel's reply (on its connection, inside hiredis; NULL: the
 * connection failed, errstr says why). */
void state_redis_sentinel_reply(struct state_redis *r, enum op_kind kind, const redisReply *x, const char *errstr)
{
    if (x == NULL) {
        state_redis_sentinel_failed(r, errstr[0] ? errstr : "connection lost");
        return;
    }
    if (x->type == REDIS_REPLY_ERROR) {
        if (strncmp(x->str, "WRONGPASS", 9) == 0 || (kind == OP_S_AUTH && strncmp(x->str, "ERR", 3) == 0))
            state_redis_sentinel_failed(r, "the password is refused (redis_sentinel_password_file)");
        else if (strncmp(x->str, "NOAUTH", 6) == 0)
            state_redis_sentinel_failed(r, "the Sentinel asks for a password (redis_sentinel_password_file)");
        else
            state_redis_sentinel_failed(r, x->str);
        return;
    }
    if (kind == OP_S_AUTH)
        return;
    const char *bad;
    if (x->type == REDIS_REPLY_NIL) {
        char why[160];
        snprintf(why, sizeof why, "the Sentinel does not know the master \"%s\"", r->cfg.master);
        state_redis_sentinel_failed(r, why);
    } else if (!reply_is(x, REDIS_REPLY_ARRAY) || x->elements != 2 || !reply_is(x->element[0], REDIS_REPLY_STRING) ||
               !reply_is(x->element[1], REDIS_REPLY_STRING)) {
        state_redis_sentinel_failed(r, "the Sentinel's answer is not an address and a port");
    } else if ((bad = state_redis_master_addr(x->element[0]->str, x->element[0]->len, x->element[1]->str,
                                              x->element[1]->len, r->sfound_ip, &r->sfound_port)) != NULL) {
        state_redis_sentinel_failed(r, bad);
    } else {
        r->sanswered = true;
        loop_timer_at(r->loop, &r->sentinel_timer, loop_now(r->loop));
    }
}

/* The Sentinel asked answered, failed, or took too long: on to the next,
 * or the end of the question. */
static void on_sentinel_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    if (r->sasking < 0)
        return;
    state_redis_sentinel_close(r);
    int i = r->order[r->sasking];
    if (r->sanswered) {
        r->sfail_logged[i] = false;
        state_redis_order_move(r->order, r->cfg.nsentinels, r->sasking, true);
        r->snamed_next = i;
        sentinel_answer(r, true);
        return;
    }
    if (r->sfail[0] == '\0')
        snprintf(r->sfail, sizeof r->sfail, "no answer within %d ms", STATE_REDIS_SENTINEL_MS);
    sentinel_one_failed(r);
    r->sasking++;
    sentinel_try(r);
}

/* The end of a question: ok, a Sentinel (r->snamed_next) named
 * r->sfound_ip:sfound_port. */
static void sentinel_answer(struct state_redis *r, bool ok)
{
    bool for_join = r->sfor_join;
    r->sasking = -1;
    r->sfor_join = false;
    if (for_join && r->phase == PH_JOINING) {
        if (!ok) {
            char why[600];
            snprintf(why, sizeof why, "no Sentinel named the master (the last: %s)", r->swhy);
            state_redis_went_down(r, why);
            return;
        }
        util_copy(r->ip, sizeof r->ip, r->sfound_ip);
        r->port = r->sfound_port;
        r->ip_ok = true;
        r->snamed = r->snamed_next;
        state_redis_join_connect(r);
        return;
    }
    if (r->phase != PH_UP)
        return;
    loop_timer_at(r->loop, &r->scheck_timer, util_mono_ms() + STATE_REDIS_SENTINEL_CHECK_MS);
    if (ok && (strcmp(r->sfound_ip, r->ip) != 0 || r->sfound_port != r->port)) {
        char why[300];
        snprintf(why, sizeof why, "the Sentinels name another master: %s:%d", r->sfound_ip, r->sfound_port);
        state_redis_went_down(r, why);
        loop_timer_at(r->loop, &r->retry_timer, util_mono_ms()); /* join the new one now */
    }
}

/* While up: is the master still the one the Sentinels name? */
static void on_scheck_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    if (r->phase == PH_UP && !r->stopping)
        state_redis_sentinel_ask(r, false);
}

/* From a callback: the address a Sentinel named answered ROLE with
 * something else than master (a replica): not used; the Sentinel goes to
 * the back of the order (the next question asks another first). */
void state_redis_not_a_master(struct state_redis *r, const redisReply *x)
{
    char role[40] = "?", addr[sizeof r->not_master];
    if (reply_is(x, REDIS_REPLY_ARRAY) && x->elements >= 1 && reply_is(x->element[0], REDIS_REPLY_STRING))
        snprintf(role, sizeof role, "%.30s", x->element[0]->str);
    snprintf(addr, sizeof addr, "%s:%d", r->ip, r->port);
    if (strcmp(addr, r->not_master) != 0) { /* once per address, not every second */
        util_copy(r->not_master, sizeof r->not_master, addr);
        struct log_line l;
        log_begin(&l, LOG_LV_WARN, "redis_not_master");
        state_redis_log_where(r, &l);
        log_str(&l, "role", role);
        log_str(&l, "msg", "the address the Sentinel named is not a master: not used; the Sentinels are asked again");
        log_end(&l);
    }
    int k = 0;
    while (k < r->cfg.nsentinels && r->order[k] != r->snamed)
        k++;
    state_redis_order_move(r->order, r->cfg.nsentinels, k, false);
    char why[80];
    snprintf(why, sizeof why, "ROLE says %s, not master", role);
    state_redis_went_down(r, why);
}

void state_redis_sentinel_timers_init(struct state_redis *r)
{
    loop_timer_init(&r->sentinel_timer, on_sentinel_timer, r);
    loop_timer_init(&r->scheck_timer, on_scheck_timer, r);
}
