/* serve_private.h - what the files of the serve module share (serve.c
 * routes and holds requests; serve_reply.c builds and sends answers;
 * serve_metrics.c the metrics page; serve_notify.c the admin notify POST;
 * serve_handover.c a request's save and restore for a successor). Only
 * these files include it. */
#ifndef KEMBALI_SERVE_PRIVATE_H
#define KEMBALI_SERVE_PRIVATE_H

#include "serve.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "coord.h"
#include "dynbuf.h"
#include "log.h"
#include "metrics.h"
#include "notify.h"
#include "state_redis.h"
#include "pace.h"
#include "render.h"
#include "request.h"
#include "stream.h"
#include "util.h"
#include "word.h"

/* Requests held for one shop (by id: shops come and go with reloads). */
struct serve_shop {
    char id[STATE_SHOP_MAX + 1];
    long held;
    bool logged;                /* an "over the cap" line was written, */
    int64_t logged_at;          /* at this time */
    struct serve_shop *next;
};

#define SERVE_SHOP_BUCKETS 256
#define SERVE_CAP_RETRY_S 5      /* Retry-After of an answer given because every slot is taken */
#define SERVE_CAP_LOG_MS 60000   /* one line per shop per minute */
/* The ceiling of an answer's buffers (dynbuf.h): what the front takes in
 * one answer. A page is a template (under 256 KiB) with its values escaped;
 * one that does not fit, with its headers, is answered 503 and logged,
 * never cut. */
#define SERVE_ANSWER_MAX FRONT_REPLY_MAX
/* What an answer's buffers are first made for (dynbuf_expect), so that a
 * usual answer is built in one allocation, not grown in steps: a page as
 * the stock templates render it (2.5 KB) or a little larger, and the
 * headers every answer carries (under 1 KB). */
#define SERVE_PAGE_EXPECT 4096
#define SERVE_HEADERS_EXPECT 1024
#define SERVE_ADDR_MAX 64        /* REMOTE_ADDR kept for a handover (an IPv6 address is at most 45) */

struct serve_notify;

struct serve {
    struct app *app;
    struct loop *loop;
    struct front *front;
    struct resolver *rs;
    struct serve_shop *shops[SERVE_SHOP_BUCKETS];
    struct serve_notify *telling; /* admin POSTs waiting for Redis's word */
    int64_t auth_logged_at;       /* the last auth_allowance_spent line (0: none) */
    bool handing;                 /* handing over to a successor: hold nothing here (serve_handing) */
    struct serve_req *parked;     /* requests kept aside meanwhile */
};

/* One request, from its arrival to its answer. Held requests live on the
 * heap (a few hundred bytes, the parameters already copied out); the others
 * on the stack of the handler. */
struct serve_req {
    struct serve *s;
    struct front_req *fr;
    struct config *cfg;         /* a reference, dropped when answered */
    const struct shop *shop;    /* in cfg */
    char id[STATE_ID_MAX + 1];
    bool json, head;
    const char *origin;         /* an allowed CORS origin (in cfg), or NULL */
    int64_t arrived;
    bool held;
    char addr[SERVE_ADDR_MAX];  /* REMOTE_ADDR, for a successor (handover.h) */
    struct state_client client; /* REMOTE_ADDR's identity */
    struct state_redis_client rclient; /* the same in Redis (has_rclient) */
    bool has_rclient;
    struct serve_shop *counted; /* its shop's count of held requests */
    struct resolver_waiter rw;
    struct serve_notify *telling; /* an admin POST waiting for Redis (not held) */
    /* the streamed page (stream.h): held requests only */
    bool stream;                /* may get it (a browser's navigation, its shop and templates allow it) */
    bool undecided;             /* its transaction is known undecided */
    struct stream_clock sc;     /* sc.painted != 0: the top went out, the result ends the answer */
    struct loop_timer st;       /* its next part */
    bool parked;                /* kept while handing over, never given to the resolver */
    struct serve_req *pprev, *pnext; /* the parked ones (serve's list) */
    bool frozen;                /* saved for a successor: neither held nor answered here */
};

/* An admin POST ?format=notify waiting for Redis's word on its status. */
struct serve_notify {
    struct serve_req r;           /* a copy; r.telling is this */
    struct notify_told t;
    struct state_redis_op *op;
    struct serve_notify *prev, *next;
};

/* ---- serve_reply.c: answers ---- */

/* The headers of an answer (status, content type, Kembali-Status `word`
 * when not NULL, Retry-After when retry_after >= 0, the security headers,
 * CORS when r's origin is allowed, then `extra`, already CRLF-ended) into
 * out. Returns DYNBUF_OK or why it did not fit. */
enum dynbuf_rc serve_put_headers(const struct serve_req *r, int http, const char *word, const char *ctype,
                                 long retry_after, const char *extra, struct dynbuf *out);

/* A whole answer (serve_put_headers, then body unless r is HEAD) into out. */
enum dynbuf_rc serve_build_response(const struct serve_req *r, int http, const char *word, const char *ctype,
                                    long retry_after, const char *extra, const struct dynbuf *body,
                                    struct dynbuf *out);

/* r's event=request line. Can't fail. */
void serve_log_request(const struct serve_req *r, int http, const char *word);

/* An answer (or its streamed `part`) that could not be built: one line. */
void serve_log_answer_failed(const struct serve_req *r, const char *part, enum dynbuf_rc rc);

/* Send out (built with result rc) as r's answer, or 503 when rc failed;
 * r->fr is answered and cleared. */
void serve_send_out(struct serve_req *r, const struct dynbuf *out, enum dynbuf_rc rc);

/* The values r's page fills its placeholders with; retry (cap bytes)
 * takes the "check again" URL of r's shop and id. */
void serve_page_vars_of(const struct serve_req *r, char *retry, size_t cap, struct page_vars *v);

/* Answer r with ans (HTML or JSON as r asks) at HTTP status `http`, with
 * `extra` headers (CRLF-ended, or NULL), and log it. */
void serve_respond(struct serve_req *r, const struct answer *ans, int http, const char *extra);

/* serve_respond() at the HTTP status of ans's word. */
void serve_respond_word(struct serve_req *r, const struct answer *ans);

/* The 405 for a method other than GET and HEAD (and the admin POST). */
void serve_respond_405(struct serve_req *r);

/* ---- serve_metrics.c ---- */

/* The metrics page (KEMBALI_ADMIN=1, format=metrics) as r's answer. */
void serve_respond_metrics(struct serve_req *r);

/* ---- serve_notify.c ---- */

/* The admin notify POST r (its query and Kembali-Signature sig): answered
 * here (returns false), or waiting for Redis's word (returns true: r's
 * copy then owns r->cfg). */
bool serve_respond_notify(struct serve_req *r, const char *query, const char *sig);

/* Take n off s's list of POSTs waiting for Redis. Can't fail. */
void serve_notify_unlink(struct serve *s, struct serve_notify *n);

/* Redis's word on a waiting POST (the callback of state_redis_tell_ask;
 * data is its struct serve_notify); rt->down: decided here (serve_stop
 * calls it so for every POST still waiting). The POST is answered and
 * freed. */
void serve_on_told(void *data, const struct state_redis_told *rt);

/* ---- serve.c: held requests ---- */

/* Hold tmp (copied to the heap; it takes tmp->cfg whatever happens): over
 * its shop's cap or out of memory it is answered at once. */
void serve_hold(struct serve_req *tmp);

/* Give a held r to the resolver (which may answer and free it at once). */
void serve_hold_go(struct serve_req *r);

/* Keep r aside while handing over (serve_handing), or take it back. */
void serve_park(struct serve_req *r);
void serve_unpark(struct serve_req *r);

/* r's place with the resolver (r->rw): its shop, id, client and format,
 * held until `deadline`; wants_read: a successor's request that had asked
 * for a read. Can't fail. */
void serve_waiter_init(struct serve_req *r, int64_t deadline, bool wants_read);

/* A held request's end: its shop's count, its configuration reference and
 * its memory. */
void serve_held_free(struct serve_req *r);

/* Answer r with what is known now (Retry-After: retry_after when >= 0 and
 * nothing final), dropping its configuration reference. */
void serve_answer_now(struct serve_req *r, long retry_after);

/* The count of requests held for shop `id` (created when missing; NULL
 * when out of memory). */
struct serve_shop *serve_shop_count(struct serve *s, const char *id);

/* The resolver's answer for a held request (resolver.h's waiter fn). */
void serve_on_answer(void *ctx, struct resolver_waiter *w, const struct state_fact *f);

/* A held request's streamed page: its next part is due. */
void serve_on_stream_timer(struct loop *l, struct loop_timer *t);

/* ---- serve_handover.c: the front's handover callbacks (front.h) ---- */

int serve_on_save(void *ctx, struct front_req *fr, void *user, struct handover_rec *rec);
void serve_on_restore(void *ctx, struct front_req *fr, void *user);
void serve_on_release(void *ctx, struct front_req *fr, void *user);

#endif
