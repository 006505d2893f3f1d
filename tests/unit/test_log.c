/* test_log.c - unit tests of src/log.c: value quoting and whole lines. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

/* Format `in` with a roomy buffer and compare with `want`. */
static void check_fmt(const char *in, const char *want)
{
    char out[256];
    memset(out, 'X', sizeof out);
    size_t n = log_format_value(out, sizeof out, in);
    assert_string_equal(out, want);
    assert_int_equal(n, strlen(want));
}

static void test_plain_values_unquoted(void **unused)
{
    (void)unused;
    check_fmt("toko-a", "toko-a");
    check_fmt("T1_abc-9", "T1_abc-9");
    check_fmt("200", "200");
    check_fmt("https://pay.kasera.id/v1", "https://pay.kasera.id/v1");
}

static void test_empty_is_quoted(void **unused)
{
    (void)unused;
    check_fmt("", "\"\"");
}

static void test_spaces_quotes_equals_backslash(void **unused)
{
    (void)unused;
    check_fmt("a b", "\"a b\"");
    check_fmt("say \"hi\"", "\"say \\\"hi\\\"\"");
    check_fmt("a=b", "\"a=b\"");
    check_fmt("c:\\dir", "\"c:\\\\dir\"");
    check_fmt("\"", "\"\\\"\"");
    check_fmt("\\", "\"\\\\\"");
}

static void test_control_bytes_hex(void **unused)
{
    (void)unused;
    check_fmt("a\nb", "\"a\\x0ab\"");
    check_fmt("tab\there", "\"tab\\x09here\"");
    check_fmt("\r", "\"\\x0d\"");
    check_fmt("\x1b[31m", "\"\\x1b[31m\"");
    check_fmt("del\x7f", "\"del\\x7f\"");
    check_fmt("\x01\x1f", "\"\\x01\\x1f\"");
}

static void test_utf8_passes_through_quoted(void **unused)
{
    (void)unused;
    /* bytes >= 0x80 make the value quoted, but are not escaped */
    check_fmt("Toko \xc3\xa4", "\"Toko \xc3\xa4\"");
    check_fmt("\xe2\x9c\x93", "\"\xe2\x9c\x93\"");
}

static void test_format_never_overflows(void **unused)
{
    (void)unused;
    char big[600];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    for (size_t cap = 1; cap < 40; cap++) {
        char out[64];
        memset(out, 'Z', sizeof out);
        size_t n = log_format_value(out, cap, big);
        assert_true(n < cap);
        assert_int_equal(strlen(out), n);
        assert_int_equal(out[cap], 'Z'); /* nothing written past cap */
        n = log_format_value(out, cap, "a \"b\" \n c");
        assert_true(n < cap);
        assert_int_equal(strlen(out), n);
        assert_int_equal(out[cap], 'Z');
    }
    /* cap 0 writes nothing at all */
    char one = 'Q';
    assert_int_equal(log_format_value(&one, 0, "abc"), 0);
    assert_int_equal(one, 'Q');
}

/* A quoted value cut short must still end with its closing quote, or the
 * rest of the line (every later key=value) reads as part of the value. */
static void test_truncated_quoted_value_stays_closed(void **unused)
{
    (void)unused;
    const char *v = "a value with spaces that is far too long for the buffer";
    for (size_t cap = 3; cap < 30; cap++) {
        char out[64];
        size_t n = log_format_value(out, cap, v);
        assert_true(n >= 2);
        assert_int_equal(out[0], '"');
        assert_int_equal(out[n - 1], '"');
    }
    /* and never in the middle of an escape */
    const char *esc = "\\\\\\\\\\\\\\\\\\\\\\\\"; /* twelve backslashes */
    for (size_t cap = 3; cap < 30; cap++) {
        char out[64];
        size_t n = log_format_value(out, cap, esc);
        assert_true(n >= 2);
        assert_int_equal(out[n - 1], '"');
        /* the characters between the quotes are complete "\\" pairs */
        assert_int_equal((n - 2) % 2, 0);
    }
}

/* ---- whole lines, captured from stderr ---- */

/* Run fn with stderr redirected into a temporary file; return what was
 * written (malloc'd). */
static char *capture_stderr(void (*fn)(void *), void *arg)
{
    char path[] = "/tmp/kembali-test-log-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    fn(arg);
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    off_t size = lseek(fd, 0, SEEK_END);
    assert_true(size >= 0);
    char *buf = calloc(1, (size_t)size + 1);
    assert_non_null(buf);
    assert_int_equal(pread(fd, buf, (size_t)size, 0), size);
    close(fd);
    return buf;
}

static void write_read_line(void *arg)
{
    (void)arg;
    struct log_line l;
    log_begin(&l, LOG_LV_INFO, "read");
    log_str(&l, "shop", "toko-a");
    log_str(&l, "id", "T1");
    log_int(&l, "http", 200);
    log_int(&l, "retry_after_ms", -1500);
    log_str(&l, "skipped", NULL); /* appends nothing */
    log_str(&l, "msg", "at most one read per second");
    log_str(&l, "empty", "");
    log_end(&l);
}

static void test_full_line(void **unused)
{
    (void)unused;
    char *got = capture_stderr(write_read_line, NULL);
    regex_t re;
    assert_int_equal(regcomp(&re,
                             "^ts=[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                             "level=info event=read shop=toko-a id=T1 http=200 retry_after_ms=-1500 "
                             "msg=\"at most one read per second\" empty=\"\"\n$",
                             REG_EXTENDED | REG_NOSUB),
                     0);
    int rc = regexec(&re, got, 0, NULL, 0);
    regfree(&re);
    if (rc != 0)
        print_error("line was: %s", got);
    assert_int_equal(rc, 0);
    assert_null(strstr(got, "skipped"));
    free(got);
}

static void write_two_lines(void *arg)
{
    (void)arg;
    log_msg(LOG_LV_WARN, "config", "reload refused");
    log_msg(LOG_LV_ERROR, "key", NULL);
}

static void test_log_msg_one_line_each(void **unused)
{
    (void)unused;
    char *got = capture_stderr(write_two_lines, NULL);
    char *nl = strchr(got, '\n');
    assert_non_null(nl);
    assert_non_null(strstr(got, " level=warn event=config msg=\"reload refused\"\n"));
    assert_non_null(strstr(nl + 1, " level=error event=key\n"));
    assert_int_equal(strncmp(got, "ts=", 3), 0);
    assert_int_equal(strncmp(nl + 1, "ts=", 3), 0);
    assert_int_equal(got[strlen(got) - 1], '\n');
    int lines = 0;
    for (const char *c = got; *c; c++)
        lines += *c == '\n';
    assert_int_equal(lines, 2);
    free(got);
}

static void write_long_line(void *arg)
{
    (void)arg;
    struct log_line l;
    char v[400];
    memset(v, 'v', sizeof v - 1);
    v[sizeof v - 1] = '\0';
    log_begin(&l, LOG_LV_INFO, "long");
    for (int i = 0; i < 10; i++)
        log_str(&l, "k", v);
    log_end(&l);
}

static void test_long_line_truncated(void **unused)
{
    (void)unused;
    char *got = capture_stderr(write_long_line, NULL);
    size_t n = strlen(got);
    assert_true(n <= LOG_LINE_MAX - 1);
    assert_true(n > LOG_LINE_MAX / 2);
    assert_int_equal(got[n - 1], '\n');
    assert_null(memchr(got, '\n', n - 1)); /* one line, not two */
    free(got);
}

static void write_injection(void *arg)
{
    (void)arg;
    struct log_line l;
    log_begin(&l, LOG_LV_INFO, "read");
    log_str(&l, "msg", "x\nts=forged level=error");
    log_end(&l);
}

static void test_value_cannot_forge_a_line(void **unused)
{
    (void)unused;
    char *got = capture_stderr(write_injection, NULL);
    assert_non_null(strstr(got, "msg=\"x\\x0ats=forged level=error\"\n"));
    assert_int_equal(strchr(got, '\n') - got, (long)strlen(got) - 1);
    free(got);
}

/* ---- --log: log_open, log_reopen ---- */

static char *slurp(const char *path)
{
    static char buf[8192];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return buf;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

static void test_log_open_and_reopen(void **unused)
{
    (void)unused;
    char dir[] = "/tmp/kembali-test-log-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], rotated[256], err[256];
    snprintf(path, sizeof path, "%s/k.log", dir);
    snprintf(rotated, sizeof rotated, "%s/k.log.1", dir);
    int saved = dup(STDERR_FILENO); /* the test's own stderr, restored below */
    assert_true(saved >= 0);

    assert_int_equal(log_open(path, err, sizeof err), 0);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0640);
    assert_true(fcntl(STDERR_FILENO, F_GETFL) & O_APPEND);
    log_msg(LOG_LV_INFO, "one", "first");
    assert_int_equal(rename(path, rotated), 0);
    log_msg(LOG_LV_INFO, "two", "after the rename, before the reopen");
    log_reopen(path);
    log_msg(LOG_LV_INFO, "three", "after the reopen");
    /* appends: a reopen of an existing file keeps what it has */
    log_reopen(path);
    log_msg(LOG_LV_INFO, "four", "again");
    /* a path that cannot be opened: the old file goes on, saying why */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/missing/k.log", dir);
    assert_int_equal(log_open(bad, err, sizeof err), -1);
    assert_non_null(strstr(err, "--log"));
    assert_non_null(strstr(err, "No such file"));
    log_reopen(bad);
    log_msg(LOG_LV_INFO, "five", "still here");
    log_reopen(NULL); /* without --log: nothing */

    dup2(saved, STDERR_FILENO);
    close(saved);
    char *old = strdup(slurp(rotated));
    const char *cur = slurp(path);
    assert_int_equal(count(old, "event=one"), 1);
    assert_int_equal(count(old, "event=two"), 1);
    assert_int_equal(count(old, "event=three"), 0);
    assert_int_equal(count(cur, "event=three"), 1);
    assert_int_equal(count(cur, "event=four"), 1);
    assert_int_equal(count(cur, "level=error event=log"), 1);
    assert_int_equal(count(cur, "event=five"), 1);
    assert_int_equal(count(cur, "\n"), 4);
    free(old);
    unlink(path);
    unlink(rotated);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_values_unquoted),
        cmocka_unit_test(test_empty_is_quoted),
        cmocka_unit_test(test_spaces_quotes_equals_backslash),
        cmocka_unit_test(test_control_bytes_hex),
        cmocka_unit_test(test_utf8_passes_through_quoted),
        cmocka_unit_test(test_format_never_overflows),
        cmocka_unit_test(test_truncated_quoted_value_stays_closed),
        cmocka_unit_test(test_full_line),
        cmocka_unit_test(test_log_msg_one_line_each),
        cmocka_unit_test(test_long_line_truncated),
        cmocka_unit_test(test_value_cannot_forge_a_line),
        cmocka_unit_test(test_log_open_and_reopen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
