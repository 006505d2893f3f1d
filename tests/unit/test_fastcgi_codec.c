/* test_fastcgi_codec.c - unit tests of src/fastcgi_codec.c: FastCGI records
 * in, events out, answers encoded. Records are built here byte by byte. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastcgi_codec.h"

/* ---- building input ---- */

struct msg {
    uint8_t *b;
    size_t len, cap;
};

static void put(struct msg *m, const void *d, size_t n)
{
    if (m->len + n > m->cap) {
        m->cap = (m->len + n) * 2;
        m->b = realloc(m->b, m->cap);
        assert_non_null(m->b);
    }
    if (n)
        memcpy(m->b + m->len, d, n);
    m->len += n;
}

static void put_byte(struct msg *m, uint8_t c)
{
    put(m, &c, 1);
}

/* A record of any version; padding bytes are 0xAA so a parser that reads
 * them as content or headers notices. */
static void rec_version(struct msg *m, uint8_t version, uint8_t type, uint16_t id, const void *c, size_t n,
                        uint8_t pad)
{
    assert_true(n <= 0xffff);
    uint8_t h[8] = {version, type, (uint8_t)(id >> 8), (uint8_t)id, (uint8_t)(n >> 8), (uint8_t)n, pad, 0};
    put(m, h, 8);
    put(m, c, n);
    for (int i = 0; i < pad; i++)
        put_byte(m, 0xAA);
}

static void rec(struct msg *m, uint8_t type, uint16_t id, const void *c, size_t n, uint8_t pad)
{
    rec_version(m, FCGI_VERSION_1, type, id, c, n, pad);
}

/* data[0..n) as records of at most `each` bytes (no empty record). */
static void stream(struct msg *m, uint8_t type, uint16_t id, const void *data, size_t n, size_t each, uint8_t pad)
{
    const uint8_t *d = data;
    while (n > 0) {
        size_t k = n < each ? n : each;
        rec(m, type, id, d, k, pad);
        d += k;
        n -= k;
    }
}

static void put_len(struct msg *m, size_t n)
{
    if (n < 128) {
        put_byte(m, (uint8_t)n);
        return;
    }
    uint8_t b[4] = {(uint8_t)(0x80 | (n >> 24)), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
    put(m, b, 4);
}

/* One name-value pair, lengths encoded as the spec says. */
static void pair_n(struct msg *m, const char *name, size_t nl, const char *value, size_t vl)
{
    put_len(m, nl);
    put_len(m, vl);
    put(m, name, nl);
    put(m, value, vl);
}

static void pair(struct msg *m, const char *name, const char *value)
{
    pair_n(m, name, strlen(name), value, strlen(value));
}

static void begin(struct msg *m, uint16_t id, uint16_t role, uint8_t flags, uint8_t pad)
{
    uint8_t b[8] = {(uint8_t)(role >> 8), (uint8_t)role, flags, 0, 0, 0, 0, 0};
    rec(m, FCGI_BEGIN_REQUEST, id, b, 8, pad);
}

static void msg_free(struct msg *m)
{
    free(m->b);
    memset(m, 0, sizeof *m);
}

/* A name and a value over 127 bytes: both take the 4-byte length. */
static char long_name[141], long_value[301];

static void fill_longs(void)
{
    memset(long_name, 'N', sizeof long_name - 1);
    memcpy(long_name, "HTTP_X_", 7);
    long_name[sizeof long_name - 1] = 0;
    memset(long_value, 'v', sizeof long_value - 1);
    long_value[sizeof long_value - 1] = 0;
}

/* The params nginx sends for GET /id/tx_123?lang=en, and more. */
static void nginx_params(struct msg *pm)
{
    fill_longs();
    pair(pm, "QUERY_STRING", "lang=en");
    pair(pm, "REQUEST_METHOD", "POST");
    pair(pm, "CONTENT_TYPE", "application/json");
    pair(pm, "CONTENT_LENGTH", "11");
    pair(pm, "SCRIPT_NAME", "/id/tx_123");
    pair(pm, "REQUEST_URI", "/id/tx_123?lang=en");
    pair(pm, "DOCUMENT_URI", "/id/tx_123");
    pair(pm, "SERVER_PROTOCOL", "HTTP/1.1");
    pair(pm, "GATEWAY_INTERFACE", "CGI/1.1");
    pair(pm, "REMOTE_ADDR", "192.0.2.7");
    pair(pm, "HTTP_ACCEPT_LANGUAGE", "");
    pair(pm, "HTTP_COOKIE", long_value);
    pair(pm, long_name, "x");
    pair(pm, "QUERY_STRING", "second");
}

/* A whole request: padding on every record (255 on the empty ones), params
 * cut mid-pair across records, a DATA record, stdin in two records. */
static void normal_request(struct msg *m, uint16_t id, uint8_t flags)
{
    struct msg pm = {0};
    nginx_params(&pm);
    begin(m, id, FCGI_RESPONDER, flags, 5);
    stream(m, FCGI_PARAMS, id, pm.b, pm.len, 100, 3);
    rec(m, FCGI_PARAMS, id, NULL, 0, 255);
    rec(m, FCGI_DATA, id, "data", 4, 4);
    rec(m, FCGI_STDIN, id, "hello", 5, 1);
    rec(m, FCGI_STDIN, id, " world", 6, 2);
    rec(m, FCGI_STDIN, id, NULL, 0, 255);
    msg_free(&pm);
}

static void check_normal_request(const struct fcgi_parser *p, uint16_t id)
{
    assert_int_equal(fcgi_request_id(p), id);
    assert_string_equal(fcgi_param(p, "QUERY_STRING"), "second"); /* the last of two */
    assert_string_equal(fcgi_param(p, "REQUEST_METHOD"), "POST");
    assert_string_equal(fcgi_param(p, "SCRIPT_NAME"), "/id/tx_123");
    assert_string_equal(fcgi_param(p, "REQUEST_URI"), "/id/tx_123?lang=en");
    assert_string_equal(fcgi_param(p, "REMOTE_ADDR"), "192.0.2.7");
    assert_string_equal(fcgi_param(p, "HTTP_ACCEPT_LANGUAGE"), "");
    assert_string_equal(fcgi_param(p, "HTTP_COOKIE"), long_value);
    assert_string_equal(fcgi_param(p, long_name), "x");
    assert_null(fcgi_param(p, "SCRIPT"));
    assert_null(fcgi_param(p, "SCRIPT_NAMEX"));
    assert_null(fcgi_param(p, "lang=en"));
    assert_null(fcgi_param(p, ""));
    size_t n;
    const uint8_t *in = fcgi_stdin(p, &n);
    assert_int_equal(n, 11);
    assert_memory_equal(in, "hello world", 11);
    assert_false(fcgi_stdin_truncated(p));
    assert_false(fcgi_params_too_large(p));
}

/* ---- feeding ---- */

/* Feeds b[0..len) as the event loop does, at most `chunk` bytes a call
 * (0: all), never crossing offset `split` in one call (0: no split). */
struct feeder {
    const uint8_t *b;
    size_t len, off, chunk, split;
};

static struct feeder feeder_of(const struct msg *m)
{
    return (struct feeder){.b = m->b, .len = m->len};
}

/* Feed until the first event other than FCGI_EV_NONE; FCGI_EV_NONE when the
 * input ran out first. */
static enum fcgi_ev next_ev(struct fcgi_parser *p, struct feeder *f, struct fcgi_event *ev)
{
    while (f->off < f->len) {
        size_t n = f->len - f->off;
        if (f->chunk && n > f->chunk)
            n = f->chunk;
        if (f->split && f->off < f->split && n > f->split - f->off)
            n = f->split - f->off;
        size_t used = (size_t)-1;
        enum fcgi_ev e = fcgi_feed(p, f->b + f->off, n, &used, ev);
        assert_int_equal(ev->type, e);
        assert_true(used <= n);
        assert_true(fcgi_parser_held(p) <= FCGI_CODEC_PARAMS_MAX + FCGI_CODEC_STDIN_KEEP);
        f->off += used;
        if (e != FCGI_EV_NONE)
            return e;
        assert_int_equal(used, n);
        assert_int_equal(ev->reply_len, 0);
    }
    return FCGI_EV_NONE;
}

/* Feed a whole message to a new parser and expect one error. */
static void expect_error(const struct msg *m, const char *why_part)
{
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_ERROR);
    assert_non_null(ev.why);
    assert_non_null(strstr(ev.why, why_part));
    assert_int_equal(f.off, m->len); /* an error takes the rest of the input */
    fcgi_parser_free(&p);
}

/* ---- requests ---- */

static void run_normal(size_t chunk, size_t split)
{
    struct msg m = {0};
    normal_request(&m, 1, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    f.chunk = chunk;
    f.split = split;
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_int_equal(ev.id, 1);
    assert_int_equal(ev.reply_len, 0);
    assert_int_equal(f.off, m.len - 255); /* the event comes before the last record's padding */
    check_normal_request(&p, 1);
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_NONE);
    fcgi_request_taken(&p);
    assert_null(fcgi_param(&p, "SCRIPT_NAME"));
    assert_int_equal(fcgi_parser_held(&p), 0);
    assert_int_equal(fcgi_request_id(&p), 1);
    fcgi_request_done(&p);
    assert_int_equal(fcgi_request_id(&p), 0);
    fcgi_parser_free(&p);
    msg_free(&m);
}

static void test_request_whole(void **unused)
{
    (void)unused;
    run_normal(0, 0);
}

static void test_request_byte_at_a_time(void **unused)
{
    (void)unused;
    run_normal(1, 0);
}

static void test_request_every_split(void **unused)
{
    (void)unused;
    struct msg m = {0};
    normal_request(&m, 1, 0);
    for (size_t k = 1; k < m.len; k++)
        run_normal(0, k);
    msg_free(&m);
}

static void test_keep_conn(void **unused)
{
    (void)unused;
    static const uint8_t flags[] = {0, FCGI_KEEP_CONN, 0xfe, 0xff};
    for (size_t i = 0; i < sizeof flags; i++) {
        struct msg m = {0};
        normal_request(&m, 3, flags[i]);
        struct fcgi_parser p;
        fcgi_parser_init(&p);
        struct feeder f = feeder_of(&m);
        struct fcgi_event ev;
        assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
        assert_int_equal(fcgi_keep_conn(&p), (flags[i] & FCGI_KEEP_CONN) != 0);
        fcgi_request_taken(&p);
        assert_int_equal(fcgi_keep_conn(&p), (flags[i] & FCGI_KEEP_CONN) != 0);
        fcgi_request_done(&p);
        assert_false(fcgi_keep_conn(&p));
        fcgi_parser_free(&p);
        msg_free(&m);
    }
}

/* A kept connection: request 1, then request 1 again and request 2, all in
 * one read, handled as the event loop does. */
static void test_requests_in_a_row(void **unused)
{
    (void)unused;
    struct msg m = {0};
    normal_request(&m, 1, FCGI_KEEP_CONN);
    begin(&m, 1, FCGI_RESPONDER, FCGI_KEEP_CONN, 0);
    struct msg pm = {0};
    pair(&pm, "SCRIPT_NAME", "/id/second");
    rec(&m, FCGI_PARAMS, 1, pm.b, pm.len, 0);
    rec(&m, FCGI_PARAMS, 1, NULL, 0, 0);
    rec(&m, FCGI_STDIN, 1, NULL, 0, 0);
    normal_request(&m, 2, 0);

    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    check_normal_request(&p, 1);
    assert_true(fcgi_keep_conn(&p));
    fcgi_request_taken(&p);
    fcgi_request_done(&p);

    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_int_equal(ev.id, 1);
    assert_string_equal(fcgi_param(&p, "SCRIPT_NAME"), "/id/second");
    assert_null(fcgi_param(&p, "QUERY_STRING"));
    size_t n = 99;
    fcgi_stdin(&p, &n);
    assert_int_equal(n, 0);
    fcgi_request_taken(&p);
    fcgi_request_done(&p);

    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_int_equal(ev.id, 2);
    check_normal_request(&p, 2);
    assert_false(fcgi_keep_conn(&p));
    fcgi_request_done(&p); /* without taken: frees too */
    assert_int_equal(fcgi_parser_held(&p), 0);
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_NONE);
    fcgi_parser_free(&p);
    msg_free(&pm);
    msg_free(&m);
}

/* fcgi_parser_mid_record: false at every record boundary, true inside a
 * header, a content or a padding (a kept connection's next request begun). */
static void test_mid_record(void **unused)
{
    (void)unused;
    struct msg m = {0};
    begin(&m, 1, FCGI_RESPONDER, FCGI_KEEP_CONN, 3);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    assert_false(fcgi_parser_mid_record(&p));
    for (size_t i = 0; i < m.len; i++) {
        struct fcgi_event ev;
        size_t used = 0;
        assert_int_equal(fcgi_feed(&p, m.b + i, 1, &used, &ev), FCGI_EV_NONE);
        assert_int_equal(used, 1);
        assert_int_equal(fcgi_parser_mid_record(&p), i + 1 < m.len);
    }
    fcgi_parser_free(&p);
    msg_free(&m);
}

/* ---- management records ---- */

static void expect_reply(const struct msg *m, size_t chunk, uint16_t id, const struct msg *want)
{
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(m);
    f.chunk = chunk;
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REPLY);
    assert_int_equal(ev.id, id);
    assert_int_equal(ev.reply_len, want->len);
    assert_memory_equal(ev.reply, want->b, want->len);
    assert_int_equal(fcgi_request_id(&p), 0);
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_NONE);
    fcgi_parser_free(&p);
}

/* The GET_VALUES_RESULT for a content (pairs), padded to 8 with zeros. */
static void gv_result(struct msg *want, const struct msg *pairs)
{
    size_t pad = (8 - pairs->len % 8) % 8;
    uint8_t h[8] = {1, FCGI_GET_VALUES_RESULT, 0, 0, 0, (uint8_t)pairs->len, (uint8_t)pad, 0};
    put(want, h, 8);
    put(want, pairs->b, pairs->len);
    for (size_t i = 0; i < pad; i++)
        put_byte(want, 0);
}

static void test_get_values_all(void **unused)
{
    (void)unused;
    struct msg q = {0}, m = {0}, r = {0}, want = {0};
    pair(&q, FCGI_MPXS_CONNS, "");
    pair(&q, "FCGI_MAX_CONNSX", "");
    pair(&q, FCGI_MAX_REQS, "");
    pair(&q, "FCGI_", "");
    pair(&q, FCGI_MAX_CONNS, "");
    pair(&q, FCGI_MAX_CONNS, ""); /* asked twice, answered once */
    rec(&m, FCGI_GET_VALUES, 0, q.b, q.len, 7);
    pair(&r, FCGI_MAX_CONNS, "10000");
    pair(&r, FCGI_MAX_REQS, "10000");
    pair(&r, FCGI_MPXS_CONNS, "0");
    gv_result(&want, &r);
    expect_reply(&m, 0, 0, &want);
    expect_reply(&m, 1, 0, &want);
    msg_free(&q);
    msg_free(&m);
    msg_free(&r);
    msg_free(&want);
}

static void test_get_values_some(void **unused)
{
    (void)unused;
    struct msg q = {0}, m = {0}, r = {0}, want = {0};
    pair(&q, "UNKNOWN", "");
    pair_n(&q, long_name, 140, "", 0); /* a 4-byte name length */
    pair(&q, FCGI_MPXS_CONNS, "ignored value");
    rec(&m, FCGI_GET_VALUES, 0, q.b, q.len, 0);
    pair(&r, FCGI_MPXS_CONNS, "0");
    gv_result(&want, &r);
    expect_reply(&m, 1, 0, &want);

    /* only unknown names: an empty result */
    struct msg q2 = {0}, m2 = {0}, empty = {0}, want2 = {0};
    pair(&q2, "UNKNOWN", "");
    rec(&m2, FCGI_GET_VALUES, 0, q2.b, q2.len, 0);
    gv_result(&want2, &empty);
    assert_int_equal(want2.len, 8);
    expect_reply(&m2, 0, 0, &want2);
    msg_free(&q);
    msg_free(&m);
    msg_free(&r);
    msg_free(&want);
    msg_free(&q2);
    msg_free(&m2);
    msg_free(&want2);
}

static void test_get_values_empty(void **unused)
{
    (void)unused;
    struct msg m = {0}, empty = {0}, want = {0};
    rec(&m, FCGI_GET_VALUES, 0, NULL, 0, 255);
    gv_result(&want, &empty);
    expect_reply(&m, 0, 0, &want);
    msg_free(&m);
    msg_free(&want);
}

static void test_get_values_malformed(void **unused)
{
    (void)unused;
    static const uint8_t bad[][8] = {
        {14, 0, 'F', 'C', 'G', 'I'},    /* name past the record */
        {2, 9, 'a', 'b', 'c'},          /* value past the record */
        {4},                            /* no value length */
        {0x80, 0, 0},                   /* a 4-byte length cut short */
        {1, 0x80, 0, 1, 0, 'a', 'b'},   /* a 4-byte value length (256) past the record */
        {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, /* 2 GB and 2 GB */
    };
    static const size_t len[] = {6, 5, 1, 3, 7, 8};
    for (size_t i = 0; i < sizeof len / sizeof len[0]; i++) {
        struct msg m = {0};
        rec(&m, FCGI_GET_VALUES, 0, bad[i], len[i], 0);
        begin(&m, 1, FCGI_RESPONDER, 0, 0);
        expect_error(&m, "GET_VALUES");
        msg_free(&m);
    }
}

static void test_unknown_management_type(void **unused)
{
    (void)unused;
    static const uint8_t types[] = {200, FCGI_BEGIN_REQUEST, FCGI_PARAMS, FCGI_STDOUT, FCGI_GET_VALUES_RESULT};
    static const uint8_t content[8] = "abcdefg";
    for (size_t i = 0; i < sizeof types; i++) {
        struct msg m = {0}, want = {0};
        rec(&m, types[i], 0, content, types[i] == FCGI_BEGIN_REQUEST ? 8 : 5, 3);
        const uint8_t w[16] = {1, FCGI_UNKNOWN_TYPE, 0, 0, 0, 8, 0, 0, types[i], 0, 0, 0, 0, 0, 0, 0};
        put(&want, w, sizeof w);
        expect_reply(&m, 0, 0, &want);
        expect_reply(&m, 1, 0, &want);
        msg_free(&m);
        msg_free(&want);
    }
}

/* ---- protocol errors ---- */

static void test_bad_version(void **unused)
{
    (void)unused;
    static const uint8_t versions[] = {0, 2, 255};
    for (size_t i = 0; i < sizeof versions; i++) {
        struct msg m = {0};
        uint8_t b[8] = {0, FCGI_RESPONDER, 0};
        rec_version(&m, versions[i], FCGI_BEGIN_REQUEST, 1, b, 8, 0);
        normal_request(&m, 1, 0);
        expect_error(&m, "version");
        msg_free(&m);
    }
    /* also on a management record */
    struct msg m = {0};
    rec_version(&m, 2, FCGI_GET_VALUES, 0, NULL, 0, 0);
    expect_error(&m, "version");
    msg_free(&m);
}

static void test_begin_wrong_length(void **unused)
{
    (void)unused;
    static const size_t lens[] = {0, 7, 9, 16};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        struct msg m = {0};
        uint8_t b[16] = {0, FCGI_RESPONDER};
        rec(&m, FCGI_BEGIN_REQUEST, 1, b, lens[i], 0);
        expect_error(&m, "8 bytes");
        msg_free(&m);
    }
}

static void test_role_not_responder(void **unused)
{
    (void)unused;
    static const uint16_t roles[] = {FCGI_AUTHORIZER, FCGI_FILTER, 0, 0x0101};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        struct msg m = {0};
        begin(&m, 0x1234, roles[i], FCGI_KEEP_CONN, 2);
        /* the refused request's records are ignored, not errors */
        rec(&m, FCGI_STDIN, 0x1234, "x", 1, 0);
        rec(&m, FCGI_PARAMS, 0x1234, NULL, 0, 0);
        rec(&m, FCGI_STDIN, 0x1234, NULL, 0, 0);
        struct fcgi_parser p;
        fcgi_parser_init(&p);
        struct feeder f = feeder_of(&m);
        struct fcgi_event ev;
        assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REPLY);
        assert_int_equal(ev.id, 0x1234);
        const uint8_t w[16] = {1, FCGI_END_REQUEST, 0x12, 0x34, 0, 8, 0, 0, 0, 0, 0, 0, FCGI_UNKNOWN_ROLE, 0, 0, 0};
        assert_int_equal(ev.reply_len, 16);
        assert_memory_equal(ev.reply, w, 16);
        assert_int_equal(fcgi_request_id(&p), 0);
        assert_false(fcgi_keep_conn(&p));
        assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_NONE);
        fcgi_parser_free(&p);
        msg_free(&m);
    }
}

static void test_second_begin_same_id(void **unused)
{
    (void)unused;
    struct msg m = {0};
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    expect_error(&m, "second BEGIN_REQUEST");
    msg_free(&m);

    /* after the request arrived, before fcgi_request_done */
    normal_request(&m, 1, 0);
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    fcgi_request_taken(&p);
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_ERROR);
    assert_non_null(strstr(ev.why, "second BEGIN_REQUEST"));
    fcgi_parser_free(&p);
    msg_free(&m);
}

static void test_begin_other_id_while_live(void **unused)
{
    (void)unused;
    struct msg m = {0}, pm = {0};
    pair(&pm, "SCRIPT_NAME", "/id/one");
    begin(&m, 1, FCGI_RESPONDER, FCGI_KEEP_CONN, 0);
    rec(&m, FCGI_PARAMS, 1, pm.b, 5, 1);
    begin(&m, 0x0102, FCGI_RESPONDER, 0, 6);
    rec(&m, FCGI_PARAMS, 1, pm.b + 5, pm.len - 5, 0);
    rec(&m, FCGI_PARAMS, 1, NULL, 0, 0);
    rec(&m, FCGI_STDIN, 1, NULL, 0, 0);

    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REPLY);
    assert_int_equal(ev.id, 0x0102);
    const uint8_t w[16] = {1, FCGI_END_REQUEST, 1, 2, 0, 8, 0, 0, 0, 0, 0, 0, FCGI_CANT_MPX_CONN, 0, 0, 0};
    assert_int_equal(ev.reply_len, 16);
    assert_memory_equal(ev.reply, w, 16);
    assert_int_equal(fcgi_request_id(&p), 1);
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_int_equal(ev.id, 1);
    assert_true(fcgi_keep_conn(&p));
    assert_string_equal(fcgi_param(&p, "SCRIPT_NAME"), "/id/one");
    fcgi_request_taken(&p);

    /* after taken: still refused until done */
    struct msg m2 = {0};
    begin(&m2, 2, FCGI_RESPONDER, 0, 0);
    struct feeder f2 = feeder_of(&m2);
    assert_int_equal(next_ev(&p, &f2, &ev), FCGI_EV_REPLY);
    assert_int_equal(ev.reply[12], FCGI_CANT_MPX_CONN);
    fcgi_request_done(&p);
    f2.off = 0;
    assert_int_equal(next_ev(&p, &f2, &ev), FCGI_EV_NONE);
    assert_int_equal(fcgi_request_id(&p), 2);
    fcgi_parser_free(&p);
    msg_free(&m);
    msg_free(&m2);
    msg_free(&pm);
}

static void test_stdin_before_params_end(void **unused)
{
    (void)unused;
    struct msg m = {0}, pm = {0};
    pair(&pm, "A", "b");
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    rec(&m, FCGI_PARAMS, 1, pm.b, pm.len, 0);
    rec(&m, FCGI_STDIN, 1, NULL, 0, 0);
    expect_error(&m, "STDIN before");
    msg_free(&m);
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    rec(&m, FCGI_STDIN, 1, "x", 1, 0);
    expect_error(&m, "STDIN before");
    msg_free(&m);
    msg_free(&pm);
}

static void test_params_after_end(void **unused)
{
    (void)unused;
    struct msg m = {0}, pm = {0};
    pair(&pm, "A", "b");
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    rec(&m, FCGI_PARAMS, 1, pm.b, pm.len, 0);
    rec(&m, FCGI_PARAMS, 1, NULL, 0, 0);
    rec(&m, FCGI_PARAMS, 1, pm.b, pm.len, 0);
    expect_error(&m, "PARAMS after");
    msg_free(&m);
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    rec(&m, FCGI_PARAMS, 1, NULL, 0, 0);
    rec(&m, FCGI_PARAMS, 1, NULL, 0, 0);
    expect_error(&m, "PARAMS after");
    msg_free(&m);
    msg_free(&pm);
}

static void test_stdin_after_end(void **unused)
{
    (void)unused;
    struct msg m = {0};
    normal_request(&m, 1, 0);
    rec(&m, FCGI_STDIN, 1, "late", 4, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_ERROR);
    assert_non_null(strstr(ev.why, "STDIN after"));
    fcgi_parser_free(&p);
    msg_free(&m);
}

/* A request whose params block is `block` (then an empty PARAMS record). */
static void request_with_block(struct msg *m, const void *block, size_t n)
{
    begin(m, 1, FCGI_RESPONDER, 0, 0);
    rec(m, FCGI_PARAMS, 1, block, n, 0);
    rec(m, FCGI_PARAMS, 1, NULL, 0, 0);
    rec(m, FCGI_STDIN, 1, NULL, 0, 0);
}

static void test_pairs_past_the_block(void **unused)
{
    (void)unused;
    static const uint8_t bad[][12] = {
        {1, 1, 'A', 'b', 5, 0, 'x', 'y'},        /* name past the end */
        {1, 1, 'A', 'b', 1, 3, 'x', 'y', 'z'},   /* value past the end */
        {1, 1, 'A', 'b', 3},                     /* no value length */
        {1, 1, 'A', 'b', 0x80, 0, 0},            /* a 4-byte length cut short */
        {1, 0x80, 0, 1, 0, 'A', 'b'},            /* a 4-byte value length (256) past the end */
        {0x80, 0, 0, 2, 0, 'A'},                 /* a 4-byte name length (2) past the end */
    };
    static const size_t len[] = {8, 9, 5, 7, 7, 6};
    for (size_t i = 0; i < sizeof len / sizeof len[0]; i++) {
        struct msg m = {0};
        request_with_block(&m, bad[i], len[i]);
        expect_error(&m, "PARAMS name-value");
        msg_free(&m);
    }
    /* the same block one byte longer parses: the check is exact */
    struct msg m = {0};
    static const uint8_t good[] = {1, 1, 'A', 'b', 1, 3, 'x', 'y', 'z', 'w'};
    request_with_block(&m, good, sizeof good);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_string_equal(fcgi_param(&p, "A"), "b");
    assert_string_equal(fcgi_param(&p, "x"), "yzw");
    fcgi_parser_free(&p);
    msg_free(&m);
}

static void test_pairs_huge_lengths(void **unused)
{
    (void)unused;
    static const uint8_t bad[][16] = {
        {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 'a', 'b', 'c', 'd'}, /* 0x7fffffff + 0x7fffffff */
        {0x80, 0, 0, 2, 0xff, 0xff, 0xff, 0xff, 'a', 'b'},                   /* 2 + 0x7fffffff */
        {0xff, 0xff, 0xff, 0xff, 0, 'a', 'b'},                               /* 0x7fffffff + 0 */
        {0x80, 0, 0, 0, 0xff, 0xff, 0xff, 0xfe, 'a'},                        /* 0 + 0x7ffffffe */
    };
    static const size_t len[] = {12, 10, 7, 9};
    for (size_t i = 0; i < sizeof len / sizeof len[0]; i++) {
        struct msg m = {0};
        request_with_block(&m, bad[i], len[i]);
        expect_error(&m, "PARAMS name-value");
        msg_free(&m);
    }
}

/* A name sent more than once counts with its last value (as PHP-FPM has
 * it): nginx sends QUERY_STRING from `include fastcgi_params` and again from
 * a `fastcgi_param` written after it, which must win. fcgi_param() and
 * fcgi_params_get() agree; a name sent once is unaffected. */
static void test_params_last_wins(void **unused)
{
    (void)unused;
    struct msg pm = {0}, m = {0};
    pair(&pm, "QUERY_STRING", "id=tx_1");
    pair(&pm, "SCRIPT_NAME", "/kembali-metrics");
    pair(&pm, "KEMBALI_ADMIN", "0");
    pair(&pm, "QUERY_STRING", "format=metrics");
    pair(&pm, "REMOTE_ADDR", "192.0.2.7");
    pair(&pm, "KEMBALI_ADMIN", "");
    pair(&pm, "KEMBALI_ADMIN", "1");
    request_with_block(&m, pm.b, pm.len);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_string_equal(fcgi_param(&p, "QUERY_STRING"), "format=metrics");
    assert_string_equal(fcgi_param(&p, "KEMBALI_ADMIN"), "1");
    assert_string_equal(fcgi_param(&p, "SCRIPT_NAME"), "/kembali-metrics");
    const char *const names[] = {"KEMBALI_ADMIN", "QUERY_STRING", "REMOTE_ADDR", "HTTP_ACCEPT"};
    const char *v[4];
    fcgi_params_get(&p, names, 4, v);
    assert_string_equal(v[0], "1");
    assert_string_equal(v[1], "format=metrics");
    assert_string_equal(v[2], "192.0.2.7");
    assert_null(v[3]);
    for (size_t i = 0; i < 3; i++)
        assert_ptr_equal(v[i], fcgi_param(&p, names[i]));
    fcgi_parser_free(&p);
    msg_free(&pm);
    msg_free(&m);
}

/* Names the index must tell apart: the empty name, one and two bytes,
 * prefixes of each other, names that take the same first slot (same
 * length and the same bytes where the slot is taken from), a long one. */
static const char *const index_pool[] = {
    "", "A", "AB", "SCRIPT", "SCRIPT_NAME", "SCRIPT_NAMEX", "AxBCD", "AyBCD", "AzBCD", "QUERY_STRING",
    "REQUEST_METHOD", "HTTP_HOST", "SERVER_NAME", "REMOTE_ADDR", "REMOTE_USER", "REMOTE_PORT", long_name,
};
#define INDEX_POOL (sizeof index_pool / sizeof index_pool[0])

/* k pairs drawn from index_pool (a fixed pseudo-random sequence; the
 * i-th pair's value is "v<i>", or a long one with `big`): every name of
 * the pool and a few absent ones, through fcgi_param() and
 * fcgi_params_get(), give the last value sent, with the index (up to
 * FCGI_CODEC_INDEX_NAMES pairs) and without it (more pairs, or a block
 * the index would take past FCGI_CODEC_PARAMS_MAX). */
static void check_index(size_t k, bool big)
{
    struct msg pm = {0}, rest = {0}, m = {0};
    size_t last[INDEX_POOL], first = 0, bigl = 0;
    for (size_t i = 0; i < INDEX_POOL; i++)
        last[i] = SIZE_MAX;
    uint32_t seed = 12345u + (uint32_t)k;
    for (size_t i = 0; i < k; i++) {
        seed = seed * 1103515245u + 12345u;
        size_t which = (seed >> 16) % INDEX_POOL;
        char v[24];
        snprintf(v, sizeof v, "v%zu", i);
        if (i == 0)
            first = which;
        else
            pair(&rest, index_pool[which], v);
        last[which] = i;
    }
    char *bigv = NULL;
    if (big) {
        /* the block at FCGI_CODEC_PARAMS_MAX exactly: its pairs fit, their
         * index after them would not */
        size_t nl = strlen(index_pool[first]);
        bigl = FCGI_CODEC_PARAMS_MAX - rest.len - nl - (nl < 128 ? 1 : 4) - 4;
        bigv = malloc(bigl);
        assert_non_null(bigv);
        memset(bigv, 'b', bigl);
        pair_n(&pm, index_pool[first], nl, bigv, bigl);
    } else {
        pair(&pm, index_pool[first], "v0");
    }
    put(&pm, rest.b, rest.len);
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    stream(&m, FCGI_PARAMS, 1, pm.b, pm.len, 30000, 0);
    rec(&m, FCGI_PARAMS, 1, NULL, 0, 0);
    rec(&m, FCGI_STDIN, 1, NULL, 0, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_false(fcgi_params_too_large(&p));
    /* the codec's own field, read here to know which way was taken */
    assert_true((p.index != NULL) == (k <= FCGI_CODEC_INDEX_NAMES && !big));
    assert_true(fcgi_parser_held(&p) <= FCGI_CODEC_PARAMS_MAX);
    for (size_t i = 0; i < INDEX_POOL; i++) {
        const char *got = fcgi_param(&p, index_pool[i]);
        if (last[i] == SIZE_MAX) {
            assert_null(got);
            continue;
        }
        assert_non_null(got);
        if (big && last[i] == 0) {
            assert_int_equal(strlen(got), bigl);
        } else {
            char v[24];
            snprintf(v, sizeof v, "v%zu", last[i]);
            assert_string_equal(got, v);
        }
    }
    const char *const absent[] = {"B", "ABC", "SCRIPT_NAM", "AwBCD", "HTTP_ACCEPT", "QUERY_STRINGS"};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
        assert_null(fcgi_param(&p, absent[i]));
    const char *const names[] = {"QUERY_STRING", "", "AyBCD", "HTTP_ACCEPT", "SCRIPT", "AB", "REMOTE_ADDR"};
    const char *v[7];
    fcgi_params_get(&p, names, 7, v);
    for (size_t i = 0; i < 7; i++)
        assert_ptr_equal(v[i], fcgi_param(&p, names[i]));
    fcgi_parser_free(&p);
    msg_free(&pm);
    msg_free(&rest);
    msg_free(&m);
    free(bigv);
}

static void test_params_index(void **unused)
{
    (void)unused;
    fill_longs();
    const size_t ks[] = {1, 2, 5, 17, 40, FCGI_CODEC_INDEX_NAMES - 1, FCGI_CODEC_INDEX_NAMES,
                         FCGI_CODEC_INDEX_NAMES + 1, 100, 400};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        check_index(ks[i], false);
    check_index(5, true);
    check_index(30, true);
}

/* A value is cut at a NUL; a name with a NUL is not kept (it must not pass
 * for the name before the NUL). */
static void test_params_with_nul(void **unused)
{
    (void)unused;
    struct msg pm = {0}, m = {0};
    pair_n(&pm, "SCRIPT_NAME\0x", 13, "/evil", 5);
    pair_n(&pm, "QUERY_STRING", 12, "a\0SCRIPT_NAME\0/evil", 19);
    pair(&pm, "SCRIPT_NAME", "/id/good");
    pair_n(&pm, "\0", 1, "", 0);
    request_with_block(&m, pm.b, pm.len);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_string_equal(fcgi_param(&p, "SCRIPT_NAME"), "/id/good");
    assert_string_equal(fcgi_param(&p, "QUERY_STRING"), "a");
    assert_null(fcgi_param(&p, ""));
    assert_null(fcgi_param(&p, "x"));
    fcgi_parser_free(&p);
    msg_free(&m);
    msg_free(&pm);
}

/* Params of exactly `total` bytes: a filler pair with 4-byte lengths and
 * SCRIPT_NAME (20 bytes). */
static void big_params(struct msg *pm, size_t total)
{
    size_t filler = total - 12 - 20;
    char *v = malloc(filler);
    assert_non_null(v);
    memset(v, 'f', filler);
    static const uint8_t nl[4] = {0x80, 0, 0, 4};
    put(pm, nl, 4);
    put_len(pm, filler);
    put(pm, "FILL", 4);
    put(pm, v, filler);
    pair(pm, "SCRIPT_NAME", "/id/big");
    assert_int_equal(pm->len, total);
    free(v);
}

static void test_params_at_the_cap(void **unused)
{
    (void)unused;
    struct msg pm = {0}, m = {0};
    big_params(&pm, FCGI_CODEC_PARAMS_MAX);
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    stream(&m, FCGI_PARAMS, 1, pm.b, pm.len, 65535, 1);
    rec(&m, FCGI_PARAMS, 1, NULL, 0, 0);
    rec(&m, FCGI_STDIN, 1, NULL, 0, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_false(fcgi_params_too_large(&p));
    assert_string_equal(fcgi_param(&p, "SCRIPT_NAME"), "/id/big");
    assert_int_equal(strlen(fcgi_param(&p, "FILL")), FCGI_CODEC_PARAMS_MAX - 12 - 20);
    fcgi_parser_free(&p);
    msg_free(&m);
    msg_free(&pm);
}

static void test_params_over_the_cap(void **unused)
{
    (void)unused;
    struct msg pm = {0}, m = {0};
    big_params(&pm, FCGI_CODEC_PARAMS_MAX + 1);
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    stream(&m, FCGI_PARAMS, 1, pm.b, pm.len, 1000, 0);
    size_t over = m.len; /* by here the cap is passed */
    for (int i = 0; i < 200; i++) /* and much more after it: counted and dropped */
        rec(&m, FCGI_PARAMS, 1, pm.b, 60000, 4);
    rec(&m, FCGI_PARAMS, 1, NULL, 0, 0);
    rec(&m, FCGI_STDIN, 1, "body", 4, 0);
    rec(&m, FCGI_STDIN, 1, NULL, 0, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    f.len = over;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_NONE);
    assert_true(fcgi_params_too_large(&p));
    assert_int_equal(fcgi_parser_held(&p), 0); /* freed as soon as the cap was passed */
    f.len = m.len;
    f.chunk = 7000;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_true(fcgi_params_too_large(&p));
    assert_null(fcgi_param(&p, "SCRIPT_NAME"));
    assert_null(fcgi_param(&p, "FILL"));
    size_t n;
    const uint8_t *in = fcgi_stdin(&p, &n);
    assert_int_equal(n, 4);
    assert_memory_equal(in, "body", 4);
    fcgi_request_done(&p);
    assert_false(fcgi_params_too_large(&p));
    fcgi_parser_free(&p);
    msg_free(&m);
    msg_free(&pm);
}

static void run_stdin(size_t total, bool truncated)
{
    uint8_t *body = malloc(total);
    assert_non_null(body);
    for (size_t i = 0; i < total; i++)
        body[i] = (uint8_t)(i % 251);
    struct msg m = {0};
    begin(&m, 9, FCGI_RESPONDER, 0, 0);
    rec(&m, FCGI_PARAMS, 9, NULL, 0, 0);
    stream(&m, FCGI_STDIN, 9, body, total, 3000, 2);
    rec(&m, FCGI_STDIN, 9, NULL, 0, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_int_equal(fcgi_stdin_truncated(&p), truncated);
    size_t n;
    const uint8_t *in = fcgi_stdin(&p, &n);
    size_t want = total < FCGI_CODEC_STDIN_KEEP ? total : FCGI_CODEC_STDIN_KEEP;
    assert_int_equal(n, want);
    assert_memory_equal(in, body, want);
    assert_true(fcgi_parser_held(&p) <= FCGI_CODEC_STDIN_KEEP);
    fcgi_request_done(&p);
    assert_false(fcgi_stdin_truncated(&p));
    fcgi_parser_free(&p);
    msg_free(&m);
    free(body);
}

static void test_stdin_over_the_keep(void **unused)
{
    (void)unused;
    run_stdin(FCGI_CODEC_STDIN_KEEP, false);
    run_stdin(FCGI_CODEC_STDIN_KEEP + 1, true);
    run_stdin(200000, true);
}

/* ---- aborts and inactive ids ---- */

static void test_abort_before_request(void **unused)
{
    (void)unused;
    struct msg m = {0}, pm = {0};
    pair(&pm, "A", "b");
    begin(&m, 4, FCGI_RESPONDER, 0, 0);
    rec(&m, FCGI_PARAMS, 4, pm.b, pm.len, 0);
    rec(&m, FCGI_ABORT_REQUEST, 4, NULL, 0, 3);
    rec(&m, FCGI_PARAMS, 4, NULL, 0, 0); /* after done: for an inactive id */
    rec(&m, FCGI_STDIN, 4, NULL, 0, 0);
    normal_request(&m, 5, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_ABORT);
    assert_int_equal(ev.id, 4);
    assert_int_equal(ev.reply_len, 0);
    assert_int_equal(fcgi_request_id(&p), 4); /* still live: the caller decides */
    fcgi_request_done(&p);
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    check_normal_request(&p, 5);
    fcgi_parser_free(&p);
    msg_free(&m);
    msg_free(&pm);
}

static void test_abort_after_request(void **unused)
{
    (void)unused;
    struct msg m = {0};
    normal_request(&m, 4, FCGI_KEEP_CONN);
    rec(&m, FCGI_ABORT_REQUEST, 4, NULL, 0, 0);
    rec(&m, FCGI_ABORT_REQUEST, 4, "xyz", 3, 5); /* content is ignored */
    begin(&m, 6, FCGI_RESPONDER, 0, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    fcgi_request_taken(&p);
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_ABORT);
    assert_int_equal(ev.id, 4);
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_ABORT);
    assert_int_equal(ev.id, 4);
    assert_int_equal(fcgi_request_id(&p), 4);
    assert_true(fcgi_keep_conn(&p));
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REPLY); /* still live: CANT_MPX_CONN */
    assert_int_equal(ev.id, 6);
    assert_int_equal(ev.reply[12], FCGI_CANT_MPX_CONN);
    fcgi_parser_free(&p);
    msg_free(&m);
}

/* A parser resumed in another process (a handed-over connection) acts as
 * the one that took the request: an ABORT for its id, a refused BEGIN for
 * another, then, once done, a new request on the kept connection. */
static void test_resumed(void **unused)
{
    (void)unused;
    struct msg m = {0};
    rec(&m, FCGI_ABORT_REQUEST, 4, NULL, 0, 0);
    begin(&m, 6, FCGI_RESPONDER, 0, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    fcgi_parser_resume(&p, 4, true);
    assert_int_equal(fcgi_request_id(&p), 4);
    assert_true(fcgi_keep_conn(&p));
    assert_false(fcgi_parser_mid_record(&p));
    assert_null(fcgi_param(&p, "QUERY_STRING"));
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_ABORT);
    assert_int_equal(ev.id, 4);
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REPLY);
    assert_int_equal(ev.reply[12], FCGI_CANT_MPX_CONN);
    fcgi_request_done(&p);
    msg_free(&m);
    struct msg m2 = {0};
    normal_request(&m2, 9, 0);
    f = feeder_of(&m2);
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_int_equal(fcgi_request_id(&p), 9);
    assert_false(fcgi_keep_conn(&p));
    fcgi_parser_free(&p);
    msg_free(&m2);
}

static void test_abort_other_id_ignored(void **unused)
{
    (void)unused;
    struct msg m = {0};
    rec(&m, FCGI_ABORT_REQUEST, 1, NULL, 0, 0); /* nothing live */
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    rec(&m, FCGI_ABORT_REQUEST, 7, NULL, 0, 0);
    rec(&m, FCGI_ABORT_REQUEST, 0x0101, NULL, 0, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_NONE);
    assert_int_equal(fcgi_request_id(&p), 1);
    fcgi_parser_free(&p);
    msg_free(&m);
}

static void test_inactive_ids_ignored(void **unused)
{
    (void)unused;
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 1};
    struct msg m = {0}, pm = {0};
    /* before any BEGIN */
    rec(&m, FCGI_STDIN, 1, "x", 1, 0);
    rec(&m, FCGI_PARAMS, 1, garbage, sizeof garbage, 0);
    rec(&m, FCGI_PARAMS, 1, NULL, 0, 0);
    rec(&m, FCGI_STDIN, 1, NULL, 0, 0);
    rec(&m, FCGI_DATA, 1, "d", 1, 0);
    /* while 1 is live, another id's records, malformed or complete */
    pair(&pm, "SCRIPT_NAME", "/id/one");
    begin(&m, 1, FCGI_RESPONDER, 0, 0);
    rec(&m, FCGI_PARAMS, 5, garbage, sizeof garbage, 2);
    rec(&m, FCGI_PARAMS, 1, pm.b, pm.len, 0);
    rec(&m, FCGI_PARAMS, 5, NULL, 0, 0);
    rec(&m, FCGI_STDIN, 5, "five", 4, 0);
    rec(&m, FCGI_STDIN, 5, NULL, 0, 0);
    rec(&m, FCGI_PARAMS, 5, NULL, 0, 0);
    rec(&m, FCGI_DATA, 5, "d", 1, 0);
    rec(&m, FCGI_PARAMS, 1, NULL, 0, 0);
    rec(&m, FCGI_STDIN, 5, "five", 4, 0);
    rec(&m, FCGI_STDIN, 1, "one", 3, 0);
    rec(&m, FCGI_STDIN, 1, NULL, 0, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct feeder f = feeder_of(&m);
    struct fcgi_event ev;
    assert_int_equal(next_ev(&p, &f, &ev), FCGI_EV_REQUEST);
    assert_int_equal(ev.id, 1);
    assert_int_equal(f.off, m.len);
    assert_string_equal(fcgi_param(&p, "SCRIPT_NAME"), "/id/one");
    size_t n;
    const uint8_t *in = fcgi_stdin(&p, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(in, "one", 3);
    fcgi_parser_free(&p);
    msg_free(&m);
    msg_free(&pm);
}

static void test_types_applications_send(void **unused)
{
    (void)unused;
    static const uint8_t types[] = {FCGI_END_REQUEST, FCGI_STDOUT, FCGI_STDERR, FCGI_GET_VALUES_RESULT,
                                    FCGI_UNKNOWN_TYPE};
    for (size_t i = 0; i < sizeof types; i++) {
        struct msg m = {0};
        begin(&m, 1, FCGI_RESPONDER, 0, 0);
        rec(&m, types[i], 1, NULL, 0, 0);
        expect_error(&m, "only applications send");
        msg_free(&m);
        rec(&m, types[i], 2, "abc", 3, 0); /* for an inactive id too */
        expect_error(&m, "only applications send");
        msg_free(&m);
    }
    struct msg m = {0};
    rec(&m, FCGI_GET_VALUES, 1, NULL, 0, 0);
    expect_error(&m, "GET_VALUES record with a request id");
    msg_free(&m);
    static const uint8_t undefined[] = {0, 12, 200, 255};
    for (size_t i = 0; i < sizeof undefined; i++) {
        rec(&m, undefined[i], 1, "abc", 3, 0);
        expect_error(&m, "does not define");
        msg_free(&m);
    }
}

static void test_errors_are_sticky(void **unused)
{
    (void)unused;
    struct msg bad = {0}, good = {0};
    rec_version(&bad, 0, FCGI_BEGIN_REQUEST, 1, "12345678", 8, 0);
    normal_request(&good, 1, 0);
    struct fcgi_parser p;
    fcgi_parser_init(&p);
    struct fcgi_event ev;
    size_t used = 0;
    /* the first error takes all of the input, not just its record */
    put(&bad, good.b, good.len);
    assert_int_equal(fcgi_feed(&p, bad.b, bad.len, &used, &ev), FCGI_EV_ERROR);
    assert_int_equal(used, bad.len);
    const char *why = ev.why;
    assert_non_null(why);
    for (size_t chunk = 1; chunk < good.len; chunk += 97) {
        used = 0;
        assert_int_equal(fcgi_feed(&p, good.b, chunk, &used, &ev), FCGI_EV_ERROR);
        assert_int_equal(used, chunk);
        assert_ptr_equal(ev.why, why);
        assert_int_equal(ev.reply_len, 0);
    }
    fcgi_request_done(&p); /* does not clear the error */
    assert_int_equal(fcgi_feed(&p, good.b, good.len, &used, &ev), FCGI_EV_ERROR);
    assert_int_equal(fcgi_request_id(&p), 0);
    fcgi_parser_free(&p);
    msg_free(&bad);
    msg_free(&good);
}

/* ---- answers ---- */

/* Parse an answer back and check it is exactly: data in STDOUT records of
 * 65535 bytes but the last, each padded to 8 with zeros, the empty STDOUT,
 * END_REQUEST(0, FCGI_REQUEST_COMPLETE). */
static void check_answer_split(const uint8_t *out, size_t n, uint16_t id, const uint8_t *data, size_t len,
                               bool parts);

static void check_answer(const uint8_t *out, size_t n, uint16_t id, const uint8_t *data, size_t len)
{
    check_answer_split(out, n, id, data, len, false);
}

/* The same, and with `parts` a data record may be short before another
 * (an answer sent in parts). */
static void check_answer_split(const uint8_t *out, size_t n, uint16_t id, const uint8_t *data, size_t len,
                               bool parts)
{
    size_t r = 0, got = 0;
    for (;;) {
        assert_true(n - r >= 8);
        const uint8_t *h = out + r;
        assert_int_equal(h[0], FCGI_VERSION_1);
        assert_int_equal(h[1], FCGI_STDOUT);
        assert_int_equal(h[2] << 8 | h[3], id);
        size_t clen = (size_t)h[4] << 8 | h[5], pad = h[6];
        assert_int_equal(h[7], 0);
        assert_int_equal((clen + pad) % 8, 0);
        assert_true(pad < 8);
        assert_true(n - r - 8 >= clen + pad);
        if (clen == 0) {
            assert_int_equal(pad, 0);
            r += 8;
            break;
        }
        /* all records but the last data record are full */
        if (parts)
            assert_true(clen <= len - got);
        else
            assert_int_equal(clen, len - got < 65535 ? len - got : 65535);
        assert_memory_equal(out + r + 8, data + got, clen);
        for (size_t i = 0; i < pad; i++)
            assert_int_equal(out[r + 8 + clen + i], 0);
        got += clen;
        r += 8 + clen + pad;
    }
    assert_int_equal(got, len);
    const uint8_t end[16] = {1, FCGI_END_REQUEST, (uint8_t)(id >> 8), (uint8_t)id, 0, 8, 0, 0,
                             0, 0, 0, 0, FCGI_REQUEST_COMPLETE, 0, 0, 0};
    assert_int_equal(n - r, 16);
    assert_memory_equal(out + r, end, 16);
}

static void test_encode_answer(void **unused)
{
    (void)unused;
    static const size_t lens[] = {0, 1, 7, 8, 9, 65535, 65536, 200000};
    static const size_t sizes[] = {24, 40, 40, 40, 48, 65568, 65584, 200000 + 4 * 8 + 3 * 1 + 5 + 24};
    uint8_t *data = malloc(200000);
    assert_non_null(data);
    for (size_t i = 0; i < 200000; i++)
        data[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        size_t need = fcgi_answer_size(lens[i]);
        assert_int_equal(need, sizes[i]);
        uint8_t *out = malloc(need + 1);
        assert_non_null(out);
        memset(out, 0x55, need + 1);
        assert_int_equal(fcgi_encode_answer(out, need - 1, 0x0203, data, lens[i]), 0);
        assert_int_equal(out[0], 0x55); /* nothing written */
        assert_int_equal(fcgi_encode_answer(out, need + 1, 0x0203, data, lens[i]), need);
        assert_int_equal(out[need], 0x55);
        check_answer(out, need, 0x0203, data, lens[i]);
        free(out);
    }
    uint8_t out[24];
    assert_int_equal(fcgi_encode_answer(out, sizeof out, 1, NULL, 0), 24);
    check_answer(out, 24, 1, NULL, 0);
    assert_int_equal(fcgi_encode_answer(out, 0, 1, NULL, 0), 0);
    free(data);
}

/* A streamed answer: parts of STDOUT records, then the last part with the
 * end; concatenated, the data are the whole answer and exactly one empty
 * STDOUT record and one END_REQUEST close it (check_answer). */
static void test_encode_stdout_parts(void **unused)
{
    (void)unused;
    static const size_t lens[] = {1, 7, 8, 9, 65535, 65536, 200000};
    static const size_t sizes[] = {16, 16, 16, 24, 65544, 65560, 200000 + 4 * 8 + 3 * 1 + 5};
    uint8_t *data = malloc(200000);
    assert_non_null(data);
    for (size_t i = 0; i < 200000; i++)
        data[i] = (uint8_t)(i * 5 + 3);
    assert_int_equal(fcgi_stdout_size(0), 0);
    uint8_t none[8];
    assert_int_equal(fcgi_encode_stdout(none, sizeof none, 1, NULL, 0), 0); /* never an empty record */
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        size_t part = fcgi_stdout_size(lens[i]);
        assert_int_equal(part, sizes[i]);
        size_t half = lens[i] / 2, need = fcgi_stdout_size(lens[i] - half) + fcgi_answer_size(half);
        uint8_t *out = malloc(need + 1);
        assert_non_null(out);
        memset(out, 0x55, need + 1);
        assert_int_equal(fcgi_encode_stdout(out, part - 1, 9, data, lens[i]), 0);
        assert_int_equal(out[0], 0x55);
        size_t a = fcgi_encode_stdout(out, need, 9, data, lens[i] - half);
        assert_int_equal(a, fcgi_stdout_size(lens[i] - half));
        size_t b = fcgi_encode_answer(out + a, need - a, 9, data + lens[i] - half, half);
        assert_int_equal(a + b, need);
        assert_int_equal(out[need], 0x55);
        check_answer_split(out, need, 9, data, lens[i], true);
        free(out);
    }
    assert_int_equal(fcgi_stdout_size(SIZE_MAX), SIZE_MAX);
    free(data);
}

static void test_answer_size_saturates(void **unused)
{
    (void)unused;
    assert_int_equal(fcgi_answer_size(SIZE_MAX), SIZE_MAX);
    assert_int_equal(fcgi_answer_size(SIZE_MAX - 100), SIZE_MAX);
    /* the most full records that fit, and one more */
    size_t full = (SIZE_MAX - 24) / 65544;
    assert_int_equal(fcgi_answer_size(full * 65535), full * 65544 + 24);
    assert_int_equal(fcgi_answer_size((full + 1) * 65535), SIZE_MAX);
    uint8_t out[64];
    assert_int_equal(fcgi_encode_answer(out, SIZE_MAX, 1, out, SIZE_MAX), 0);
}

static void test_encode_end(void **unused)
{
    (void)unused;
    uint8_t out[17];
    memset(out, 0x55, sizeof out);
    assert_int_equal(fcgi_encode_end(out, 15, 7, 0, FCGI_REQUEST_COMPLETE), 0);
    assert_int_equal(out[0], 0x55);
    assert_int_equal(fcgi_encode_end(out, sizeof out, 0xfffe, 0x01020304, FCGI_OVERLOADED), 16);
    const uint8_t want[17] = {1, FCGI_END_REQUEST, 0xff, 0xfe, 0, 8, 0, 0, 1, 2, 3, 4, FCGI_OVERLOADED, 0, 0, 0, 0x55};
    assert_memory_equal(out, want, 17);
}

int main(void)
{
    fill_longs();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_whole),
        cmocka_unit_test(test_request_byte_at_a_time),
        cmocka_unit_test(test_request_every_split),
        cmocka_unit_test(test_keep_conn),
        cmocka_unit_test(test_requests_in_a_row),
        cmocka_unit_test(test_mid_record),
        cmocka_unit_test(test_get_values_all),
        cmocka_unit_test(test_get_values_some),
        cmocka_unit_test(test_get_values_empty),
        cmocka_unit_test(test_get_values_malformed),
        cmocka_unit_test(test_unknown_management_type),
        cmocka_unit_test(test_bad_version),
        cmocka_unit_test(test_begin_wrong_length),
        cmocka_unit_test(test_role_not_responder),
        cmocka_unit_test(test_second_begin_same_id),
        cmocka_unit_test(test_begin_other_id_while_live),
        cmocka_unit_test(test_stdin_before_params_end),
        cmocka_unit_test(test_params_after_end),
        cmocka_unit_test(test_stdin_after_end),
        cmocka_unit_test(test_pairs_past_the_block),
        cmocka_unit_test(test_pairs_huge_lengths),
        cmocka_unit_test(test_params_last_wins),
        cmocka_unit_test(test_params_index),
        cmocka_unit_test(test_params_with_nul),
        cmocka_unit_test(test_params_at_the_cap),
        cmocka_unit_test(test_params_over_the_cap),
        cmocka_unit_test(test_stdin_over_the_keep),
        cmocka_unit_test(test_abort_before_request),
        cmocka_unit_test(test_abort_after_request),
        cmocka_unit_test(test_resumed),
        cmocka_unit_test(test_abort_other_id_ignored),
        cmocka_unit_test(test_inactive_ids_ignored),
        cmocka_unit_test(test_types_applications_send),
        cmocka_unit_test(test_errors_are_sticky),
        cmocka_unit_test(test_encode_answer),
        cmocka_unit_test(test_encode_stdout_parts),
        cmocka_unit_test(test_answer_size_saturates),
        cmocka_unit_test(test_encode_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
