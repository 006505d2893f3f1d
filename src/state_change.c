/* state_change.c - see state.h ("What changed"): the change log, a ring
 * of the last STATE_CHANGES changes in the region's header, written and
 * read under the state's lock. Each entry carries its change number, so
 * that a reader tells an entry overwritten or damaged from the one it
 * wants, and reads it as lost rather than as something else. */
#include "state_private.h"

#include <string.h>

#include "util.h"

void st_change_log(struct state *st, enum state_change_kind kind, const struct state_key *key, const char *id)
{
    uint64_t seq = st->h->chg_head + 1;
    __atomic_store_n(&st->h->chg_head, seq, __ATOMIC_RELEASE); /* read without the lock: state_changes_head */
    struct st_change *c = &st->h->chg[(seq - 1) % STATE_CHANGES];
    memset(c, 0, sizeof *c);
    c->seq = seq;
    c->kind = (uint8_t)kind;
    if (key != NULL && kind != STATE_CHANGE_HOST)
        c->key = *key;
    if (id != NULL && kind == STATE_CHANGE_TX)
        util_copy(c->id, sizeof c->id, id);
}

uint64_t state_changes_head(struct state *st)
{
    return __atomic_load_n(&st->h->chg_head, __ATOMIC_ACQUIRE);
}

/* Does entry c read as change `seq`, whole? */
static bool entry_ok(const struct st_change *c, uint64_t seq)
{
    if (c->seq != seq || c->kind > STATE_CHANGE_HOST)
        return false;
    return c->kind != STATE_CHANGE_TX || ids_valid_id(c->id);
}

size_t state_changes(struct state *st, uint64_t *cursor, struct state_change *out, size_t max, int64_t now,
                     bool *lost)
{
    size_t n = 0;
    *lost = false;
    st_lock(st, now);
    uint64_t head = st->h->chg_head;
    if (*cursor > head || head - *cursor > STATE_CHANGES) {
        *lost = true;
    } else {
        for (uint64_t s = *cursor + 1; s <= head && n < max; s++) {
            const struct st_change *c = &st->h->chg[(s - 1) % STATE_CHANGES];
            if (!entry_ok(c, s)) {
                *lost = true;
                break;
            }
            out[n].kind = (enum state_change_kind)c->kind;
            out[n].key = c->key;
            util_copy(out[n].id, sizeof out[n].id, c->kind == STATE_CHANGE_TX ? c->id : "");
            n++;
        }
    }
    if (*lost) {
        n = 0;
        *cursor = head;
    } else {
        *cursor += n;
    }
    st_unlock(st);
    return n;
}
