/* front.c - see front.h. */
#define NO_FCGI_DEFINES 1
#include "front.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "notify.h"
#include "resolver.h"
#include "util.h"

#define FRONT_MAX_THREADS 16

static pthread_t threads[FRONT_MAX_THREADS];
static int nthreads_started;
static int wake_pipe[2] = {-1, -1};

static const char csp[] =
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

static void put_all(struct req *r, const char *s, size_t n)
{
    if (n > 0 && FCGX_PutStr(s, (int)n, r->fcgx.out) < 0)
        errno = 0; /* the client went away; nothing to do */
}

/* Close the connection without libfcgi's lingering close, which may wait
 * two seconds for the peer: shut down our side and close. stdin was read
 * to its end when the request was parsed, so no RST is provoked. */
static void finish(struct req *r)
{
    FCGX_FClose(r->fcgx.err);
    FCGX_FClose(r->fcgx.out);
    int fd = r->fcgx.ipcFd;
    r->fcgx.ipcFd = -1;
    FCGX_Free(&r->fcgx, 0);
    if (fd >= 0) {
        shutdown(fd, SHUT_WR);
        close(fd);
    }
}

static const char *http_reason(int code)
{
    switch (code) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 503: return "Service Unavailable";
    default: return "OK";
    }
}

/* Write a complete response: the headers every answer carries, then body. */
static void write_response(struct req *r, int http, const char *word, const char *ctype,
                           long retry_after, const char *extra, const struct buf *body)
{
    struct buf h = {0};
    buf_printf(&h, "Status: %d %s\r\n", http, http_reason(http));
    buf_printf(&h, "Content-Type: %s\r\n", ctype);
    if (word != NULL)
        buf_printf(&h, "Kembali-Status: %s\r\n", word);
    buf_puts(&h, "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                 "Referrer-Policy: no-referrer\r\nX-Frame-Options: DENY\r\n");
    buf_printf(&h, "Content-Security-Policy: %s\r\n", csp);
    if (retry_after >= 0)
        buf_printf(&h, "Retry-After: %ld\r\n", retry_after);
    if (r->origin != NULL) {
        buf_puts(&h, "Access-Control-Allow-Origin: ");
        buf_puts(&h, r->origin);
        buf_puts(&h, "\r\nVary: Origin\r\nAccess-Control-Expose-Headers: Kembali-Status, Retry-After\r\n");
    }
    if (extra != NULL)
        buf_puts(&h, extra);
    if (http != 204) /* a 204 has no body and no Content-Length */
        buf_printf(&h, "Content-Length: %zu\r\n", body->len);
    buf_puts(&h, "\r\n");
    put_all(r, h.p, h.len);
    if (!r->head)
        put_all(r, body->p, body->len);
    buf_free(&h);
}

static void log_request(struct req *r, int http, const char *word, bool held)
{
    /* both clocks read back to back, so that ts minus ms is the arrival */
    long long ms = (long long)(util_mono_ms() - r->arrived);
    struct log_line l;
    log_begin(&l, "info", "request");
    log_str(&l, "shop", r->shop ? r->shop->id : NULL);
    log_str(&l, "id", r->id[0] ? r->id : NULL);
    log_str(&l, "format", r->json ? "json" : "html");
    log_str(&l, "word", word);
    log_int(&l, "http", http);
    log_int(&l, "ms", ms);
    if (held)
        log_str(&l, "held", "yes");
    log_end(&l);
}

static void free_req(struct req *r)
{
    config_unref(r->cfg);
    free(r);
}

/* Render and write `ans` with HTTP status `http` and optional extra
 * header lines, count and log it, and release the request. */
static void respond(struct app *a, struct req *r, const struct answer *ans, int http, const char *extra)
{
    struct buf body = {0};
    const char *word = word_name(ans->word);
    if (r->json) {
        render_json(r->id, ans->json_status ? ans->json_status : "unknown", ans->final, &body);
        write_response(r, http, word, "application/json", ans->final ? -1 : ans->retry_after_s, extra, &body);
    } else {
        const struct templates *t = r->shop ? r->shop->tpl : r->cfg->default_tpl;
        char retry[STATE_ID_MAX + 40];
        snprintf(retry, sizeof retry, "?%s=%s", r->shop ? r->shop->id_param : "id", r->id);
        struct page_vars v = {
            .id = r->id,
            .shop_name = r->shop ? r->shop->name : "",
            .shop_url = r->shop ? r->shop->shop_url : "",
            .retry_url = retry,
        };
        render_html(t, ans->word, &v, &body);
        write_response(r, http, word, "text/html; charset=utf-8", -1, extra, &body);
    }
    buf_free(&body);
    atomic_fetch_add(&a->m.requests[ans->word], 1);
    log_request(r, http, word, r->deadline != 0);
    finish(r);
    free_req(r);
}

void front_respond(struct app *a, struct req *r, const struct answer *ans)
{
    respond(a, r, ans, word_http(ans->word), NULL);
}

/* Other methods: 405 with the invalid page (no word of its own). */
static void respond_405(struct app *a, struct req *r)
{
    struct answer ans = {.word = W_INVALID, .json_status = "unknown", .retry_after_s = -1};
    atomic_fetch_add(&a->m.method_not_allowed, 1);
    respond(a, r, &ans, 405, "Allow: GET, HEAD\r\n");
}

static void respond_metrics(struct app *a, struct req *r)
{
    static const char *const kinds[] = {"status", "not_found", "tx_limited", "key_limited",
                                        "unauthorized", "auth_blocked", "rejected", "no_answer"};
    struct buf b = {0};
    struct state_metrics sm;
    state_metrics(a->state, &sm);
    buf_puts(&b, "# HELP kembali_answers_total Answers by status word.\n# TYPE kembali_answers_total counter\n");
    for (int w = 0; w < W_COUNT; w++)
        buf_printf(&b, "kembali_answers_total{status=\"%s\"} %ld\n", word_name((enum word)w), atomic_load(&a->m.requests[w]));
    buf_printf(&b, "kembali_method_not_allowed_total %ld\n", atomic_load(&a->m.method_not_allowed));
    buf_puts(&b, "# HELP kembali_api_reads_total Reads of the Kasera API by outcome.\n# TYPE kembali_api_reads_total counter\n");
    for (int k = 0; k <= OUT_NO_ANSWER; k++)
        buf_printf(&b, "kembali_api_reads_total{outcome=\"%s\"} %ld\n", kinds[k], atomic_load(&a->m.reads[k]));
    buf_printf(&b, "# TYPE kembali_api_reads_started_total counter\nkembali_api_reads_started_total %ld\n", atomic_load(&a->m.reads_started));
    buf_printf(&b, "# TYPE kembali_api_connections_total counter\nkembali_api_connections_total %ld\n", atomic_load(&a->m.connections));
    buf_printf(&b, "# TYPE kembali_held_requests gauge\nkembali_held_requests %ld\n", atomic_load(&a->m.held));
    buf_printf(&b, "# TYPE kembali_held_requests_peak gauge\nkembali_held_requests_peak %ld\n", atomic_load(&a->m.held_peak));
    buf_printf(&b, "# TYPE kembali_answers_without_wait_total counter\nkembali_answers_without_wait_total %ld\n", atomic_load(&a->m.cache_answers));
    buf_printf(&b, "# TYPE kembali_state_entries gauge\nkembali_state_entries %ld\nkembali_state_slots %ld\n", sm.tx_used, sm.tx_slots);
    buf_printf(&b, "# TYPE kembali_state_evictions_total counter\nkembali_state_evictions_total %ld\nkembali_state_full_total %ld\n", sm.evictions, sm.full);
    buf_printf(&b, "# HELP kembali_state_recoveries_total Times a process died holding the state lock and the state was rebuilt.\n"
                   "# TYPE kembali_state_recoveries_total counter\nkembali_state_recoveries_total %ld\n", sm.recoveries);
    write_response(r, 200, NULL, "text/plain; version=0.0.4", -1, NULL, &b);
    buf_free(&b);
    finish(r);
    free_req(r);
}

/* The admin POST ?format=notify (told by the shop): 204, or a reason in
 * plain words (400 keeps Kembali-Status: invalid). */
static void respond_notify(struct app *a, struct req *r, const char *query, const char *body, size_t len)
{
    char why[512];
    int http = notify_request(a->state, r->shop, query, body, len, util_mono_ms(), why, sizeof why);
    struct buf b = {0};
    if (http != 204)
        buf_printf(&b, "%s\n", why);
    write_response(r, http, http == 400 ? "invalid" : http == 404 ? "unknown_shop" : NULL,
                   "text/plain; charset=utf-8", http == 503 ? 1 : -1, NULL, &b);
    buf_free(&b);
    finish(r);
    free_req(r);
}

/* ---- parsing a request ---- */

/* Read the request body: its first `cap` bytes into body, the rest (up to
 * 1 MiB) discarded, so the connection can be closed without a reset.
 * Returns the bytes seen, at most cap + 1 (more than cap: too large). */
static size_t read_stdin(struct req *r, char *body, size_t cap)
{
    char tmp[4096];
    size_t total = 0;
    int n;
    while (total < cap && (n = FCGX_GetStr(body + total, (int)(cap - total), r->fcgx.in)) > 0)
        total += (size_t)n;
    size_t more = 0;
    while (more < (1u << 20) && (n = FCGX_GetStr(tmp, sizeof tmp, r->fcgx.in)) > 0)
        more += (size_t)n;
    return total + (more > 0);
}

static void handle(struct app *a, struct req *r)
{
    char **env = r->fcgx.envp;
    const char *method = FCGX_GetParam("REQUEST_METHOD", env);
    const char *query = FCGX_GetParam("QUERY_STRING", env);
    const char *host = FCGX_GetParam("HTTP_HOST", env);
    const char *admin = FCGX_GetParam("KEMBALI_ADMIN", env);
    char fmt[16] = "";
    char body[REQUEST_NOTIFY_BODY_MAX];

    r->arrived = util_mono_ms();
    r->cfg = app_config(a);
    size_t body_len = read_stdin(r, body, sizeof body);
    request_query_param(query, "format", fmt, sizeof fmt);
    r->head = method != NULL && strcmp(method, "HEAD") == 0;

    if (admin != NULL && strcmp(admin, "1") == 0 && strcmp(fmt, "metrics") == 0) {
        respond_metrics(a, r);
        return;
    }
    r->shop = config_pick_shop(r->cfg, FCGX_GetParam("KEMBALI_SHOP", env),
                               host ? host : FCGX_GetParam("SERVER_NAME", env));
    r->json = strcmp(fmt, "json") == 0 || request_wants_json(FCGX_GetParam("HTTP_ACCEPT", env));
    if (r->shop != NULL) {
        const char *origin = FCGX_GetParam("HTTP_ORIGIN", env);
        for (int i = 0; origin && i < r->shop->norigins; i++)
            if (strcmp(origin, r->shop->origins[i]) == 0)
                r->origin = r->shop->origins[i];
    }
    if (admin != NULL && strcmp(admin, "1") == 0 && strcmp(fmt, "notify") == 0 && method != NULL &&
        strcmp(method, "POST") == 0) {
        respond_notify(a, r, query, body, body_len);
        return;
    }
    if (method == NULL || (strcmp(method, "GET") != 0 && !r->head)) {
        respond_405(a, r);
        return;
    }

    struct answer ans = {.json_status = "unknown", .retry_after_s = -1};
    if (r->shop == NULL) {
        ans.word = W_UNKNOWN_SHOP;
        front_respond(a, r, &ans);
        return;
    }
    char id[STATE_ID_MAX + 2];
    if (!request_query_param(query, r->shop->id_param, id, sizeof id) || !config_valid_id(id)) {
        ans.word = W_INVALID; /* costs no read */
        front_respond(a, r, &ans);
        return;
    }
    util_copy(r->id, sizeof r->id, id);

    /* The hot path: a cached final status or a remembered 404. */
    struct state_fact f;
    state_lookup(a->state, &r->shop->key, r->id, &r->cfg->sched, r->shop->read_budget, r->arrived, &f);
    if (f.final || f.not_found) {
        request_answer(&f, r->arrived, &ans);
        atomic_fetch_add(&a->m.cache_answers, 1);
        front_respond(a, r, &ans);
        return;
    }
    r->deadline = r->arrived + (r->json ? r->cfg->read_timeout_ms + PACE_GRACE_MS : pace_hold_ms(&r->cfg->sched));
    resolver_park(a->resolver, r);
}

/* ---- accept threads ---- */

/* Connections accepted but not yet readable, per accept thread. A web server
 * sends its request as soon as it connects; one that sends nothing within
 * FIRST_BYTES_MS is closed. Waiting for the first bytes in poll() rather
 * than in a blocking read keeps silent connections from holding a thread. */
#define PENDING_MAX 256
#define FIRST_BYTES_MS 5000

struct pending {
    int fd;
    int64_t since;
};

/* Parses the request on a connection that has bytes to read, and handles
 * it. The reads are blocking, bounded by the SO_RCVTIMEO inherited from the
 * listening socket: a client that stalls in the middle of its request holds
 * this thread that long (libfcgi has no non-blocking parser). */
static void serve_connection(struct app *a, int fd)
{
    struct req *r = calloc(1, sizeof *r);
    if (r == NULL) {
        close(fd);
        return;
    }
    /* With ipcFd set and keepConnection on, FCGX_Accept_r skips its own
     * accept (which would drop a Unix-socket connection not readable within
     * 2 s, holding the thread meanwhile) and parses this connection. With no
     * listening socket it cannot accept another either: a connection that
     * closes or sends a malformed request is closed, and it returns an error. */
    FCGX_InitRequest(&r->fcgx, -1, 0);
    r->fcgx.ipcFd = fd;
    r->fcgx.keepConnection = 1;
    if (FCGX_Accept_r(&r->fcgx) < 0) {
        FCGX_Free(&r->fcgx, 1);
        free(r);
        return;
    }
    handle(a, r);
}

/* FCGI_WEB_SERVER_ADDRS, as libfcgi's own accept honours it: when set, a
 * TCP peer whose address is not in the comma-separated list is refused.
 * Read once at start (front_start). */
static char *web_server_addrs;

static bool peer_allowed(const struct sockaddr_storage *sa)
{
    if (web_server_addrs == NULL)
        return true;
    char ip[INET6_ADDRSTRLEN];
    if (sa->ss_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, ip, sizeof ip);
    } else if (sa->ss_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) /* an IPv4 peer on a dual-stack socket */
            inet_ntop(AF_INET, &a6->s6_addr[12], ip, sizeof ip);
        else
            inet_ntop(AF_INET6, a6, ip, sizeof ip);
    } else {
        return true; /* a Unix socket: its file's permissions decide */
    }
    size_t n = strlen(ip);
    for (const char *p = web_server_addrs; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && memcmp(p, ip, n) == 0)
            return true;
        p += len + (end != NULL);
    }
    return false;
}

/* Accepts one connection: served at once when its request is already
 * there (the usual case: the web server writes as soon as it connects),
 * else kept in the pending set. A pending connection is served by the
 * thread that accepted it, so serving at once also keeps it from waiting
 * behind a client that stalls this thread. Returns false when accepting
 * should pause (out of descriptors or memory). */
static bool accept_one(struct app *a, struct pending *pend, int *npend, bool *emfile_logged)
{
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;
    int fd = accept4(a->listen_fd, (struct sockaddr *)&sa, &salen, SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            if (!*emfile_logged)
                log_msg("warn", "accept", "out of file descriptors; pausing accepts");
            *emfile_logged = true;
            return false;
        }
        return true; /* EAGAIN: another thread or process took it */
    }
    *emfile_logged = false;
    if (!peer_allowed(&sa)) {
        close(fd);
        return true;
    }
    /* as libfcgi's own accept does: the answer may go out in several writes,
     * with no Nagle delay between them on TCP (on a Unix socket this fails,
     * harmlessly) */
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct pollfd ready = {.fd = fd, .events = POLLIN};
    if (poll(&ready, 1, 0) == 1) {
        serve_connection(a, fd);
        return true;
    }
    pend[*npend].fd = fd;
    pend[*npend].since = util_mono_ms();
    (*npend)++;
    return true;
}

static void *accept_main(void *arg)
{
    struct app *a = arg;
    struct pending pend[PENDING_MAX];
    struct pollfd p[2 + PENDING_MAX];
    int npend = 0;
    bool emfile_logged = false;
    while (!atomic_load(&a->stopping)) {
        /* close the connections that sent nothing in time; the next expiry
         * bounds the wait */
        int64_t now = util_mono_ms();
        int timeout = -1;
        for (int i = 0; i < npend;) {
            int64_t left = pend[i].since + FIRST_BYTES_MS - now;
            if (left <= 0) {
                close(pend[i].fd);
                pend[i] = pend[--npend];
                continue;
            }
            if (timeout < 0 || left < timeout)
                timeout = (int)left;
            i++;
        }
        /* a full pending set stops accepting here; the backlog and the other
         * threads take the rest */
        p[0] = (struct pollfd){.fd = npend < PENDING_MAX ? a->listen_fd : -1, .events = POLLIN};
        p[1] = (struct pollfd){.fd = wake_pipe[0], .events = POLLIN};
        for (int i = 0; i < npend; i++)
            p[2 + i] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        if (poll(p, (nfds_t)(2 + npend), timeout) < 0) {
            if (errno != EINTR)
                log_msg("error", "accept", strerror(errno));
            continue;
        }
        if (atomic_load(&a->stopping) || (p[1].revents & POLLIN))
            break;
        /* downwards, so that the entry moved into a freed slot (the last
         * one) was already looked at */
        for (int i = npend - 1; i >= 0; i--) {
            if (p[2 + i].revents == 0)
                continue;
            int fd = pend[i].fd;
            pend[i] = pend[--npend];
            serve_connection(a, fd);
        }
        if ((p[0].revents & (POLLIN | POLLERR | POLLHUP)) && !accept_one(a, pend, &npend, &emfile_logged))
            usleep(100 * 1000); /* out of descriptors: do not spin */
    }
    for (int i = 0; i < npend; i++)
        close(pend[i].fd);
    return NULL;
}

int front_start(struct app *a, int n)
{
    const char *addrs = getenv("FCGI_WEB_SERVER_ADDRS");
    free(web_server_addrs);
    web_server_addrs = NULL;
    if (addrs != NULL && *addrs != '\0') {
        /* without spaces, as libfcgi compares them */
        web_server_addrs = malloc(strlen(addrs) + 1);
        if (web_server_addrs == NULL)
            return -1;
        char *w = web_server_addrs;
        for (const char *p = addrs; *p; p++)
            if (*p != ' ' && *p != '\t')
                *w++ = *p;
        *w = '\0';
    }
    if (pipe2(wake_pipe, O_CLOEXEC) != 0) {
        log_msg("error", "start", strerror(errno));
        return -1;
    }
    /* Non-blocking, so a thread woken for a connection another thread (or
     * process) took returns to poll instead of blocking in accept(). */
    int fl = fcntl(a->listen_fd, F_GETFL);
    if (fl < 0 || fcntl(a->listen_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        log_msg("error", "start", "cannot make the listening socket non-blocking");
        return -1;
    }
    if (n > FRONT_MAX_THREADS)
        n = FRONT_MAX_THREADS;
    for (int i = 0; i < n; i++) {
        if (pthread_create(&threads[i], NULL, accept_main, a) != 0) {
            log_msg("error", "start", "cannot start an accept thread");
            return -1;
        }
        nthreads_started++;
    }
    return 0;
}

void front_stop(struct app *a)
{
    atomic_store(&a->stopping, true);
    if (wake_pipe[1] >= 0 && write(wake_pipe[1], "x", 1) < 0)
        log_msg("warn", "stop", strerror(errno));
    for (int i = 0; i < nthreads_started; i++)
        pthread_join(threads[i], NULL);
    nthreads_started = 0;
    free(web_server_addrs);
    web_server_addrs = NULL;
}
