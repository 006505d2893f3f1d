/* serve.h - what a request gets: routing, the answer's headers, pages.
 *
 * The front's handler. For each whole request it picks the shop, checks
 * the method and the id, and answers at once what is known (405, invalid,
 * unknown shop, metrics, a cached final status or a remembered 404), or
 * holds the request with the resolver until its answer is due. Every
 * answer is built here, in one buffer (CGI headers and body), and handed to
 * front_reply(); one log line per request. */
#ifndef KEMBALI_SERVE_H
#define KEMBALI_SERVE_H

#include <stdbool.h>
#include <stddef.h>

#include "app.h"
#include "front.h"
#include "loop.h"
#include "resolver.h"

struct serve;

/* Create the handler for app a on loop l, with its resolver. Hand
 * serve_handler() to the front, then serve_attach() the front. NULL with a
 * reason in err. */
struct serve *serve_new(struct app *a, struct loop *l, char *err, size_t errlen);

/* The front handler that routes requests to s. Can't fail. */
struct front_handler serve_handler(struct serve *s);

/* The front whose requests s answers (front_reply goes there). */
void serve_attach(struct serve *s, struct front *f);

/* Stopping: no new reads; answer every held request with what is known. */
void serve_stop(struct serve *s);

/* Handing over to a successor (on) or not any more (off): while on, a
 * request that would be held is kept aside for front_handover() instead,
 * and no read starts here (resolver_quiet: those in flight end and are
 * recorded for the successor); turned off, those kept aside are held here
 * after all. Can't fail. */
void serve_handing(struct serve *s, bool on);

/* serve_handing(), with reads started here or not (quiet) set apart: a
 * successor that did not take a later batch serves on, so those kept
 * aside are held here and answered with what is known, and no read starts
 * here (on false, quiet true). Can't fail. */
void serve_handing_quiet(struct serve *s, bool on, bool quiet);

/* Take over request fr of a connection handed over (front_adopt) as rec
 * describes it: held here as it was there (its deadline, its streamed
 * page's clock), or answered at once when its shop is no longer
 * configured. Returns 0 when held, -1 when answered. */
int serve_adopt(struct serve *s, struct front_req *fr, const struct handover_rec *rec);

/* The final statuses cached in this process's state, for a successor of
 * another layout (which opens another state file): one HANDOVER_FACT
 * record per transaction of a configured shop's key, given to emit.
 * Returns how many emit took; stops at the first it refuses (-1). */
long serve_facts(struct serve *s, int (*emit)(void *ctx, const struct handover_rec *rec), void *ctx);

/* A HANDOVER_FACT record from the process handing over: taken into the
 * state (state_import) when it comes from another layout and names a
 * configured shop; ignored otherwise (the same layout shares the file).
 * Returns true when taken. */
bool serve_take_fact(struct serve *s, const struct handover_rec *rec);

/* The layout of this process's state file (state_layout_of), which a
 * successor tells the process handing over. Can't fail. */
int serve_layout(const struct serve *s);

/* This process's reads in flight right now. */
size_t serve_reading(const struct serve *s);

/* Requests held right now. */
size_t serve_held(const struct serve *s);

/* Free s (after serve_stop; the front goes first). */
void serve_free(struct serve *s);

#endif
