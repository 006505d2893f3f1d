/* yardstick - the least a FastCGI responder can do, for `make bench` to
 * measure kembali against.
 *
 *     yardstick SOCKET_PATH RESPONSE_FILE
 *
 * One thread, one epoll loop, non-blocking sockets, raw FastCGI records (no
 * libfcgi). Every request is answered, once its FCGI_STDIN stream ends, with
 * the bytes of RESPONSE_FILE (CGI-style headers and body, as a real
 * application writes them to FCGI_STDOUT), an empty FCGI_STDOUT and an
 * FCGI_END_REQUEST. FCGI_KEEP_CONN is honoured: without it the connection
 * is closed once the answer is written. Management records and other
 * record types are ignored; a malformed record closes that connection only.
 * Runs until killed. */

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

enum { REC_BEGIN = 1, REC_END = 3, REC_STDIN = 5, REC_STDOUT = 6 };
enum { HDR = 8, CONTENT_MAX = 65535, PAD_MAX = 255, CHUNK = 65528 };
#define RESPONSE_MAX (16u << 20)
#define IN_MAX (HDR + CONTENT_MAX + PAD_MAX)

struct conn {
    int fd;
    size_t in_len;
    unsigned char in[IN_MAX]; /* always room for one whole record */
    unsigned char *out;       /* the answer being written, or NULL */
    size_t out_len, out_off;
    int keep;                 /* FCGI_KEEP_CONN of the current request */
    int close_after;          /* close once out is written */
    int polling_out;          /* registered for EPOLLOUT rather than EPOLLIN */
};

/* The answer for request id 1; record headers at `heads` get the real id. */
static unsigned char *reply;
static size_t reply_len;
static size_t heads[RESPONSE_MAX / CHUNK + 3];
static size_t nheads;

static void put_header(unsigned char *p, int type, size_t clen)
{
    heads[nheads++] = (size_t)(p - reply);
    p[0] = 1;
    p[1] = (unsigned char)type;
    p[2] = 0;
    p[3] = 1;
    p[4] = (unsigned char)(clen >> 8);
    p[5] = (unsigned char)(clen & 0xff);
    p[6] = 0;
    p[7] = 0;
}

/* Builds `reply` from the file's bytes. Returns 0, or -1 with a message. */
static int build_reply(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    unsigned char *body = malloc(RESPONSE_MAX);
    size_t n = body ? fread(body, 1, RESPONSE_MAX, f) : 0;
    int bad = !body || ferror(f) || !feof(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "yardstick: cannot read %s (or it is over %u bytes)\n", path, RESPONSE_MAX);
        free(body);
        return -1;
    }
    size_t chunks = (n + CHUNK - 1) / CHUNK;
    reply = malloc(n + HDR * (chunks + 2) + 8);
    if (!reply) {
        free(body);
        return -1;
    }
    unsigned char *p = reply;
    for (size_t off = 0; off < n; off += CHUNK) {
        size_t c = n - off < CHUNK ? n - off : CHUNK;
        put_header(p, REC_STDOUT, c);
        memcpy(p + HDR, body + off, c);
        p += HDR + c;
    }
    put_header(p, REC_STDOUT, 0);
    p += HDR;
    put_header(p, REC_END, 8);
    memset(p + HDR, 0, 8); /* appStatus 0, FCGI_REQUEST_COMPLETE */
    p += HDR + 8;
    reply_len = (size_t)(p - reply);
    free(body);
    return 0;
}

static void conn_close(int ep, struct conn *c)
{
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c->out);
    free(c);
}

/* Writes what it can of c->out. Returns 1 when all is written, 0 when the
 * socket is full, -1 on error. */
static int conn_flush(struct conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        c->out_off += (size_t)w;
    }
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = 0;
    return 1;
}

/* Queues the answer for request `id`. Returns 0, or -1 out of memory. */
static int conn_answer(struct conn *c, unsigned id)
{
    c->out = malloc(reply_len);
    if (!c->out)
        return -1;
    memcpy(c->out, reply, reply_len);
    for (size_t i = 0; i < nheads; i++) {
        c->out[heads[i] + 2] = (unsigned char)(id >> 8);
        c->out[heads[i] + 3] = (unsigned char)(id & 0xff);
    }
    c->out_len = reply_len;
    c->out_off = 0;
    c->close_after = !c->keep;
    return 0;
}

/* Consumes the whole records in c->in, stopping after one that needs an
 * answer. Returns 0, or -1 when the connection must be closed. */
static int conn_parse(struct conn *c)
{
    size_t off = 0;
    int rc = 0;
    while (!c->out && c->in_len - off >= HDR) {
        const unsigned char *h = c->in + off;
        size_t clen = ((size_t)h[4] << 8) | h[5], len = HDR + clen + h[6];
        if (h[0] != 1) {
            rc = -1;
            break;
        }
        if (c->in_len - off < len)
            break;
        unsigned id = ((unsigned)h[2] << 8) | h[3];
        if (h[1] == REC_BEGIN && id != 0 && clen >= 8)
            c->keep = h[HDR + 2] & 1;
        else if (h[1] == REC_STDIN && id != 0 && clen == 0 && conn_answer(c, id) < 0)
            rc = -1;
        off += len;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    return rc;
}

/* Waits for EPOLLOUT (out = 1) or EPOLLIN (out = 0) on c. */
static void conn_poll(int ep, struct conn *c, int out)
{
    if (c->polling_out == out)
        return;
    struct epoll_event ev = {.events = out ? EPOLLOUT : EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->polling_out = out;
}

/* Handles readiness on a connection: writes, reads, parses, answers, as far
 * as the socket allows; closes it when it is done or broken. */
static void conn_event(int ep, struct conn *c)
{
    for (;;) {
        if (c->out) {
            int f = conn_flush(c);
            if (f < 0 || (f > 0 && c->close_after)) {
                conn_close(ep, c);
                return;
            }
            conn_poll(ep, c, f == 0);
            if (f == 0)
                return;
        }
        if (conn_parse(c) < 0) {
            conn_close(ep, c);
            return;
        }
        if (c->out)
            continue; /* write it at once: the socket is usually writable */
        ssize_t r = recv(c->fd, c->in + c->in_len, sizeof c->in - c->in_len, 0);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            conn_close(ep, c);
            return;
        }
        if (r < 0)
            return;
        c->in_len += (size_t)r;
    }
}

static int listen_unix(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        fprintf(stderr, "yardstick: socket path too long\n");
        return -1;
    }
    strcpy(sa.sun_path, path);
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 1024) < 0) {
        perror(path);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    chmod(path, 0777); /* the web server's workers connect */
    return fd;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: yardstick SOCKET_PATH RESPONSE_FILE\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    int lfd, ep;
    if (build_reply(argv[2]) < 0 || (lfd = listen_unix(argv[1])) < 0)
        return 1;
    if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        perror("epoll_create1");
        return 1;
    }
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
    fprintf(stderr, "yardstick: listening on %s, %zu bytes per answer\n", argv[1], reply_len);
    struct epoll_event evs[256];
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (c) {
                conn_event(ep, c);
                continue;
            }
            int fd;
            while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                c = calloc(1, sizeof *c);
                struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                if (!c || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
                    close(fd);
                    free(c);
                    continue;
                }
                c->fd = fd;
            }
            if (errno == EMFILE || errno == ENFILE)
                usleep(100 * 1000); /* out of descriptors: do not spin */
        }
    }
}
