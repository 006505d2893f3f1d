/* fuzz_redis_msg.c - lines published on kembali's Redis channel
 * (state_redis_msg_parse): anybody who can reach the Redis can publish.
 *
 * Input: one message's bytes. Checked: an accepted line has a 32-hex key,
 * an id (or for B a 32-hex client, for R a read's name, for S nothing), a
 * span within bounds and, for F and P, a status word; printing it back in the canonical form parses to the
 * same message. */
#include <stdio.h>

#include "ids.h"
#include "fuzz.h"
#include "state_redis_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct state_redis_msg m;
    if (!state_redis_msg_parse((const char *)data, size, &m))
        return 0;
    uint8_t k[16];
    FUZZ_CHECK(ids_unhex(m.key.hex, strlen(m.key.hex), k, 16));
    FUZZ_CHECK(m.ms >= 0 && m.ms <= STATE_REDIS_MSG_MAX_MS);
    static const char kinds[] = "FPWNBSR";
    FUZZ_CHECK(m.kind >= STATE_REDIS_MSG_FINAL && m.kind <= STATE_REDIS_MSG_READ);
    if (m.kind == STATE_REDIS_MSG_SEED || m.kind == STATE_REDIS_MSG_READ) {
        /* S KEY; R KEY NAME (16 hex digits, ':', its time) */
        char line[256];
        int n = m.kind == STATE_REDIS_MSG_SEED ? snprintf(line, sizeof line, "S %s", m.key.hex)
                                               : snprintf(line, sizeof line, "R %s %s", m.key.hex, m.id);
        if (m.kind == STATE_REDIS_MSG_READ)
            FUZZ_CHECK(strlen(m.id) >= 18 && m.id[16] == ':' && ids_unhex(m.id, 16, k, 8));
        else
            FUZZ_CHECK(m.id[0] == '\0' && m.ms == 0);
        struct state_redis_msg again;
        FUZZ_CHECK(n > 0 && (size_t)n < sizeof line && state_redis_msg_parse(line, (size_t)n, &again));
        FUZZ_CHECK(again.kind == m.kind && strcmp(again.key.hex, m.key.hex) == 0 && strcmp(again.id, m.id) == 0);
        return 0;
    }
    bool worded = m.kind == STATE_REDIS_MSG_FINAL || m.kind == STATE_REDIS_MSG_STATUS;
    if (m.kind == STATE_REDIS_MSG_BLOCK)
        FUZZ_CHECK(ids_unhex(m.id, strlen(m.id), k, 16));
    else
        FUZZ_CHECK(ids_valid_id(m.id));
    FUZZ_CHECK(worded ? ids_valid_word(m.word, strlen(m.word)) : m.word[0] == '\0');
    char line[256];
    int n = worded ? snprintf(line, sizeof line, "%c %s %s %lld %s", kinds[m.kind], m.key.hex, m.id, (long long)m.ms, m.word)
                   : snprintf(line, sizeof line, "%c %s %s %lld", kinds[m.kind], m.key.hex, m.id, (long long)m.ms);
    struct state_redis_msg again;
    FUZZ_CHECK(n > 0 && (size_t)n < sizeof line && state_redis_msg_parse(line, (size_t)n, &again));
    FUZZ_CHECK(again.kind == m.kind && again.ms == m.ms && strcmp(again.key.hex, m.key.hex) == 0 &&
               strcmp(again.id, m.id) == 0 && strcmp(again.word, m.word) == 0);
    return 0;
}
