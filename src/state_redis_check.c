/* state_redis_check.c - see state_redis_check.h. */
#include "state_redis_check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "state_redis_msg.h"
#include "util.h"

static struct timeval tv_of(int64_t ms)
{
    if (ms < 1)
        ms = 1;
    struct timeval tv = {.tv_sec = (time_t)(ms / 1000), .tv_usec = (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

/* A reply's text for a message: at most 200 bytes, unprintable bytes as
 * '?', and nothing at all when it holds the password. */
static void quote_reply(const char *text, size_t len, const char *password, char *out, size_t outlen)
{
    if (outlen == 0)
        return;
    if (password != NULL && *password != '\0' && memmem(text, len, password, strlen(password)) != NULL) {
        snprintf(out, outlen, "(the reply is not shown: it quotes the password)");
        return;
    }
    size_t n = len < 200 ? len : 200;
    if (n >= outlen)
        n = outlen - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)text[i];
        out[i] = ch >= ' ' && ch < 0x7f ? (char)ch : '?';
    }
    out[n] = '\0';
}

static bool starts_with(const char *s, size_t len, const char *word)
{
    size_t w = strlen(word);
    return len >= w && memcmp(s, word, w) == 0;
}

/* An error reply that says "try again later" rather than "no". */
static bool transient(const char *s, size_t len)
{
    return starts_with(s, len, "LOADING") || starts_with(s, len, "BUSY") || starts_with(s, len, "MASTERDOWN") ||
           starts_with(s, len, "TRYAGAIN") || starts_with(s, len, "CLUSTERDOWN");
}

/* One command; its verdict (STATE_REDIS_CHECK_*) with the reason in why.
 * `name` is the command as messages show it ("AUTH", "SELECT 3"). */
static int run(redisContext *ctx, const char *password, const char *pwkey, int64_t deadline, int timeout_ms,
               int argc, const char **argv, const char *name, redisReply **keep, char *why, size_t whylen)
{
    int64_t left = deadline - util_mono_ms();
    if (left <= 0) {
        snprintf(why, whylen, "no answer to %s within %d ms", name, timeout_ms);
        return STATE_REDIS_CHECK_UNREACHABLE;
    }
    if (redisSetTimeout(ctx, tv_of(left)) != REDIS_OK) {
        snprintf(why, whylen, "cannot set a timeout: %s", ctx->errstr);
        return STATE_REDIS_CHECK_UNREACHABLE;
    }
    size_t lens[4];
    for (int i = 0; i < argc && i < 4; i++)
        lens[i] = strlen(argv[i]);
    errno = 0;
    redisReply *rep = redisCommandArgv(ctx, argc, argv, lens);
    int err = errno;
    if (rep == NULL) {
        if (ctx->err == REDIS_ERR_IO && (err == EAGAIN || err == EWOULDBLOCK || err == ETIMEDOUT))
            snprintf(why, whylen, "no answer to %s within %d ms", name, timeout_ms);
        else if (ctx->err == REDIS_ERR_EOF)
            snprintf(why, whylen, "the connection was closed at %s", name);
        else if (ctx->err == REDIS_ERR_PROTOCOL)
            snprintf(why, whylen, "the answer to %s is not Redis's protocol: %s", name, ctx->errstr);
        else
            snprintf(why, whylen, "%s failed: %s", name, ctx->errstr[0] ? ctx->errstr : "no answer");
        return STATE_REDIS_CHECK_UNREACHABLE;
    }
    int rc = STATE_REDIS_CHECK_OK;
    if (rep->type == REDIS_REPLY_ERROR) {
        const char *s = rep->str ? rep->str : "";
        size_t len = rep->str ? rep->len : 0;
        char text[256];
        quote_reply(s, len, password, text, sizeof text);
        if (transient(s, len)) {
            snprintf(why, whylen, "not ready: %s answered %s", name, text);
            rc = STATE_REDIS_CHECK_UNREACHABLE;
        } else if (starts_with(s, len, "NOAUTH") && password == NULL) {
            snprintf(why, whylen, "%s refused: %s (it asks for a password: give %s)", name, text, pwkey);
            rc = STATE_REDIS_CHECK_REFUSED;
        } else if (strcmp(argv[0], "AUTH") == 0) {
            snprintf(why, whylen, "AUTH refused (the password of %s): %s", pwkey, text);
            rc = STATE_REDIS_CHECK_REFUSED;
        } else {
            snprintf(why, whylen, "%s refused: %s", name, text);
            rc = STATE_REDIS_CHECK_REFUSED;
        }
    } else if (strcmp(argv[0], "PING") == 0 &&
               !(rep->type == REDIS_REPLY_STATUS && rep->str != NULL && strcmp(rep->str, "PONG") == 0)) {
        snprintf(why, whylen, "the answer to PING is not PONG: not a Redis?");
        rc = STATE_REDIS_CHECK_UNREACHABLE;
    }
    if (keep != NULL && rc == STATE_REDIS_CHECK_OK)
        *keep = rep;
    else
        freeReplyObject(rep);
    return rc;
}

/* Connect to host:port (host NULL: r's Unix socket) within timeout_ms. */
static redisContext *connect_to(const struct config_redis *r, const char *host, int port, int timeout_ms, char *why,
                                size_t whylen)
{
    redisContext *ctx = host == NULL ? redisConnectUnixWithTimeout(r->path, tv_of(timeout_ms))
                                     : redisConnectWithTimeout(host, port, tv_of(timeout_ms));
    if (ctx == NULL) {
        snprintf(why, whylen, "cannot connect: out of memory");
        return NULL;
    }
    if (ctx != NULL && ctx->err) {
        snprintf(why, whylen, "cannot connect: %s", ctx->errstr[0] ? ctx->errstr : "unknown error");
        redisFree(ctx);
        return NULL;
    }
    return ctx;
}

/* The Redis at host:port (NULL: r's socket): AUTH, SELECT, PING, and with
 * Sentinels ROLE, whose first word goes to role (capacity 16). */
static int probe(const struct config_redis *r, const char *host, int port, int timeout_ms, char *role, char *why,
                 size_t whylen)
{
    int64_t deadline = util_mono_ms() + timeout_ms;
    redisContext *ctx = connect_to(r, host, port, timeout_ms, why, whylen);
    if (ctx == NULL)
        return STATE_REDIS_CHECK_UNREACHABLE;
    int rc = STATE_REDIS_CHECK_OK;
    const char *pwkey = "redis_password_file";
    if (r->password != NULL) {
        const char *argv[] = {"AUTH", r->password};
        rc = run(ctx, r->password, pwkey, deadline, timeout_ms, 2, argv, "AUTH", NULL, why, whylen);
    }
    if (rc == STATE_REDIS_CHECK_OK && r->db != 0) {
        char db[16], name[24];
        snprintf(db, sizeof db, "%d", r->db);
        snprintf(name, sizeof name, "SELECT %d", r->db);
        const char *argv[] = {"SELECT", db};
        rc = run(ctx, r->password, pwkey, deadline, timeout_ms, 2, argv, name, NULL, why, whylen);
    }
    if (rc == STATE_REDIS_CHECK_OK) {
        const char *argv[] = {"PING"};
        rc = run(ctx, r->password, pwkey, deadline, timeout_ms, 1, argv, "PING", NULL, why, whylen);
    }
    redisReply *x = NULL;
    if (rc == STATE_REDIS_CHECK_OK && role != NULL) {
        const char *argv[] = {"ROLE"};
        rc = run(ctx, r->password, pwkey, deadline, timeout_ms, 1, argv, "ROLE", &x, why, whylen);
        snprintf(role, 16, "%.15s",
                 x != NULL && x->type == REDIS_REPLY_ARRAY && x->elements > 0 &&
                         x->element[0]->type == REDIS_REPLY_STRING
                     ? x->element[0]->str
                     : "?");
        if (x != NULL)
            freeReplyObject(x);
    }
    redisFree(ctx); /* its buffers (the AUTH command among them) are freed, not wiped: the process is not dumpable */
    return rc;
}

/* Sentinel i of r: AUTH (its password), SENTINEL get-master-addr-by-name. */
static int ask_sentinel(const struct config_redis *r, int i, int timeout_ms, char *ip, size_t iplen, int *port,
                        char *why, size_t whylen)
{
    int64_t deadline = util_mono_ms() + timeout_ms;
    redisContext *ctx = connect_to(r, r->sentinels[i].host, r->sentinels[i].port, timeout_ms, why, whylen);
    if (ctx == NULL)
        return STATE_REDIS_CHECK_UNREACHABLE;
    const char *pw = r->sentinel_password, *pwkey = "redis_sentinel_password_file";
    int rc = STATE_REDIS_CHECK_OK;
    if (pw != NULL)
        rc = run(ctx, pw, pwkey, deadline, timeout_ms, 2, (const char *[]){"AUTH", pw}, "AUTH", NULL, why, whylen);
    redisReply *x = NULL;
    if (rc == STATE_REDIS_CHECK_OK)
        rc = run(ctx, pw, pwkey, deadline, timeout_ms, 3,
                 (const char *[]){"SENTINEL", "get-master-addr-by-name", r->master}, "SENTINEL get-master-addr-by-name",
                 &x, why, whylen);
    if (rc == STATE_REDIS_CHECK_OK) {
        if (x->type == REDIS_REPLY_NIL) {
            snprintf(why, whylen, "the Sentinel does not know the master \"%s\" (sentinel monitor %s ...)", r->master,
                     r->master);
            rc = STATE_REDIS_CHECK_REFUSED;
        } else if (x->type != REDIS_REPLY_ARRAY || x->elements != 2 || x->element[0]->type != REDIS_REPLY_STRING ||
                   x->element[1]->type != REDIS_REPLY_STRING) {
            snprintf(why, whylen, "the answer to SENTINEL get-master-addr-by-name is not an address and a port: "
                                  "not a Sentinel?");
            rc = STATE_REDIS_CHECK_UNREACHABLE;
        } else {
            char a[STATE_REDIS_ADDR_MAX];
            const char *bad = state_redis_master_addr(x->element[0]->str, x->element[0]->len, x->element[1]->str,
                                                      x->element[1]->len, a, port);
            if (bad != NULL) {
                snprintf(why, whylen, "%s", bad);
                rc = STATE_REDIS_CHECK_REFUSED;
            } else {
                util_copy(ip, iplen, a);
            }
        }
    }
    if (x != NULL)
        freeReplyObject(x);
    redisFree(ctx);
    return rc;
}

static int with_sigpipe_blocked(int (*fn)(void *), void *arg)
{
    /* a write to a connection Redis closed raises SIGPIPE in this thread:
     * blocked here, discarded below */
    sigset_t pipe, old;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    bool was_pending = false;
    sigset_t pending;
    if (sigpending(&pending) == 0)
        was_pending = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &old);
    int rc = fn(arg);
    if (!was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

struct master_job {
    const struct config_redis *r;
    int timeout_ms;
    char *ip;
    size_t iplen;
    int *port, *which;
    FILE *out;
    char *why;
    size_t whylen;
};

static int master_run(void *arg)
{
    struct master_job *j = arg;
    const struct config_redis *r = j->r;
    int worst = STATE_REDIS_CHECK_OK;
    bool found = false;
    char why[600] = "";
    *j->which = -1;
    for (int i = 0; i < r->nsentinels && (j->out != NULL || !found); i++) {
        char ip[INET6_ADDRSTRLEN + 1], sw[600] = "";
        int port = 0;
        int rc = ask_sentinel(r, i, j->timeout_ms, ip, sizeof ip, &port, sw, sizeof sw);
        bool v6 = strchr(r->sentinels[i].host, ':') != NULL;
        if (rc == STATE_REDIS_CHECK_OK) {
            if (j->out != NULL)
                fprintf(j->out, "kembali: redis Sentinel %s%s%s:%d: master %s is %s:%d\n", v6 ? "[" : "",
                        r->sentinels[i].host, v6 ? "]" : "", r->sentinels[i].port, r->master, ip, port);
            if (!found) {
                found = true;
                util_copy(j->ip, j->iplen, ip);
                *j->port = port;
                *j->which = i;
            }
            continue;
        }
        snprintf(why, sizeof why, "Sentinel %s%s%s:%d: %s", v6 ? "[" : "", r->sentinels[i].host, v6 ? "]" : "",
                 r->sentinels[i].port, sw);
        if (j->out != NULL)
            fprintf(j->out, "kembali: %s: redis %s\n", rc == STATE_REDIS_CHECK_REFUSED ? "error" : "warning", why);
        if (rc > worst)
            worst = rc;
    }
    if (!found) {
        snprintf(j->why, j->whylen, "no Sentinel named the master %s (the last: %s)", r->master, why);
        return worst == STATE_REDIS_CHECK_OK ? STATE_REDIS_CHECK_UNREACHABLE : worst;
    }
    if (worst != STATE_REDIS_CHECK_OK)
        snprintf(j->why, j->whylen, "%s", why);
    return worst;
}

int state_redis_sentinel_master(const struct config_redis *r, int timeout_ms, char *ip, size_t iplen, int *port,
                                int *which, FILE *out, char *why, size_t whylen)
{
    if (whylen > 0)
        why[0] = '\0';
    struct master_job j = {r, timeout_ms < 1 ? 1 : timeout_ms, ip, iplen, port, which, out, why, whylen};
    if (!r->on || !r->sentinel) {
        snprintf(why, whylen, "no Sentinels are configured");
        return STATE_REDIS_CHECK_UNREACHABLE;
    }
    return with_sigpipe_blocked(master_run, &j);
}

struct probe_job {
    const struct config_redis *r;
    const char *host;
    int port, timeout_ms;
    char *role, *why;
    size_t whylen;
};

static int probe_run(void *arg)
{
    struct probe_job *j = arg;
    return probe(j->r, j->host, j->port, j->timeout_ms, j->role, j->why, j->whylen);
}

int state_redis_check_master(const struct config_redis *r, const char *ip, int port, int timeout_ms, char *role,
                             char *why, size_t whylen)
{
    if (whylen > 0)
        why[0] = '\0';
    struct probe_job j = {r, ip, port, timeout_ms < 1 ? 1 : timeout_ms, role, why, whylen};
    int rc = with_sigpipe_blocked(probe_run, &j);
    if (rc == STATE_REDIS_CHECK_OK && whylen > 0)
        why[0] = '\0';
    return rc;
}

int state_redis_check(const struct config_redis *r, int timeout_ms, char *why, size_t whylen)
{
    if (whylen > 0)
        why[0] = '\0';
    if (!r->on || r->sentinel) {
        snprintf(why, whylen, r->on ? "the master is asked of the Sentinels (state_redis_sentinel_master)"
                                    : "no redis is configured");
        return STATE_REDIS_CHECK_UNREACHABLE;
    }
    return state_redis_check_master(r, r->unix_socket ? NULL : r->host, r->port, timeout_ms, NULL, why, whylen);
}
