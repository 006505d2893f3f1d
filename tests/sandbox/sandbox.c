/*
 * kasera-sandbox: a local stand-in for the Kasera Pay API, for kembali's tests.
 *
 * It answers GET /v1/transactions/{id} the way Kasera's API documentation
 * describes it (tests/sandbox/README.md): the failed-authentication limiter
 * per client IP, the key check, the fixed 300-per-minute window per key
 * (rejected requests count), the fixed one-read-per-second window per
 * (key, transaction) with Retry-After, and the RateLimit-* headers. Tests script transactions (status
 * timelines, faults, delays, dropped connections) and inspect what the client
 * did through a control API under /_sandbox/. Everything is in process memory.
 *
 * Threading: one thread per connection (libmicrohttpd), so a delayed answer
 * blocks only its own connection. All shared state lives in struct sandbox
 * behind one mutex, which is never held while sleeping or doing socket I/O.
 *
 * Secret keys are never printed: logs and the control API show only a tail
 * (the last 4 characters; valid keys are at least 8 characters long; a
 * presented token shorter than 8 shows as "(short)", none as null/"(none)").
 *
 * Requests under /v1/ are checked in this order (times: arrival of the headers):
 *  1. client IP blocked by the failed-auth limiter -> 429 rate_limited
 *     "too many failed authentication attempts ..." (no Retry-After);
 *  2. "Authorization: Bearer <valid key>" (scheme case-insensitive), else a
 *     failure is counted for the IP and 401 unauthorized. Failures count in a
 *     fixed --auth-fail-window-ms window from the first one; the failure that
 *     reaches --auth-fail-limit still gets its 401, and from then on every
 *     request from that IP gets the 429 of check 1 for --auth-block-ms;
 *  3. the key's fixed window (from its first request): every request counts,
 *     rejected ones included; over --key-limit -> 429 rate_limited "too many
 *     requests for this API key", no Retry-After, no RateLimit-* headers;
 *  then any other /v1 path -> 404 not_found, a malformed id -> 404, a method
 *  other than GET on /v1/transactions/{id} -> 405 (Allow: GET);
 *  4. the (key, transaction) window, opened by an accepted read: a read inside
 *     it -> 429 with Retry-After and RateLimit-Reset = whole seconds left
 *     (at least 1), RateLimit-Limit: 1, RateLimit-Remaining: 0;
 *  5. the next queued scripted response, if any (a demo slow-/boom- id
 *     behaves like one); else a queued forced fault or, in chaos mode, with
 *     probability rate, a fault drawn by weight (see "Chaos" below);
 *  6. 200 with {"id","status","amount":50000,"currency":"IDR"}, or 404 for an
 *     unknown id. Every answer from 5-6 carries RateLimit-Limit: 1,
 *     RateLimit-Remaining: 0, RateLimit-Reset: the window in whole seconds (1).
 * Error bodies: {"error":{"code","message","request_id":"req_<16 hex>"}}.
 *
 * Control API (no auth; the server accepts loopback peers only):
 *  PUT /_sandbox/transactions/{id}  {"timeline":[{"after_ms":N,"status":S}...],
 *      "responses":[{"http":200-599,"headers":{name: value|null},"body":string|JSON,
 *      "delay_ms":N,"close":bool,"pad_bytes":N}...]}  (both optional, unknown fields refused;
 *      pad_bytes appends that many spaces to the body, for oversized answers).
 *      Status = the latest timeline entry whose after_ms has passed since the
 *      PUT (entries are sorted by time), "pending" before the first. Replaces
 *      the id's script and forgets its read log; its rate windows stay. 204.
 *  GET /_sandbox/reads[?id=X]  {"reads":[{"id","t_ms","http","status",
 *      "error_code","key_tail","request_id"}...],"dropped":N}; http 0 = dropped,
 *      null = not answered yet (delayed); status/error_code as found in the
 *      body sent.
 *  GET /_sandbox/stats  {"connections","requests","by_key":{tail:N},
 *      "v1_connections" (connections that carried a /v1 request since the
 *      reset), "open_connections"}.
 *  POST /_sandbox/reset  forgets reads, stats, windows, auth failures and
 *      blocks, scripts and demo clocks; keeps keys. 204.
 *  POST /_sandbox/keys {"key":K}, DELETE /_sandbox/keys/{K}  204 (404 when
 *      there is no such valid key).
 *  PUT /_sandbox/chaos {"seed":N,"rate":0..1,"kinds":[K...] or {K:weight...},
 *      "hang_ms":N,"pad_bytes":N}  chaos mode (defaults: rate 1, every kind
 *      weight 1, hang 10000 ms, padding 100000 bytes); DELETE ends it. 204.
 *  POST /_sandbox/chaos/force {"kind":K[,"key_tail":T]}  one fault of kind K
 *      for the next read that reaches step 5 (with that key), chaos on or not. 204.
 *  POST /_sandbox/outage {"ms":N}  the API goes down for N ms, as a crash
 *      would (connections closed, delayed answers dropped, connections
 *      refused), then listens again on the same port with all its state. 202.
 *
 * Chaos kinds: hang (the answer after hang_ms), reset (dropped), 5xx (500,
 * 502, 503 or 504), bad_json (200, a truncated JSON or an HTML body), huge
 * (200, padded to over 64 KiB), retry_after (429, Retry-After: 1-3),
 * retry_after_date (429, Retry-After: an HTTP date 2-4 s ahead), key_limit
 * (429 rate_limited, no Retry-After), auth_block (the failed-authentication
 * 429), unverified_cap (429 unverified_count_cap or unverified_amount_cap).
 * The read log's "fault" names the kind injected and "retry_after_ms" the wait
 * a Retry-After stated (from the read's arrival); stats.chaos counts them.
 *
 * Build: gcc -std=c11 -D_GNU_SOURCE -Wall -Wextra -O2 -o kasera-sandbox \
 *          sandbox.c $(pkg-config --cflags --libs libmicrohttpd jansson) -lpthread -lm
 * Usage: kasera-sandbox --help
 */

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

/* ------------------------------------------------------------------------ */
/* Limits and constants                                                     */
/* ------------------------------------------------------------------------ */

#define BODY_MAX            (64 * 1024) /* largest request body accepted */
#define ID_MAX              64          /* transaction ids: 1..64 of [A-Za-z0-9_-] */
#define LOGGED_ID_MAX       80          /* how much of a malformed id the read log keeps */
#define KEY_MIN_LEN         8           /* so that a 4-character tail never shows a key whole */
#define KEY_MAX_LEN         256
#define KEYS_MAX            1024        /* key records, valid or revoked */
#define IPS_MAX             4096        /* client IPs tracked by the auth limiter */
#define TAILS_MAX           256         /* distinct key tails in stats.by_key */
#define READS_MAX           200000      /* read log entries kept (oldest dropped first) */
#define TX_SWEEP_AT         65536       /* transaction records before idle ones are swept */
#define SCRIPT_ITEMS_MAX    1024        /* timeline entries, queued responses */
#define FAULT_HDRS_MAX      32          /* extra headers of one scripted response */
#define ANSWER_HDRS_MAX     (FAULT_HDRS_MAX + 8)
#define HDR_NAME_MAX        64
#define HDR_VALUE_MAX       1024
#define STATUS_MAX          256         /* bytes of a scripted status string */
#define DELAY_MAX_MS        600000      /* longest scripted delay: 10 minutes */
#define AFTER_MAX_MS        1e12        /* latest timeline point */
#define CONNECTION_LIMIT    8192
#define CONNECTION_TIMEOUT_S 300        /* idle keep-alive connections are closed after this */
#define THREAD_STACK        (512 * 1024)
#define DEMO_SLOW_MS        7000
#define TX_AMOUNT           50000
#define TX_CURRENCY         "IDR"
#define TAIL_LEN            16          /* buffer for a printable key tail */
#define RID_LEN             24          /* buffer for "req_" + 16 hex digits */
#define IP_LEN              64          /* buffer for a textual client address */
#define CHAOS_FORCE_MAX     64          /* queued forced faults */
#define CHAOS_WEIGHT_MAX    1000000     /* largest weight of one chaos kind */
#define CHAOS_HANG_MS       10000       /* default hang of the "hang" kind */
#define CHAOS_PAD_BYTES     100000      /* default padding of the "huge" kind (over 64 KiB) */
#define OUTAGE_MAX_MS       600000      /* longest outage: 10 minutes */
#define OUTAGE_GRACE_US     100000      /* lets the outage call's own answer go out first */

#define MSG_AUTH_BLOCK "too many failed authentication attempts from this IP address"
#define MSG_UNAUTH     "invalid API key"
#define MSG_KEY_LIMIT  "too many requests for this API key"
#define MSG_TX_LIMIT   "at most one read per second per transaction; use webhooks for status updates"
#define MSG_UNVERIFIED "this account is not verified yet: finish verification in the dashboard"

/* ------------------------------------------------------------------------ */
/* Data                                                                     */
/* ------------------------------------------------------------------------ */

/* Command-line settings; read-only once the server runs. Times in microseconds. */
struct options {
	struct sockaddr_storage addr; /* where to listen (always a loopback address) */
	bool ipv6;
	bool demo;
	const char **keys;            /* --key values (point into argv) */
	size_t nkeys;
	int64_t key_limit;            /* requests per key window */
	int64_t key_window_us;
	int64_t tx_window_us;         /* 0 = no per-transaction window */
	int64_t auth_fail_limit;      /* 0 = never block */
	int64_t auth_fail_window_us;
	int64_t auth_block_us;
};

/* One header of an answer or of a scripted response. In a scripted response a
 * NULL value means "remove this default header". */
struct hdr {
	char *name;
	char *value;
};

/* One scripted response (an entry of "responses"), or a demo id's behaviour. */
struct fault {
	int http;            /* 0 = not given: the normal answer */
	struct hdr *hdrs;    /* extra headers, applied over the defaults */
	size_t nhdrs;
	char *body;          /* NULL = the default body for the status */
	int64_t delay_us;    /* sleep this long before answering */
	bool close;          /* drop the connection without answering */
	size_t pad;          /* append this many spaces to the body (oversized answers) */
};

/* One timeline point: from after_us after the PUT, the status is status. */
struct tl_entry {
	int64_t after_us;
	char *status;
};

/* What PUT /_sandbox/transactions/{id} installs. */
struct script {
	struct tl_entry *tl; /* sorted by after_us (stable) */
	size_t ntl;
	struct fault *faults;
	size_t nfaults;
};

/* The kinds of fault chaos mode injects (see chaos_plan). */
enum chaos_kind {
	CK_HANG,          /* the answer comes after hang_ms (beyond the client's timeout) */
	CK_RESET,         /* the connection is dropped without an answer */
	CK_5XX,           /* 500, 502, 503 or 504 */
	CK_BAD_JSON,      /* 200 with a truncated JSON or an HTML body */
	CK_HUGE,          /* 200 with the normal body padded past 64 KiB */
	CK_RETRY_AFTER,   /* 429 rate_limited, Retry-After: 1-3 (seconds) */
	CK_RETRY_DATE,    /* 429 rate_limited, Retry-After: an HTTP date 2-4 s ahead */
	CK_KEY_LIMIT,     /* 429 rate_limited without Retry-After: the key's minute is spent */
	CK_AUTH_BLOCK,    /* 429 rate_limited, the failed-authentication message */
	CK_UNVERIFIED,    /* 429 unverified_count_cap or unverified_amount_cap */
	CK_COUNT
};

static const char *const chaos_names[CK_COUNT] = {
	"hang", "reset", "5xx", "bad_json", "huge", "retry_after", "retry_after_date",
	"key_limit", "auth_block", "unverified_cap",
};

/* A fault queued by POST /_sandbox/chaos/force for the next read (with key
 * tail `tail`, or any key when tail is empty). */
struct chaos_force {
	enum chaos_kind kind;
	char tail[TAIL_LEN];
};

/* Chaos mode: every read that passed checks 1-4 and has no scripted response
 * gets, with probability rate, a fault of a kind drawn by weight from a seeded
 * generator (the same seed and the same reads give the same faults). */
struct chaos {
	bool on;
	uint64_t seed;
	uint64_t rng;                   /* xorshift64* state, never 0 */
	double rate;
	uint64_t weight[CK_COUNT];
	uint64_t total_weight;
	int64_t hang_us;
	size_t pad;
	struct chaos_force force[CHAOS_FORCE_MAX];
	size_t nforce;
	uint64_t injected[CK_COUNT];    /* since start or reset, forced ones included */
};

/* The per-(key, transaction) window: start of the window opened by the last
 * accepted read of this transaction with key number key. */
struct txwin {
	size_t key;
	int64_t start;
};

/* Everything known about one transaction id. */
struct tx {
	struct tx *next;          /* hash chain */
	char id[ID_MAX + 1];
	bool scripted;
	int64_t script_t0;        /* when the script was PUT */
	struct script script;
	size_t next_fault;        /* first queued response not yet used */
	bool demo_started;
	int64_t demo_t0;          /* first read of a demo id */
	struct txwin *wins;
	size_t nwins;
};

/* A secret key. Records are never removed (indices stay stable); a deleted key
 * is only marked invalid. */
struct key {
	char *secret;
	bool valid;
	bool win_open;
	int64_t win_start;
	int64_t win_count;
};

/* Failed-authentication bookkeeping for one client IP. */
struct ipstate {
	char ip[IP_LEN];
	int64_t fails;
	int64_t fail_start;
	bool blocked;
	int64_t blocked_until;
};

/* stats.by_key: requests to /v1 per presented key tail. */
struct tailcount {
	char tail[TAIL_LEN];
	uint64_t n;
};

/* One entry of the read log (every request to /v1/transactions/). */
struct readrec {
	uint64_t seq;
	int64_t t_us;
	int http;                  /* -1 until the answer is decided; 0 = dropped */
	char id[LOGGED_ID_MAX + 1];
	char tail[TAIL_LEN];
	bool has_tail;
	char request_id[RID_LEN];
	char *status;              /* owned; NULL = JSON null */
	char *error_code;          /* owned; NULL = JSON null */
	const char *fault;         /* chaos kind injected (static), or NULL */
	int64_t retry_after_ms;    /* the wait a Retry-After stated, from arrival; -1 = none */
};

/* The whole shared state. Everything below `lock` is protected by it. */
struct sandbox {
	struct options opt;
	_Atomic uint64_t rid_counter;
	uint64_t rid_seed;

	pthread_mutex_t stop_lock;   /* protects stopping; stop_cond wakes sleepers */
	pthread_cond_t stop_cond;
	bool stopping;

	pthread_mutex_t lock;
	struct key *keys;
	size_t nkeys;
	struct tx **buckets;
	size_t nbuckets, ntx, sweep_at;
	struct ipstate *ips;
	size_t nips;
	struct tailcount *tails;
	size_t ntails;
	struct readrec *reads;
	size_t nreads, capreads;
	uint64_t reads_dropped, next_seq;
	uint64_t connections, open_connections, v1_connections, requests;
	uint64_t generation;         /* bumped by reset; see struct conn */
	struct chaos chaos;
	int64_t outage_us;           /* an outage asked for, not yet begun (0 = none) */
	uint64_t outages;            /* outages begun since start or reset */
};

/* Per TCP connection: the generation in which it was last counted in
 * stats.v1_connections. */
struct conn {
	uint64_t v1_gen;
};

/* Per HTTP request. */
struct req {
	int64_t t_arrival;
	char ip[IP_LEN];
	char *body;
	size_t len;
	bool too_large;
	bool answered;
};

/* An answer under construction, plus what the log line and read log need. */
struct answer {
	int http;                  /* 0 = drop the connection without answering */
	char *body;                /* NUL-terminated, owned; NULL = empty */
	struct hdr hdrs[ANSWER_HDRS_MAX];
	size_t nhdrs;
	char request_id[RID_LEN];  /* "" when none */
	bool v1;                   /* a request to /v1 */
	bool has_tail;
	char tail[TAIL_LEN];
	uint64_t seq;              /* its read log entry, 0 = none */
	char *status;              /* owned: "status" of the body sent, or NULL */
	char *error_code;          /* owned: "error.code" of the body sent, or NULL */
	const char *note;          /* the log's fault=: "scripted", "delay", "close", ... */
	const char *chaos;         /* the chaos kind injected (static), or NULL */
	int64_t retry_after_ms;    /* the wait its Retry-After states; -1 = none */
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static int64_t g_mono_base_us;       /* set once in main before any thread */
static _Thread_local bool t_quiet;   /* silences MHD's log for a deliberate drop */

/* Returns microseconds of CLOCK_MONOTONIC since the sandbox started. Can't fail. */
static int64_t mono_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 - g_mono_base_us;
}

/* Returns the part of s after prefix, or NULL when s does not start with it. */
static const char *strprefix(const char *s, const char *prefix)
{
	size_t n = strlen(prefix);
	return strncmp(s, prefix, n) == 0 ? s + n : NULL;
}

/* Returns true when s is a transaction id: 1..ID_MAX characters of
 * [A-Za-z0-9_-]. */
static bool id_valid(const char *s)
{
	size_t n;
	for (n = 0; s[n]; n++) {
		char c = s[n];
		if (n >= ID_MAX)
			return false;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '-'))
			return false;
	}
	return n > 0;
}

/* Returns true when s is acceptable as a secret key: KEY_MIN_LEN..KEY_MAX_LEN
 * bytes of visible ASCII (no spaces). */
static bool key_valid(const char *s)
{
	size_t n = strlen(s);
	if (n < KEY_MIN_LEN || n > KEY_MAX_LEN)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
			return false;
	return true;
}

/* What printable_copy also replaces: for a bare log value, for a quoted log
 * value, for a JSON string (which jansson escapes itself). */
#define BAD_LOG_TOKEN " \"\\"
#define BAD_LOG_QUOTED "\"\\"
#define BAD_NONE ""

/* Copies src into dst (size n >= 4), replacing every byte outside printable
 * ASCII (0x20-0x7e) or in bad with '?'; a value too long for dst is cut and
 * ends in "...". The result is safe in a log line and valid UTF-8. Can't fail. */
static void printable_copy(char *dst, size_t n, const char *src, const char *bad)
{
	size_t i = 0;
	for (; src[i] && i + 1 < n; i++) {
		unsigned char c = (unsigned char)src[i];
		dst[i] = (c < 0x20 || c > 0x7e || strchr(bad, c)) ? '?' : (char)c;
	}
	dst[i] = '\0';
	if (src[i] && n >= 4)
		memcpy(dst + n - 4, "...", 4);
}

/* Writes the printable tail of a presented bearer token into out: its last 4
 * characters, anything outside [A-Za-z0-9._~+/:-] shown as '?'; or "(short)"
 * when the token is shorter than a valid key can be, so that no short token is
 * ever printed whole. Can't fail. */
static void key_tail(const char *token, char out[TAIL_LEN])
{
	size_t n = strlen(token);
	if (n < KEY_MIN_LEN) {
		snprintf(out, TAIL_LEN, "(short)");
		return;
	}
	for (size_t i = 0; i < 4; i++) {
		char c = token[n - 4 + i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || strchr("._~+/:-", c) != NULL;
		out[i] = ok ? c : '?';
	}
	out[4] = '\0';
}

/* Returns the token of an "Authorization: Bearer <token>" value (scheme
 * matched case-insensitively, one or more spaces after it), pointing into
 * value; NULL when value is NULL, another scheme, or has an empty token. */
static const char *bearer_token(const char *value)
{
	if (!value || strncasecmp(value, "Bearer", 6) != 0 || value[6] != ' ')
		return NULL;
	value += 6;
	while (*value == ' ')
		value++;
	return *value ? value : NULL;
}

/* Returns a JSON string for s, or JSON null when s is NULL (or not UTF-8).
 * Returns NULL only when out of memory. */
static json_t *json_string_or_null(const char *s)
{
	json_t *j = s ? json_string(s) : NULL;
	return j ? j : json_null();
}

/* Returns a new request id, "req_" + 16 hex digits, into out. Ids are unique
 * for the life of the process (a bijective mix of a counter). Can't fail. */
static void request_id_new(struct sandbox *sb, char out[RID_LEN])
{
	uint64_t x = atomic_fetch_add(&sb->rid_counter, 1) + sb->rid_seed;
	x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
	x ^= x >> 31;
	snprintf(out, RID_LEN, "req_%016" PRIx64, x);
}

/* Sleeps for us microseconds, or less when shutdown begins meanwhile. Returns
 * true when it slept the whole time, false when shutdown interrupted it. Holds
 * no lock but stop_lock (released while waiting). */
static bool sleep_unless_stopping(struct sandbox *sb, int64_t us)
{
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += (time_t)(us / 1000000);
	until.tv_nsec += (long)(us % 1000000) * 1000;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&sb->stop_lock);
	while (!sb->stopping &&
	       pthread_cond_timedwait(&sb->stop_cond, &sb->stop_lock, &until) != ETIMEDOUT)
		;
	bool slept = !sb->stopping;
	pthread_mutex_unlock(&sb->stop_lock);
	return slept;
}

/* ------------------------------------------------------------------------ */
/* Answers                                                                  */
/* ------------------------------------------------------------------------ */

/* Frees a scripted response's contents and zeroes it. NULL-safe. */
static void fault_free(struct fault *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->nhdrs; i++) {
		free(f->hdrs[i].name);
		free(f->hdrs[i].value);
	}
	free(f->hdrs);
	free(f->body);
	memset(f, 0, sizeof *f);
}

/* Frees what an answer owns. */
static void answer_free(struct answer *a)
{
	for (size_t i = 0; i < a->nhdrs; i++) {
		free(a->hdrs[i].name);
		free(a->hdrs[i].value);
	}
	a->nhdrs = 0;
	free(a->body);
	free(a->status);
	free(a->error_code);
	a->body = a->status = a->error_code = NULL;
}

/* Sets header name on the answer, replacing any header of that name
 * (case-insensitively); a NULL value only removes it. Silently does nothing
 * when out of room or memory (the answer is still well-formed). */
static void answer_header(struct answer *a, const char *name, const char *value)
{
	for (size_t i = 0; i < a->nhdrs;) {
		if (strcasecmp(a->hdrs[i].name, name) == 0) {
			free(a->hdrs[i].name);
			free(a->hdrs[i].value);
			a->hdrs[i] = a->hdrs[--a->nhdrs];
		} else {
			i++;
		}
	}
	if (!value || a->nhdrs >= ANSWER_HDRS_MAX)
		return;
	char *n = strdup(name), *v = strdup(value);
	if (!n || !v) {
		free(n);
		free(v);
		return;
	}
	a->hdrs[a->nhdrs++] = (struct hdr){ n, v };
}

/* Returns true when the answer has a header called name. */
static bool answer_has_header(const struct answer *a, const char *name)
{
	for (size_t i = 0; i < a->nhdrs; i++)
		if (strcasecmp(a->hdrs[i].name, name) == 0)
			return true;
	return false;
}

/* Returns a malloc'd {"error":{"code","message","request_id"}} body, or NULL
 * when out of memory. message is made printable ASCII first. */
static char *error_body(const char *code, const char *message, const char *rid)
{
	char msg[512];
	printable_copy(msg, sizeof msg, message, BAD_NONE);
	json_t *j = json_pack("{s:{s:s,s:s,s:s}}", "error", "code", code,
			      "message", msg, "request_id", rid);
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	return s;
}

/* Makes the answer an error: status http and the standard error body. Gives
 * the answer a request id first when it has none. */
static void answer_error(struct sandbox *sb, struct answer *a, int http,
			 const char *code, const char *message)
{
	if (!a->request_id[0])
		request_id_new(sb, a->request_id);
	a->http = http;
	free(a->body);
	a->body = error_body(code, message, a->request_id);
}

/* Returns the error code and message a generic error body uses for status
 * http (for scripted responses without a body). */
static void generic_error(int http, const char **code, const char **message)
{
	static const struct { int http; const char *code, *message; } table[] = {
		{ 400, "bad_request", "bad request" },
		{ 401, "unauthorized", MSG_UNAUTH },
		{ 403, "forbidden", "forbidden" },
		{ 404, "not_found", "transaction not found" },
		{ 405, "method_not_allowed", "method not allowed" },
		{ 409, "conflict", "conflict" },
		{ 422, "unprocessable_entity", "unprocessable entity" },
		{ 429, "rate_limited", "too many requests" },
		{ 500, "internal_error", "internal server error" },
		{ 502, "bad_gateway", "bad gateway" },
		{ 503, "service_unavailable", "service unavailable" },
		{ 504, "gateway_timeout", "gateway timeout" },
	};
	for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
		if (table[i].http == http) {
			*code = table[i].code;
			*message = table[i].message;
			return;
		}
	}
	*code = http >= 500 ? "server_error" : "error";
	*message = http >= 500 ? "server error" : "error";
}

/* Returns the malloc'd normal body of a transaction read, or NULL when out of
 * memory. */
static char *tx_body(const char *id, const char *status)
{
	json_t *j = json_pack("{s:s,s:s,s:i,s:s}", "id", id, "status", status,
			      "amount", TX_AMOUNT, "currency", TX_CURRENCY);
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	return s;
}

/* Extracts, for the read log, "status" and "error.code" from a body that is
 * a JSON object; each is a malloc'd copy or NULL when absent. Can't fail
 * (out of memory reads as absent). */
static void body_summary(const char *body, char **status, char **error_code)
{
	*status = *error_code = NULL;
	if (!body)
		return;
	json_t *j = json_loads(body, JSON_DECODE_ANY, NULL);
	if (json_is_object(j)) {
		const char *s = json_string_value(json_object_get(j, "status"));
		const char *e = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
		*status = s ? strdup(s) : NULL;
		*error_code = e ? strdup(e) : NULL;
	}
	json_decref(j);
}

/* Sends the answer on the connection. Returns MHD's verdict; MHD_NO (which
 * closes the connection) for a deliberate drop or when out of memory. */
static enum MHD_Result answer_send(struct MHD_Connection *c, struct answer *a)
{
	if (a->http == 0) {
		t_quiet = true; /* MHD would log the drop as an application error */
		return MHD_NO;
	}
	size_t len = a->body ? strlen(a->body) : 0;
	struct MHD_Response *r = MHD_create_response_from_buffer(len, a->body ? a->body : (char *)"",
								 MHD_RESPMEM_MUST_COPY);
	if (!r)
		return MHD_NO;
	for (size_t i = 0; i < a->nhdrs; i++)
		if (MHD_add_response_header(r, a->hdrs[i].name, a->hdrs[i].value) != MHD_YES)
			fprintf(stderr, "event=warning msg=\"header refused by libmicrohttpd\"\n");
	if (len > 0 && !answer_has_header(a, MHD_HTTP_HEADER_CONTENT_TYPE))
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	enum MHD_Result ret = MHD_queue_response(c, (unsigned int)a->http, r);
	MHD_destroy_response(r);
	return ret;
}

/* ------------------------------------------------------------------------ */
/* Transactions: hash table, scripts, demo ids, windows                     */
/* ------------------------------------------------------------------------ */

/* Frees a script's contents and zeroes it. */
static void script_free(struct script *s)
{
	for (size_t i = 0; i < s->ntl; i++)
		free(s->tl[i].status);
	free(s->tl);
	for (size_t i = 0; i < s->nfaults; i++)
		fault_free(&s->faults[i]);
	free(s->faults);
	memset(s, 0, sizeof *s);
}

/* Frees a transaction record. */
static void tx_free(struct tx *tx)
{
	script_free(&tx->script);
	free(tx->wins);
	free(tx);
}

/* Returns the FNV-1a hash of s. */
static uint64_t hash_str(const char *s)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * UINT64_C(0x100000001b3);
	return h;
}

/* Returns the record of id, or NULL. Caller holds sb->lock. */
static struct tx *tx_find(struct sandbox *sb, const char *id)
{
	if (!sb->nbuckets)
		return NULL;
	for (struct tx *t = sb->buckets[hash_str(id) % sb->nbuckets]; t; t = t->next)
		if (strcmp(t->id, id) == 0)
			return t;
	return NULL;
}

/* Drops records that carry nothing worth keeping at time now: not scripted,
 * no demo clock, every window over. Caller holds sb->lock. Can't fail. */
static void tx_sweep(struct sandbox *sb, int64_t now)
{
	for (size_t b = 0; b < sb->nbuckets; b++) {
		struct tx **pp = &sb->buckets[b];
		while (*pp) {
			struct tx *t = *pp;
			bool idle = !t->scripted && !t->demo_started;
			for (size_t i = 0; idle && i < t->nwins; i++)
				if (now - t->wins[i].start < sb->opt.tx_window_us)
					idle = false;
			if (idle) {
				*pp = t->next;
				tx_free(t);
				sb->ntx--;
			} else {
				pp = &t->next;
			}
		}
	}
	sb->sweep_at = sb->ntx * 2 > TX_SWEEP_AT ? sb->ntx * 2 : TX_SWEEP_AT;
}

/* Returns the record of id (a valid id), creating it when absent. Returns
 * NULL only when out of memory. Caller holds sb->lock. */
static struct tx *tx_get(struct sandbox *sb, const char *id, int64_t now)
{
	struct tx *t = tx_find(sb, id);
	if (t)
		return t;
	if (sb->ntx >= sb->sweep_at)
		tx_sweep(sb, now);
	if (sb->ntx >= sb->nbuckets * 2) { /* grow, rehashing every chain */
		size_t nb = sb->nbuckets ? sb->nbuckets * 2 : 1024;
		struct tx **nbk = calloc(nb, sizeof *nbk);
		if (nbk) {
			for (size_t b = 0; b < sb->nbuckets; b++) {
				while (sb->buckets[b]) {
					struct tx *m = sb->buckets[b];
					sb->buckets[b] = m->next;
					m->next = nbk[hash_str(m->id) % nb];
					nbk[hash_str(m->id) % nb] = m;
				}
			}
			free(sb->buckets);
			sb->buckets = nbk;
			sb->nbuckets = nb;
		} else if (!sb->nbuckets) {
			return NULL;
		}
	}
	t = calloc(1, sizeof *t);
	if (!t)
		return NULL;
	snprintf(t->id, sizeof t->id, "%s", id);
	size_t b = hash_str(id) % sb->nbuckets;
	t->next = sb->buckets[b];
	sb->buckets[b] = t;
	sb->ntx++;
	return t;
}

/* Frees every transaction record. Caller holds sb->lock (or is alone). */
static void tx_clear(struct sandbox *sb)
{
	for (size_t b = 0; b < sb->nbuckets; b++) {
		while (sb->buckets[b]) {
			struct tx *t = sb->buckets[b];
			sb->buckets[b] = t->next;
			tx_free(t);
		}
	}
	sb->ntx = 0;
	sb->sweep_at = TX_SWEEP_AT;
}

/* Returns the status a script's timeline gives elapsed_us after the PUT: the
 * last entry whose time has come, or "pending" before the first one (and when
 * there is no timeline). */
static const char *timeline_status(const struct script *s, int64_t elapsed_us)
{
	const char *status = "pending";
	for (size_t i = 0; i < s->ntl && s->tl[i].after_us <= elapsed_us; i++)
		status = s->tl[i].status;
	return status;
}

enum demo_kind { DEMO_TIMED, DEMO_SLOW, DEMO_BOOM };

/* A demo id family: pending for pending_ms after the first read (-1 = for
 * ever), then final. */
struct demo_rule {
	const char *prefix;
	enum demo_kind kind;
	int64_t pending_ms;
	const char *final;
};

static const struct demo_rule demo_rules[] = {
	{ "ok-", DEMO_TIMED, 5000, "succeeded" },
	{ "pay-", DEMO_TIMED, 12000, "succeeded" },
	{ "fail-", DEMO_TIMED, 0, "failed" },
	{ "cancel-", DEMO_TIMED, 0, "canceled" },
	{ "exp-", DEMO_TIMED, 0, "expired" },
	{ "pend-", DEMO_TIMED, -1, "pending" },
	{ "slow-", DEMO_SLOW, -1, "pending" },
	{ "boom-", DEMO_BOOM, -1, "pending" },
};

/* Returns the demo rule for id, or NULL when demo ids are off or id matches
 * no prefix. */
static const struct demo_rule *demo_rule_for(const struct sandbox *sb, const char *id)
{
	if (!sb->opt.demo)
		return NULL;
	for (size_t i = 0; i < sizeof demo_rules / sizeof demo_rules[0]; i++)
		if (strprefix(id, demo_rules[i].prefix))
			return &demo_rules[i];
	return NULL;
}

/* Returns the status transaction id has at time now (a pointer into the
 * state or a literal, valid while the lock is held), or NULL when the id is
 * not known (neither scripted nor a demo id). Caller holds sb->lock. */
static const char *tx_status_at(struct sandbox *sb, const char *id, int64_t now)
{
	struct tx *t = tx_find(sb, id);
	if (t && t->scripted)
		return timeline_status(&t->script, now - t->script_t0);
	const struct demo_rule *r = demo_rule_for(sb, id);
	if (!r)
		return NULL;
	int64_t t0 = (t && t->demo_started) ? t->demo_t0 : now;
	if (r->pending_ms < 0 || now - t0 < r->pending_ms * 1000)
		return "pending";
	return r->final;
}

/* Applies the per-(key, transaction) window to a read of t with key number
 * key at time now. Returns true when the read is accepted (it then opens a
 * new window); false when it falls inside the current window, with the whole
 * seconds until that window ends (at least 1) in *wait_s. A rejected read
 * does not extend the window. Caller holds sb->lock. */
static bool tx_window_admit(struct sandbox *sb, struct tx *t, size_t key, int64_t now,
			    int64_t *wait_s)
{
	if (sb->opt.tx_window_us == 0)
		return true;
	for (size_t i = 0; i < t->nwins; i++) {
		if (t->wins[i].key != key)
			continue;
		int64_t left = t->wins[i].start + sb->opt.tx_window_us - now;
		if (left > 0) {
			*wait_s = (left + 999999) / 1000000;
			return false;
		}
		t->wins[i].start = now;
		return true;
	}
	struct txwin *w = realloc(t->wins, (t->nwins + 1) * sizeof *w);
	if (w) { /* out of memory: accept without a window rather than fail */
		t->wins = w;
		t->wins[t->nwins++] = (struct txwin){ key, now };
	}
	return true;
}

/* ------------------------------------------------------------------------ */
/* Keys, the failed-authentication limiter, stats                           */
/* ------------------------------------------------------------------------ */

/* Finds the valid key equal to token; returns true with its index in *idx,
 * false when token is NULL or no valid key matches. Caller holds sb->lock. */
static bool key_lookup(struct sandbox *sb, const char *token, size_t *idx)
{
	if (!token)
		return false;
	for (size_t i = 0; i < sb->nkeys; i++) {
		if (sb->keys[i].valid && strcmp(sb->keys[i].secret, token) == 0) {
			*idx = i;
			return true;
		}
	}
	return false;
}

/* Makes secret a valid key (re-validating a deleted one keeps its record).
 * Returns 0, or -1 when out of room or memory. Caller holds sb->lock (or is
 * alone). */
static int key_add(struct sandbox *sb, const char *secret)
{
	for (size_t i = 0; i < sb->nkeys; i++) {
		if (strcmp(sb->keys[i].secret, secret) == 0) {
			sb->keys[i].valid = true;
			return 0;
		}
	}
	if (sb->nkeys >= KEYS_MAX)
		return -1;
	struct key *k = realloc(sb->keys, (sb->nkeys + 1) * sizeof *k);
	if (!k)
		return -1;
	sb->keys = k;
	char *s = strdup(secret);
	if (!s)
		return -1;
	sb->keys[sb->nkeys++] = (struct key){ .secret = s, .valid = true };
	return 0;
}

/* Counts a request with key k at time now in the key's fixed window (which
 * starts at the key's first request and lasts key_window). Returns true when
 * the request is within the limit. Caller holds sb->lock. */
static bool key_admit(struct sandbox *sb, struct key *k, int64_t now)
{
	if (!k->win_open || now - k->win_start >= sb->opt.key_window_us) {
		k->win_open = true;
		k->win_start = now;
		k->win_count = 0;
	}
	k->win_count++;
	return k->win_count <= sb->opt.key_limit;
}

/* Returns the limiter record of ip, creating one when create is set (reusing
 * an idle record when full). Returns NULL when absent, or when full of busy
 * records. Caller holds sb->lock. */
static struct ipstate *ip_find(struct sandbox *sb, const char *ip, bool create, int64_t now)
{
	for (size_t i = 0; i < sb->nips; i++)
		if (strcmp(sb->ips[i].ip, ip) == 0)
			return &sb->ips[i];
	if (!create)
		return NULL;
	struct ipstate *st = NULL;
	if (sb->nips < IPS_MAX) {
		st = &sb->ips[sb->nips++];
	} else {
		for (size_t i = 0; i < sb->nips && !st; i++) {
			struct ipstate *s = &sb->ips[i];
			if (!(s->blocked && now < s->blocked_until) &&
			    now - s->fail_start >= sb->opt.auth_fail_window_us)
				st = s;
		}
		if (!st)
			return NULL;
	}
	memset(st, 0, sizeof *st);
	snprintf(st->ip, sizeof st->ip, "%s", ip);
	return st;
}

/* Returns true while ip is blocked by the failed-authentication limiter at
 * time now; a block that has run out is lifted (with a fresh failure count).
 * Caller holds sb->lock. */
static bool ip_blocked(struct sandbox *sb, const char *ip, int64_t now)
{
	struct ipstate *st = ip_find(sb, ip, false, now);
	if (!st || !st->blocked)
		return false;
	if (now < st->blocked_until)
		return true;
	st->blocked = false;
	st->fails = 0;
	return false;
}

/* Counts a failed authentication from ip at time now. Failures are counted in
 * a fixed window of auth_fail_window starting at the first failure; the
 * failure that reaches auth_fail_limit still gets its 401, and blocks ip for
 * auth_block from that moment. Caller holds sb->lock. Can't fail (an
 * untrackable IP is simply not counted). */
static void ip_fail(struct sandbox *sb, const char *ip, int64_t now)
{
	if (sb->opt.auth_fail_limit == 0)
		return;
	struct ipstate *st = ip_find(sb, ip, true, now);
	if (!st)
		return;
	if (st->fails == 0 || now - st->fail_start >= sb->opt.auth_fail_window_us) {
		st->fails = 0;
		st->fail_start = now;
	}
	if (++st->fails >= sb->opt.auth_fail_limit) {
		st->blocked = true;
		st->blocked_until = now + sb->opt.auth_block_us;
		st->fails = 0;
		fprintf(stderr, "event=auth_block ip=%s block_ms=%" PRId64 "\n", ip,
			sb->opt.auth_block_us / 1000);
	}
}

/* Counts one /v1 request under tail in stats.by_key (tails beyond TAILS_MAX
 * are counted under "(other)"). Caller holds sb->lock. Can't fail. */
static void tail_count(struct sandbox *sb, const char *tail)
{
	for (size_t i = 0; i < sb->ntails; i++) {
		if (strcmp(sb->tails[i].tail, tail) == 0) {
			sb->tails[i].n++;
			return;
		}
	}
	if (sb->ntails + 1 >= TAILS_MAX) /* keep the last slot for "(other)" */
		tail = "(other)";
	for (size_t i = 0; i < sb->ntails; i++) {
		if (strcmp(sb->tails[i].tail, tail) == 0) {
			sb->tails[i].n++;
			return;
		}
	}
	snprintf(sb->tails[sb->ntails].tail, TAIL_LEN, "%s", tail);
	sb->tails[sb->ntails++].n = 1;
}

/* ------------------------------------------------------------------------ */
/* The read log                                                             */
/* ------------------------------------------------------------------------ */

/* Frees the strings of read log entries [from, to). */
static void reads_free_range(struct sandbox *sb, size_t from, size_t to)
{
	for (size_t i = from; i < to; i++) {
		free(sb->reads[i].status);
		free(sb->reads[i].error_code);
	}
}

/* Appends an entry (answer not yet known) and returns its sequence number,
 * or 0 when out of memory. When READS_MAX entries are kept, the oldest tenth
 * is dropped first (counted in reads_dropped). Caller holds sb->lock. */
static uint64_t reads_append(struct sandbox *sb, const char *id, int64_t t_us,
			     const char *tail, const char *rid)
{
	if (sb->nreads >= READS_MAX) {
		size_t drop = READS_MAX / 10;
		reads_free_range(sb, 0, drop);
		memmove(sb->reads, sb->reads + drop, (sb->nreads - drop) * sizeof *sb->reads);
		sb->nreads -= drop;
		sb->reads_dropped += drop;
	}
	if (sb->nreads == sb->capreads) {
		size_t cap = sb->capreads ? sb->capreads * 2 : 1024;
		struct readrec *r = realloc(sb->reads, cap * sizeof *r);
		if (!r)
			return 0;
		sb->reads = r;
		sb->capreads = cap;
	}
	struct readrec *r = &sb->reads[sb->nreads++];
	memset(r, 0, sizeof *r);
	r->seq = ++sb->next_seq;
	r->t_us = t_us;
	r->http = -1;
	r->retry_after_ms = -1;
	printable_copy(r->id, sizeof r->id, id, BAD_NONE);
	if (tail) {
		r->has_tail = true;
		snprintf(r->tail, sizeof r->tail, "%s", tail);
	}
	snprintf(r->request_id, sizeof r->request_id, "%s", rid);
	return r->seq;
}

/* Records the answer a of entry seq: its HTTP status, copies of status and
 * error_code (either may be NULL), the chaos kind and the stated Retry-After.
 * An entry gone meanwhile (reset, PUT) is ignored. Caller holds sb->lock.
 * Can't fail (out of memory records null). */
static void reads_finish(struct sandbox *sb, uint64_t seq, const struct answer *a)
{
	int http = a->http;
	const char *status = a->status, *error_code = a->error_code;
	size_t lo = 0, hi = sb->nreads; /* entries are sorted by seq */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (sb->reads[mid].seq < seq)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (seq == 0 || lo >= sb->nreads || sb->reads[lo].seq != seq)
		return;
	struct readrec *r = &sb->reads[lo];
	r->http = http;
	free(r->status);
	free(r->error_code);
	r->status = status ? strdup(status) : NULL;
	r->error_code = error_code ? strdup(error_code) : NULL;
	r->fault = a->chaos;
	r->retry_after_ms = a->retry_after_ms;
}

/* Removes every entry about id, keeping the others in order. Caller holds
 * sb->lock. */
static void reads_forget_id(struct sandbox *sb, const char *id)
{
	size_t out = 0;
	for (size_t i = 0; i < sb->nreads; i++) {
		if (strcmp(sb->reads[i].id, id) == 0)
			reads_free_range(sb, i, i + 1);
		else
			sb->reads[out++] = sb->reads[i];
	}
	sb->nreads = out;
}

/* ------------------------------------------------------------------------ */
/* GET /v1/transactions/{id}                                                */
/* ------------------------------------------------------------------------ */

/* A read that passed checks 1-4, to answer after the lock is released. */
struct plan {
	char id[ID_MAX + 1];
	struct fault fault; /* owned; all zero = the normal answer */
	const char *chaos;  /* the chaos kind that made fault, or NULL */
	int64_t retry_after_ms; /* the wait fault's Retry-After states; -1 = none */
};

/* Decides how the accepted read of t at time now is answered: takes the next
 * queued scripted response (moving it into plan), or a demo id's behaviour,
 * and starts a demo id's clock on its first read. Returns true when a
 * scripted response or a demo behaviour applies (chaos then stays out).
 * Caller holds sb->lock. */
static bool plan_read(struct sandbox *sb, struct tx *t, int64_t now, struct plan *plan)
{
	snprintf(plan->id, sizeof plan->id, "%s", t->id);
	plan->retry_after_ms = -1;
	if (t->scripted) {
		if (t->next_fault < t->script.nfaults) {
			plan->fault = t->script.faults[t->next_fault];
			memset(&t->script.faults[t->next_fault], 0, sizeof plan->fault);
			t->next_fault++;
			return true;
		}
		return false;
	}
	const struct demo_rule *r = demo_rule_for(sb, t->id);
	if (!r)
		return false;
	if (!t->demo_started) {
		t->demo_started = true;
		t->demo_t0 = now;
	}
	if (r->kind == DEMO_SLOW)
		plan->fault.delay_us = (int64_t)DEMO_SLOW_MS * 1000;
	else if (r->kind == DEMO_BOOM)
		plan->fault.http = 500;
	return r->kind != DEMO_TIMED;
}

/* ---- chaos mode ---- */

/* Returns the next number of the chaos generator (xorshift64*). */
static uint64_t chaos_next(struct chaos *ch)
{
	ch->rng ^= ch->rng >> 12;
	ch->rng ^= ch->rng << 25;
	ch->rng ^= ch->rng >> 27;
	return ch->rng * UINT64_C(2685821657736338717);
}

/* Returns a number in [0, n) from the chaos generator (n > 0). */
static uint64_t chaos_below(struct chaos *ch, uint64_t n)
{
	return chaos_next(ch) % n;
}

/* Adds header name: value (NULL = remove that default) to f. Returns false
 * when out of memory (f stays valid for fault_free). */
static bool fault_add_header(struct fault *f, const char *name, const char *value)
{
	struct hdr *h = realloc(f->hdrs, (f->nhdrs + 1) * sizeof *h);
	if (!h)
		return false;
	f->hdrs = h;
	h[f->nhdrs].name = strdup(name);
	h[f->nhdrs].value = value ? strdup(value) : NULL;
	f->nhdrs++;
	return h[f->nhdrs - 1].name && (!value || h[f->nhdrs - 1].value);
}

/* Makes f the 429 rate_limited answer with message msg and no RateLimit-*
 * headers (the key's or the host's limit, not the transaction's). */
static void fault_no_window(struct fault *f, const char *code, const char *msg, const char *rid)
{
	f->http = 429;
	f->body = error_body(code, msg, rid);
	fault_add_header(f, "RateLimit-Limit", NULL);
	fault_add_header(f, "RateLimit-Remaining", NULL);
	fault_add_header(f, "RateLimit-Reset", NULL);
}

/* Picks the fault of the read of plan->id with key tail `tail` (NULL: none
 * presented): the first queued forced fault for that tail (or for any key),
 * else, in chaos mode, with probability rate a kind drawn by weight; fills
 * plan (fault, chaos kind, stated Retry-After) and counts it. rid is the
 * read's request id, for error bodies. Caller holds sb->lock. Can't fail
 * (out of memory gives a fault without its body or headers). */
static void chaos_plan(struct sandbox *sb, const char *tail, const char *rid, struct plan *plan)
{
	struct chaos *ch = &sb->chaos;
	enum chaos_kind kind = CK_COUNT;
	char buf[64];

	for (size_t i = 0; i < ch->nforce; i++) {
		if (ch->force[i].tail[0] && (!tail || strcmp(ch->force[i].tail, tail) != 0))
			continue;
		kind = ch->force[i].kind;
		memmove(&ch->force[i], &ch->force[i + 1], (ch->nforce - i - 1) * sizeof ch->force[0]);
		ch->nforce--;
		break;
	}
	if (kind == CK_COUNT && ch->on && ch->total_weight > 0 &&
	    (double)(chaos_next(ch) >> 11) * 0x1.0p-53 < ch->rate) {
		uint64_t r = chaos_below(ch, ch->total_weight);
		for (kind = 0; kind < CK_COUNT - 1 && r >= ch->weight[kind]; kind++)
			r -= ch->weight[kind];
	}
	if (kind == CK_COUNT)
		return;
	ch->injected[kind]++;
	plan->chaos = chaos_names[kind];
	struct fault *f = &plan->fault;
	switch (kind) {
	case CK_HANG:
		f->delay_us = ch->hang_us;
		break;
	case CK_RESET:
		f->close = true;
		break;
	case CK_5XX: {
		static const int codes[] = { 500, 502, 503, 504 };
		f->http = codes[chaos_below(ch, 4)];
		break;
	}
	case CK_BAD_JSON:
		f->http = 200;
		if (chaos_below(ch, 2) == 0) {
			snprintf(buf, sizeof buf, "{\"id\":\"%.20s\",\"status\":\"succ", plan->id);
			f->body = strdup(buf);
		} else {
			f->body = strdup("<html><body>502 Bad Gateway</body></html>");
			fault_add_header(f, "Content-Type", "text/html");
		}
		break;
	case CK_HUGE:
		f->http = 200;
		f->pad = ch->pad;
		break;
	case CK_RETRY_AFTER:
	case CK_RETRY_DATE: {
		int64_t secs = kind == CK_RETRY_AFTER ? 1 + (int64_t)chaos_below(ch, 3) : 2 + (int64_t)chaos_below(ch, 3);
		f->http = 429;
		f->body = error_body("rate_limited", MSG_TX_LIMIT, rid);
		if (kind == CK_RETRY_AFTER) {
			snprintf(buf, sizeof buf, "%" PRId64, secs);
			plan->retry_after_ms = secs * 1000;
		} else { /* a whole second of the wall clock, secs ahead: the date has no finer unit */
			struct timespec now;
			struct tm tm;
			clock_gettime(CLOCK_REALTIME, &now);
			time_t when = now.tv_sec + (time_t)secs;
			gmtime_r(&when, &tm);
			strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
			plan->retry_after_ms = secs * 1000 - now.tv_nsec / 1000000;
		}
		fault_add_header(f, "Retry-After", buf);
		snprintf(buf, sizeof buf, "%" PRId64, secs);
		fault_add_header(f, "RateLimit-Reset", buf);
		break;
	}
	case CK_KEY_LIMIT:
		fault_no_window(f, "rate_limited", MSG_KEY_LIMIT, rid);
		break;
	case CK_AUTH_BLOCK:
		fault_no_window(f, "rate_limited", MSG_AUTH_BLOCK, rid);
		break;
	case CK_UNVERIFIED:
		fault_no_window(f, chaos_below(ch, 2) ? "unverified_count_cap" : "unverified_amount_cap",
				MSG_UNVERIFIED, rid);
		break;
	case CK_COUNT:
		break;
	}
}

/* Adds the per-transaction limit headers (Reset = the window in whole
 * seconds, at least 1, or secs when given). */
static void add_ratelimit_headers(struct sandbox *sb, struct answer *a, int64_t secs)
{
	char buf[32];
	if (secs <= 0)
		secs = sb->opt.tx_window_us > 0 ? (sb->opt.tx_window_us + 999999) / 1000000 : 1;
	snprintf(buf, sizeof buf, "%" PRId64, secs);
	answer_header(a, "RateLimit-Limit", "1");
	answer_header(a, "RateLimit-Remaining", "0");
	answer_header(a, "RateLimit-Reset", buf);
}

/* Carries out an accepted read: sleeps for a delay (without the lock), drops
 * the connection for "close", else answers with the scripted status, headers
 * and body over the defaults (the RateLimit-* headers, the transaction JSON
 * for 200 with the status at the moment of answering, a generic error body
 * otherwise). A delay cut short by shutdown drops the connection. */
static void carry_out(struct sandbox *sb, struct plan *plan, struct answer *a)
{
	struct fault *f = &plan->fault;
	if (f->delay_us > 0) {
		a->note = "delay";
		if (!sleep_unless_stopping(sb, f->delay_us)) {
			a->http = 0;
			return;
		}
	}
	if (f->close) {
		a->note = "close";
		a->http = 0;
		return;
	}
	pthread_mutex_lock(&sb->lock);
	const char *st = tx_status_at(sb, plan->id, mono_us());
	char *status = st ? strdup(st) : NULL;
	pthread_mutex_unlock(&sb->lock);

	a->http = f->http ? f->http : (st ? 200 : 404);
	if (f->body) {
		a->body = f->body; /* taken over from the plan */
		f->body = NULL;
	} else if (a->http == 200) {
		/* a status that vanished meanwhile (reset during a delay) reads as pending */
		a->body = tx_body(plan->id, status ? status : "pending");
	} else {
		const char *code, *message;
		generic_error(a->http, &code, &message);
		a->body = error_body(code, message, a->request_id);
	}
	free(status);
	if (f->pad > 0 && a->body) { /* JSON allows trailing whitespace: still valid, just large */
		size_t n = strlen(a->body);
		char *nb = realloc(a->body, n + f->pad + 1);
		if (nb) {
			memset(nb + n, ' ', f->pad);
			nb[n + f->pad] = '\0';
			a->body = nb;
		}
	}
	add_ratelimit_headers(sb, a, 0);
	for (size_t i = 0; i < f->nhdrs; i++)
		answer_header(a, f->hdrs[i].name, f->hdrs[i].value);
	if (f->http || f->body || f->nhdrs)
		a->note = a->note ? "delay+scripted" : "scripted";
}

/* Answers any request under /v1/: checks 1-3 (failed-auth block, key, key
 * window) for every path, then routes; for GET /v1/transactions/{id} checks
 * 4-6 (transaction window, scripted responses, status or 404). Every request
 * under /v1/transactions/ gets a read log entry. Fills a; can't fail (out of
 * memory gives a 500 or an empty body). */
static void serve_v1(struct sandbox *sb, struct MHD_Connection *c, const char *url,
		     const char *method, const struct req *rq, struct answer *a)
{
	const char *token = bearer_token(MHD_lookup_connection_value(c, MHD_HEADER_KIND,
								     MHD_HTTP_HEADER_AUTHORIZATION));
	const char *id = strprefix(url, "/v1/transactions/");
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct conn *cc = ci ? ci->socket_context : NULL;
	struct plan plan;
	bool planned = false;
	int64_t now = rq->t_arrival;
	size_t k = 0;
	int64_t wait_s = 1;

	memset(&plan, 0, sizeof plan);
	a->v1 = true;
	request_id_new(sb, a->request_id);
	if (token) {
		a->has_tail = true;
		key_tail(token, a->tail);
	}

	pthread_mutex_lock(&sb->lock);
	sb->requests++;
	tail_count(sb, token ? a->tail : "(none)");
	if (cc && cc->v1_gen != sb->generation) {
		cc->v1_gen = sb->generation;
		sb->v1_connections++;
	}
	if (id)
		a->seq = reads_append(sb, id, now, token ? a->tail : NULL, a->request_id);

	if (ip_blocked(sb, rq->ip, now)) {
		answer_error(sb, a, 429, "rate_limited", MSG_AUTH_BLOCK);
	} else if (!key_lookup(sb, token, &k)) {
		ip_fail(sb, rq->ip, now);
		answer_error(sb, a, 401, "unauthorized", MSG_UNAUTH);
	} else if (!key_admit(sb, &sb->keys[k], now)) {
		answer_error(sb, a, 429, "rate_limited", MSG_KEY_LIMIT);
	} else if (!id) {
		answer_error(sb, a, 404, "not_found", "no such endpoint");
	} else if (!id_valid(id)) {
		answer_error(sb, a, 404, "not_found", "transaction not found");
	} else if (strcmp(method, MHD_HTTP_METHOD_GET) != 0) {
		answer_error(sb, a, 405, "method_not_allowed", "method not allowed");
		answer_header(a, MHD_HTTP_HEADER_ALLOW, MHD_HTTP_METHOD_GET);
	} else {
		struct tx *t = tx_get(sb, id, now);
		if (!t) {
			answer_error(sb, a, 500, "internal_error", "out of memory");
		} else if (!tx_window_admit(sb, t, k, now, &wait_s)) {
			char secs[32];
			snprintf(secs, sizeof secs, "%" PRId64, wait_s);
			answer_error(sb, a, 429, "rate_limited", MSG_TX_LIMIT);
			answer_header(a, MHD_HTTP_HEADER_RETRY_AFTER, secs);
			add_ratelimit_headers(sb, a, wait_s);
			a->retry_after_ms = wait_s * 1000;
		} else {
			if (!plan_read(sb, t, now, &plan))
				chaos_plan(sb, token ? a->tail : NULL, a->request_id, &plan);
			planned = true;
		}
	}
	pthread_mutex_unlock(&sb->lock);

	if (planned) {
		carry_out(sb, &plan, a);
		a->chaos = plan.chaos;
		if (plan.retry_after_ms >= 0)
			a->retry_after_ms = plan.retry_after_ms;
		if (plan.chaos)
			a->note = plan.chaos;
	}
	fault_free(&plan.fault);

	body_summary(a->http ? a->body : NULL, &a->status, &a->error_code);
	if (a->seq) {
		pthread_mutex_lock(&sb->lock);
		reads_finish(sb, a->seq, a);
		pthread_mutex_unlock(&sb->lock);
	}
}

/* ------------------------------------------------------------------------ */
/* The control API: /_sandbox/                                              */
/* ------------------------------------------------------------------------ */

/* Returns true when name is an HTTP header name (1..HDR_NAME_MAX tchars). */
static bool header_name_valid(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n > HDR_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      strchr("!#$%&'*+-.^_`|~", c)))
			return false;
	}
	return true;
}

/* Returns true when value can be sent as a header value: at most
 * HDR_VALUE_MAX bytes, no control characters but tab. */
static bool header_value_valid(const char *value)
{
	size_t n = strlen(value);
	if (n > HDR_VALUE_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)value[i];
		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return false;
	}
	return true;
}

/* Reads a JSON number in [0, max] into *out. Returns false when j is not one. */
static bool json_range(const json_t *j, double max, double *out)
{
	if (!json_is_number(j))
		return false;
	double v = json_number_value(j);
	if (!isfinite(v) || v < 0 || v > max)
		return false;
	*out = v;
	return true;
}

/* Parses one entry of "responses" (number i) into *f. Returns true on
 * success; false with a reason in err (f then holds what was parsed so far,
 * for fault_free). */
static bool fault_parse(json_t *o, size_t i, struct fault *f, char *err, size_t errlen)
{
	const char *name;
	json_t *v;
	double d;

	if (!json_is_object(o)) {
		snprintf(err, errlen, "responses[%zu] must be an object", i);
		return false;
	}
	json_object_foreach(o, name, v) {
		if (strcmp(name, "http") == 0) {
			json_int_t h = json_integer_value(v);
			if (!json_is_integer(v) || h < 200 || h > 599) {
				snprintf(err, errlen, "responses[%zu].http must be an integer from 200 to 599", i);
				return false;
			}
			f->http = (int)h;
		} else if (strcmp(name, "headers") == 0) {
			const char *hn;
			json_t *hv;
			if (!json_is_object(v) || json_object_size(v) > FAULT_HDRS_MAX) {
				snprintf(err, errlen, "responses[%zu].headers must be an object of at most %d headers",
					 i, FAULT_HDRS_MAX);
				return false;
			}
			f->hdrs = calloc(json_object_size(v) + 1, sizeof *f->hdrs);
			if (!f->hdrs) {
				snprintf(err, errlen, "out of memory");
				return false;
			}
			json_object_foreach(v, hn, hv) {
				if (!header_name_valid(hn) || !(json_is_null(hv) || (json_is_string(hv) &&
				    header_value_valid(json_string_value(hv))))) {
					snprintf(err, errlen, "responses[%zu].headers: a bad header name or value "
						 "(values: strings without control characters, or null to remove a default)", i);
					return false;
				}
				struct hdr *h = &f->hdrs[f->nhdrs++];
				h->name = strdup(hn);
				h->value = json_is_string(hv) ? strdup(json_string_value(hv)) : NULL;
				if (!h->name || (json_is_string(hv) && !h->value)) {
					snprintf(err, errlen, "out of memory");
					return false;
				}
			}
		} else if (strcmp(name, "body") == 0) {
			if (json_is_string(v))
				f->body = strdup(json_string_value(v));
			else if (!json_is_null(v))
				f->body = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
			if (!json_is_null(v) && !f->body) {
				snprintf(err, errlen, "out of memory");
				return false;
			}
		} else if (strcmp(name, "delay_ms") == 0) {
			if (!json_range(v, DELAY_MAX_MS, &d)) {
				snprintf(err, errlen, "responses[%zu].delay_ms must be a number from 0 to %d",
					 i, DELAY_MAX_MS);
				return false;
			}
			f->delay_us = (int64_t)llround(d * 1000);
		} else if (strcmp(name, "pad_bytes") == 0) {
			if (!json_range(v, 1 << 20, &d)) {
				snprintf(err, errlen, "responses[%zu].pad_bytes must be a number from 0 to %d", i, 1 << 20);
				return false;
			}
			f->pad = (size_t)d;
		} else if (strcmp(name, "close") == 0) {
			if (!json_is_boolean(v)) {
				snprintf(err, errlen, "responses[%zu].close must be true or false", i);
				return false;
			}
			f->close = json_is_true(v);
		} else {
			snprintf(err, errlen, "responses[%zu]: unknown field (known: http, headers, body, "
				 "delay_ms, close, pad_bytes)", i);
			return false;
		}
	}
	return true;
}

/* Returns true when libmicrohttpd accepts every header of f; otherwise false
 * with the reason in err. */
static bool fault_headers_sendable(const struct fault *f, size_t i, char *err, size_t errlen)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
	bool ok = r != NULL;
	for (size_t h = 0; ok && h < f->nhdrs; h++)
		if (f->hdrs[h].value && MHD_add_response_header(r, f->hdrs[h].name, f->hdrs[h].value) != MHD_YES)
			ok = false;
	if (r)
		MHD_destroy_response(r);
	if (!ok)
		snprintf(err, errlen, "responses[%zu].headers: libmicrohttpd refuses one of them "
			 "(Content-Length, Transfer-Encoding and the like cannot be scripted)", i);
	return ok;
}

/* Parses a PUT /_sandbox/transactions/{id} body into *out. Returns true on
 * success; false with a reason in err and nothing allocated. Unknown fields
 * are refused so that a typo cannot silently change a test. */
static bool script_parse(const char *body, size_t len, struct script *out, char *err, size_t errlen)
{
	json_error_t je;
	json_t *root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
	struct script s;
	const char *name;
	json_t *v;
	bool ok = false;

	memset(&s, 0, sizeof s);
	if (!root) {
		snprintf(err, errlen, "body is not JSON: %s (line %d, column %d)", je.text, je.line,
			 je.column);
		return false;
	}
	if (!json_is_object(root)) {
		snprintf(err, errlen, "body must be a JSON object");
		goto out;
	}
	json_object_foreach(root, name, v) {
		if (strcmp(name, "timeline") != 0 && strcmp(name, "responses") != 0) {
			snprintf(err, errlen, "unknown field (known: timeline, responses)");
			goto out;
		}
	}

	v = json_object_get(root, "timeline");
	if (v && !json_is_null(v)) {
		if (!json_is_array(v) || json_array_size(v) > SCRIPT_ITEMS_MAX) {
			snprintf(err, errlen, "timeline must be an array of at most %d entries", SCRIPT_ITEMS_MAX);
			goto out;
		}
		s.tl = calloc(json_array_size(v) + 1, sizeof *s.tl);
		if (!s.tl) {
			snprintf(err, errlen, "out of memory");
			goto out;
		}
		for (size_t i = 0; i < json_array_size(v); i++) {
			json_t *e = json_array_get(v, i), *f;
			const char *fname;
			double after = 0;
			const char *status = NULL;
			if (!json_is_object(e)) {
				snprintf(err, errlen, "timeline[%zu] must be an object", i);
				goto out;
			}
			json_object_foreach(e, fname, f) {
				if (strcmp(fname, "after_ms") == 0) {
					if (!json_range(f, AFTER_MAX_MS, &after)) {
						snprintf(err, errlen, "timeline[%zu].after_ms must be a number >= 0", i);
						goto out;
					}
				} else if (strcmp(fname, "status") == 0) {
					status = json_string_value(f);
					if (!status || !*status || strlen(status) > STATUS_MAX) {
						snprintf(err, errlen, "timeline[%zu].status must be a string of 1 to %d bytes",
							 i, STATUS_MAX);
						goto out;
					}
				} else {
					snprintf(err, errlen, "timeline[%zu]: unknown field (known: after_ms, status)", i);
					goto out;
				}
			}
			if (!status) {
				snprintf(err, errlen, "timeline[%zu].status is missing", i);
				goto out;
			}
			/* insertion sort by time, stable: equal times keep their order */
			struct tl_entry ent = { (int64_t)llround(after * 1000), strdup(status) };
			if (!ent.status) {
				snprintf(err, errlen, "out of memory");
				goto out;
			}
			size_t at = s.ntl;
			while (at > 0 && s.tl[at - 1].after_us > ent.after_us) {
				s.tl[at] = s.tl[at - 1];
				at--;
			}
			s.tl[at] = ent;
			s.ntl++;
		}
	}

	v = json_object_get(root, "responses");
	if (v && !json_is_null(v)) {
		if (!json_is_array(v) || json_array_size(v) > SCRIPT_ITEMS_MAX) {
			snprintf(err, errlen, "responses must be an array of at most %d entries", SCRIPT_ITEMS_MAX);
			goto out;
		}
		s.faults = calloc(json_array_size(v) + 1, sizeof *s.faults);
		if (!s.faults) {
			snprintf(err, errlen, "out of memory");
			goto out;
		}
		for (size_t i = 0; i < json_array_size(v); i++) {
			s.nfaults++; /* counted first so that script_free frees a partial entry */
			if (!fault_parse(json_array_get(v, i), i, &s.faults[i], err, errlen) ||
			    !fault_headers_sendable(&s.faults[i], i, err, errlen))
				goto out;
		}
	}
	ok = true;
out:
	json_decref(root);
	if (ok)
		*out = s;
	else
		script_free(&s);
	return ok;
}

/* PUT /_sandbox/transactions/{id}: installs a script (replacing any previous
 * one, with its queue) and forgets the id's read log; the id's rate-limit
 * windows are kept. 204, or 400/404 with a reason. */
static void control_put_tx(struct sandbox *sb, const char *id, const struct req *rq,
			   struct answer *a)
{
	char err[256];
	struct script s;

	if (!id_valid(id)) {
		answer_error(sb, a, 404, "not_found",
			     "transaction ids are 1 to 64 characters of A-Z a-z 0-9 _ -");
		return;
	}
	if (!script_parse(rq->body, rq->len, &s, err, sizeof err)) {
		answer_error(sb, a, 400, "invalid_script", err);
		return;
	}
	pthread_mutex_lock(&sb->lock);
	struct tx *t = tx_get(sb, id, rq->t_arrival);
	if (t) {
		script_free(&t->script);
		t->script = s;
		t->scripted = true;
		t->script_t0 = rq->t_arrival;
		t->next_fault = 0;
		reads_forget_id(sb, id);
	}
	pthread_mutex_unlock(&sb->lock);
	if (!t) {
		script_free(&s);
		answer_error(sb, a, 500, "internal_error", "out of memory");
		return;
	}
	a->http = 204;
}

/* Makes a malloc'd compact JSON text of j and frees j. NULL when out of memory. */
static char *json_take_dump(json_t *j)
{
	char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(15)) : NULL;
	json_decref(j);
	return s;
}

/* GET /_sandbox/reads[?id=X]: the read log in arrival order, optionally only
 * the entries of one id. 200. */
static void control_reads(struct sandbox *sb, struct MHD_Connection *c, struct answer *a)
{
	const char *only = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "id");
	json_t *arr = json_array();

	pthread_mutex_lock(&sb->lock);
	for (size_t i = 0; arr && i < sb->nreads; i++) {
		const struct readrec *r = &sb->reads[i];
		if (only && strcmp(r->id, only) != 0)
			continue;
		json_t *e = json_object();
		if (!e)
			break;
		json_object_set_new(e, "id", json_string_or_null(r->id));
		json_object_set_new(e, "t_ms", json_real((double)r->t_us / 1000.0));
		json_object_set_new(e, "http", r->http >= 0 ? json_integer(r->http) : json_null());
		json_object_set_new(e, "status", json_string_or_null(r->status));
		json_object_set_new(e, "error_code", json_string_or_null(r->error_code));
		json_object_set_new(e, "key_tail", json_string_or_null(r->has_tail ? r->tail : NULL));
		json_object_set_new(e, "request_id", json_string_or_null(r->request_id));
		json_object_set_new(e, "fault", json_string_or_null(r->fault));
		json_object_set_new(e, "retry_after_ms", r->retry_after_ms >= 0 ?
				    json_integer((json_int_t)r->retry_after_ms) : json_null());
		json_array_append_new(arr, e);
	}
	uint64_t dropped = sb->reads_dropped;
	pthread_mutex_unlock(&sb->lock);

	a->http = 200;
	a->body = json_take_dump(json_pack("{s:o,s:I}", "reads", arr, "dropped", (json_int_t)dropped));
}

/* GET /_sandbox/stats: connection and request counters since start or reset. 200. */
static void control_stats(struct sandbox *sb, struct answer *a)
{
	json_t *by_key = json_object();
	json_t *chaos = json_object();

	pthread_mutex_lock(&sb->lock);
	for (size_t i = 0; by_key && i < sb->ntails; i++)
		json_object_set_new(by_key, sb->tails[i].tail, json_integer((json_int_t)sb->tails[i].n));
	for (size_t i = 0; chaos && i < CK_COUNT; i++)
		json_object_set_new(chaos, chaos_names[i], json_integer((json_int_t)sb->chaos.injected[i]));
	json_t *j = json_pack("{s:I,s:I,s:o,s:I,s:I,s:o,s:I}",
			      "connections", (json_int_t)sb->connections,
			      "requests", (json_int_t)sb->requests,
			      "by_key", by_key,
			      "v1_connections", (json_int_t)sb->v1_connections,
			      "open_connections", (json_int_t)sb->open_connections,
			      "chaos", chaos,
			      "outages", (json_int_t)sb->outages);
	pthread_mutex_unlock(&sb->lock);

	a->http = 200;
	a->body = json_take_dump(j);
}

/* POST /_sandbox/reset: forgets reads, stats, windows, failed-auth counts and
 * blocks, scripts and demo clocks, and ends chaos mode (its counts and forced
 * faults too); keys stay as they are. 204. */
static void control_reset(struct sandbox *sb, struct answer *a)
{
	pthread_mutex_lock(&sb->lock);
	tx_clear(sb);
	reads_free_range(sb, 0, sb->nreads);
	sb->nreads = 0;
	sb->reads_dropped = 0;
	sb->nips = 0;
	sb->ntails = 0;
	for (size_t i = 0; i < sb->nkeys; i++) {
		sb->keys[i].win_open = false;
		sb->keys[i].win_count = 0;
	}
	sb->connections = sb->requests = sb->v1_connections = 0;
	sb->outages = 0;
	memset(&sb->chaos, 0, sizeof sb->chaos);
	sb->generation++;
	pthread_mutex_unlock(&sb->lock);
	a->http = 204;
}

/* POST /_sandbox/keys with {"key":"..."}: makes that key valid. 204, or 400. */
static void control_add_key(struct sandbox *sb, const struct req *rq, struct answer *a)
{
	json_t *j = json_loadb(rq->body ? rq->body : "", rq->len, JSON_REJECT_DUPLICATES, NULL);
	const char *key = json_string_value(json_object_get(j, "key"));

	if (!json_is_object(j) || json_object_size(j) != 1 || !key || !key_valid(key)) {
		answer_error(sb, a, 400, "invalid_key",
			     "body must be {\"key\": K} with K 8 to 256 printable ASCII characters, no spaces");
	} else {
		pthread_mutex_lock(&sb->lock);
		int rc = key_add(sb, key);
		pthread_mutex_unlock(&sb->lock);
		if (rc == 0)
			a->http = 204;
		else
			answer_error(sb, a, 400, "too_many_keys", "too many keys");
	}
	json_decref(j);
}

/* DELETE /_sandbox/keys/{key}: revokes the key (401 from now on). 204, or 404
 * when no such valid key exists. */
static void control_delete_key(struct sandbox *sb, const char *key, struct answer *a)
{
	size_t k;
	pthread_mutex_lock(&sb->lock);
	bool found = key_lookup(sb, key, &k);
	if (found)
		sb->keys[k].valid = false;
	pthread_mutex_unlock(&sb->lock);
	if (found)
		a->http = 204;
	else
		answer_error(sb, a, 404, "not_found", "no such key");
}

/* Returns the chaos kind called name, or CK_COUNT when there is none. */
static enum chaos_kind chaos_kind_named(const char *name)
{
	for (size_t i = 0; i < CK_COUNT; i++)
		if (strcmp(chaos_names[i], name) == 0)
			return (enum chaos_kind)i;
	return CK_COUNT;
}

/* Parses the "kinds" field of a chaos body (a list of kinds, weight 1 each,
 * or an object of kind: weight) into ch->weight. Returns true on success;
 * false with a reason in err. */
static bool chaos_parse_kinds(json_t *v, struct chaos *ch, char *err, size_t errlen)
{
	const char *kn;
	json_t *kv;
	size_t i;

	if (json_is_array(v)) {
		json_array_foreach(v, i, kv) {
			enum chaos_kind k = json_is_string(kv) ? chaos_kind_named(json_string_value(kv)) : CK_COUNT;
			if (k == CK_COUNT) {
				snprintf(err, errlen, "kinds[%zu] is not a kind (see GET /_sandbox/stats)", i);
				return false;
			}
			ch->weight[k] = 1;
		}
		return true;
	}
	if (!json_is_object(v)) {
		snprintf(err, errlen, "kinds must be a list of kinds or an object of kind: weight");
		return false;
	}
	json_object_foreach(v, kn, kv) {
		enum chaos_kind k = chaos_kind_named(kn);
		json_int_t w = json_integer_value(kv);
		if (k == CK_COUNT || !json_is_integer(kv) || w < 0 || w > CHAOS_WEIGHT_MAX) {
			snprintf(err, errlen, "kinds: each name must be a kind (see GET /_sandbox/stats) "
				 "and each weight an integer from 0 to %d", CHAOS_WEIGHT_MAX);
			return false;
		}
		ch->weight[k] = (uint64_t)w;
	}
	return true;
}

/* Parses a PUT /_sandbox/chaos body into *ch: mode on, generator seeded, no
 * counts and nothing forced. Returns true on success; false with a reason in
 * err. Unknown fields and kinds are refused. */
static bool chaos_parse(const char *body, size_t len, struct chaos *ch, char *err, size_t errlen)
{
	json_t *root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, NULL);
	const char *name;
	json_t *v;
	double d;
	bool ok = false, have_kinds = false;

	memset(ch, 0, sizeof *ch);
	ch->rate = 1.0;
	ch->hang_us = (int64_t)CHAOS_HANG_MS * 1000;
	ch->pad = CHAOS_PAD_BYTES;
	if (!json_is_object(root)) {
		snprintf(err, errlen, "body must be a JSON object");
		goto out;
	}
	json_object_foreach(root, name, v) {
		if (strcmp(name, "seed") == 0) {
			if (!json_is_integer(v) || json_integer_value(v) < 0) {
				snprintf(err, errlen, "seed must be an integer >= 0");
				goto out;
			}
			ch->seed = (uint64_t)json_integer_value(v);
		} else if (strcmp(name, "rate") == 0) {
			if (!json_range(v, 1.0, &ch->rate)) {
				snprintf(err, errlen, "rate must be a number from 0 to 1");
				goto out;
			}
		} else if (strcmp(name, "hang_ms") == 0) {
			if (!json_range(v, DELAY_MAX_MS, &d)) {
				snprintf(err, errlen, "hang_ms must be a number from 0 to %d", DELAY_MAX_MS);
				goto out;
			}
			ch->hang_us = (int64_t)llround(d * 1000);
		} else if (strcmp(name, "pad_bytes") == 0) {
			if (!json_range(v, 1 << 20, &d)) {
				snprintf(err, errlen, "pad_bytes must be a number from 0 to %d", 1 << 20);
				goto out;
			}
			ch->pad = (size_t)d;
		} else if (strcmp(name, "kinds") == 0) {
			have_kinds = true;
			if (!chaos_parse_kinds(v, ch, err, errlen))
				goto out;
		} else {
			snprintf(err, errlen, "unknown field (known: seed, rate, kinds, hang_ms, pad_bytes)");
			goto out;
		}
	}
	for (size_t i = 0; i < CK_COUNT; i++) {
		if (!have_kinds)
			ch->weight[i] = 1;
		ch->total_weight += ch->weight[i];
	}
	ch->on = true;
	ch->rng = ch->seed ^ UINT64_C(0x9e3779b97f4a7c15);
	if (ch->rng == 0)
		ch->rng = 1;
	ok = true;
out:
	json_decref(root);
	return ok;
}

/* PUT /_sandbox/chaos: starts (or restarts, from its seed) chaos mode; the
 * counts of injected faults and the forced faults queued are kept. 204, or
 * 400 with a reason. */
static void control_put_chaos(struct sandbox *sb, const struct req *rq, struct answer *a)
{
	char err[256];
	struct chaos ch;

	if (!chaos_parse(rq->body, rq->len, &ch, err, sizeof err)) {
		answer_error(sb, a, 400, "invalid_chaos", err);
		return;
	}
	pthread_mutex_lock(&sb->lock);
	memcpy(ch.injected, sb->chaos.injected, sizeof ch.injected);
	memcpy(ch.force, sb->chaos.force, sizeof ch.force);
	ch.nforce = sb->chaos.nforce;
	sb->chaos = ch;
	pthread_mutex_unlock(&sb->lock);
	a->http = 204;
}

/* DELETE /_sandbox/chaos: ends chaos mode (counts and forced faults stay). 204. */
static void control_delete_chaos(struct sandbox *sb, struct answer *a)
{
	pthread_mutex_lock(&sb->lock);
	sb->chaos.on = false;
	pthread_mutex_unlock(&sb->lock);
	a->http = 204;
}

/* POST /_sandbox/chaos/force {"kind": K, "key_tail": T}: queues one fault of
 * kind K for the next read that passes checks 1-4 and has no scripted
 * response (with key tail T when given), chaos mode on or not. 204, or 400. */
static void control_force_chaos(struct sandbox *sb, const struct req *rq, struct answer *a)
{
	json_t *j = json_loadb(rq->body ? rq->body : "", rq->len, JSON_REJECT_DUPLICATES, NULL);
	const char *kind = json_string_value(json_object_get(j, "kind"));
	json_t *tail = json_object_get(j, "key_tail");
	size_t fields = tail ? 2 : 1;
	enum chaos_kind k = kind ? chaos_kind_named(kind) : CK_COUNT;

	if (!json_is_object(j) || json_object_size(j) != fields || k == CK_COUNT ||
	    (tail && (!json_is_string(tail) || strlen(json_string_value(tail)) >= TAIL_LEN))) {
		answer_error(sb, a, 400, "invalid_force",
			     "body must be {\"kind\": K} or {\"kind\": K, \"key_tail\": T} with a known kind");
	} else {
		pthread_mutex_lock(&sb->lock);
		bool room = sb->chaos.nforce < CHAOS_FORCE_MAX;
		if (room) {
			struct chaos_force *f = &sb->chaos.force[sb->chaos.nforce++];
			f->kind = k;
			snprintf(f->tail, sizeof f->tail, "%s", tail ? json_string_value(tail) : "");
		}
		pthread_mutex_unlock(&sb->lock);
		if (room)
			a->http = 204;
		else
			answer_error(sb, a, 400, "too_many_forced", "too many forced faults queued");
	}
	json_decref(j);
}

/* POST /_sandbox/outage {"ms": N}: the API goes down for N ms, as if Kasera
 * crashed: once this answer is out, the listening socket and every open
 * connection are closed (delayed answers are dropped), connections are
 * refused meanwhile (the control API's too), then the server listens again on
 * the same port with all its state. 202, 400, or 409 while one is pending. */
static void control_outage(struct sandbox *sb, const struct req *rq, struct answer *a)
{
	json_t *j = json_loadb(rq->body ? rq->body : "", rq->len, JSON_REJECT_DUPLICATES, NULL);
	double ms;

	if (!json_is_object(j) || json_object_size(j) != 1 ||
	    !json_range(json_object_get(j, "ms"), OUTAGE_MAX_MS, &ms) || ms < 1) {
		answer_error(sb, a, 400, "invalid_outage", "body must be {\"ms\": N} with N from 1 to 600000");
	} else {
		pthread_mutex_lock(&sb->lock);
		bool busy = sb->outage_us > 0;
		if (!busy)
			sb->outage_us = (int64_t)llround(ms * 1000);
		pthread_mutex_unlock(&sb->lock);
		if (busy) {
			answer_error(sb, a, 409, "outage_pending", "an outage is already pending");
		} else {
			kill(getpid(), SIGUSR1); /* main takes it with sigwait */
			a->http = 202;
		}
	}
	json_decref(j);
}

/* Routes a request under /_sandbox/. Fills a; can't fail. */
static void serve_control(struct sandbox *sb, struct MHD_Connection *c, const char *url,
			  const char *method, const struct req *rq, struct answer *a)
{
	const char *rest = url + strlen("/_sandbox/");
	const char *arg;
	const char *want; /* the one method this path allows */

	if ((arg = strprefix(rest, "transactions/"))) {
		want = MHD_HTTP_METHOD_PUT;
		if (strcmp(method, want) == 0)
			control_put_tx(sb, arg, rq, a);
	} else if (strcmp(rest, "reads") == 0) {
		want = MHD_HTTP_METHOD_GET;
		if (strcmp(method, want) == 0)
			control_reads(sb, c, a);
	} else if (strcmp(rest, "stats") == 0) {
		want = MHD_HTTP_METHOD_GET;
		if (strcmp(method, want) == 0)
			control_stats(sb, a);
	} else if (strcmp(rest, "reset") == 0) {
		want = MHD_HTTP_METHOD_POST;
		if (strcmp(method, want) == 0)
			control_reset(sb, a);
	} else if (strcmp(rest, "keys") == 0) {
		want = MHD_HTTP_METHOD_POST;
		if (strcmp(method, want) == 0)
			control_add_key(sb, rq, a);
	} else if ((arg = strprefix(rest, "keys/"))) {
		want = MHD_HTTP_METHOD_DELETE;
		if (strcmp(method, want) == 0)
			control_delete_key(sb, arg, a);
	} else if (strcmp(rest, "chaos") == 0) {
		if (strcmp(method, MHD_HTTP_METHOD_DELETE) == 0) {
			want = MHD_HTTP_METHOD_DELETE;
			control_delete_chaos(sb, a);
		} else {
			want = MHD_HTTP_METHOD_PUT;
			if (strcmp(method, want) == 0)
				control_put_chaos(sb, rq, a);
		}
	} else if (strcmp(rest, "chaos/force") == 0) {
		want = MHD_HTTP_METHOD_POST;
		if (strcmp(method, want) == 0)
			control_force_chaos(sb, rq, a);
	} else if (strcmp(rest, "outage") == 0) {
		want = MHD_HTTP_METHOD_POST;
		if (strcmp(method, want) == 0)
			control_outage(sb, rq, a);
	} else {
		answer_error(sb, a, 404, "not_found", "no such endpoint");
		return;
	}
	if (strcmp(method, want) != 0) {
		answer_error(sb, a, 405, "method_not_allowed", "method not allowed");
		answer_header(a, MHD_HTTP_HEADER_ALLOW, want);
	}
}

/* ------------------------------------------------------------------------ */
/* libmicrohttpd glue                                                       */
/* ------------------------------------------------------------------------ */

/* Writes the client's address of connection c as text into out (IP_LEN). */
static void peer_ip(struct MHD_Connection *c, char out[IP_LEN])
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	const struct sockaddr *sa = ci ? ci->client_addr : NULL;
	const char *ok = NULL;
	if (sa && sa->sa_family == AF_INET)
		ok = inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, out, IP_LEN);
	else if (sa && sa->sa_family == AF_INET6)
		ok = inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, out, IP_LEN);
	if (!ok)
		snprintf(out, IP_LEN, "unknown");
}

/* Writes one key=value line about an answered request to stderr. The path of
 * DELETE /_sandbox/keys/{key} is shown with the key's tail only. */
static void log_request(const char *method, const char *url, const struct req *rq,
			const struct answer *a)
{
	char path[200], meth[24], line[768];
	const char *key = strprefix(url, "/_sandbox/keys/");
	int n;

	if (key) {
		char tail[TAIL_LEN];
		key_tail(key, tail);
		snprintf(path, sizeof path, "/_sandbox/keys/...%s", tail);
	} else {
		printable_copy(path, sizeof path, url, BAD_LOG_TOKEN);
	}
	printable_copy(meth, sizeof meth, method, BAD_LOG_TOKEN);
	n = snprintf(line, sizeof line, "event=request t_ms=%.3f ip=%s method=%s path=%s http=%d dur_ms=%.3f",
		     (double)rq->t_arrival / 1000.0, rq->ip, meth, path, a->http,
		     (double)(mono_us() - rq->t_arrival) / 1000.0);
	if (a->v1 && n > 0 && (size_t)n < sizeof line) {
		char st[64], ec[64];
		printable_copy(st, sizeof st, a->status ? a->status : "-", BAD_LOG_TOKEN);
		printable_copy(ec, sizeof ec, a->error_code ? a->error_code : "-", BAD_LOG_TOKEN);
		snprintf(line + n, sizeof line - (size_t)n, " key_tail=%s status=%s error_code=%s request_id=%s%s%s",
			 a->has_tail ? a->tail : "-", st, ec, a->request_id,
			 a->note ? " fault=" : "", a->note ? a->note : "");
	}
	fprintf(stderr, "%s\n", line);
}

/* MHD access handler: collects the request (body capped at BODY_MAX), then
 * dispatches to /v1, /_sandbox or a 404, sends the answer and logs it. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	struct sandbox *sb = cls;
	struct req *rq = *con_cls;
	struct answer a;
	(void)version;

	t_quiet = false;
	if (!rq) { /* headers are in: the request has arrived */
		rq = calloc(1, sizeof *rq);
		if (!rq)
			return MHD_NO;
		rq->t_arrival = mono_us();
		peer_ip(c, rq->ip);
		*con_cls = rq;
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
		if (!cl || strtoull(cl, NULL, 10) <= BODY_MAX)
			return MHD_YES;
		rq->too_large = true; /* refuse before reading the body */
	} else if (*upload_size > 0) {
		if (!rq->answered && !rq->too_large) {
			if (rq->len + *upload_size > BODY_MAX) {
				rq->too_large = true;
			} else {
				char *b = realloc(rq->body, rq->len + *upload_size + 1);
				if (!b)
					return MHD_NO;
				memcpy(b + rq->len, upload, *upload_size);
				rq->len += *upload_size;
				b[rq->len] = '\0';
				rq->body = b;
			}
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (rq->answered)
		return MHD_YES;
	rq->answered = true;

	memset(&a, 0, sizeof a);
	a.retry_after_ms = -1;
	if (rq->too_large)
		answer_error(sb, &a, 413, "payload_too_large", "request body larger than 64 KiB");
	else if (strprefix(url, "/v1/") || strcmp(url, "/v1") == 0)
		serve_v1(sb, c, url, method, rq, &a);
	else if (strprefix(url, "/_sandbox/"))
		serve_control(sb, c, url, method, rq, &a);
	else
		answer_error(sb, &a, 404, "not_found", "no such endpoint");

	enum MHD_Result ret = answer_send(c, &a);
	log_request(method, url, rq, &a);
	answer_free(&a);
	return ret;
}

/* MHD request-completed callback: frees the request context. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct req *rq = *con_cls;
	(void)cls;
	(void)c;
	(void)toe;
	if (rq) {
		free(rq->body);
		free(rq);
		*con_cls = NULL;
	}
}

/* MHD connection callback: counts accepted and open connections and gives
 * each connection its struct conn. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	struct sandbox *sb = cls;
	(void)c;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		*socket_context = calloc(1, sizeof(struct conn)); /* NULL: not counted in v1_connections */
		pthread_mutex_lock(&sb->lock);
		sb->connections++;
		sb->open_connections++;
		pthread_mutex_unlock(&sb->lock);
	} else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
		free(*socket_context);
		*socket_context = NULL;
		pthread_mutex_lock(&sb->lock);
		if (sb->open_connections > 0)
			sb->open_connections--;
		pthread_mutex_unlock(&sb->lock);
	}
}

/* MHD accept policy: only loopback peers (127.0.0.0/8, ::1, ::ffff:127.x). */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *sa, socklen_t len)
{
	(void)cls;
	if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)(const void *)sa;
		return (ntohl(s4->sin_addr.s_addr) >> 24) == 127 ? MHD_YES : MHD_NO;
	}
	if (sa->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
		const struct in6_addr *a6 = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
		if (IN6_IS_ADDR_LOOPBACK(a6))
			return MHD_YES;
		return (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127) ? MHD_YES : MHD_NO;
	}
	return MHD_NO;
}

/* MHD's own error messages, as key=value lines; silent for a deliberate drop. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512], safe[512];
	(void)cls;
	if (t_quiet)
		return;
	vsnprintf(msg, sizeof msg, fmt, ap);
	msg[strcspn(msg, "\r\n")] = '\0';
	printable_copy(safe, sizeof safe, msg, BAD_LOG_QUOTED);
	fprintf(stderr, "event=mhd msg=\"%s\"\n", safe);
}

/* ------------------------------------------------------------------------ */
/* Start-up                                                                 */
/* ------------------------------------------------------------------------ */

static void usage(FILE *out)
{
	fputs("usage: kasera-sandbox [--listen HOST:PORT] [--demo] [--key KEY]...\n"
	      "                      [--key-limit N] [--key-window-ms MS] [--tx-window-ms MS]\n"
	      "                      [--auth-fail-limit N] [--auth-fail-window-ms MS]\n"
	      "                      [--auth-block-ms MS] [--help]\n"
	      "\n"
	      "A local stand-in for the Kasera Pay API (GET /v1/transactions/{id}) with a\n"
	      "control API under /_sandbox/. Prints \"listening port=N\" once bound.\n"
	      "\n"
	      "  --listen HOST:PORT        loopback address to listen on (127.0.0.0/8, localhost\n"
	      "                            or [::1]); port 0 = any free port (default 127.0.0.1:0)\n"
	      "  --demo                    add key sk_test_demo and the demo ids (ok-*, pay-*,\n"
	      "                            fail-*, cancel-*, exp-*, pend-*, slow-*, boom-*)\n"
	      "  --key KEY                 a valid secret key, 8-256 printable characters (repeatable)\n"
	      "  --key-limit N             requests per key per window (default 300)\n"
	      "  --key-window-ms MS        the key window (default 60000)\n"
	      "  --tx-window-ms MS         one read per (key, transaction) per window (default 1000;\n"
	      "                            0 = no limit)\n"
	      "  --auth-fail-limit N       failed authentications per IP before a block (default 10;\n"
	      "                            0 = never block)\n"
	      "  --auth-fail-window-ms MS  window in which those failures count (default 60000)\n"
	      "  --auth-block-ms MS        how long a block lasts (default 60000)\n"
	      "\n"
	      "Control API: PUT /_sandbox/transactions/{id}, GET /_sandbox/reads[?id=X],\n"
	      "GET /_sandbox/stats, POST /_sandbox/reset, POST /_sandbox/keys,\n"
	      "DELETE /_sandbox/keys/{key}, PUT|DELETE /_sandbox/chaos, POST /_sandbox/chaos/force,\n"
	      "POST /_sandbox/outage. See the comments in tests/sandbox/sandbox.c.\n",
	      out);
}

/* Parses a decimal integer in [lo, hi]. Returns false when s is anything else. */
static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
	char *end;
	if (!s || *s < '0' || *s > '9')
		return false;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (errno || *end || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

/* Parses --listen HOST:PORT into opt (HOST: an IPv4 address in 127.0.0.0/8,
 * "localhost", or "[::1]"). Returns false for anything else. */
static bool parse_listen(const char *spec, struct options *opt)
{
	char host[64];
	const char *port, *end;
	int64_t p;

	if (spec[0] == '[') {
		end = strchr(spec, ']');
		if (!end || end[1] != ':')
			return false;
		spec++;
		port = end + 2;
	} else {
		end = strrchr(spec, ':');
		if (!end)
			return false;
		port = end + 1;
	}
	if (end == spec || (size_t)(end - spec) >= sizeof host || !parse_int(port, 0, 65535, &p))
		return false;
	memcpy(host, spec, (size_t)(end - spec));
	host[end - spec] = '\0';
	if (strcmp(host, "localhost") == 0)
		snprintf(host, sizeof host, "127.0.0.1");

	memset(&opt->addr, 0, sizeof opt->addr);
	struct sockaddr_in *s4 = (struct sockaddr_in *)(void *)&opt->addr;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)(void *)&opt->addr;
	if (inet_pton(AF_INET, host, &s4->sin_addr) == 1) {
		if ((ntohl(s4->sin_addr.s_addr) >> 24) != 127)
			return false;
		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)p);
		opt->ipv6 = false;
		return true;
	}
	if (inet_pton(AF_INET6, host, &s6->sin6_addr) == 1 && IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr)) {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)p);
		opt->ipv6 = true;
		return true;
	}
	return false;
}

/* Parses the command line into opt. Exits 0 after --help, 2 on a bad
 * argument (naming it, never printing a key). */
static void parse_args(int argc, char **argv, struct options *opt)
{
	enum { O_LISTEN = 1, O_DEMO, O_KEY, O_KEY_LIMIT, O_KEY_WINDOW, O_TX_WINDOW, O_AUTH_LIMIT,
	       O_AUTH_WINDOW, O_AUTH_BLOCK, O_HELP };
	static const struct option longopts[] = {
		{ "listen", required_argument, NULL, O_LISTEN },
		{ "demo", no_argument, NULL, O_DEMO },
		{ "key", required_argument, NULL, O_KEY },
		{ "key-limit", required_argument, NULL, O_KEY_LIMIT },
		{ "key-window-ms", required_argument, NULL, O_KEY_WINDOW },
		{ "tx-window-ms", required_argument, NULL, O_TX_WINDOW },
		{ "auth-fail-limit", required_argument, NULL, O_AUTH_LIMIT },
		{ "auth-fail-window-ms", required_argument, NULL, O_AUTH_WINDOW },
		{ "auth-block-ms", required_argument, NULL, O_AUTH_BLOCK },
		{ "help", no_argument, NULL, O_HELP },
		{ NULL, 0, NULL, 0 },
	};
	const int64_t ms_max = INT64_C(86400000) * 365; /* a year */
	int64_t v;
	int c;

	opt->keys = calloc((size_t)argc + 1, sizeof *opt->keys);
	if (!opt->keys) {
		fprintf(stderr, "kasera-sandbox: out of memory\n");
		exit(1);
	}
	opt->key_limit = 300;
	opt->key_window_us = 60000000;
	opt->tx_window_us = 1000000;
	opt->auth_fail_limit = 10;
	opt->auth_fail_window_us = 60000000;
	opt->auth_block_us = 60000000;
	parse_listen("127.0.0.1:0", opt);

	opterr = 0;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		const char *bad = NULL;
		switch (c) {
		case O_LISTEN:
			if (!parse_listen(optarg, opt))
				bad = "--listen wants HOST:PORT with a loopback HOST (127.x.x.x, localhost, [::1])";
			break;
		case O_DEMO:
			opt->demo = true;
			break;
		case O_KEY:
			if (!key_valid(optarg))
				bad = "--key wants 8 to 256 printable ASCII characters without spaces";
			else
				opt->keys[opt->nkeys++] = optarg;
			break;
		case O_KEY_LIMIT:
			if (!parse_int(optarg, 1, INT32_MAX, &opt->key_limit))
				bad = "--key-limit wants an integer >= 1";
			break;
		case O_KEY_WINDOW:
			if (!parse_int(optarg, 1, ms_max, &v))
				bad = "--key-window-ms wants an integer >= 1";
			else
				opt->key_window_us = v * 1000;
			break;
		case O_TX_WINDOW:
			if (!parse_int(optarg, 0, ms_max, &v))
				bad = "--tx-window-ms wants an integer >= 0";
			else
				opt->tx_window_us = v * 1000;
			break;
		case O_AUTH_LIMIT:
			if (!parse_int(optarg, 0, INT32_MAX, &opt->auth_fail_limit))
				bad = "--auth-fail-limit wants an integer >= 0";
			break;
		case O_AUTH_WINDOW:
			if (!parse_int(optarg, 1, ms_max, &v))
				bad = "--auth-fail-window-ms wants an integer >= 1";
			else
				opt->auth_fail_window_us = v * 1000;
			break;
		case O_AUTH_BLOCK:
			if (!parse_int(optarg, 1, ms_max, &v))
				bad = "--auth-block-ms wants an integer >= 1";
			else
				opt->auth_block_us = v * 1000;
			break;
		case O_HELP:
			usage(stdout);
			exit(0);
		default:
			bad = "unknown option or missing argument";
			break;
		}
		if (bad) {
			fprintf(stderr, "kasera-sandbox: %s\n", bad);
			usage(stderr);
			exit(2);
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kasera-sandbox: unexpected argument\n");
		usage(stderr);
		exit(2);
	}
	if (opt->demo)
		opt->keys[opt->nkeys++] = "sk_test_demo";
}

/* Initialises the shared state from opt. Returns 0, or -1 when out of memory. */
static int sandbox_init(struct sandbox *sb, const struct options *opt)
{
	pthread_condattr_t ca;
	uint64_t seed = 0;

	memset(sb, 0, sizeof *sb);
	sb->opt = *opt;
	if (getrandom(&seed, sizeof seed, 0) != (ssize_t)sizeof seed)
		seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	sb->rid_seed = seed;
	atomic_init(&sb->rid_counter, 0);
	pthread_mutex_init(&sb->lock, NULL);
	pthread_mutex_init(&sb->stop_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&sb->stop_cond, &ca);
	pthread_condattr_destroy(&ca);
	sb->generation = 1;
	sb->sweep_at = TX_SWEEP_AT;
	sb->ips = calloc(IPS_MAX, sizeof *sb->ips);
	sb->tails = calloc(TAILS_MAX, sizeof *sb->tails);
	if (!sb->ips || !sb->tails)
		return -1;
	for (size_t i = 0; i < opt->nkeys; i++)
		if (key_add(sb, opt->keys[i]) != 0)
			return -1;
	return 0;
}

/* Frees the shared state. Only after every server thread has ended. */
static void sandbox_free(struct sandbox *sb)
{
	tx_clear(sb);
	free(sb->buckets);
	reads_free_range(sb, 0, sb->nreads);
	free(sb->reads);
	for (size_t i = 0; i < sb->nkeys; i++)
		free(sb->keys[i].secret);
	free(sb->keys);
	free(sb->ips);
	free(sb->tails);
	free((void *)sb->opt.keys);
	pthread_mutex_destroy(&sb->lock);
	pthread_mutex_destroy(&sb->stop_lock);
	pthread_cond_destroy(&sb->stop_cond);
}

/* Returns the port of opt's listening address (0 = any), for MHD's messages;
 * the address itself is passed with MHD_OPTION_SOCK_ADDR. */
static uint16_t listen_port(const struct options *opt)
{
	const void *sa = &opt->addr;
	return ntohs(opt->ipv6 ? ((const struct sockaddr_in6 *)sa)->sin6_port
			       : ((const struct sockaddr_in *)sa)->sin_port);
}

/* Raises the soft limit on open files to the hard limit, so that thousands of
 * connections can be held. Failure is only logged. */
static void raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
			fprintf(stderr, "event=warning msg=\"cannot raise the open-file limit\"\n");
	}
}

/* Starts the server on sb's listening address. Returns the daemon, or NULL
 * when it cannot listen. */
static struct MHD_Daemon *daemon_start(struct sandbox *sb)
{
	return MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD |
				MHD_USE_ERROR_LOG | (sb->opt.ipv6 ? MHD_USE_IPv6 : 0),
				listen_port(&sb->opt), on_accept, sb, on_request, sb,
				MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL, /* must come first */
				MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sb->opt.addr,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned int)CONNECTION_LIMIT,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)CONNECTION_TIMEOUT_S,
				MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned int)1024,
				MHD_OPTION_THREAD_STACK_SIZE, (size_t)THREAD_STACK,
				MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned int)1,
				MHD_OPTION_NOTIFY_COMPLETED, on_completed, sb,
				MHD_OPTION_NOTIFY_CONNECTION, on_connection, sb,
				MHD_OPTION_END);
}

/* Sets or clears sb->stopping, waking every delayed answer when set. */
static void set_stopping(struct sandbox *sb, bool on)
{
	pthread_mutex_lock(&sb->stop_lock);
	sb->stopping = on;
	pthread_cond_broadcast(&sb->stop_cond);
	pthread_mutex_unlock(&sb->stop_lock);
}

/* Carries out the outage asked for (POST /_sandbox/outage): stops the server
 * as a crash would (delayed answers dropped, connections closed), waits the
 * outage out (a SIGINT or SIGTERM meanwhile ends it, and the process: *sig
 * is then set), then listens again on the same port. Returns the new daemon,
 * or NULL when the process must end (a signal, or the port could not be
 * bound again within 5 s). */
static struct MHD_Daemon *outage(struct sandbox *sb, struct MHD_Daemon *d, const sigset_t *sigs, int *sig)
{
	int64_t us;
	struct timespec ts;

	pthread_mutex_lock(&sb->lock);
	us = sb->outage_us;
	sb->outages++;
	pthread_mutex_unlock(&sb->lock);
	ts.tv_sec = 0;
	ts.tv_nsec = OUTAGE_GRACE_US * 1000;
	nanosleep(&ts, NULL);
	set_stopping(sb, true);
	MHD_stop_daemon(d);
	set_stopping(sb, false);
	fprintf(stderr, "event=outage_start t_ms=%.3f ms=%" PRId64 "\n", (double)mono_us() / 1000.0, us / 1000);
	int64_t until = mono_us() + us;
	for (int64_t left; (left = until - mono_us()) > 0;) {
		ts.tv_sec = (time_t)(left / 1000000);
		ts.tv_nsec = (long)(left % 1000000) * 1000;
		int got = sigtimedwait(sigs, NULL, &ts);
		if (got == SIGINT || got == SIGTERM) {
			*sig = got;
			return NULL;
		}
	}
	d = NULL;
	for (int i = 0; i < 50 && !d; i++) { /* the port may linger a moment */
		d = daemon_start(sb);
		if (!d) {
			ts.tv_sec = 0;
			ts.tv_nsec = 100000000L;
			nanosleep(&ts, NULL);
		}
	}
	pthread_mutex_lock(&sb->lock);
	sb->outage_us = 0;
	pthread_mutex_unlock(&sb->lock);
	if (!d)
		fprintf(stderr, "kasera-sandbox: cannot listen again after the outage\n");
	else
		fprintf(stderr, "event=outage_end t_ms=%.3f\n", (double)mono_us() / 1000.0);
	return d;
}

int main(int argc, char **argv)
{
	struct options opt;
	struct sandbox sb;
	struct MHD_Daemon *d;
	sigset_t sigs;
	int sig = 0, rc = 0;
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	g_mono_base_us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
	memset(&opt, 0, sizeof opt);
	parse_args(argc, argv, &opt);
	raise_nofile();

	/* SIGINT/SIGTERM are taken by sigwait below; every thread inherits the mask */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGUSR1); /* an outage asked for through the control API */
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);

	json_object_seed(0); /* before any thread uses jansson */
	if (sandbox_init(&sb, &opt) != 0) {
		fprintf(stderr, "kasera-sandbox: out of memory\n");
		return 1;
	}
	if (opt.nkeys == 0)
		fprintf(stderr, "event=warning msg=\"no keys (use --key or --demo): every read gets 401\"\n");

	d = daemon_start(&sb);
	if (!d) {
		fprintf(stderr, "kasera-sandbox: cannot listen (address in use or not available)\n");
		sandbox_free(&sb);
		return 1;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
	if (di) { /* an outage listens again on this very port */
		if (sb.opt.ipv6)
			((struct sockaddr_in6 *)(void *)&sb.opt.addr)->sin6_port = htons(di->port);
		else
			((struct sockaddr_in *)(void *)&sb.opt.addr)->sin_port = htons(di->port);
	}
	printf("listening port=%u\n", di ? (unsigned int)di->port : 0u);
	fflush(stdout);
	fprintf(stderr, "event=start port=%u demo=%d keys=%zu key_limit=%" PRId64 " key_window_ms=%" PRId64
		" tx_window_ms=%" PRId64 " auth_fail_limit=%" PRId64 " auth_fail_window_ms=%" PRId64
		" auth_block_ms=%" PRId64 "\n",
		di ? (unsigned int)di->port : 0u, opt.demo ? 1 : 0, opt.nkeys, opt.key_limit,
		opt.key_window_us / 1000, opt.tx_window_us / 1000, opt.auth_fail_limit,
		opt.auth_fail_window_us / 1000, opt.auth_block_us / 1000);

	for (;;) {
		while (sigwait(&sigs, &sig) != 0)
			;
		if (sig != SIGUSR1)
			break;
		d = outage(&sb, d, &sigs, &sig);
		if (!d) {
			rc = sig == SIGUSR1 ? 1 : 0; /* could not listen again, or a signal */
			break;
		}
	}
	fprintf(stderr, "event=stop signal=%d\n", sig);

	/* wake delayed answers first, so that stopping does not wait for them */
	set_stopping(&sb, true);
	if (d)
		MHD_stop_daemon(d);
	sandbox_free(&sb);
	return rc;
}
