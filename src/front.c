/* front.c - see front.h.
 *
 * A connection is in one of three moods, and its one timer follows it:
 *   reading a request   until the codec reports it whole (FRONT_REQUEST_MS)
 *   holding it          the handler has it; no timer of ours (the handler
 *                       answers by the request's deadline), but the socket
 *                       is still read, for FCGI_ABORT_REQUEST and the close
 *   idle (kept)         between requests (FRONT_IDLE_MS)
 * and whenever bytes wait to be written, FRONT_WRITE_MS from when the socket
 * stopped taking them. A peer that closes (or half-closes) its side while a
 * request is held, resets the connection or aborts loses its request at once
 * (the handler's on_gone); an answer already written still goes out.
 *
 * Callbacks of the handler may answer the very connection being read: a
 * connection is never freed inside them, only marked, and freed by the
 * outermost function working on it (conn_release). */
#include "front.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fastcgi_codec.h"
#include "log.h"
#include "util.h"

#define FRONT_READ_CHUNK (16 * 1024)
#define FRONT_READS_PER_EVENT 4       /* then let other connections have a turn */
#define FRONT_ACCEPTS_PER_EVENT 64
/* replies a peer does not read: beyond this it is closed; one answer of
 * FRONT_REPLY_MAX always fits with its framing (16 bytes per 65535) */
#define FRONT_OUT_MAX (FRONT_REPLY_MAX + 64 * 1024)
#define FRONT_EMFILE_PAUSE_MS 100

struct front_conn;

struct front_req {
    struct front_conn *c;     /* NULL in CGI mode */
    struct front *f;
    void *user;
    bool live;                /* handed to the handler, not answered yet */
};

struct front_conn {
    struct front *f;
    struct loop_io io;
    struct loop_timer timer;
    struct fcgi_parser p;
    struct front_req req;
    int64_t req_since;        /* a request is being read since (0: none) */
    int64_t idle_since;       /* kept and idle since (0: not idle) */
    int64_t early_since;      /* bytes came while a request was held, since (0: none) */
    int64_t out_since;        /* bytes wait to be written since (0: none) */
    uint8_t *out;
    size_t out_len, out_off;
    bool eof;                 /* the peer will send nothing more */
    bool close_after_write;
    bool dead;                /* to be freed by the outermost caller */
    bool frozen;              /* handed over, not yet committed: not read, written or timed */
    bool in_part;             /* front_reply_part at work: a close now is that part's
                               * failure, told by its return value, not by on_gone */
    int busy;                 /* nesting of functions working on it */
    struct front_conn *prev, *next;
};

struct front {
    struct loop *loop;
    struct front_handler h;
    int listen_fd;
    struct loop_io listen_io;
    struct loop_timer emfile_timer;
    bool emfile_logged, stopping;
    char *web_server_addrs;   /* FCGI_WEB_SERVER_ADDRS without blanks, or NULL */
    struct front_conn *conns;
    size_t nconns;
    unsigned long accepted;
    uint8_t scratch[FRONT_READ_CHUNK];
    /* CGI mode */
    bool cgi, cgi_answered;
    struct front_req cgi_req;
    struct loop_timer cgi_timer;
    uint8_t *cgi_body;
    size_t cgi_body_len;
    bool cgi_body_truncated;
};

/* ---- connections ---- */

static void conn_arm(struct front_conn *c);

static void conn_free(struct front_conn *c)
{
    struct front *f = c->f;
    loop_io_set(f->loop, &c->io, 0);
    loop_timer_stop(f->loop, &c->timer);
    shutdown(c->io.fd, SHUT_WR); /* no lingering close; the peer read what it wanted */
    close(c->io.fd);
    fcgi_parser_free(&c->p);
    free(c->out);
    if (c->prev)
        c->prev->next = c->next;
    else
        f->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    f->nconns--;
    free(c);
}

/* Close c: a request the handler keeps is forgotten (on_gone). Deferred
 * while a function up the stack works on c. */
static void conn_close(struct front_conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    if (c->req.live && c->in_part) {
        c->req.live = false; /* front_reply_part returns -1: its caller forgets it */
        c->req.user = NULL;
    } else if (c->req.live) {
        c->req.live = false;
        c->busy++;
        c->f->h.on_gone(c->f->h.ctx, &c->req, c->req.user);
        c->busy--;
    }
    if (c->busy == 0)
        conn_free(c);
}

/* End of a function that worked on c: free it if it died meanwhile. */
static void conn_release(struct front_conn *c)
{
    if (--c->busy == 0 && c->dead)
        conn_free(c);
}

/* Write what is queued; returns false when the connection failed. */
static bool conn_flush(struct front_conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = write(c->io.fd, c->out + c->out_off, c->out_len - c->out_off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                break;
            return false; /* EPIPE, ECONNRESET: the peer is gone */
        }
        c->out_off += (size_t)n;
    }
    if (c->out_off == c->out_len) {
        free(c->out);
        c->out = NULL;
        c->out_len = c->out_off = 0;
        c->out_since = 0;
    } else if (c->out_since == 0) {
        c->out_since = loop_now(c->f->loop);
    }
    return true;
}

/* Queue bytes (already framed) and write what the socket takes. */
static bool conn_queue(struct front_conn *c, const uint8_t *b, size_t n)
{
    if (n == 0)
        return true;
    size_t pending = c->out_len - c->out_off;
    if (pending + n > FRONT_OUT_MAX)
        return false;
    if (pending == 0) {
        /* the common case: try the socket first, copy only what it leaves */
        ssize_t w;
        do
            w = write(c->io.fd, b, n);
        while (w < 0 && errno == EINTR);
        if (w < 0 && errno != EAGAIN)
            return false;
        size_t done = w < 0 ? 0 : (size_t)w;
        if (done == n)
            return true;
        b += done;
        n -= done;
        free(c->out);
        c->out = malloc(n);
        if (c->out == NULL)
            return false;
        memcpy(c->out, b, n);
        c->out_len = n;
        c->out_off = 0;
        c->out_since = loop_now(c->f->loop);
        return true;
    }
    if (c->out_off > 0) {
        memmove(c->out, c->out + c->out_off, pending);
        c->out_len = pending;
        c->out_off = 0;
    }
    uint8_t *nb = realloc(c->out, pending + n);
    if (nb == NULL)
        return false;
    c->out = nb;
    memcpy(c->out + c->out_len, b, n);
    c->out_len += n;
    return true;
}

/* Write the three parts at once (nothing else is queued); keep what the
 * socket does not take. False when the connection failed. */
static bool conn_queue_iov(struct front_conn *c, const uint8_t *a, size_t na, const void *b, size_t nb,
                           const uint8_t *t, size_t nt)
{
    struct iovec iov[3] = {{(void *)a, na}, {(void *)b, nb}, {(void *)t, nt}};
    ssize_t w;
    do
        w = writev(c->io.fd, iov, 3);
    while (w < 0 && errno == EINTR);
    if (w < 0 && errno != EAGAIN)
        return false;
    size_t done = w < 0 ? 0 : (size_t)w, total = na + nb + nt;
    if (done == total)
        return true;
    uint8_t *rest = malloc(total - done);
    if (rest == NULL)
        return false;
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        size_t skip = done > iov[i].iov_len ? iov[i].iov_len : done;
        done -= skip;
        memcpy(rest + n, (const uint8_t *)iov[i].iov_base + skip, iov[i].iov_len - skip);
        n += iov[i].iov_len - skip;
    }
    free(c->out);
    c->out = rest;
    c->out_len = n;
    c->out_off = 0;
    c->out_since = loop_now(c->f->loop);
    return true;
}

/* After output was queued or written: close, go idle, or wait for EPOLLOUT. */
static void conn_after_output(struct front_conn *c)
{
    if (c->dead)
        return;
    bool pending = c->out_off < c->out_len;
    if (!pending && c->close_after_write) {
        conn_close(c);
        return;
    }
    uint32_t ev = (c->eof ? 0 : EPOLLIN) | (pending ? EPOLLOUT : 0);
    if (loop_io_set(c->f->loop, &c->io, ev) != 0) {
        conn_close(c);
        return;
    }
    if (!pending && !c->req.live && c->req_since == 0 && c->idle_since == 0)
        c->idle_since = loop_now(c->f->loop);
    conn_arm(c);
}

static void on_conn_timer(struct loop *l, struct loop_timer *t)
{
    struct front_conn *c = t->data;
    (void)l;
    conn_close(c); /* too slow to send its request, to take its answer, or idle too long */
}

/* The one timer: the earliest limit that applies now. */
static void conn_arm(struct front_conn *c)
{
    int64_t at = INT64_MAX;
    if (c->out_since != 0 && c->out_since + FRONT_WRITE_MS < at)
        at = c->out_since + FRONT_WRITE_MS;
    if (c->req_since != 0 && !c->req.live && c->req_since + FRONT_REQUEST_MS < at)
        at = c->req_since + FRONT_REQUEST_MS;
    if (c->idle_since != 0 && c->idle_since + FRONT_IDLE_MS < at)
        at = c->idle_since + FRONT_IDLE_MS;
    if (at == INT64_MAX)
        loop_timer_stop(c->f->loop, &c->timer);
    else if (loop_timer_at(c->f->loop, &c->timer, at) != 0)
        conn_close(c); /* no memory for a timer: a connection without limits is not kept */
}

/* A whole request: hand it over. */
static void conn_request(struct front_conn *c)
{
    c->req.live = true;
    c->req.user = NULL;
    c->req_since = 0;
    c->idle_since = 0;
    loop_timer_stop(c->f->loop, &c->timer);
    c->f->h.on_request(c->f->h.ctx, &c->req);
    if (c->req.live) /* kept: its parameters were copied; free them */
        fcgi_request_taken(&c->p);
}

/* Feed n bytes to the codec and act on its events. */
static void conn_feed(struct front_conn *c, const uint8_t *b, size_t n)
{
    if (c->req_since == 0 && !c->req.live) {
        c->req_since = loop_now(c->f->loop); /* a kept connection: the next request's first byte */
        c->idle_since = 0;
    } else if (c->req.live && c->early_since == 0) {
        c->early_since = loop_now(c->f->loop); /* maybe the next request, sent early */
    }
    while (n > 0 && !c->dead) {
        struct fcgi_event ev;
        size_t used = 0;
        enum fcgi_ev t = fcgi_feed(&c->p, b, n, &used, &ev);
        b += used;
        n -= used;
        if (ev.reply_len > 0 && !conn_queue(c, ev.reply, ev.reply_len)) {
            conn_close(c);
            return;
        }
        switch (t) {
        case FCGI_EV_NONE:
        case FCGI_EV_REPLY:
            break;
        case FCGI_EV_REQUEST:
            conn_request(c);
            break;
        case FCGI_EV_ABORT: {
            uint8_t end[16];
            bool keep = fcgi_keep_conn(&c->p);
            if (c->req.live) {
                c->req.live = false;
                c->f->h.on_gone(c->f->h.ctx, &c->req, c->req.user);
            }
            size_t e = fcgi_encode_end(end, sizeof end, ev.id, 0, FCGI_REQUEST_COMPLETE);
            fcgi_request_done(&c->p);
            c->req_since = n > 0 ? loop_now(c->f->loop) : 0; /* bytes after it: the next request */
            c->early_since = 0;
            if (!keep)
                c->close_after_write = true;
            if (!conn_queue(c, end, e)) {
                conn_close(c);
                return;
            }
            break;
        }
        case FCGI_EV_ERROR:
            conn_close(c); /* a protocol error: nothing more can be understood */
            return;
        }
    }
}

static void conn_read(struct front_conn *c)
{
    for (int i = 0; i < FRONT_READS_PER_EVENT && !c->dead && !c->eof; i++) {
        ssize_t n = read(c->io.fd, c->f->scratch, sizeof c->f->scratch);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                conn_close(c); /* reset: the peer is gone */
            return;
        }
        if (n == 0) {
            c->eof = true;
            /* The web server closed the connection. With a request held,
             * that is how it aborts it (FastCGI: by closing the transport
             * connection) when its client left: drop the request at once,
             * so it stops counting and gives its reservation back. On TCP
             * a close and a half-close both arrive as this read of 0 (a
             * Unix socket's close also raises EPOLLHUP); FastCGI gives a
             * half-close no meaning, so it ends the request too. An answer
             * already queued still goes out. */
            if (c->req.live || c->out_off == c->out_len)
                conn_close(c);
            else
                c->close_after_write = true;
            return;
        }
        conn_feed(c, c->f->scratch, (size_t)n);
        if ((size_t)n < sizeof c->f->scratch)
            return;
    }
}

static void on_conn_event(struct loop *l, struct loop_io *io, uint32_t events)
{
    struct front_conn *c = io->data;
    (void)l;
    c->busy++;
    if (events & EPOLLIN)
        conn_read(c);
    if (!c->dead && (events & (EPOLLERR | EPOLLHUP)))
        conn_close(c); /* both directions closed (the peer is gone), or an error */
    if (!c->dead && c->out_off < c->out_len && !conn_flush(c))
        conn_close(c);
    if (!c->dead)
        conn_after_output(c);
    conn_release(c);
}

/* ---- accepting ---- */

static bool peer_allowed(const struct front *f, const struct sockaddr_storage *sa)
{
    if (f->web_server_addrs == NULL)
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
    for (const char *p = f->web_server_addrs; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && memcmp(p, ip, n) == 0)
            return true;
        p += len + (end != NULL);
    }
    return false;
}

static void on_emfile_timer(struct loop *l, struct loop_timer *t)
{
    struct front *f = t->data;
    if (!f->stopping)
        loop_io_set(l, &f->listen_io, EPOLLIN);
}

static void accept_one(struct front *f, int fd, const struct sockaddr_storage *sa)
{
    if (!peer_allowed(f, sa)) {
        close(fd);
        return;
    }
    struct front_conn *c = calloc(1, sizeof *c);
    if (c == NULL) {
        close(fd);
        return;
    }
    /* as libfcgi does: no Nagle delay (on a Unix socket this fails, harmlessly) */
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->f = f;
    c->req.c = c;
    c->req.f = f;
    fcgi_parser_init(&c->p);
    loop_io_init(&c->io, fd, on_conn_event, c);
    loop_timer_init(&c->timer, on_conn_timer, c);
    c->req_since = loop_now(f->loop);
    c->next = f->conns;
    if (f->conns)
        f->conns->prev = c;
    f->conns = c;
    f->nconns++;
    f->accepted++;
    if (loop_io_set(f->loop, &c->io, EPOLLIN) != 0) {
        conn_close(c);
        return;
    }
    /* the web server writes its request as soon as it connects: read it now */
    c->busy++;
    conn_read(c);
    if (!c->dead)
        conn_after_output(c);
    conn_release(c);
}

static void on_listen(struct loop *l, struct loop_io *io, uint32_t events)
{
    struct front *f = io->data;
    (void)events;
    for (int i = 0; i < FRONT_ACCEPTS_PER_EVENT && !f->stopping; i++) {
        struct sockaddr_storage sa;
        socklen_t salen = sizeof sa;
        int fd = accept4(f->listen_fd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* out of descriptors: stop accepting for a moment instead of spinning */
                if (!f->emfile_logged)
                    log_msg(LOG_LV_WARN, "accept", "out of file descriptors; pausing accepts");
                f->emfile_logged = true;
                loop_io_set(l, &f->listen_io, 0);
                loop_timer_at(l, &f->emfile_timer, loop_now(l) + FRONT_EMFILE_PAUSE_MS);
            }
            return; /* EAGAIN: nothing more, or another process took it */
        }
        f->emfile_logged = false;
        accept_one(f, fd, &sa);
    }
}

/* ---- the interface ---- */

static struct front *front_alloc(struct loop *l, const struct front_handler *h, char *err, size_t errlen)
{
    struct front *f = calloc(1, sizeof *f);
    if (f == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    f->loop = l;
    f->h = *h;
    f->listen_fd = -1;
    loop_timer_init(&f->emfile_timer, on_emfile_timer, f);
    return f;
}

struct front *front_new(struct loop *l, int listen_fd, const struct front_handler *h, char *err, size_t errlen)
{
    struct front *f = front_alloc(l, h, err, errlen);
    if (f == NULL)
        return NULL;
    const char *addrs = getenv("FCGI_WEB_SERVER_ADDRS");
    if (addrs != NULL && *addrs != '\0') {
        /* without blanks, as libfcgi compares them */
        f->web_server_addrs = malloc(strlen(addrs) + 1);
        if (f->web_server_addrs == NULL) {
            snprintf(err, errlen, "out of memory");
            front_free(f);
            return NULL;
        }
        char *w = f->web_server_addrs;
        for (const char *p = addrs; *p; p++)
            if (*p != ' ' && *p != '\t')
                *w++ = *p;
        *w = '\0';
    }
    int fl = fcntl(listen_fd, F_GETFL);
    if (fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        snprintf(err, errlen, "cannot make the listening socket non-blocking: %s", strerror(errno));
        front_free(f);
        return NULL;
    }
    f->listen_fd = listen_fd;
    loop_io_init(&f->listen_io, listen_fd, on_listen, f);
    if (loop_io_set(l, &f->listen_io, EPOLLIN) != 0) {
        snprintf(err, errlen, "epoll: %s", strerror(errno));
        front_free(f);
        return NULL;
    }
    return f;
}

static void on_cgi_timer(struct loop *l, struct loop_timer *t)
{
    struct front *f = t->data;
    (void)l;
    f->cgi_req.live = true;
    f->h.on_request(f->h.ctx, &f->cgi_req);
}

struct front *front_new_cgi(struct loop *l, const struct front_handler *h, char *err, size_t errlen)
{
    struct front *f = front_alloc(l, h, err, errlen);
    if (f == NULL)
        return NULL;
    f->cgi = true;
    f->cgi_req.f = f;
    /* the body, as the CGI server passes it: CONTENT_LENGTH bytes on stdin */
    const char *cl = getenv("CONTENT_LENGTH");
    long want = cl ? strtol(cl, NULL, 10) : 0;
    if (want > 0) {
        size_t keep = want > FCGI_CODEC_STDIN_KEEP ? FCGI_CODEC_STDIN_KEEP : (size_t)want;
        f->cgi_body = malloc(keep);
        if (f->cgi_body == NULL) {
            snprintf(err, errlen, "out of memory");
            front_free(f);
            return NULL;
        }
        while (f->cgi_body_len < keep) {
            ssize_t n = read(0, f->cgi_body + f->cgi_body_len, keep - f->cgi_body_len);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                break;
            f->cgi_body_len += (size_t)n;
        }
        f->cgi_body_truncated = want > (long)keep;
    }
    loop_timer_init(&f->cgi_timer, on_cgi_timer, f);
    if (loop_timer_at(l, &f->cgi_timer, loop_now(l)) != 0) {
        snprintf(err, errlen, "out of memory");
        front_free(f);
        return NULL;
    }
    return f;
}

void front_params(const struct front_req *r, const char *const *names, size_t n, const char **values)
{
    if (r->c == NULL) {
        for (size_t i = 0; i < n; i++)
            values[i] = getenv(names[i]);
        return;
    }
    fcgi_params_get(&r->c->p, names, n, values);
}

const uint8_t *front_body(const struct front_req *r, size_t *len, bool *truncated)
{
    if (r->c == NULL) {
        *len = r->f->cgi_body_len;
        *truncated = r->f->cgi_body_truncated;
        return r->f->cgi_body;
    }
    *truncated = fcgi_stdin_truncated(&r->c->p);
    return fcgi_stdin(&r->c->p, len);
}

bool front_params_too_large(const struct front_req *r)
{
    return r->c != NULL && fcgi_params_too_large(&r->c->p);
}

void front_req_set_user(struct front_req *r, void *user)
{
    r->user = user;
}

/* Write n bytes to standard output (blocking, as CGI is). */
static int cgi_write(const uint8_t *b, size_t n)
{
    while (n > 0) {
        ssize_t w = write(1, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1; /* the server went away: nothing to do */
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

static int cgi_reply(struct front *f, const uint8_t *b, size_t n)
{
    f->cgi_req.live = false;
    f->cgi_answered = true;
    return cgi_write(b, n);
}

int front_reply_part(struct front *f, struct front_req *r, const void *part, size_t len)
{
    if (len == 0)
        return 0;
    if (r->c == NULL) {
        if (cgi_write(part, len) == 0)
            return 0;
        r->live = false;
        f->cgi_answered = true; /* the server went away: nothing more to do */
        return -1;
    }
    struct front_conn *c = r->c;
    size_t need = fcgi_stdout_size(len);
    uint8_t *b = need == SIZE_MAX ? NULL : malloc(need);
    c->busy++;
    c->in_part = true;
    int rc = 0;
    if (b == NULL || fcgi_encode_stdout(b, need, fcgi_request_id(&c->p), part, len) != need ||
        !conn_queue(c, b, need)) {
        /* r is the caller's to forget: no on_gone for it */
        r->live = false;
        r->user = NULL;
        rc = -1;
        conn_close(c);
    }
    free(b);
    if (!c->dead)
        conn_after_output(c); /* may close c (epoll or a timer failing) */
    if (c->dead)
        rc = -1;
    c->in_part = false;
    conn_release(c);
    return rc;
}

int front_reply(struct front *f, struct front_req *r, const void *resp, size_t len)
{
    if (r->c == NULL)
        return cgi_reply(f, resp, len);
    struct front_conn *c = r->c;
    uint16_t id = fcgi_request_id(&c->p);
    bool keep = fcgi_keep_conn(&c->p);
    r->live = false;
    r->user = NULL;
    fcgi_request_done(&c->p);
    /* part of a record already in: the next request's clock started at its
     * first byte, not now (else a peer could trickle it in an idle's 60 s) */
    if (fcgi_parser_mid_record(&c->p))
        c->req_since = c->early_since ? c->early_since : loop_now(f->loop);
    c->early_since = 0;
    if (!keep || c->eof || f->stopping)
        c->close_after_write = true;
    c->busy++;
    int rc = 0;
    if (len > 0 && len <= FCGI_MAX_LENGTH && c->out_off == c->out_len) {
        /* the usual case, one record of content: written in place with
         * writev, the framing around it; only what the socket leaves is
         * copied */
        uint8_t head[FCGI_HEADER_LEN], tail[7 + 2 * FCGI_HEADER_LEN + sizeof(FCGI_EndRequestBody)];
        size_t pad = (8 - len % 8) % 8;
        FCGI_Header *h = (FCGI_Header *)head;
        *h = (FCGI_Header){.version = FCGI_VERSION_1, .type = FCGI_STDOUT,
                           .requestIdB1 = (uint8_t)(id >> 8), .requestIdB0 = (uint8_t)id,
                           .contentLengthB1 = (uint8_t)(len >> 8), .contentLengthB0 = (uint8_t)len,
                           .paddingLength = (uint8_t)pad};
        memset(tail, 0, pad);
        size_t nt = pad + fcgi_encode_answer(tail + pad, sizeof tail - pad, id, NULL, 0);
        if (!conn_queue_iov(c, head, sizeof head, resp, len, tail, nt)) {
            rc = -1;
            conn_close(c);
        }
    } else {
        size_t need = fcgi_answer_size(len);
        uint8_t *b = need == SIZE_MAX ? NULL : malloc(need);
        if (b == NULL || fcgi_encode_answer(b, need, id, resp, len) != need || !conn_queue(c, b, need)) {
            rc = -1;
            conn_close(c);
        }
        free(b);
    }
    if (!c->dead)
        conn_after_output(c);
    conn_release(c);
    return rc;
}

void front_pause_accepting(struct front *f)
{
    f->stopping = true;
    if (f->listen_fd >= 0)
        loop_io_set(f->loop, &f->listen_io, 0);
    loop_timer_stop(f->loop, &f->emfile_timer);
}

void front_resume_accepting(struct front *f)
{
    f->stopping = false;
    if (f->listen_fd >= 0)
        loop_io_set(f->loop, &f->listen_io, EPOLLIN);
}

/* Can c go to the successor now, and as what? 0: not now. */
static int conn_handable(const struct front_conn *c)
{
    if (c->dead || c->frozen || c->eof || c->close_after_write || c->busy > 0 || fcgi_parser_mid_record(&c->p) ||
        c->out_len - c->out_off > FRONT_HANDOVER_OUT_MAX)
        return 0;
    if (c->req.live)
        return c->req.user != NULL ? HANDOVER_HELD : 0;
    return fcgi_request_id(&c->p) == 0 ? HANDOVER_IDLE : 0; /* else a request is still arriving */
}

/* Freeze or thaw c: off the epoll set and its timer, or back on them. */
static void conn_freeze(struct front_conn *c, bool frozen)
{
    c->frozen = frozen;
    if (frozen) {
        loop_io_set(c->f->loop, &c->io, 0);
        loop_timer_stop(c->f->loop, &c->timer);
    } else {
        c->busy++;
        conn_after_output(c);
        conn_release(c);
    }
}

long front_handover(struct front *f, front_emit_fn *emit, void *ctx)
{
    long n = 0;
    bool failed = false;
    for (struct front_conn *c = f->conns; c && !failed; c = c->next) {
        int kind = conn_handable(c);
        if (kind == 0)
            continue;
        struct handover_rec rec = {.kind = (uint8_t)kind, .idle_since = c->idle_since, .arrived = c->req_since,
                                   .out_since = c->out_off < c->out_len ? c->out_since : 0,
                                   .out = c->out_off < c->out_len ? c->out + c->out_off : NULL,
                                   .out_len = c->out_len - c->out_off};
        if (kind == HANDOVER_HELD) {
            rec.fcgi_id = fcgi_request_id(&c->p);
            rec.keep_conn = fcgi_keep_conn(&c->p);
            if (f->h.save == NULL || f->h.save(f->h.ctx, &c->req, c->req.user, &rec) != 0)
                continue; /* stays here: answered here */
        }
        conn_freeze(c, true);
        if (emit(ctx, c->io.fd, &rec) != 0)
            failed = true;
        n++;
    }
    if (failed) {
        front_handover_rollback(f);
        return -1;
    }
    return n;
}

void front_handover_commit(struct front *f)
{
    for (struct front_conn *c = f->conns, *nx; c; c = nx) {
        nx = c->next;
        if (!c->frozen)
            continue;
        if (c->req.live) {
            c->req.live = false;
            if (f->h.release != NULL)
                f->h.release(f->h.ctx, &c->req, c->req.user);
        }
        /* conn_free without the shutdown: the successor has the socket */
        close(c->io.fd);
        c->io.fd = -1;
        fcgi_parser_free(&c->p);
        free(c->out);
        if (c->prev)
            c->prev->next = c->next;
        else
            f->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        f->nconns--;
        free(c);
    }
}

void front_handover_rollback(struct front *f)
{
    for (struct front_conn *c = f->conns, *nx; c; c = nx) {
        nx = c->next;
        if (!c->frozen)
            continue;
        if (c->req.live && f->h.restore != NULL)
            f->h.restore(f->h.ctx, &c->req, c->req.user); /* may answer it at once */
        if (!c->dead)
            conn_freeze(c, false);
    }
}

int front_adopt(struct front *f, int fd, const struct handover_rec *rec, struct front_req **held, char *err,
                size_t errlen)
{
    *held = NULL;
    struct front_conn *c = calloc(1, sizeof *c);
    uint8_t *out = rec->out_len > 0 ? malloc(rec->out_len) : NULL;
    if (c == NULL || (rec->out_len > 0 && out == NULL)) {
        snprintf(err, errlen, "out of memory");
        free(c);
        free(out);
        close(fd);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0 && !(fl & O_NONBLOCK))
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    int64_t now = loop_now(f->loop);
    c->f = f;
    c->req.c = c;
    c->req.f = f;
    fcgi_parser_init(&c->p);
    loop_io_init(&c->io, fd, on_conn_event, c);
    loop_timer_init(&c->timer, on_conn_timer, c);
    if (out != NULL) {
        memcpy(out, rec->out, rec->out_len);
        c->out = out;
        c->out_len = rec->out_len;
        c->out_since = rec->out_since != 0 ? rec->out_since : now;
    }
    if (rec->kind == HANDOVER_HELD) {
        fcgi_parser_resume(&c->p, rec->fcgi_id, rec->keep_conn);
        c->req.live = true;
    } else if (rec->idle_since != 0) {
        c->idle_since = rec->idle_since;
    } else {
        c->req_since = rec->arrived != 0 ? rec->arrived : now; /* its first request has not come yet */
    }
    c->next = f->conns;
    if (f->conns)
        f->conns->prev = c;
    f->conns = c;
    f->nconns++;
    c->busy++;
    conn_after_output(c); /* on the epoll set, its timer armed; a failure closes it */
    bool dead = c->dead;
    if (!dead && c->req.live)
        *held = &c->req;
    conn_release(c);
    if (dead) {
        snprintf(err, errlen, "cannot watch the connection (epoll or timer)");
        return -1;
    }
    return 0;
}

void front_stop_accepting(struct front *f)
{
    f->stopping = true;
    if (f->listen_fd >= 0)
        loop_io_set(f->loop, &f->listen_io, 0);
    loop_timer_stop(f->loop, &f->emfile_timer);
    for (struct front_conn *c = f->conns, *n; c; c = n) {
        n = c->next;
        if (!c->req.live && !c->eof) {
            /* a request that has arrived is answered, not dropped: read what
             * the socket holds (the handler answers at once while stopping) */
            c->busy++;
            conn_read(c);
            if (!c->dead)
                conn_after_output(c);
            bool dead = c->dead;
            conn_release(c);
            if (dead)
                continue;
        }
        if (c->req.live)
            continue; /* answered shortly */
        if (c->out_off < c->out_len)
            c->close_after_write = true; /* its last answer is still going out */
        else
            conn_close(c); /* idle, or its request is not whole: nothing to answer */
    }
}

bool front_done(const struct front *f)
{
    if (f->cgi)
        return f->cgi_answered;
    return f->stopping && f->conns == NULL;
}

size_t front_connections(const struct front *f)
{
    return f->nconns;
}

unsigned long front_accepted(const struct front *f)
{
    return f->accepted;
}

void front_free(struct front *f)
{
    if (f == NULL)
        return;
    while (f->conns) {
        struct front_conn *c = f->conns;
        c->req.live = false; /* the handler has forgotten its requests by now */
        c->busy = 0;
        conn_free(c);
    }
    if (f->listen_fd >= 0)
        loop_io_set(f->loop, &f->listen_io, 0);
    loop_timer_stop(f->loop, &f->emfile_timer);
    if (f->cgi)
        loop_timer_stop(f->loop, &f->cgi_timer);
    free(f->cgi_body);
    free(f->web_server_addrs);
    free(f);
}
