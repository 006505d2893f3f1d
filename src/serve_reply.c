/* serve_reply.c - the answers of the serve module: headers, bodies,
 * their log lines (serve_private.h). */
#include "serve_private.h"

static const char csp[] =
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

static const char *http_reason(int code)
{
    switch (code) {
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 503: return "Service Unavailable";
    default: return "OK";
    }
}

/* The decimal n (no printf on the hot path). DYNBUF_OK or out's failure. */
static enum dynbuf_rc put_num(struct dynbuf *out, unsigned long long n)
{
    char d[24];
    size_t i = sizeof d;
    do
        d[--i] = (char)('0' + n % 10);
    while ((n /= 10) > 0 && i > 0);
    return dynbuf_add(out, d + i, sizeof d - i);
}

/* A header line: name, the decimal n, CRLF. DYNBUF_OK or out's failure. */
static enum dynbuf_rc put_num_line(struct dynbuf *out, const char *name, unsigned long long n)
{
    if (dynbuf_adds(out, name) != DYNBUF_OK || put_num(out, n) != DYNBUF_OK)
        return dynbuf_error(out);
    return dynbuf_add(out, "\r\n", 2);
}

/* The headers every answer carries (without Content-Length and the blank
 * line). DYNBUF_OK, or out's failure: then out holds nothing (a failed
 * buffer stays failed, so the writes below need no check between them; the
 * last one's result is the whole header's). */
enum dynbuf_rc serve_put_headers(const struct serve_req *r, int http, const char *word, const char *ctype,
                                  long retry_after, const char *extra, struct dynbuf *out)
{
    enum dynbuf_rc rc = dynbuf_adds(out, "Status: ");
    rc = put_num(out, (unsigned)http);
    rc = dynbuf_adds(out, " ");
    rc = dynbuf_adds(out, http_reason(http));
    rc = dynbuf_adds(out, "\r\nContent-Type: ");
    rc = dynbuf_adds(out, ctype);
    if (word != NULL) {
        rc = dynbuf_adds(out, "\r\nKembali-Status: ");
        rc = dynbuf_adds(out, word);
    }
    rc = dynbuf_adds(out, "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                          "Referrer-Policy: no-referrer\r\nX-Frame-Options: DENY\r\nContent-Security-Policy: ");
    rc = dynbuf_adds(out, csp);
    rc = dynbuf_adds(out, "\r\n");
    if (retry_after >= 0)
        rc = put_num_line(out, "Retry-After: ", (unsigned long long)retry_after);
    if (r->origin != NULL) {
        rc = dynbuf_adds(out, "Access-Control-Allow-Origin: ");
        rc = dynbuf_adds(out, r->origin);
        rc = dynbuf_adds(out, "\r\nVary: Origin\r\nAccess-Control-Expose-Headers: Kembali-Status, Retry-After\r\n");
    }
    if (extra != NULL)
        rc = dynbuf_adds(out, extra);
    return rc != DYNBUF_OK ? rc : dynbuf_error(out);
}

/* The headers every answer carries, then the body; one buffer. DYNBUF_OK,
 * or out's failure: then out holds nothing (as serve_put_headers()). */
enum dynbuf_rc serve_build_response(const struct serve_req *r, int http, const char *word, const char *ctype,
                                     long retry_after, const char *extra, const struct dynbuf *body,
                                     struct dynbuf *out)
{
    dynbuf_expect(out, dynbuf_len(out) + SERVE_HEADERS_EXPECT + (r->head ? 0 : dynbuf_len(body)));
    enum dynbuf_rc rc = serve_put_headers(r, http, word, ctype, retry_after, extra, out);
    if (http != 204) /* a 204 has no body and no Content-Length */
        rc = put_num_line(out, "Content-Length: ", dynbuf_len(body));
    rc = dynbuf_adds(out, "\r\n");
    if (!r->head)
        rc = dynbuf_add(out, dynbuf_ptr(body), dynbuf_len(body));
    return rc != DYNBUF_OK ? rc : dynbuf_error(out);
}

/* One line per request, written before its answer goes out (so that
 * whoever has the answer finds the line). */
void serve_log_request(const struct serve_req *r, int http, const char *word)
{
    /* both clocks read back to back, so that ts minus ms is the arrival */
    long long ms = (long long)(util_mono_ms() - r->arrived);
    struct log_line l;
    log_begin(&l, LOG_LV_INFO, "request");
    log_str(&l, "shop", r->shop ? r->shop->id : NULL);
    log_str(&l, "id", r->id[0] ? r->id : NULL);
    log_str(&l, "format", r->json ? "json" : "html");
    log_str(&l, "word", word);
    if (http != 0)
        log_int(&l, "http", http);
    log_int(&l, "ms", ms);
    if (r->held)
        log_str(&l, "held", "yes");
    if (r->sc.painted != 0)
        log_int(&l, "streamed_ms", (long long)(r->sc.painted - r->arrived)); /* when its top went out */
    if (word == NULL)
        log_str(&l, "gone", "yes"); /* the client left before its answer */
    log_end(&l);
}

/* The one line saying that building r's answer (or a part of it, `part`:
 * NULL for a whole answer) failed with rc. */
void serve_log_answer_failed(const struct serve_req *r, const char *part, enum dynbuf_rc rc)
{
    struct log_line l;
    log_begin(&l, LOG_LV_ERROR, "answer_failed");
    log_str(&l, "shop", r->shop ? r->shop->id : NULL);
    log_str(&l, "id", r->id[0] ? r->id : NULL);
    log_str(&l, "part", part);
    log_str(&l, "reason", dynbuf_strerror(rc));
    log_end(&l);
}

/* Send `out` as r's answer; when building it failed (rc), a 503 instead
 * and one log line saying why (what was to be sent is not sent in part). */
void serve_send_out(struct serve_req *r, const struct dynbuf *out, enum dynbuf_rc rc)
{
    if (rc != DYNBUF_OK) {
        static const char fail[] = "Status: 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                                   "Cache-Control: no-store\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n";
        serve_log_answer_failed(r, NULL, rc);
        front_reply(r->s->front, r->fr, fail, sizeof fail - 1);
    } else {
        front_reply(r->s->front, r->fr, dynbuf_ptr(out), dynbuf_len(out));
    }
    r->fr = NULL;
}

/* The values r's page shows (retry: room for its "check again" URL). */
void serve_page_vars_of(const struct serve_req *r, char *retry, size_t cap, struct page_vars *v)
{
    render_retry_url(retry, cap, r->shop ? r->shop->id_param : "id", r->id);
    *v = (struct page_vars){
        .id = r->id,
        .shop_name = r->shop ? r->shop->name : "",
        .shop_url = r->shop ? r->shop->shop_url : "",
        .retry_url = retry,
    };
}

/* Render and send `ans` with HTTP status `http` and optional extra header
 * lines; count and log it. */
void serve_respond(struct serve_req *r, const struct answer *ans, int http, const char *extra)
{
    struct app *a = r->s->app;
    struct dynbuf body, out;
    dynbuf_init(&body, SERVE_ANSWER_MAX);
    dynbuf_init(&out, SERVE_ANSWER_MAX);
    const char *word = word_name(ans->word);
    enum dynbuf_rc rc;
    if (r->json) {
        rc = render_json(r->id, ans->json_status ? ans->json_status : "unknown", ans->final, &body);
        if (rc == DYNBUF_OK)
            rc = serve_build_response(r, http, word, "application/json", ans->final ? -1 : ans->retry_after_s, extra,
                                &body, &out);
    } else {
        const struct templates *t = r->shop ? r->shop->tpl : r->cfg->default_tpl;
        char retry[STATE_ID_MAX + 40];
        struct page_vars v;
        serve_page_vars_of(r, retry, sizeof retry, &v);
        dynbuf_expect(&body, SERVE_PAGE_EXPECT);
        rc = render_html(t, ans->word, &v, &body);
        if (rc == DYNBUF_OK)
            rc = serve_build_response(r, http, word, "text/html; charset=utf-8", -1, extra, &body, &out);
    }
    dynbuf_free(&body);
    atomic_fetch_add(&a->m.requests[ans->word], 1);
    if (r->json)
        atomic_fetch_add(&a->m.json_answers, 1);
    serve_log_request(r, http, word);
    serve_send_out(r, &out, rc);
    dynbuf_free(&out);
}

void serve_respond_word(struct serve_req *r, const struct answer *ans)
{
    serve_respond(r, ans, word_http(ans->word), NULL);
}

/* Other methods: 405 with the invalid page (no word of its own). */
void serve_respond_405(struct serve_req *r)
{
    struct answer ans = {.word = W_INVALID, .json_status = "unknown", .retry_after_s = -1};
    atomic_fetch_add(&r->s->app->m.method_not_allowed, 1);
    serve_respond(r, &ans, 405, "Allow: GET, HEAD\r\n");
}
