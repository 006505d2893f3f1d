/* request.c - the pure parts of answering a request: reading the query
 * string and Accept header, and turning what the state knows into an
 * answer. No I/O; see request.h. */
#include "request.h"

#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

bool request_query_param(const char *q, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    if (q == NULL || cap == 0)
        return false;
    while (*q) {
        size_t len = strcspn(q, "&;");
        if (len > nl && strncmp(q, name, nl) == 0 && q[nl] == '=') {
            size_t n = 0;
            for (size_t i = nl + 1; i < len; i++) {
                int c = (unsigned char)q[i];
                if (c == '+') {
                    c = ' ';
                } else if (c == '%' && i + 2 < len && hexval((unsigned char)q[i + 1]) >= 0 &&
                           hexval((unsigned char)q[i + 2]) >= 0) {
                    c = hexval((unsigned char)q[i + 1]) * 16 + hexval((unsigned char)q[i + 2]);
                    i += 2;
                }
                if (c == 0 || n + 1 >= cap)
                    return false; /* %00 cannot be part of a string */
                out[n++] = (char)c;
            }
            out[n] = '\0';
            return true;
        }
        if (len == nl && strncmp(q, name, nl) == 0) { /* "id" without '=' */
            out[0] = '\0';
            return true;
        }
        q += len;
        if (*q)
            q++;
    }
    return false;
}

bool request_wants_json(const char *accept)
{
    return accept != NULL && util_contains_ci(accept, strlen(accept), "application/json");
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
