/* fuzz_notify.c - the body of a notify POST (request_notify_status).
 *
 * Input: the body, exactly as the web server's STDIN carries it (any bytes,
 * not NUL-terminated: the copy has no terminator, so ASan sees a read past
 * it). Checked: true only with one of Kasera's five words, which the body
 * names; false with a reason that is NUL-terminated within a small buffer. */
#include <stdbool.h>

#include "fuzz.h"
#include "request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *body = malloc(size ? size : 1);
    FUZZ_CHECK(body != NULL);
    if (size)
        memcpy(body, data, size);
    static const size_t whys[] = {1, 17, 200};
    for (size_t i = 0; i < sizeof whys / sizeof whys[0]; i++) {
        char why[200];
        memset(why, 'W', sizeof why);
        enum tx_status st = TXS_NONE;
        bool ok = request_notify_status(body, size, &st, why, whys[i]);
        if (ok) {
            FUZZ_CHECK(st >= TXS_PENDING && st <= TXS_EXPIRED);
            FUZZ_CHECK(size <= REQUEST_NOTIFY_BODY_MAX);
            FUZZ_CHECK(memmem(body, size, tx_status_word(st), strlen(tx_status_word(st))) != NULL ||
                       memchr(body, '\\', size) != NULL); /* or spelt with escapes */
        } else {
            FUZZ_CHECK(strnlen(why, whys[i]) < whys[i]);
            if (whys[i] > 1)
                FUZZ_CHECK(why[0] != '\0');
        }
    }
    free(body);
    return 0;
}
