/* kasera.c - see kasera.h. */
#include "kasera.h"

#include <curl/curl.h>
#include <sys/epoll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "dev"
#endif

struct kasera_client {
    CURLM *multi;
    struct loop *loop;
    struct loop_timer timer;   /* libcurl's timeout */
    kasera_done_fn *done;
    void *ctx;
    int active;                          /* transfers under way (at most KASERA_READS_MAX) */
    struct kasera_read *qhead, *qtail;   /* reads waiting their turn, oldest first */
};

/* One socket libcurl asked us to watch (curl_multi_assign'ed to it). */
struct kasera_sock {
    struct loop_io io;
    struct kasera_client *c;
};

static void check_done(struct kasera_client *c);

static void on_sock_event(struct loop *l, struct loop_io *io, uint32_t events)
{
    struct kasera_sock *ks = io->data;
    struct kasera_client *c = ks->c;
    int flags = 0, running;
    (void)l;
    if (events & (EPOLLIN | EPOLLHUP))
        flags |= CURL_CSELECT_IN;
    if (events & EPOLLOUT)
        flags |= CURL_CSELECT_OUT;
    if (events & EPOLLERR)
        flags |= CURL_CSELECT_ERR;
    curl_multi_socket_action(c->multi, io->fd, flags, &running); /* may free ks */
    check_done(c);
}

static void on_timer(struct loop *l, struct loop_timer *t)
{
    struct kasera_client *c = t->data;
    int running;
    (void)l;
    curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    check_done(c);
}

/* CURLMOPT_SOCKETFUNCTION: watch s as libcurl says. */
static int on_socket(CURL *e, curl_socket_t s, int what, void *userp, void *socketp)
{
    struct kasera_client *c = userp;
    struct kasera_sock *ks = socketp;
    (void)e;
    if (what == CURL_POLL_REMOVE) {
        if (ks != NULL) {
            loop_io_set(c->loop, &ks->io, 0);
            curl_multi_assign(c->multi, s, NULL);
            free(ks);
        }
        return 0;
    }
    if (ks == NULL) {
        ks = calloc(1, sizeof *ks);
        if (ks == NULL)
            return -1; /* libcurl fails that transfer */
        ks->c = c;
        loop_io_init(&ks->io, s, on_sock_event, ks);
        ks->io.bulk = true; /* a read's end can wait a turn behind a cached answer */
        curl_multi_assign(c->multi, s, ks);
    }
    uint32_t ev = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0);
    return loop_io_set(c->loop, &ks->io, ev) == 0 ? 0 : -1;
}

/* CURLMOPT_TIMERFUNCTION: one timer for the whole multi handle. */
static int on_curl_timer(CURLM *m, long timeout_ms, void *userp)
{
    struct kasera_client *c = userp;
    (void)m;
    if (timeout_ms < 0) {
        loop_timer_stop(c->loop, &c->timer);
        return 0;
    }
    return loop_timer_at(c->loop, &c->timer, util_mono_ms() + timeout_ms) == 0 ? 0 : -1;
}

struct kasera_client *kasera_new(struct loop *l, kasera_done_fn *done, void *ctx)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return NULL;
    struct kasera_client *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->multi = curl_multi_init();
    if (c->multi == NULL) {
        free(c);
        return NULL;
    }
    c->loop = l;
    c->done = done;
    c->ctx = ctx;
    loop_timer_init(&c->timer, on_timer, c);
    curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS, (long)KASERA_READS_MAX);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
    return c;
}

void kasera_free(struct kasera_client *c)
{
    if (c == NULL)
        return;
    curl_multi_cleanup(c->multi); /* closes its sockets: on_socket frees their watchers */
    loop_timer_stop(c->loop, &c->timer);
    free(c);
    curl_global_cleanup();
}

_Static_assert(sizeof((struct kasera_headers *)0)->curl_error >= CURL_ERROR_SIZE, "libcurl's error buffer size");

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    struct kasera_read *r = ud;
    size_t len = size * n;
    if (r->body_len + len > KASERA_BODY_MAX) {
        r->too_big = 1;
        return 0; /* aborts the transfer */
    }
    char *nb = realloc(r->body, r->body_len + len + 1);
    if (nb == NULL)
        return 0;
    r->body = nb;
    memcpy(r->body + r->body_len, p, len);
    r->body_len += len;
    r->body[r->body_len] = '\0';
    return len;
}

/* Copy the value of header `name` from line `p` (len bytes) into dst. */
static void take_header(const char *p, size_t len, const char *name, char *dst, size_t cap)
{
    size_t nl = strlen(name);
    if (len <= nl || strncasecmp(p, name, nl) != 0 || p[nl] != ':')
        return;
    p += nl + 1;
    len -= nl + 1;
    while (len > 0 && (*p == ' ' || *p == '\t'))
        p++, len--;
    while (len > 0 && (p[len - 1] == '\r' || p[len - 1] == '\n' || p[len - 1] == ' '))
        len--;
    size_t n = 0;
    for (size_t i = 0; i < len && n + 1 < cap; i++)
        if ((unsigned char)p[i] >= ' ' && (unsigned char)p[i] < 0x7f)
            dst[n++] = p[i];
    dst[n] = '\0';
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
    struct kasera_read *r = ud;
    size_t len = size * n;
    if (len > 5 && strncmp(p, "HTTP/", 5) == 0) {
        /* a new response (e.g. after 100 Continue): forget earlier headers */
        struct kasera_headers *h = r->hdr;
        h->retry_after[0] = h->rl_limit[0] = h->rl_remaining[0] = h->rl_reset[0] = '\0';
        h->rl_sf[0] = h->rl_policy[0] = '\0';
        return len;
    }
    struct kasera_headers *h = r->hdr;
    take_header(p, len, "Retry-After", h->retry_after, sizeof h->retry_after);
    take_header(p, len, "RateLimit-Limit", h->rl_limit, sizeof h->rl_limit);
    take_header(p, len, "RateLimit-Remaining", h->rl_remaining, sizeof h->rl_remaining);
    take_header(p, len, "RateLimit-Reset", h->rl_reset, sizeof h->rl_reset);
    take_header(p, len, "RateLimit", h->rl_sf, sizeof h->rl_sf);
    take_header(p, len, "RateLimit-Policy", h->rl_policy, sizeof h->rl_policy);
    return len;
}

/* Called before each send of the request; a second call is libcurl's
 * automatic resend, refused (see kasera.h). */
static int on_prereq(void *ud, char *conn_primary_ip, char *conn_local_ip, int conn_primary_port,
                     int conn_local_port)
{
    struct kasera_read *r = ud;
    (void)conn_primary_ip, (void)conn_local_ip, (void)conn_primary_port, (void)conn_local_port;
    if (++r->sends > 1) {
        util_copy(r->error, sizeof r->error, "connection lost before any answer; not resent");
        return CURL_PREREQFUNC_ABORT;
    }
    r->sent = util_mono_ms();
    return CURL_PREREQFUNC_OK;
}

static void wipe_headers(struct kasera_read *r)
{
    for (struct curl_slist *h = r->headers; h != NULL; h = h->next)
        explicit_bzero(h->data, strlen(h->data));
    curl_slist_free_all(r->headers);
    r->headers = NULL;
}

static int start_now(struct kasera_client *c, struct kasera_read *r, const char *api_base, const char *id,
                     const char *key, long timeout_ms);

static void queue_unlink(struct kasera_client *c, struct kasera_read *r)
{
    if (r->q_prev)
        r->q_prev->q_next = r->q_next;
    else
        c->qhead = r->q_next;
    if (r->q_next)
        r->q_next->q_prev = r->q_prev;
    else
        c->qtail = r->q_prev;
    r->q_prev = r->q_next = NULL;
    r->queued = 0;
}

/* Start the reads waiting their turn while there is room; one whose time
 * ran out while it waited ends unsent. */
static void queue_pump(struct kasera_client *c)
{
    while (c->active < KASERA_READS_MAX && c->qhead != NULL) {
        struct kasera_read *r = c->qhead;
        queue_unlink(c, r);
        long left = r->q_timeout - (long)(util_mono_ms() - r->q_since);
        if (left <= 0)
            util_copy(r->error, sizeof r->error, "no connection free within the read's timeout; not sent");
        if (left <= 0 || start_now(c, r, r->q_base, r->q_id, r->q_key, left) != 0)
            c->done(c->ctx, r); /* may start or queue reads: the loop looks again */
    }
}

int kasera_start(struct kasera_client *c, struct kasera_read *r, const char *api_base,
                 const char *id, const char *key, long timeout_ms)
{
    if (c->active < KASERA_READS_MAX && c->qhead == NULL)
        return start_now(c, r, api_base, id, key, timeout_ms);
    r->http = 0;
    r->body = NULL;
    r->body_len = 0;
    r->error[0] = '\0';
    r->connects = 0;
    r->sends = 0;
    r->sent = 0;
    r->easy = r->headers = NULL;
    r->q_base = api_base;
    r->q_id = id;
    r->q_key = key;
    r->q_timeout = timeout_ms;
    r->q_since = util_mono_ms();
    r->queued = 1;
    r->q_next = NULL;
    r->q_prev = c->qtail;
    if (c->qtail)
        c->qtail->q_next = r;
    else
        c->qhead = r;
    c->qtail = r;
    return 0;
}

static int start_now(struct kasera_client *c, struct kasera_read *r, const char *api_base, const char *id,
                     const char *key, long timeout_ms)
{
    char url[1024], auth[300];
    r->http = 0;
    r->body = NULL;
    r->body_len = 0;
    r->too_big = 0;
    r->error[0] = '\0';
    r->connects = 0;
    r->sends = 0;
    r->sent = 0;
    r->headers = NULL;

    if ((size_t)snprintf(url, sizeof url, "%s/v1/transactions/%s", api_base, id) >= sizeof url) {
        util_copy(r->error, sizeof r->error, "URL too long");
        return -1;
    }
    if (r->hdr == NULL && (r->hdr = malloc(sizeof *r->hdr)) == NULL) {
        util_copy(r->error, sizeof r->error, "out of memory");
        return -1;
    }
    memset(r->hdr, 0, sizeof *r->hdr);
    CURL *e = curl_easy_init();
    if (e == NULL) {
        util_copy(r->error, sizeof r->error, "curl_easy_init failed");
        return -1;
    }
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    struct curl_slist *h = curl_slist_append(NULL, auth);
    explicit_bzero(auth, sizeof auth);
    struct curl_slist *h2 = h ? curl_slist_append(h, "Accept: application/json") : NULL;
    if (h2 == NULL) {
        curl_slist_free_all(h);
        curl_easy_cleanup(e);
        util_copy(r->error, sizeof r->error, "out of memory");
        return -1;
    }
    r->headers = h2;
    r->easy = e;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h2);
    curl_easy_setopt(e, CURLOPT_USERAGENT, "kembali/" PACKAGE_VERSION);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(e, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(e, CURLOPT_MAXFILESIZE, (long)KASERA_BODY_MAX);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->hdr->curl_error);
    curl_easy_setopt(e, CURLOPT_PRIVATE, r);
    curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, r);
    curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
    if (curl_multi_add_handle(c->multi, e) != CURLM_OK) {
        wipe_headers(r);
        curl_easy_cleanup(e);
        r->easy = NULL;
        util_copy(r->error, sizeof r->error, "curl_multi_add_handle failed");
        return -1;
    }
    c->active++;
    return 0;
}

/* Hand every finished read to the done callback. */
static void check_done(struct kasera_client *c)
{
    int left;
    CURLMsg *m;
    while ((m = curl_multi_info_read(c->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE)
            continue;
        CURL *e = m->easy_handle;
        CURLcode rc = m->data.result;
        struct kasera_read *r = NULL;
        curl_easy_getinfo(e, CURLINFO_PRIVATE, (char **)&r);
        long code = 0;
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
        curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &r->connects);
        if (rc != CURLE_OK) {
            r->http = 0; /* a partial answer is no answer */
            if (r->too_big)
                util_copy(r->error, sizeof r->error, "answer larger than 64 KiB");
            else if (r->sends > 1)
                util_copy(r->error, sizeof r->error, "connection lost before any answer; not resent");
            else if (r->error[0] == '\0')
                util_copy(r->error, sizeof r->error,
                          r->hdr->curl_error[0] != '\0' ? r->hdr->curl_error : curl_easy_strerror(rc));
        } else {
            r->http = code;
        }
        curl_multi_remove_handle(c->multi, e);
        curl_easy_cleanup(e);
        wipe_headers(r);
        r->easy = NULL;
        c->active--;
        c->done(c->ctx, r);
    }
    queue_pump(c);
}

void kasera_response(const struct kasera_read *r, struct api_response *out)
{
    memset(out, 0, sizeof *out);
    out->http = r->http;
    out->body = r->body;
    out->body_len = r->body_len;
    const struct kasera_headers *h = r->hdr;
    if (h == NULL)
        return;
    out->retry_after = h->retry_after[0] ? h->retry_after : NULL;
    out->rl_limit = h->rl_limit[0] ? h->rl_limit : NULL;
    out->rl_remaining = h->rl_remaining[0] ? h->rl_remaining : NULL;
    out->rl_reset = h->rl_reset[0] ? h->rl_reset : NULL;
    out->rl_sf = h->rl_sf[0] ? h->rl_sf : NULL;
    out->rl_policy = h->rl_policy[0] ? h->rl_policy : NULL;
}

const char *kasera_retry_after(const struct kasera_read *r)
{
    return r->hdr != NULL ? r->hdr->retry_after : "";
}

void kasera_abort(struct kasera_client *c, struct kasera_read *r)
{
    if (r->queued) {
        queue_unlink(c, r);
        return;
    }
    if (r->easy == NULL)
        return;
    curl_multi_remove_handle(c->multi, r->easy);
    curl_easy_cleanup(r->easy);
    wipe_headers(r);
    r->easy = NULL;
    c->active--;
}

void kasera_read_clear(struct kasera_read *r)
{
    free(r->body);
    r->body = NULL;
    r->body_len = 0;
    free(r->hdr);
    r->hdr = NULL;
}
