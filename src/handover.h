/* handover.h - a request in hand as one process hands it to the next.
 *
 * An upgrade (SIGUSR2) or a restart under systemd (its file-descriptor
 * store) hands each connection of the old process to the new one with a
 * record describing it: what the FastCGI side needs (the request id, the
 * keep-conn flag, bytes already framed but not yet written) and, for a
 * held request, what the handler needs to go on as if it had taken the
 * request itself (shop, transaction, format, deadline, the streamed page's
 * clock). docs/handover.md describes the exchange; this module is only the
 * record and its bytes, as plain code: no I/O, no clock. Times are
 * CLOCK_MONOTONIC milliseconds, which every process of a host shares.
 *
 * The bytes (HANDOVER_FORMAT 2), all integers little-endian:
 *   u8 format, u8 kind, u16 fcgi_id, u8 flags (bit 0 keep_conn, 1 json,
 *   2 head, 3 stream, 4 undecided, 5 wants_read), u16 layout (the
 *   sender's state layout), then i64 idle_since, out_since, arrived,
 *   deadline, painted, last_sent; then four strings (u8 length, bytes):
 *   shop, id, addr, origin; then u32 out_len and the out bytes; then u8
 *   snap (0: none), and with one: u8 status, u8 flags (bit 0 has_tx, 1
 *   reserved, 2 not_found), i32 reads, i64 last_start, last_end,
 *   inflight_until, not_before, known_until, key_paused_until,
 *   host_paused_until, and the status word as a string.
 * Format 1 is format 2 without the layout and the snapshot (a reader takes
 * it as layout 0: unknown, nothing to import). A reader refuses a format
 * it does not know: a new format number comes with any change here.
 * A description holding several records (the fd store's memfd) frames
 * each as u32 fd index, u32 length, the record. */
#ifndef KEMBALI_HANDOVER_H
#define KEMBALI_HANDOVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "state.h"

#define HANDOVER_FORMAT 2
#define HANDOVER_STR_MAX 255          /* each string's bytes */
#define HANDOVER_OUT_MAX (4u << 20)   /* queued bytes of one connection (the front keeps less) */
#define HANDOVER_FIXED 64             /* the bytes of a record besides its strings, out and snapshot */
#define HANDOVER_SNAP_FIXED 63        /* the bytes of a snapshot besides its status word */
/* the most bytes a record takes besides out */
#define HANDOVER_REC_MAX (HANDOVER_FIXED + HANDOVER_SNAP_FIXED + 5 * HANDOVER_STR_MAX)

enum handover_kind {
    HANDOVER_IDLE = 1,   /* a kept connection between requests */
    HANDOVER_HELD = 2,   /* a connection with a request held */
    HANDOVER_FACT = 3,   /* no connection: a final status the sender's state has cached (shop, id,
                          * layout and snapshot: for a successor of another layout) */
};

struct handover_rec {
    uint8_t kind;             /* enum handover_kind */
    /* the connection */
    uint16_t fcgi_id;         /* HELD: the FastCGI request id */
    bool keep_conn;           /* HELD: FCGI_KEEP_CONN */
    int64_t idle_since;       /* IDLE: idle since (0: not idle yet: its last answer is going out) */
    int64_t out_since;        /* out bytes wait since (0: none) */
    const uint8_t *out;       /* bytes framed and not yet written (points into the decoded buffer) */
    size_t out_len;
    /* the request (HELD) */
    char shop[HANDOVER_STR_MAX + 1];   /* the shop's id */
    char id[HANDOVER_STR_MAX + 1];     /* the transaction's id */
    char addr[HANDOVER_STR_MAX + 1];   /* REMOTE_ADDR ("" when none) */
    char origin[HANDOVER_STR_MAX + 1]; /* the allowed CORS origin it answers, "" when none */
    bool json, head;
    bool stream, undecided;   /* the streamed page (stream.h) */
    bool wants_read;          /* JSON: a read started for it (hold.h) */
    int64_t arrived, deadline;
    int64_t painted, last_sent; /* the streamed page's clock (0: not yet) */
    /* across layouts (HELD): what the sender's state held of the transaction */
    int layout;               /* the sender's state layout (0: unknown, a format 1 record) */
    bool has_snap;
    struct state_snap snap;
};

/* The bytes handover_encode() writes for r; SIZE_MAX when r cannot be
 * encoded (a string over HANDOVER_STR_MAX, out over HANDOVER_OUT_MAX).
 * This function can't fail. */
size_t handover_size(const struct handover_rec *r);

/* Encode r into out (capacity cap). Returns the bytes written
 * (handover_size(r)), or 0 with nothing useful in out when cap is too
 * small or r cannot be encoded. */
size_t handover_encode(const struct handover_rec *r, uint8_t *out, size_t cap);

/* The same in an older `format` (1 or HANDOVER_FORMAT), for a reader that
 * reads no newer one: format 1 leaves out the layout and the snapshot and
 * has no HANDOVER_FACT (0 then). */
size_t handover_encode_as(const struct handover_rec *r, int format, uint8_t *out, size_t cap);

/* Decode one record from in[0..len) into *r (r->out points into in).
 * Returns 0, or -1 with a reason in why: an unknown format or kind, a
 * length past the end, bytes left over, a string holding a NUL. */
int handover_decode(const uint8_t *in, size_t len, struct handover_rec *r, char *why, size_t whylen);

/* The frame of a description: write the header of a record of rec_len
 * bytes for fd number `index` into hdr[8]. This function can't fail. */
void handover_frame(uint8_t hdr[8], uint32_t index, uint32_t rec_len);

/* The next framed record of buf[0..len) from *off: its fd index and its
 * bytes; *off moves past it. Returns 1, 0 at the end (*off == len), or -1
 * when the frame runs past the end. */
int handover_next(const uint8_t *buf, size_t len, size_t *off, uint32_t *index, const uint8_t **rec,
                  size_t *rec_len);

#endif
