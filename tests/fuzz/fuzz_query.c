/* fuzz_query.c - the query string and the transaction id.
 *
 * Input: 1 byte choosing the output capacity, then the query string (as the
 * web server passes QUERY_STRING: cut at a NUL byte), then after a NUL an
 * id_param name. request_query_param() is asked for several names into a
 * buffer of exactly that capacity (ASan sees any byte written past it), and
 * what it returns goes through config_valid_id(), checked against the
 * interface's rule: 1 to 64 characters of A-Z a-z 0-9 _ -. */
#include <stdbool.h>

#include "config.h"
#include "fuzz.h"
#include "request.h"

static const size_t caps[] = {1, 2, 3, 8, STATE_ID_MAX, STATE_ID_MAX + 1, STATE_ID_MAX + 2, 128, 4096};

static bool valid_id_reference(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static void ask(const char *q, const char *name, size_t cap)
{
    char *out = malloc(cap);
    FUZZ_CHECK(out != NULL);
    memset(out, 'Z', cap);
    if (request_query_param(q, name, out, cap)) {
        size_t n = strnlen(out, cap);
        FUZZ_CHECK(n < cap); /* NUL-terminated within cap */
        /* nothing decoded appears from nowhere: without escapes the value is
         * a piece of the query */
        if (strpbrk(q, "%+") == NULL)
            FUZZ_CHECK(strstr(q, out) != NULL);
        FUZZ_CHECK(config_valid_id(out) == valid_id_reference(out));
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct fuzz_in in = {data + 1, size - 1};
    size_t cap = caps[data[0] % (sizeof caps / sizeof caps[0])];
    char *q = fuzz_field(&in, 0, NULL);
    char *name = fuzz_field(&in, 0, NULL);

    static const char *const names[] = {"id", "format", "status", "i", ""};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        ask(q, names[i], cap);
    if (name[0] != '\0')
        ask(q, name, cap);
    FUZZ_CHECK(!request_query_param(NULL, "id", q, 1));
    FUZZ_CHECK(config_valid_id(q) == valid_id_reference(q));
    FUZZ_CHECK(!config_valid_id(NULL));

    free(q);
    free(name);
    return 0;
}
