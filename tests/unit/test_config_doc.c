/* test_config_doc.c - the configuration's documentation against its one
 * table (src/config_keys.c): every key of config_keys has its row in
 * docs/configuration.md's tables (top level, then "Per shop:") with the
 * default the table gives and, for an integer, its range; and its item in the man
 * page (contrib/ship/kembali.8, "Top-level keys" or "Shop keys") with the
 * same default and range. The docs stay prose written by people; what they
 * state as fact (names, defaults, ranges) comes from the C table, and a
 * drift fails here. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "pace.h"

static char *slurp(const char *rel)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", TEST_SRCDIR, rel);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n > 0);
    rewind(f);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* The row of the table in [from, end) whose first cell names `name`
 * ("| `name` |", or one of "| `a` / `b` |"), as a new string; NULL if none. */
static char *row_of(const char *from, const char *end, const char *name)
{
    char needle[128];
    snprintf(needle, sizeof needle, "`%s`", name);
    for (const char *p = from; p != NULL && p < end; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (strncmp(p, "| `", 3) != 0)
            continue;
        const char *cell_end = strstr(p + 2, " | ");
        const char *hit = strstr(p, needle);
        if (cell_end == NULL || hit == NULL || hit > cell_end)
            continue;
        char *l = strndup(p, n);
        assert_non_null(l);
        return l;
    }
    return NULL;
}

/* The default as the docs must say it, into buf. */
static void doc_default(enum config_key_id id, char *buf, size_t len)
{
    const struct config_key *k = &config_keys[id];
    if (k->def_doc != NULL) {
        snprintf(buf, len, "%s", k->def_doc);
    } else if (id == CK_SCHEDULE_MS) {
        struct pace_schedule s;
        pace_default(&s);
        size_t n = (size_t)snprintf(buf, len, "`[");
        for (int i = 0; i < s.n && n < len; i++)
            n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)s.wait_ms[i]);
        if (n < len)
            snprintf(buf + n, len - n, "]`");
    } else if (k->type == CONFIG_INT) {
        snprintf(buf, len, "`%ld`", k->def);
    } else if (k->type == CONFIG_BOOL) {
        snprintf(buf, len, "`%s`", k->def ? "true" : "false");
    } else if (k->def_str != NULL) {
        snprintf(buf, len, "`%s`", k->def_str);
    } else {
        snprintf(buf, len, "—");
    }
}

/* docs/configuration.md: each key's row, its default cell and its range. */
static void test_docs_table(void **unused)
{
    (void)unused;
    char *md = slurp("docs/configuration.md");
    const char *top = strstr(md, "| key | default | meaning |");
    assert_non_null(top);
    const char *shop = strstr(top, "\nPer shop:\n");
    assert_non_null(shop);
    const char *shop_end = strstr(shop + 11, "\n\n");
    shop_end = shop_end ? strstr(shop_end + 2, "\n\n") : NULL; /* the table follows a blank line */
    assert_non_null(shop_end);
    for (int i = 0; i < CK_COUNT; i++) {
        const struct config_key *k = &config_keys[i];
        const char *from = k->scope == CONFIG_TOP ? top : shop, *end = k->scope == CONFIG_TOP ? shop : shop_end;
        char want[256], range[64];
        char *row = row_of(from, end, k->name);
        if (row == NULL)
            fail_msg("docs/configuration.md: no row for %s", k->name);
        doc_default((enum config_key_id)i, want, sizeof want);
        const char *cell = strstr(row + 2, " | ");
        assert_non_null(cell);
        cell += 3;
        if (strncmp(cell, want, strlen(want)) != 0 || strncmp(cell + strlen(want), " |", 2) != 0)
            fail_msg("docs/configuration.md: %s's default should read %s: %s", k->name, want, row);
        if (k->type == CONFIG_INT && k->hi > 0) {
            snprintf(range, sizeof range, "%ld\xe2\x80\x93%ld", k->lo, k->hi);
            if (strstr(row, range) == NULL)
                fail_msg("docs/configuration.md: %s's row should give its range %s: %s", k->name, range, row);
        }
        free(row);
    }
    free(md);
}

/* The man page: each key's item under its section, its default and range. */
static void test_man_page(void **unused)
{
    (void)unused;
    char *man = slurp("contrib/ship/kembali.8");
    const char *top = strstr(man, ".Ss Top-level keys\n");
    const char *shop = strstr(man, ".Ss Shop keys\n");
    assert_non_null(top);
    assert_non_null(shop);
    const char *shop_end = strstr(shop, "\n.El\n");
    assert_non_null(shop_end);
    for (int i = 0; i < CK_COUNT; i++) {
        const struct config_key *k = &config_keys[i];
        const char *from = k->scope == CONFIG_TOP ? top : shop, *end = k->scope == CONFIG_TOP ? shop : shop_end;
        char item[128], want[128];
        snprintf(item, sizeof item, "\n.It Cm %s\n", k->name);
        const char *at = strstr(from, item);
        if (at == NULL || at > end)
            fail_msg("kembali.8: no item for %s", k->name);
        at += strlen(item);
        const char *next = strstr(at, "\n.It ");
        const char *el = strstr(at, "\n.El");
        size_t n = (size_t)((next && next < el ? next : el) - at);
        char *text = strndup(at, n);
        assert_non_null(text);
        for (char *p = text; *p; p++) /* one line of words: macros and line breaks aside */
            if (*p == '\n')
                *p = ' ';
        if (k->type == CONFIG_INT && k->def_doc == NULL) {
            snprintf(want, sizeof want, "default %ld", k->def);
            if (strstr(text, want) == NULL)
                fail_msg("kembali.8: %s should say \"%s\": %s", k->name, want, text);
        }
        if (k->type == CONFIG_INT && k->hi > 0) {
            snprintf(want, sizeof want, "%ld to %ld", k->lo, k->hi);
            if (strstr(text, want) == NULL)
                fail_msg("kembali.8: %s should give its range \"%s\": %s", k->name, want, text);
        }
        if (k->type == CONFIG_BOOL) {
            snprintf(want, sizeof want, "%s (default", k->def ? "true" : "false");
            const char *alt = k->def ? "true  (default" : "false  (default";
            if (strstr(text, want) == NULL && strstr(text, alt) == NULL &&
                strstr(text, k->def ? "(default true)" : "(default false)") == NULL)
                fail_msg("kembali.8: %s should give its default (%s): %s", k->name, k->def ? "true" : "false", text);
        }
        if (k->type == CONFIG_STRING && k->def_str != NULL && k->def_doc == NULL && strstr(text, k->def_str) == NULL)
            fail_msg("kembali.8: %s should give its default %s: %s", k->name, k->def_str, text);
        free(text);
    }
    free(man);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_table),
        cmocka_unit_test(test_man_page),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
