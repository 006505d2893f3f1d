/* fuzz_notify.c - the body of a notify POST (request_notify_status) and its
 * signature (notify_sig_check).
 *
 * Input: the body, exactly as the web server's STDIN carries it (any bytes,
 * not NUL-terminated: the copy has no terminator, so ASan sees a read past
 * it). When the input holds a NUL byte, what comes before the first one is
 * a Kembali-Signature header and the rest is the body. Checked: the body is
 * accepted only with one of Kasera's five words, which it names; refused
 * with a reason that is NUL-terminated within a small buffer. The header:
 * any bytes give one of the answers with a reason; OK only when it carries
 * the right HMAC; a header made right for the body (the signing rule) is OK
 * at its own time and at the window's edge, stale one second past it, and
 * wrong under another secret. */
#include <stdbool.h>

#include "fuzz.h"
#include "notify_sig.h"
#include "request.h"

#define SECRET "whsec-fuzz"
#define NOW 1764000000LL

static void check_header(const char *header, const char *body, size_t size)
{
    static const size_t whys[] = {1, 17, 200};
    for (size_t i = 0; i < sizeof whys / sizeof whys[0]; i++) {
        char why[200];
        memset(why, 'W', sizeof why);
        enum notify_sig r = notify_sig_check(header, SECRET, "T1", body, size, NOW, why, whys[i]);
        FUZZ_CHECK(r >= NOTIFY_SIG_OK && r <= NOTIFY_SIG_ERROR);
        if (r != NOTIFY_SIG_OK) {
            FUZZ_CHECK(strnlen(why, whys[i]) < whys[i]);
            if (whys[i] > 1)
                FUZZ_CHECK(why[0] != '\0');
            continue;
        }
        const char *t = strstr(header, "t=");
        FUZZ_CHECK(t != NULL);
        char hex[65];
        size_t tl = strspn(t + 2, "0123456789");
        FUZZ_CHECK(notify_sig_hmac(SECRET, t + 2, tl, "T1", body, size, hex) == 0);
        FUZZ_CHECK(strstr(header, hex) != NULL);
    }
}

static void check_signed(const char *body, size_t size)
{
    char hex[65], header[128], why[200];
    FUZZ_CHECK(notify_sig_hmac(SECRET, "1764000000", 10, "T1", body, size, hex) == 0);
    snprintf(header, sizeof header, "t=1764000000,v1=%s", hex);
    FUZZ_CHECK(notify_sig_check(header, SECRET, "T1", body, size, NOW, why, sizeof why) == NOTIFY_SIG_OK);
    FUZZ_CHECK(notify_sig_check(header, SECRET, "T1", body, size, NOW + NOTIFY_SIG_WINDOW_S, why, sizeof why) ==
               NOTIFY_SIG_OK);
    FUZZ_CHECK(notify_sig_check(header, SECRET, "T1", body, size, NOW + NOTIFY_SIG_WINDOW_S + 1, why, sizeof why) ==
               NOTIFY_SIG_STALE);
    FUZZ_CHECK(notify_sig_check(header, "whsec-other", "T1", body, size, NOW, why, sizeof why) == NOTIFY_SIG_WRONG);
    FUZZ_CHECK(notify_sig_check(header, SECRET, "T2", body, size, NOW, why, sizeof why) == NOTIFY_SIG_WRONG);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    char *header = NULL;
    if (nul != NULL) { /* header NUL body */
        size_t hl = (size_t)(nul - data);
        header = malloc(hl + 1);
        FUZZ_CHECK(header != NULL);
        memcpy(header, data, hl);
        header[hl] = '\0';
        data = nul + 1;
        size -= hl + 1;
    }
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
    if (header != NULL)
        check_header(header, body, size);
    else
        check_signed(body, size);
    free(header);
    free(body);
    return 0;
}
