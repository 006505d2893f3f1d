/* fuzz_accept.c - the Accept header (request_wants_json).
 *
 * Input: the header's value as the web server passes HTTP_ACCEPT (cut at a
 * NUL byte). Checked: no memory or undefined-behaviour error, the same
 * answer twice (no hidden state), and a header that never names a JSON
 * type is not JSON. */
#include <ctype.h>
#include <stdbool.h>
#include <strings.h>

#include "fuzz.h"
#include "request.h"

static bool mentions_json(const char *s)
{
    for (; *s; s++)
        if (strncasecmp(s, "json", 4) == 0)
            return true;
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *a = malloc(size + 1);
    FUZZ_CHECK(a != NULL);
    memcpy(a, data, size);
    a[size] = '\0';
    bool j = request_wants_json(a);
    FUZZ_CHECK(j == request_wants_json(a));
    if (!mentions_json(a))
        FUZZ_CHECK(!j);
    free(a);
    FUZZ_CHECK(!request_wants_json(NULL));
    return 0;
}
