/* state_snap.c - see state.h (state_snapshot, state_import): what a
 * transaction in hand needs, carried from one layout's state to another's
 * at a handover (docs/handover.md). */
#include "state_private.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

void state_snapshot(struct state *st, const struct state_key *key, const char *id, int64_t now,
                    struct state_snap *out)
{
    memset(out, 0, sizeof *out);
    out->status = TXS_NONE;
    st_lock(st, now);
    const struct st_tx *e = strlen(id) <= STATE_ID_MAX ? st_tx_find(st, key, id) : NULL;
    if (e != NULL) {
        out->has_tx = true;
        out->reads = e->reads;
        out->last_start = e->last_start;
        out->last_end = e->last_end;
        out->inflight_until = e->inflight_until;
        out->not_before = e->not_before;
        out->status = (enum tx_status)e->status;
        util_copy(out->status_word, sizeof out->status_word, e->status != TXS_NONE ? e->status_word : "");
        out->known_until = e->known_until;
        out->not_found = e->not_found;
    }
    const struct st_keyent *k = st_key_find(st, key);
    if (k != NULL)
        out->key_paused_until = k->paused_until;
    out->host_paused_until = st->h->host_paused_until;
    st_unlock(st);
}

/* t, no later than now + span (a time further ahead is damage or another
 * boot's clock, as st_region_check has it). */
static int64_t within(int64_t t, int64_t now, int64_t span)
{
    return t > now + span ? now + span : t;
}

static bool cached_final(enum tx_status s, bool not_found, int64_t known_until, int64_t now)
{
    return !not_found && known_until > now && tx_status_final(s);
}

size_t state_finals(struct state *st, int64_t now, struct state_final **out)
{
    *out = NULL;
    size_t n = 0, cap = 0;
    struct state_final *v = NULL;
    st_lock(st, now);
    for (int32_t i = 0; i < st->txn; i++) {
        const struct st_tx *e = &st->txs[i];
        if (!e->used || !cached_final((enum tx_status)e->status, e->not_found, e->known_until, now) ||
            strnlen(e->id, sizeof e->id) > STATE_ID_MAX)
            continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            struct state_final *nv = realloc(v, nc * sizeof *nv);
            if (nv == NULL)
                break;
            v = nv;
            cap = nc;
        }
        struct state_final *f = &v[n++];
        memset(f, 0, sizeof *f);
        f->key = e->key;
        memcpy(f->id, e->id, sizeof f->id);
        f->id[STATE_ID_MAX] = '\0';
        f->snap.has_tx = true;
        f->snap.status = (enum tx_status)e->status;
        util_copy(f->snap.status_word, sizeof f->snap.status_word, e->status_word);
        f->snap.known_until = e->known_until;
        f->snap.last_start = e->last_start;
        f->snap.last_end = e->last_end;
        f->snap.reads = e->reads;
        f->snap.not_before = e->not_before;
    }
    st_unlock(st);
    if (n == 0)
        free(v);
    else
        *out = v;
    return n;
}

/* The snapshot's facts of the transaction into e (under the lock);
 * whether anything changed. */
static bool import_tx(struct st_tx *e, const struct state_snap *sn, int64_t now)
{
    bool changed = false;
    if (sn->last_start > e->last_start) { /* its last read is newer than any recorded here */
        e->reads = sn->reads;
        e->last_start = sn->last_start;
        changed = true;
    }
    if (sn->last_end > e->last_end) {
        e->last_end = sn->last_end;
        changed = true;
    }
    if (sn->inflight_until > now && sn->inflight_until > e->inflight_until) {
        /* that read's end is recorded in the other layout's file only: its
         * lease is waited out here, as for a process that died reading */
        e->inflight_until = sn->inflight_until;
        changed = true;
    }
    if (sn->not_before > e->not_before) {
        e->not_before = sn->not_before;
        changed = true;
    }
    enum tx_status cur = (enum tx_status)e->status;
    bool here_final = cached_final(cur, e->not_found, e->known_until, now);
    enum tx_status s = sn->status;
    if (s != TXS_NONE && !sn->not_found && ids_valid_word(sn->status_word, strlen(sn->status_word))) {
        bool take;
        if (cached_final(s, false, sn->known_until, now))
            take = rules_may_replace(cur, here_final, s, false) &&
                   !(cur == s && here_final && e->known_until >= sn->known_until);
        else
            take = cur == TXS_NONE && !tx_status_final(s); /* what is known here is as new */
        if (take) {
            e->status = (uint8_t)s;
            util_copy(e->status_word, sizeof e->status_word, sn->status_word);
            e->not_found = 0;
            e->known_until = tx_status_final(s) ? sn->known_until : 0;
            changed = true;
        }
    }
    if (sn->not_found && sn->known_until > now && !here_final && cur == TXS_NONE &&
        (!e->not_found || e->known_until < sn->known_until)) {
        e->not_found = 1;
        e->known_until = sn->known_until;
        changed = true;
    }
    return changed;
}

bool state_import(struct state *st, const struct state_key *key, const char *id, const struct state_snap *in,
                  int64_t now)
{
    struct state_snap c = *in, *snap = &c;
    c.last_start = within(c.last_start, now, 0);
    c.last_end = within(c.last_end, now, 0);
    c.inflight_until = within(c.inflight_until, now, SPAN_LEASE);
    c.not_before = within(c.not_before, now, SPAN_RETRY);
    c.known_until = within(c.known_until, now, c.not_found ? STATE_TTL_NOT_FOUND_MS : rules_status_ttl(c.status));
    c.key_paused_until = within(c.key_paused_until, now, SPAN_KEY_PAUSE);
    c.host_paused_until = within(c.host_paused_until, now, SPAN_HOST_PAUSE);
    c.status_word[sizeof c.status_word - 1] = '\0';
    bool valid = ids_valid_id(id);
    bool room = false;
    st_lock(st, now);
    bool key_grew = false, host_grew = false, tx_changed = false;
    struct st_keyent *k = snap->key_paused_until > now || (valid && snap->has_tx) ? st_key_get(st, key, now, true)
                                                                                  : NULL;
    if (k != NULL && snap->key_paused_until > k->paused_until) {
        st_pause_until(&k->paused_until, snap->key_paused_until);
        key_grew = true;
    }
    if (snap->host_paused_until > now && snap->host_paused_until > st->h->host_paused_until) {
        st_pause_until(&st->h->host_paused_until, snap->host_paused_until);
        host_grew = true;
    }
    if (valid && snap->has_tx) {
        struct st_tx *e = st_tx_get(st, key, id, now, false, k);
        if (e != NULL) {
            room = true;
            e->last_used = now;
            tx_changed = import_tx(e, snap, now);
        }
    }
    if (tx_changed)
        st_change_log(st, STATE_CHANGE_TX, key, id);
    if (key_grew)
        st_change_log(st, STATE_CHANGE_KEY, key, NULL);
    if (host_grew)
        st_change_log(st, STATE_CHANGE_HOST, NULL, NULL);
    st_unlock(st);
    if (tx_changed || key_grew || host_grew)
        st_bump(st);
    return room || (valid && !snap->has_tx);
}
