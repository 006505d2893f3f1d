/* config_fixture.h - what the configuration's unit tests share
 * (test_config.c, test_config_shops.c, test_config_secret.c,
 * test_config_redis.c): a scratch directory of key files for the group,
 * a configuration written and loaded from it, and what its errors must
 * name. Static: a file uses what it needs. */
#ifndef KEMBALI_TEST_CONFIG_FIXTURE_H
#define KEMBALI_TEST_CONFIG_FIXTURE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"

#define TEMPLATES TEST_SRCDIR "/templates"
/* The start of every configuration written here. */
#define HEAD "{\"templates_dir\": \"" TEMPLATES "\", \"state_dir\": \"/tmp\", "

static char g_dir[64];       /* scratch directory of the group */
static char g_cfg[128];      /* g_dir/kembali.json */
static char g_err[8192];

static inline int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static inline void put_file(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static inline void make_dir(const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    assert_true(mkdir(path, 0700) == 0 || errno == EEXIST);
}

static inline int group_setup(void **state)
{
    (void)state;
    umask(077); /* key files 0600: others' modes are tested one by one */
    snprintf(g_dir, sizeof g_dir, "/tmp/kembali-test-config-XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        return -1;
    snprintf(g_cfg, sizeof g_cfg, "%s/kembali.json", g_dir);
    put_file("key_a", "  sk_test_aaa \t \nsecond line is ignored\n");
    put_file("key_b", "sk_test_bbb\n");
    put_file("key_a_copy", "sk_test_aaa");
    put_file("key_space", "sk test\n");
    put_file("key_empty", "");
    setenv("KEMBALI_TEST_KEY_B", "sk_env_bbb", 1);
    unsetenv("KEMBALI_TEST_UNSET");
    return 0;
}

static inline int group_teardown(void **state)
{
    (void)state;
    nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

static inline struct config *load_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Write the configuration (printf format) to g_cfg and load it. */
static inline struct config *load_fmt(const char *fmt, ...)
{
    char text[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && (size_t)n < sizeof text);
    FILE *f = fopen(g_cfg, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    memset(g_err, 0, sizeof g_err);
    return config_load(g_cfg, g_err, sizeof g_err);
}

/* The load failed and the message names the file and every `needle`. */
static inline void expect_error(struct config *c, const char *file, const char *key, const char *also)
{
    if (c != NULL)
        config_unref(c);
    assert_null(c);
    if (strstr(g_err, file) == NULL || (key && strstr(g_err, key) == NULL) || (also && strstr(g_err, also) == NULL))
        print_error("error text was: %s\n(wanted %s, %s, %s)\n", g_err, file, key ? key : "-", also ? also : "-");
    assert_non_null(strstr(g_err, file));
    if (key != NULL)
        assert_non_null(strstr(g_err, key));
    if (also != NULL)
        assert_non_null(strstr(g_err, also));
}

static inline struct config *expect_ok(struct config *c)
{
    if (c == NULL)
        print_error("config_load failed: %s\n", g_err);
    assert_non_null(c);
    return c;
}

/* A configuration with one shop whose members are `shop` (text). */
static inline struct config *load_one_shop(const char *shop)
{
    return load_fmt(HEAD "\"shops\": [{\"id\": \"toko-a\", %s}]}", shop);
}

/* The configuration text that names shops_dir `sub` with keys_dir g_dir/keys
 * (and `more` top-level members). */
static inline struct config *load_dir(const char *sub, const char *more)
{
    return load_fmt(HEAD "\"keys_dir\": \"%s/keys\", \"shops_dir\": \"%s/%s\"%s%s}", g_dir, g_dir, sub,
                    more ? ", " : "", more ? more : "");
}

/* The skipped entry of c for shops_dir file `rel` (relative to g_dir), or fail. */
static inline const struct config_skip *skipped(const struct config *c, const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    for (int i = 0; i < c->nskipped; i++)
        if (strcmp(c->skipped[i].file, path) == 0)
            return &c->skipped[i];
    print_error("%s was not skipped (%d skipped)\n", path, c->nskipped);
    fail();
    return NULL;
}

static inline void make_keys_dir(void)
{
    make_dir("keys");
    put_file("keys/a", "sk_test_aaa\n");
    put_file("keys/b", "sk_test_bbb\n");
}

/* The key of tenant `name`: keys_dir/NAME (keys_dir is g_dir/keys). */
static inline void put_tenant_key(const char *name, const char *key)
{
    char rel[128], text[128];
    snprintf(rel, sizeof rel, "keys/%s", name);
    snprintf(text, sizeof text, "%s\n", key);
    put_file(rel, text);
}

/* The shop file `dir`/NAME.json holding `members` (JSON text without the
 * braces, printf format). */
static inline void put_tenant(const char *dir, const char *name, const char *members, ...)
    __attribute__((format(printf, 3, 4)));
static void put_tenant(const char *dir, const char *name, const char *members, ...)
{
    char rel[200], body[4096], text[4200];
    va_list ap;
    va_start(ap, members);
    vsnprintf(body, sizeof body, members, ap);
    va_end(ap);
    snprintf(rel, sizeof rel, "%s/%s.json", dir, name);
    snprintf(text, sizeof text, "{%s}", body);
    put_file(rel, text);
}

#endif
