/* front.h - the FastCGI side: connections on the loop, or one CGI request.
 *
 * The front accepts connections on the listening socket, reads them without
 * ever blocking, feeds the bytes to the FastCGI codec (fastcgi_codec.h) and
 * hands each whole request to its handler. It knows nothing of shops or
 * statuses: the handler reads the request's parameters while it runs,
 * answers at once (front_reply) or keeps the request and answers later.
 * A connection carries one request at a time; with FCGI_KEEP_CONN it stays
 * open for the next one.
 *
 * Limits (README, "The web server"): a whole request within
 * FRONT_REQUEST_MS of connecting (on a kept connection, of the request's
 * first byte), an answer taken within FRONT_WRITE_MS, a kept connection
 * idle for FRONT_IDLE_MS is closed. Every buffer has a ceiling (the
 * codec's); no peer can delay another one's answer.
 *
 * In CGI mode (front_new_cgi) there is no socket: the one request comes
 * from the environment and standard input, and its answer goes to standard
 * output. */
#ifndef KEMBALI_FRONT_H
#define KEMBALI_FRONT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "handover.h"
#include "loop.h"

#define FRONT_REQUEST_MS 5000
#define FRONT_WRITE_MS 2000
#define FRONT_IDLE_MS 60000
/* The longest answer front_reply() takes (CGI headers and body, before the
 * FastCGI framing): a handler builds its answers within it. */
#define FRONT_REPLY_MAX (1024 * 1024)
/* A connection goes to a successor with at most this many bytes still to
 * write (front_handover); one with more finishes writing here. */
#define FRONT_HANDOVER_OUT_MAX (64 * 1024)

struct front;
struct front_req;

struct front_handler {
    /* A whole request arrived. Its parameters and body are readable until
     * this returns; the handler either answers (front_reply) or keeps r
     * for later, after front_req_set_user(). */
    void (*on_request)(void *ctx, struct front_req *r);
    /* A kept request's client went away (connection closed or reset,
     * FCGI_ABORT_REQUEST): forget it; r is gone when this returns. */
    void (*on_gone)(void *ctx, struct front_req *r, void *user);
    /* Handing over (front_handover): fill rec's request part for r, kept
     * with `user`, and stop working on it (no answer, no timer) until
     * release or restore; -1 when it cannot go (it stays the handler's,
     * live). NULL: no request can be handed over. */
    int (*save)(void *ctx, struct front_req *r, void *user, struct handover_rec *rec);
    /* The handover failed: r is the handler's again, as before save. */
    void (*restore)(void *ctx, struct front_req *r, void *user);
    /* The handover succeeded: forget r (the successor answers it). */
    void (*release)(void *ctx, struct front_req *r, void *user);
    void *ctx;
};

/* A front serving listen_fd (already listening) on loop l. With
 * FCGI_WEB_SERVER_ADDRS set (comma-separated), TCP peers not listed are
 * refused. NULL with a reason in err. */
struct front *front_new(struct loop *l, int listen_fd, const struct front_handler *h, char *err, size_t errlen);

/* A front for one CGI request: the handler is called from the loop's first
 * turn with the request of the environment (and up to CONTENT_LENGTH bytes
 * of standard input). front_done() is true once it has been answered. */
struct front *front_new_cgi(struct loop *l, const struct front_handler *h, char *err, size_t errlen);

/* Several parameters at once (n <= 16), in one pass: values[i] for
 * names[i], or NULL. Only while the handler's on_request runs. */
void front_params(const struct front_req *r, const char *const *names, size_t n, const char **values);

/* The request body (up to 8 KiB are kept); *truncated when more came. */
const uint8_t *front_body(const struct front_req *r, size_t *len, bool *truncated);

/* True when the parameters passed the codec's cap (none are readable). */
bool front_params_too_large(const struct front_req *r);

/* Keep r: `user` is handed to on_gone if its client goes away first. */
void front_req_set_user(struct front_req *r, void *user);

/* Answer r with a CGI response (headers, blank line, body): framed as
 * FastCGI records and written at once where the socket takes it, the rest
 * by the loop. r is gone when this returns (on_gone is never called for
 * it). Returns 0, or -1 when the answer could not be queued (no memory, an
 * answer over FRONT_REPLY_MAX, or a peer that left earlier answers unread
 * past that; the connection is closed). */
int front_reply(struct front *f, struct front_req *r, const void *resp, size_t len);

/* Send one part of r's answer, more to come (a streamed page): the first
 * part starts the CGI response (headers, blank line, the top of the body),
 * later ones continue the body; front_reply() sends the last part and ends
 * the answer. Framed as FastCGI STDOUT records (written to standard output
 * in CGI mode) and written at once where the socket takes it, the rest by
 * the loop; the connection's limits hold as for any answer (a peer that
 * does not take it within FRONT_WRITE_MS is disconnected, and on_gone
 * called for r). Returns 0 (r stays the caller's, live), or -1 when the
 * part could not be queued (no memory, the peer is gone): the connection
 * is closed, r is gone, and on_gone is not called for it. len 0 sends
 * nothing. */
int front_reply_part(struct front *f, struct front_req *r, const void *part, size_t len);

/* Stop accepting new connections; close connections that have no whole
 * request. Requests in hand are still answered. Can't fail. */
void front_stop_accepting(struct front *f);

/* True when nothing is left to write and no request is in hand (after
 * front_stop_accepting: time to exit), or in CGI mode once answered. */
bool front_done(const struct front *f);

/* Stop accepting new connections (the successor accepts on the same
 * socket), leaving every connection as it is. Can't fail. */
void front_pause_accepting(struct front *f);

/* Accept again after front_pause_accepting (the successor failed). Can't
 * fail. */
void front_resume_accepting(struct front *f);

/* Called for each connection handed over: its descriptor and its record.
 * Returns 0 when it was sent, -1 when not (the handover fails). */
typedef int front_emit_fn(void *ctx, int fd, const struct handover_rec *rec);

/* Hand over every connection that can go now: a kept connection between
 * requests, and one whose request the handler keeps (save) that is not in
 * the middle of a record; not one whose request is still arriving, whose
 * peer has closed, or that is to be closed once written. Each is frozen
 * (no read, no write, no timer) and passed to emit. Returns how many went,
 * or -1 when emit failed (every connection frozen by this call is thawed
 * and its request restored). Then front_handover_commit() or _rollback(). */
long front_handover(struct front *f, front_emit_fn *emit, void *ctx);

/* The frozen connections are the successor's: close our descriptors
 * (without a shutdown: the socket stays open in the successor) and release
 * their requests. Can't fail. */
void front_handover_commit(struct front *f);

/* The successor did not take them: thaw every frozen connection and
 * restore its request. Can't fail. */
void front_handover_rollback(struct front *f);

/* Take over connection fd (non-blocking, as handed over) described by rec:
 * a kept connection between requests, or one with a held request, which
 * *held then points to (hand it to the handler with front_req_set_user,
 * or answer it); *held is NULL otherwise. Returns 0, or -1 with a reason
 * in err (fd is then closed). */
int front_adopt(struct front *f, int fd, const struct handover_rec *rec, struct front_req **held, char *err,
                size_t errlen);

/* Open connections right now, and accepted since the start (metrics). */
size_t front_connections(const struct front *f);
unsigned long front_accepted(const struct front *f);

/* Close every connection and free the front. */
void front_free(struct front *f);

#endif
