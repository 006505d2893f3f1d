/* request.c - the pure parts of answering a request: reading the query
 * string and Accept header, and turning what the state knows into an
 * answer. No I/O; see request.h. */
#include "request.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "util.h"

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The byte at q[*i] of a query component, '+' and %XX decoded; *i moves
 * past it. A broken escape stays as it is. end: the component's end. */
static int decode_at(const char *q, size_t *i, size_t end)
{
    int c = (unsigned char)q[*i];
    if (c == '+') {
        c = ' ';
    } else if (c == '%' && *i + 2 < end && hexval((unsigned char)q[*i + 1]) >= 0 &&
               hexval((unsigned char)q[*i + 2]) >= 0) {
        c = hexval((unsigned char)q[*i + 1]) * 16 + hexval((unsigned char)q[*i + 2]);
        *i += 2;
    }
    (*i)++;
    return c;
}

bool request_query_param(const char *q, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    if (q == NULL || cap == 0)
        return false;
    while (*q) {
        size_t len = strcspn(q, "&"); /* '&' only: ';' belongs to the value */
        size_t eq = strcspn(q, "&=");
        /* the name, decoded as the value is (WHATWG): "%69d" is "id" */
        size_t i = 0, k = 0;
        bool match = true;
        while (i < eq && match) {
            int c = decode_at(q, &i, eq);
            match = k < nl && c == (unsigned char)name[k];
            k++;
        }
        if (match && k == nl) {
            size_t n = 0;
            for (i = eq + 1; i < len;) {
                int c = decode_at(q, &i, len);
                if (c == 0 || n + 1 >= cap)
                    return false; /* %00 cannot be part of a string */
                out[n++] = (char)c;
            }
            out[n] = '\0'; /* "id" without '=' is an empty value */
            return true;
        }
        q += len;
        if (*q)
            q++;
    }
    return false;
}

/* ---- Accept ---- */

static bool is_tchar(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static size_t skip_ows(const char *s, size_t i)
{
    while (s[i] == ' ' || s[i] == '\t')
        i++;
    return i;
}

static size_t token_end(const char *s, size_t i)
{
    while (is_tchar((unsigned char)s[i]))
        i++;
    return i;
}

/* A qvalue (RFC 9110 12.4.2): "0" ["." 0-3 digits] or "1" ["." 0-3 zeros],
 * in thousandths; -1 when malformed. */
static int parse_qvalue(const char *s, size_t n)
{
    if (n == 0 || (s[0] != '0' && s[0] != '1'))
        return -1;
    int q = (s[0] - '0') * 1000;
    if (n == 1)
        return q;
    if (s[1] != '.' || n > 5)
        return -1;
    int scale = 100;
    for (size_t i = 2; i < n; i++, scale /= 10) {
        if (s[i] < '0' || s[i] > '9' || (q == 1000 && s[i] != '0'))
            return -1;
        q += (s[i] - '0') * scale;
    }
    return q;
}

/* One media range of an Accept header starting at s[*i]: type and
 * subtype (offsets into s) and its weight in thousandths. *i moves to the
 * comma that ends it (or the end). False when the range is malformed: a
 * bad token, a missing '/', "* /x", junk, or a malformed q. */
static bool parse_range(const char *s, size_t *i, size_t *t0, size_t *tn, size_t *s0, size_t *sn, int *q)
{
    size_t p = skip_ows(s, *i);
    bool ok = true;
    *q = 1000;
    *t0 = p;
    p = token_end(s, p);
    *tn = p - *t0;
    if (*tn == 0 || s[p] != '/')
        ok = false;
    else {
        *s0 = ++p;
        p = token_end(s, p);
        *sn = p - *s0;
        if (*sn == 0 || (*tn == 1 && s[*t0] == '*' && !(*sn == 1 && s[*s0] == '*')))
            ok = false;
    }
    bool weighted = false;
    while (ok) {
        p = skip_ows(s, p);
        if (s[p] != ';')
            break;
        p = skip_ows(s, p + 1);
        size_t k0 = p;
        p = token_end(s, p);
        size_t kn = p - k0;
        if (kn == 0 || s[p] != '=') {
            ok = false;
            break;
        }
        size_t v0 = ++p;
        bool quoted = s[p] == '"';
        if (quoted) {
            for (p++; s[p] && s[p] != '"'; p++)
                if (s[p] == '\\' && s[p + 1])
                    p++;
            if (s[p] != '"') {
                ok = false;
                break;
            }
            p++;
        } else {
            p = token_end(s, p);
            if (p == v0) {
                ok = false;
                break;
            }
        }
        if (!weighted && kn == 1 && (s[k0] == 'q' || s[k0] == 'Q')) {
            weighted = true; /* later parameters are accept-ext: ignored */
            *q = quoted ? -1 : parse_qvalue(s + v0, p - v0);
            if (*q < 0)
                ok = false;
        }
    }
    if (ok) {
        p = skip_ows(s, p);
        ok = s[p] == ',' || s[p] == '\0';
    }
    /* to the comma that ends this range, quoted strings skipped */
    bool in_quote = false;
    for (; s[p] && (in_quote || s[p] != ','); p++) {
        if (in_quote && s[p] == '\\' && s[p + 1])
            p++;
        else if (s[p] == '"')
            in_quote = !in_quote;
    }
    *i = p;
    return ok;
}

static bool same_ci(const char *s, size_t n, const char *word)
{
    return strlen(word) == n && strncasecmp(s, word, n) == 0;
}

bool request_wants_json(const char *accept)
{
    if (accept == NULL)
        return false;
    int json_q = -1;            /* the highest q given for application/json itself */
    int html_q[3] = {-1, -1, -1}; /* text/html, text/ *, * / *: the most specific counts */
    size_t i = 0;
    while (accept[i] != '\0') {
        size_t t0, tn, s0 = 0, sn = 0;
        int q;
        if (parse_range(accept, &i, &t0, &tn, &s0, &sn, &q)) {
            const char *t = accept + t0, *st = accept + s0;
            if (same_ci(t, tn, "application") && same_ci(st, sn, "json"))
                json_q = q > json_q ? q : json_q;
            int level = same_ci(t, tn, "text") && same_ci(st, sn, "html") ? 0
                      : same_ci(t, tn, "text") && same_ci(st, sn, "*")    ? 1
                      : same_ci(t, tn, "*") && same_ci(st, sn, "*")       ? 2
                                                                            : -1;
            if (level >= 0 && q > html_q[level])
                html_q[level] = q;
        }
        if (accept[i] == ',')
            i++;
    }
    int html = html_q[0] >= 0 ? html_q[0] : html_q[1] >= 0 ? html_q[1] : html_q[2] >= 0 ? html_q[2] : 0;
    return json_q > 0 && json_q >= html;
}

/* ---- answers ---- */

static enum word word_of_status(enum tx_status s)
{
    switch (s) {
    case TXS_SUCCEEDED: return W_SUCCEEDED;
    case TXS_FAILED: return W_FAILED;
    case TXS_CANCELED: return W_CANCELED;
    case TXS_EXPIRED: return W_EXPIRED;
    default: return W_CHECKING;
    }
}

static long seconds_until(int64_t t, int64_t now)
{
    int64_t ms = t - now;
    long s = ms <= 0 ? 1 : (long)((ms + 999) / 1000);
    return s < 1 ? 1 : s;
}

void request_answer(const struct state_fact *f, int64_t now, struct answer *out)
{
    out->json_status = f->status == TXS_NONE ? "unknown" : f->status_word;
    out->final = false;
    out->retry_after_s = -1;
    if (f->final) {
        out->word = word_of_status(f->status);
        out->final = true;
    } else if (f->not_found) {
        out->word = W_NOT_FOUND;
        out->json_status = "unknown";
        out->retry_after_s = seconds_until(f->known_until, now);
    } else {
        out->word = W_CHECKING;
        /* when the pace allows the next read; a read in flight does not
         * change that (its lease only bounds how long it may take) */
        out->retry_after_s = seconds_until(f->next_read, now);
    }
}


/* ---- told by the shop ---- */

bool request_notify_status(const char *body, size_t len, enum tx_status *out, char *why, size_t whylen)
{
    if (body == NULL || len == 0) {
        snprintf(why, whylen, "the body is empty: send {\"status\": \"succeeded\"} (or another Kasera status)");
        return false;
    }
    if (len > REQUEST_NOTIFY_BODY_MAX) {
        snprintf(why, whylen, "the body is larger than %d bytes", REQUEST_NOTIFY_BODY_MAX);
        return false;
    }
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (root == NULL) {
        snprintf(why, whylen, "the body is not JSON (line %d: %s)", jerr.line, jerr.text);
        return false;
    }
    bool ok = false;
    json_t *st = json_is_object(root) ? json_object_get(root, "status") : NULL;
    if (!json_is_object(root)) {
        snprintf(why, whylen, "the body must be a JSON object such as {\"status\": \"succeeded\"}");
    } else if (st == NULL) {
        snprintf(why, whylen, "the body has no \"status\"");
    } else if (!json_is_string(st)) {
        snprintf(why, whylen, "\"status\" must be a string");
    } else if ((*out = tx_status_parse(json_string_value(st))) == TXS_UNKNOWN) {
        snprintf(why, whylen, "\"status\" must be one of pending, succeeded, failed, canceled, expired");
    } else {
        ok = true;
    }
    json_decref(root);
    return ok;
}
