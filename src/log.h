/* log.h - one line per event on standard error (or a --log file), as key=value pairs.
 *
 *   ts=2026-11-30T04:00:00.123Z level=info event=read shop=toko-a id=T1 http=200 status=pending
 *
 * A line is built in a caller-owned buffer and written with one write(2),
 * so lines from several threads or processes never interleave. Values that
 * are empty or contain spaces, quotes, '=' or control bytes are quoted with
 * backslash escapes; control bytes become \xNN. Secrets are never passed to
 * this module: callers log shop ids, never keys. */
#ifndef KEMBALI_LOG_H
#define KEMBALI_LOG_H

#include <stddef.h>

#define LOG_LINE_MAX 1024

struct log_line {
    char buf[LOG_LINE_MAX];
    size_t len;
};

/* A line's level: info (what happened), warn (something a person may want
 * to look at), error (something a person must fix, or an answer that
 * failed). Written as level=info, level=warn, level=error. */
enum log_level {
    LOG_LV_INFO,
    LOG_LV_WARN,
    LOG_LV_ERROR,
};

/* Start a line with ts, level and event. */
void log_begin(struct log_line *l, enum log_level level, const char *event);
/* Append key=value; a NULL value appends nothing. Truncates, never overflows. */
void log_str(struct log_line *l, const char *key, const char *value);
void log_int(struct log_line *l, const char *key, long long value);
/* Terminate the line and write it to stderr. This function can't fail. */
void log_end(struct log_line *l);

/* Format `value` as it would appear in a line (quoted if needed) into out;
 * exposed for tests. Returns the length written. */
size_t log_format_value(char *out, size_t cap, const char *value);

/* Send the log from now on to `path`: open it for appending (O_APPEND,
 * created 0640) and put it on descriptor 2 with dup3(), which swaps the
 * descriptor in one step: a line written meanwhile by another thread goes
 * whole to the old file or whole to the new one, never split or lost.
 * Descriptor 2 is the process's one log descriptor, so this module keeps
 * no state (and what libraries or sanitizers print lands in the file too).
 * Returns 0, or -1 with a reason in err (descriptor 2 unchanged). */
int log_open(const char *path, char *err, size_t errlen);

/* log_open() again after the file was rotated (SIGUSR1, SIGHUP). On
 * failure the log goes on in the old file, with an error line there saying
 * why. This function can't fail. */
void log_reopen(const char *path);

/* A one-call convenience for simple events: log_msg(LOG_LV_WARN, "config", "msg"). */
void log_msg(enum log_level level, const char *event, const char *msg);

#endif
