/* state_redis_check.c - see state_redis_check.h. */
#include "state_redis_check.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

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
static int run(redisContext *ctx, const struct config_redis *r, int64_t deadline, int timeout_ms, int argc,
               const char **argv, const char *name, char *why, size_t whylen)
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
    size_t lens[2];
    for (int i = 0; i < argc; i++)
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
        quote_reply(s, len, r->password, text, sizeof text);
        if (transient(s, len)) {
            snprintf(why, whylen, "not ready: %s answered %s", name, text);
            rc = STATE_REDIS_CHECK_UNREACHABLE;
        } else if (starts_with(s, len, "NOAUTH") && r->password == NULL) {
            snprintf(why, whylen, "%s refused: %s (Redis asks for a password: give redis_password_file)", name, text);
            rc = STATE_REDIS_CHECK_REFUSED;
        } else if (strcmp(argv[0], "AUTH") == 0) {
            snprintf(why, whylen, "AUTH refused (the password of redis_password_file): %s", text);
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
    freeReplyObject(rep);
    return rc;
}

static int probe(const struct config_redis *r, int timeout_ms, char *why, size_t whylen)
{
    int64_t deadline = util_mono_ms() + timeout_ms;
    redisContext *ctx = r->unix_socket ? redisConnectUnixWithTimeout(r->path, tv_of(timeout_ms))
                                       : redisConnectWithTimeout(r->host, r->port, tv_of(timeout_ms));
    if (ctx == NULL) {
        snprintf(why, whylen, "cannot connect: out of memory");
        return STATE_REDIS_CHECK_UNREACHABLE;
    }
    if (ctx->err) {
        snprintf(why, whylen, "cannot connect: %s", ctx->errstr[0] ? ctx->errstr : "unknown error");
        redisFree(ctx);
        return STATE_REDIS_CHECK_UNREACHABLE;
    }
    int rc = STATE_REDIS_CHECK_OK;
    if (r->password != NULL) {
        const char *argv[] = {"AUTH", r->password};
        rc = run(ctx, r, deadline, timeout_ms, 2, argv, "AUTH", why, whylen);
    }
    if (rc == STATE_REDIS_CHECK_OK && r->db != 0) {
        char db[16], name[24];
        snprintf(db, sizeof db, "%d", r->db);
        snprintf(name, sizeof name, "SELECT %d", r->db);
        const char *argv[] = {"SELECT", db};
        rc = run(ctx, r, deadline, timeout_ms, 2, argv, name, why, whylen);
    }
    if (rc == STATE_REDIS_CHECK_OK) {
        const char *argv[] = {"PING"};
        rc = run(ctx, r, deadline, timeout_ms, 1, argv, "PING", why, whylen);
    }
    redisFree(ctx); /* its buffers (the AUTH command among them) are freed, not wiped: the process is not dumpable */
    return rc;
}

int state_redis_check(const struct config_redis *r, int timeout_ms, char *why, size_t whylen)
{
    if (whylen > 0)
        why[0] = '\0';
    if (!r->on) {
        snprintf(why, whylen, "no redis is configured");
        return STATE_REDIS_CHECK_UNREACHABLE;
    }
    if (timeout_ms < 1)
        timeout_ms = 1;
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
    int rc = probe(r, timeout_ms, why, whylen);
    if (!was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == STATE_REDIS_CHECK_OK && whylen > 0)
        why[0] = '\0';
    return rc;
}
