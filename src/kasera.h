/* kasera.h - the Kasera API client: one libcurl multi handle on the loop.
 *
 * Every read of GET {api_base}/v1/transactions/{id} goes through one
 * kasera_client, whose sockets and timer are events of the process's loop
 * (curl_multi_socket_action), so a read never blocks anything. The multi handle keeps a pool of
 * keep-alive connections, so sequential reads reuse one connection. Each
 * read has a connect timeout and a total timeout (both read_timeout_ms), a
 * body size cap (64 KiB), no redirects, and HTTP(S) only. A request is
 * sent at most once: libcurl would silently resend it on a fresh connection
 * when a reused one dies before any answer, which Kasera would count as a
 * second read of the transaction within its 1 s window; such a read ends as
 * a read without answer instead.
 * At most KASERA_READS_MAX reads are under way at once: the others wait
 * their turn in order, holding no transfer (a burst of thousands of first
 * reads would otherwise open as many connections, each with libcurl's
 * buffers); the wait counts in the read's timeout, so a read still ends
 * within its timeout of kasera_start(), sent or not.
 * The secret key is put in the Authorization header and nowhere else; the
 * header memory is wiped when the read ends. */
#ifndef KEMBALI_KASERA_H
#define KEMBALI_KASERA_H

#include <stdint.h>

#include "classify.h"
#include "loop.h"

#define KASERA_BODY_MAX (64 * 1024)
#define KASERA_READS_MAX 64   /* reads under way at once (the connections kept are as many) */

struct kasera_client;

/* The headers of an answer that kembali reads, and libcurl's own words
 * for a failed transfer: allocated when a read's transfer starts, so that
 * a read waiting its turn (thousands, when a flash sale's reads fall due at
 * once) costs its struct kasera_read alone. */
struct kasera_headers {
    char retry_after[80], rl_limit[32], rl_remaining[32], rl_reset[32];
    char rl_sf[256], rl_policy[256];
    char curl_error[256];     /* CURLOPT_ERRORBUFFER (CURL_ERROR_SIZE) */
};

/* One read in progress; owned by the client between start and done. */
struct kasera_read {
    void *user;               /* the caller's context */
    long http;                /* 0 when no HTTP answer */
    char *body;
    size_t body_len;
    int too_big;
    struct kasera_headers *hdr; /* the answer's headers; NULL until its transfer started */
    char error[128];          /* why there is no answer when http == 0 (cut to fit) */
    long connects;            /* new connections this read opened (0 when reused) */
    int sends;                /* times the request was about to be sent */
    int64_t sent;             /* util_mono_ms() when it was sent (connected), 0 if never */
    /* private */
    void *easy;
    void *headers;
    int queued;               /* waiting its turn (no transfer yet) */
    const char *q_base, *q_id, *q_key;
    long q_timeout;
    int64_t q_since;
    struct kasera_read *q_prev, *q_next;
};

/* Called on the loop for each read that ended; the read's fields are final
 * and its transfer released except `body` and `hdr` (kasera_read_clear). */
typedef void kasera_done_fn(void *ctx, struct kasera_read *r);

/* Create a client on loop l; `done` is called for every read that ends.
 * Call once per process before any other thread starts (curl_global_init).
 * Returns NULL on failure (libcurl could not start). */
struct kasera_client *kasera_new(struct loop *l, kasera_done_fn *done, void *ctx);
void kasera_free(struct kasera_client *c);

/* Start reading transaction `id` (already validated) from api_base with
 * secret `key`, within timeout_ms; when KASERA_READS_MAX reads are under
 * way it waits its turn (api_base, id and key must then stay valid until
 * the read ends), and ends unsent (http 0) if its time runs out first.
 * Returns 0, or -1 with r->error set (nothing started). */
int kasera_start(struct kasera_client *c, struct kasera_read *r, const char *api_base,
                 const char *id, const char *key, long timeout_ms);

/* The answer of a finished read, as classify_response() wants it. */
void kasera_response(const struct kasera_read *r, struct api_response *out);

/* The answer's Retry-After as sent (for the log), or "" when none. */
const char *kasera_retry_after(const struct kasera_read *r);

/* Abandon a read in flight or waiting its turn (at shutdown); its
 * resources are released except `body` and `hdr` (kasera_read_clear). */
void kasera_abort(struct kasera_client *c, struct kasera_read *r);

/* Free the body and headers of a finished or abandoned read. */
void kasera_read_clear(struct kasera_read *r);

#endif
