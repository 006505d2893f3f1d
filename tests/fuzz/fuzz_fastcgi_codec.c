/* fuzz_fastcgi_codec.c - the FastCGI codec against arbitrary peers.
 *
 * Input: 4 bytes of split seed, 1 byte of flags, 1 byte of repeat count,
 * 2 bytes of encode multiplier, then the byte stream a peer sends.
 *
 * The stream is fed twice, in one piece and split at points the seed picks
 * (one byte at a time, small or large pieces), with the same reactions to
 * the events (taken, done, as the flags say). Checked, on every call and
 * between the two runs (fastcgi_codec.h):
 *   - used <= len; FCGI_EV_NONE consumes everything; an event makes progress;
 *   - the buffers held never pass FCGI_CODEC_PARAMS_MAX + FCGI_CODEC_STDIN_KEEP;
 *   - a reply is one whole record of version 1 and fits ev->reply;
 *   - after FCGI_EV_ERROR every call is FCGI_EV_ERROR again, same why,
 *     everything consumed;
 *   - any split gives the same events at the same offsets, the same
 *     parameters and stdin;
 *   - fcgi_params_get agrees with fcgi_param.
 * Then fcgi_encode_answer round trip: data (the stream, repeated up to a
 * few hundred KiB so that it spans several 65535-byte records) encoded at
 * exactly fcgi_answer_size bytes, decoded record by record back to the
 * same bytes; one byte less of room writes nothing. */
#include <stdbool.h>

#include "fastcgi_codec.h"
#include "fuzz.h"

#define MAX_EVENTS 4096
#define N_NAMES 6

static const char *const names[N_NAMES] = {
    "QUERY_STRING", "REQUEST_METHOD", "HTTP_ACCEPT", "KEMBALI_SHOP", "HTTP_HOST", "",
};

/* What one event looked like, for comparing two runs. */
struct rec {
    enum fcgi_ev type;
    uint16_t id;
    size_t at; /* stream offset after the event */
    size_t reply_len;
    uint32_t reply_hash;
    const char *why;
    uint32_t req_hash; /* params, stdin and flags at FCGI_EV_REQUEST */
};

struct run {
    struct rec ev[MAX_EVENTS];
    size_t n;
    bool overflow;
};

static uint32_t hash(uint32_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 16777619u;
    return h;
}

static uint32_t hash_str(uint32_t h, const char *s)
{
    return s ? hash(hash(h, "S", 1), s, strlen(s) + 1) : hash(h, "N", 1);
}

/* Check a reply is one whole record. */
static void check_reply(const struct fcgi_event *ev)
{
    FUZZ_CHECK(ev->reply_len <= sizeof ev->reply);
    if (ev->reply_len == 0)
        return;
    FUZZ_CHECK(ev->reply_len >= FCGI_HEADER_LEN);
    FCGI_Header h;
    memcpy(&h, ev->reply, sizeof h);
    size_t clen = (size_t)h.contentLengthB1 << 8 | h.contentLengthB0;
    FUZZ_CHECK(h.version == FCGI_VERSION_1);
    FUZZ_CHECK(FCGI_HEADER_LEN + clen + h.paddingLength == ev->reply_len);
}

/* Read the request the way front.c does, and hash what it sees. */
static uint32_t read_request(struct fcgi_parser *p)
{
    uint32_t h = 2166136261u;
    const char *vals[N_NAMES];
    fcgi_params_get(p, names, N_NAMES, vals);
    for (size_t i = 0; i < N_NAMES; i++) {
        const char *v = fcgi_param(p, names[i]);
        FUZZ_CHECK(v == vals[i]); /* the same last value, the same pointer */
        if (fcgi_params_too_large(p))
            FUZZ_CHECK(v == NULL);
        h = hash_str(h, v);
    }
    size_t n;
    const uint8_t *in = fcgi_stdin(p, &n);
    FUZZ_CHECK(n <= FCGI_CODEC_STDIN_KEEP);
    FUZZ_CHECK(n == 0 || in != NULL);
    h = hash(h, &n, sizeof n);
    if (n > 0)
        h = hash(h, in, n);
    bool flags[3] = {fcgi_stdin_truncated(p), fcgi_params_too_large(p), fcgi_keep_conn(p)};
    return hash(h, flags, sizeof flags);
}

/* React to an event as the flags say; the same in both runs. */
static void react(struct fcgi_parser *p, const struct fcgi_event *ev, uint8_t flags, struct rec *r)
{
    unsigned mode = (flags >> 2) & 3;
    if (ev->type == FCGI_EV_REQUEST) {
        FUZZ_CHECK(fcgi_request_id(p) == ev->id && ev->id != 0);
        r->req_hash = read_request(p);
        if (mode == 0 || mode == 1)
            fcgi_request_taken(p);
        if (mode == 0 || mode == 2)
            fcgi_request_done(p);
        if (mode != 3) { /* taken or done: nothing of it is left */
            size_t n;
            FUZZ_CHECK(fcgi_param(p, "QUERY_STRING") == NULL && fcgi_stdin(p, &n) == NULL && n == 0);
        }
    } else if (ev->type == FCGI_EV_ABORT) {
        FUZZ_CHECK(ev->id != 0);
        if (!(flags & 0x40))
            fcgi_request_done(p);
    }
    FUZZ_CHECK(fcgi_parser_held(p) <= FCGI_CODEC_PARAMS_MAX + FCGI_CODEC_STDIN_KEEP);
}

/* Feed `len` bytes as the caller does; chunk sizes come from the seed
 * (split 0: one piece). */
static void feed(const uint8_t *s, size_t len, uint32_t seed, unsigned split, uint8_t flags, struct run *run)
{
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    size_t off = 0;
    const char *poisoned = NULL;
    run->n = 0;
    run->overflow = false;
    while (off < len) {
        size_t chunk = len - off;
        if (split == 1)
            chunk = 1;
        else if (split == 2)
            chunk = 1 + fuzz_rand(&seed) % 16;
        else if (split == 3)
            chunk = 1 + fuzz_rand(&seed) % 4096;
        if (chunk > len - off)
            chunk = len - off;
        const uint8_t *b = s + off;
        size_t left = chunk;
        while (left > 0) {
            struct fcgi_event ev;
            size_t used = (size_t)-1;
            enum fcgi_ev e = fcgi_feed(&p, b, left, &used, &ev);
            FUZZ_CHECK(e == ev.type);
            FUZZ_CHECK(used <= left);
            check_reply(&ev);
            FUZZ_CHECK(fcgi_parser_held(&p) <= FCGI_CODEC_PARAMS_MAX + FCGI_CODEC_STDIN_KEEP);
            if (poisoned) { /* checked, not recorded: the number of calls depends on the split */
                FUZZ_CHECK(e == FCGI_EV_ERROR && ev.why == poisoned && used == left);
                off += used;
                left = 0;
                continue;
            }
            if (e == FCGI_EV_NONE) {
                FUZZ_CHECK(used == left && ev.why == NULL);
            } else if (e == FCGI_EV_ERROR) {
                FUZZ_CHECK(used == left && ev.why != NULL && ev.reply_len == 0);
                poisoned = ev.why;
            } else {
                FUZZ_CHECK(used > 0 && ev.why == NULL);
            }
            b += used;
            left -= used;
            off += used;
            if (e == FCGI_EV_NONE)
                continue;
            struct rec r = {.type = e, .id = ev.id, .at = off, .reply_len = ev.reply_len,
                            .reply_hash = hash(0, ev.reply, ev.reply_len), .why = ev.why};
            if (e != FCGI_EV_ERROR)
                react(&p, &ev, flags, &r);
            else
                r.at = 0; /* an error discards the rest of the piece fed: its offset depends on the split */
            if (run->n < MAX_EVENTS)
                run->ev[run->n++] = r;
            else
                run->overflow = true;
        }
    }
    if (poisoned) { /* it stays an error, also for nothing or a few bytes more */
        struct fcgi_event ev;
        size_t used = 99;
        FUZZ_CHECK(fcgi_feed(&p, s, 0, &used, &ev) == FCGI_EV_ERROR && used == 0 && ev.why == poisoned);
        if (len > 0) {
            FUZZ_CHECK(fcgi_feed(&p, s, len < 9 ? len : 9, &used, &ev) == FCGI_EV_ERROR);
            FUZZ_CHECK(used == (len < 9 ? len : 9) && ev.why == poisoned);
        }
    }
    fcgi_request_done(&p);
    FUZZ_CHECK(fcgi_request_id(&p) == 0);
    fcgi_parser_free(&p);
}

static struct run whole_run, split_run;

static void compare(const struct run *a, const struct run *b)
{
    FUZZ_CHECK(a->n == b->n && a->overflow == b->overflow);
    for (size_t i = 0; i < a->n; i++) {
        const struct rec *x = &a->ev[i], *y = &b->ev[i];
        FUZZ_CHECK(x->type == y->type && x->id == y->id && x->at == y->at);
        FUZZ_CHECK(x->reply_len == y->reply_len && x->reply_hash == y->reply_hash);
        FUZZ_CHECK(x->why == y->why && x->req_hash == y->req_hash);
    }
}

static size_t pad8(size_t n)
{
    return (8 - n % 8) % 8;
}

/* Encode data and decode it back. */
static void round_trip(uint16_t id, const uint8_t *data, size_t len)
{
    size_t need = fcgi_answer_size(len);
    FUZZ_CHECK(need != SIZE_MAX && need >= 24 && need % 8 == 0);
    uint8_t *out = malloc(need);
    FUZZ_CHECK(out != NULL);
    FUZZ_CHECK(fcgi_encode_answer(out, need, id, data, len) == need);

    size_t r = 0, got = 0;
    bool ended = false;
    while (r < need) {
        FUZZ_CHECK(need - r >= FCGI_HEADER_LEN);
        FCGI_Header h;
        memcpy(&h, out + r, sizeof h);
        size_t clen = (size_t)h.contentLengthB1 << 8 | h.contentLengthB0, pad = h.paddingLength;
        FUZZ_CHECK(h.version == FCGI_VERSION_1 && (h.requestIdB1 << 8 | h.requestIdB0) == id);
        FUZZ_CHECK(need - r - FCGI_HEADER_LEN >= clen + pad);
        const uint8_t *c = out + r + FCGI_HEADER_LEN;
        r += FCGI_HEADER_LEN + clen + pad;
        if (h.type == FCGI_STDOUT && clen > 0) {
            FUZZ_CHECK(!ended && pad == pad8(clen));
            FUZZ_CHECK(got + clen <= len && memcmp(c, data + got, clen) == 0);
            for (size_t i = 0; i < pad; i++)
                FUZZ_CHECK(c[clen + i] == 0);
            got += clen;
        } else if (h.type == FCGI_STDOUT) {
            FUZZ_CHECK(!ended && pad == 0 && got == len);
            ended = true;
        } else {
            FCGI_EndRequestBody e;
            FUZZ_CHECK(h.type == FCGI_END_REQUEST && ended && clen == sizeof e && pad == 0);
            memcpy(&e, c, sizeof e);
            FUZZ_CHECK(e.protocolStatus == FCGI_REQUEST_COMPLETE);
            FUZZ_CHECK((e.appStatusB3 | e.appStatusB2 | e.appStatusB1 | e.appStatusB0) == 0);
            FUZZ_CHECK(r == need);
        }
    }
    FUZZ_CHECK(got == len && ended);

    /* one byte short: 0, nothing written */
    memset(out, 0xA5, need);
    FUZZ_CHECK(fcgi_encode_answer(out, need - 1, id, data, len) == 0);
    for (size_t i = 0; i < need; i++)
        FUZZ_CHECK(out[i] == 0xA5);
    free(out);

    uint8_t end[16];
    FUZZ_CHECK(fcgi_encode_end(end, 15, id, 1, FCGI_REQUEST_COMPLETE) == 0);
    FUZZ_CHECK(fcgi_encode_end(end, sizeof end, id, 7, FCGI_OVERLOADED) == 16);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8)
        return 0;
    uint32_t seed = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    uint8_t flags = data[4], repeat = data[5];
    uint16_t mult = (uint16_t)(data[6] | data[7] << 8);
    const uint8_t *s = data + 8;
    size_t len = size - 8;

    /* Amplify: the stream repeated, to reach the params and stdin caps. */
    uint8_t *big = NULL;
    if ((flags & 0x10) && len > 0) {
        size_t times = 1 + repeat % 64;
        big = malloc(len * times);
        FUZZ_CHECK(big != NULL);
        for (size_t i = 0; i < times; i++)
            memcpy(big + i * len, s, len);
        s = big;
        len *= times;
    }

    feed(s, len, seed, 0, flags, &whole_run);
    feed(s, len, seed, 1 + (flags & 3) % 3, flags, &split_run);
    compare(&whole_run, &split_run);

    if (flags & 0x20) {
        /* up to ~400 KiB: several full records and a partial one */
        size_t times = 1 + mult % 8, n = len * times;
        if (n > 400 * 1024)
            n = 400 * 1024;
        uint8_t *d = malloc(n ? n : 1);
        FUZZ_CHECK(d != NULL);
        for (size_t i = 0; i < n; i++)
            d[i] = s[i % len];
        round_trip((uint16_t)(mult ^ seed), d, n);
        free(d);
    } else {
        round_trip((uint16_t)seed, len ? s : NULL, len);
    }
    free(big);
    return 0;
}
