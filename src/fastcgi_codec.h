/* fastcgi_codec.h - the FastCGI protocol as a pure codec: bytes in, events out.
 *
 * The application side of one FastCGI connection, one request at a time
 * (FCGI_MPXS_CONNS is "0"). No I/O, no clock, no globals: the caller reads
 * the socket and feeds what it read; fcgi_feed() reports the first thing that
 * happened and how many bytes that took, and the caller feeds the rest:
 *
 *   while (len > 0) {
 *       ev = fcgi_feed(p, buf, len, &used, &e);
 *       buf += used; len -= used;
 *       ... send e.reply_len bytes of e.reply; act on ev ...
 *   }
 *
 * The protocol's record layouts and constants are libfcgi's <fastcgi.h>.
 * What a peer sends decides the events:
 *
 *   requestId 0: GET_VALUES is answered (FCGI_EV_REPLY, GET_VALUES_RESULT);
 *     any other type is answered with UNKNOWN_TYPE (FCGI_EV_REPLY).
 *   BEGIN_REQUEST: becomes the live request (FCGI_EV_NONE), or is refused
 *     with END_REQUEST(FCGI_UNKNOWN_ROLE) for a role other than RESPONDER,
 *     or END_REQUEST(FCGI_CANT_MPX_CONN) while another id is live
 *     (FCGI_EV_REPLY; the live request is unaffected).
 *   PARAMS, STDIN for the live id: kept until the empty STDIN record,
 *     which is FCGI_EV_REQUEST. DATA is ignored.
 *   ABORT_REQUEST for the live id: FCGI_EV_ABORT, each time one comes.
 *   ABORT_REQUEST, PARAMS, STDIN, DATA for any other id: ignored, as the
 *     spec says of records for inactive requests.
 *
 * Protocol errors (FCGI_EV_ERROR; the caller closes the connection): a
 * version other than FCGI_VERSION_1; a BEGIN_REQUEST whose body is not 8
 * bytes, or a second one for the live id; STDIN before the empty PARAMS
 * record or after the empty STDIN record; PARAMS after the empty PARAMS
 * record; name-value pairs whose lengths run past their block (PARAMS or
 * GET_VALUES); and, with a non-zero requestId, any type a web server does
 * not send: the types only applications send (END_REQUEST, STDOUT, STDERR,
 * GET_VALUES_RESULT, UNKNOWN_TYPE), GET_VALUES, and types the spec does not
 * define. (UNKNOWN_TYPE is defined for management records only, so there is
 * nothing to answer them with.) An allocation failure is reported the same
 * way, with why "out of memory".
 *
 * Padding (0..255 bytes) is skipped on every record. An ABORT_REQUEST's
 * content, if any, is ignored. A parameter value is cut at its first NUL byte
 * (fcgi_param() returns C strings); a pair whose name holds a NUL byte is not
 * kept, so no name can pass for another.
 *
 * Memory: at most FCGI_CODEC_PARAMS_MAX + FCGI_CODEC_STDIN_KEEP bytes of
 * buffers per parser, whatever the peer sends; a GET_VALUES record is
 * scanned as it comes, never buffered. */
#ifndef KEMBALI_FASTCGI_CODEC_H
#define KEMBALI_FASTCGI_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <fastcgi.h>

#define FCGI_CODEC_PARAMS_MAX (64 * 1024)  /* bytes of name-value pairs kept per request */
#define FCGI_CODEC_STDIN_KEEP (8 * 1024)   /* stdin bytes kept (a notify body); the rest is counted and discarded */

enum fcgi_ev {
    FCGI_EV_NONE,    /* every input byte consumed, nothing happened yet: read more */
    FCGI_EV_REQUEST, /* a whole request arrived (BEGIN, PARAMS to the empty record, STDIN to the empty record) */
    FCGI_EV_ABORT,   /* FCGI_ABORT_REQUEST for the live request (before or after FCGI_EV_REQUEST) */
    FCGI_EV_REPLY,   /* nothing for the caller but bytes to send: ev->reply (GET_VALUES_RESULT, UNKNOWN_TYPE,
                        END_REQUEST for a refused BEGIN) */
    FCGI_EV_ERROR,   /* a protocol error: the caller closes the connection; ev->why says what in plain words;
                        every later fcgi_feed returns FCGI_EV_ERROR again */
};

struct fcgi_event {
    enum fcgi_ev type;
    uint16_t id;        /* the request id the event is about (0: management) */
    uint8_t reply[256]; /* bytes the caller must send, for any event type; reply_len may be 0 */
    size_t reply_len;
    const char *why;    /* FCGI_EV_ERROR: a static string; NULL otherwise */
};

/* Private: read it only through the functions below. */
struct fcgi_parser {
    const char *why;         /* set once a protocol error happened: poisoned */
    uint8_t phase;           /* header, content or padding of the current record */
    uint8_t mode;            /* what the current record's content is for */
    uint8_t hdr[FCGI_HEADER_LEN];
    size_t hdr_have;
    uint8_t type;            /* the current record */
    uint16_t id;
    size_t clen, cseen, padlen, padseen;
    uint8_t begin[sizeof(FCGI_BeginRequestBody)];
    struct {                 /* the GET_VALUES scan */
        uint8_t stage, lb_have, lb[4];
        uint32_t nlen, vlen, nseen, vseen;
        char name[16];
        unsigned asked;      /* bit i: the i-th known name was asked */
    } gv;
    uint16_t live;           /* the live request's id, 0 if none */
    bool keep_conn, params_done, params_ready, stdin_done, taken, too_large, truncated;
    uint8_t *params;         /* raw pairs, then (params_ready) name\0value\0 ... */
    size_t params_len, params_cap;
    const uint16_t *index;   /* params_ready: a hash table of the names in params (their
                                offsets + 1, 0 for a free slot), after them in the same
                                buffer; NULL (no pairs, too many, no room): a scan */
    uint8_t *in;             /* the kept stdin */
    size_t in_len, in_cap;
};

/* Make p an idle parser: no request live, no error. Allocates nothing.
 * This function can't fail. */
void fcgi_parser_init(struct fcgi_parser *p);

/* Free p's buffers. p may then be fcgi_parser_init()ed again; nothing else. */
void fcgi_parser_free(struct fcgi_parser *p);

/* Consume bytes of in[0..len) up to and including the record content that
 * makes the first event, set *used to the bytes consumed and fill *ev; the
 * caller feeds the rest in the next call. Any split of the input gives the
 * same events (one byte at a time too). FCGI_EV_NONE means *used == len.
 * On FCGI_EV_ERROR, *used is len (the rest of the input is discarded) and
 * the parser is poisoned: every later call returns FCGI_EV_ERROR again with
 * the same ev->why and *used = len, so a loop like the one above ends. */
enum fcgi_ev fcgi_feed(struct fcgi_parser *p, const uint8_t *in, size_t len, size_t *used,
                       struct fcgi_event *ev);

/* Between FCGI_EV_REQUEST and fcgi_request_taken():
 *
 * fcgi_param(): the last value of parameter `name` (a name sent twice counts
 * with its last value, as PHP-FPM has it, so nginx's `fastcgi_param` after
 * `include fastcgi_params` overrides), NUL-terminated, or NULL (also for
 * every name when fcgi_params_too_large()). The pointer is valid
 * until fcgi_request_taken() or fcgi_request_done(). The names are indexed
 * once, when the params end, so a lookup does not scan them (up to
 * FCGI_CODEC_INDEX_NAMES pairs; with more, lookups scan, with the same
 * results). */
#define FCGI_CODEC_INDEX_NAMES 48
const char *fcgi_param(const struct fcgi_parser *p, const char *name);

/* Look up n names (n <= FCGI_CODEC_GET_MAX) at once, as fcgi_param() each:
 * values[i] is the last value of names[i] (NUL-terminated), or NULL; all
 * NULL when n is larger. Same validity as fcgi_param(). This function
 * can't fail. */
#define FCGI_CODEC_GET_MAX 16
void fcgi_params_get(const struct fcgi_parser *p, const char *const *names, size_t n, const char **values);

/* The kept stdin bytes (the first FCGI_CODEC_STDIN_KEEP); *len is set to
 * their count. May return NULL when *len is 0. */
const uint8_t *fcgi_stdin(const struct fcgi_parser *p, size_t *len);

/* True when more than FCGI_CODEC_STDIN_KEEP stdin bytes came. */
bool fcgi_stdin_truncated(const struct fcgi_parser *p);

/* True when the params passed FCGI_CODEC_PARAMS_MAX bytes: none were kept,
 * but the request still completes, so the caller can answer "invalid"
 * instead of dropping it. */
bool fcgi_params_too_large(const struct fcgi_parser *p);

/* True when FCGI_KEEP_CONN was set in the live request's BEGIN_REQUEST
 * (valid until fcgi_request_done()). */
bool fcgi_keep_conn(const struct fcgi_parser *p);

/* The live request's id, 0 if none. */
uint16_t fcgi_request_id(const struct fcgi_parser *p);

/* Bytes of buffers p holds now (never more than FCGI_CODEC_PARAMS_MAX +
 * FCGI_CODEC_STDIN_KEEP). */
size_t fcgi_parser_held(const struct fcgi_parser *p);

/* True when p has taken part of a record (its header or content) and waits
 * for the rest: on a kept connection, the start of the next request. This
 * function can't fail. */
bool fcgi_parser_mid_record(const struct fcgi_parser *p);

/* The caller has copied what it needs: free the params and stdin buffers
 * (fcgi_param() returns NULL and fcgi_stdin() nothing from now on). The
 * request stays live until fcgi_request_done(): an ABORT_REQUEST for it is
 * still reported and a BEGIN_REQUEST for another id still refused with
 * FCGI_CANT_MPX_CONN. This function can't fail. */
void fcgi_request_taken(struct fcgi_parser *p);

/* Make an idle parser (fresh from fcgi_parser_init, between records) hold
 * request `id` as a whole request already taken, with FCGI_KEEP_CONN as
 * `keep_conn`: what another process's parser held for a connection it
 * handed over (handover.h). From here on it is as after
 * fcgi_request_taken(). This function can't fail. */
void fcgi_parser_resume(struct fcgi_parser *p, uint16_t id, bool keep_conn);

/* The live request was answered (or aborted): free what it held and accept
 * a new BEGIN_REQUEST (kept connections). Later records for its id are
 * ignored. Does nothing when no request is live. This function can't fail. */
void fcgi_request_done(struct fcgi_parser *p);

/* The exact bytes fcgi_encode_answer() needs for len bytes of data;
 * SIZE_MAX when that does not fit a size_t. */
size_t fcgi_answer_size(size_t len);

/* Encode the whole answer of request `id` into out (capacity cap): STDOUT
 * records carrying data[0..len) (at most 65535 bytes a record, each padded
 * to a multiple of 8 bytes with zeros), the empty STDOUT record, and
 * END_REQUEST(appStatus 0, FCGI_REQUEST_COMPLETE). Returns the bytes written,
 * fcgi_answer_size(len), or 0 (nothing written) when cap is too small. data
 * may be NULL when len is 0. */
size_t fcgi_encode_answer(uint8_t *out, size_t cap, uint16_t id, const void *data, size_t len);

/* The exact bytes fcgi_encode_stdout() needs for len bytes of data (0 for
 * none); SIZE_MAX when that does not fit a size_t. */
size_t fcgi_stdout_size(size_t len);

/* Encode one part of request `id`'s answer, more to come (a streamed
 * answer): STDOUT records carrying data[0..len), framed as in
 * fcgi_encode_answer(), without the empty STDOUT record or END_REQUEST
 * (the answer's last part is sent with fcgi_encode_answer()). Returns the
 * bytes written, fcgi_stdout_size(len), or 0 when cap is too small or len
 * is 0 (nothing to send: an empty STDOUT record would end the stream). */
size_t fcgi_encode_stdout(uint8_t *out, size_t cap, uint16_t id, const void *data, size_t len);

/* Encode END_REQUEST alone for request `id` (e.g. after an ABORT_REQUEST).
 * Returns the bytes written (16), or 0 when cap is below 16. */
size_t fcgi_encode_end(uint8_t *out, size_t cap, uint16_t id, uint32_t app_status, uint8_t proto_status);

#endif
