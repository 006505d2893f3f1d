/* request.c - the pure parts of answering a request: reading the query
 * string and Accept header, and turning what the state knows into an
 * answer. No I/O; see request.h. */
#include "request.h"

#include <ctype.h>
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

