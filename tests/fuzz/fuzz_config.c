/* fuzz_config.c - the configuration and the shop files (config_load).
 *
 * Input: the main configuration, then up to four shop files for shops_dir,
 * separated by 0xFF bytes (which JSON text never holds). Everything is
 * written into a private folder (fuzz_fs.h) and loaded from there.
 *
 * No file outside that folder is ever touched: a part that parses as JSON
 * has every member that names a file or folder (secret_key_file,
 * templates_dir, shops_dir, state_dir, and keys_dir, shop_templates_root,
 * redis_password_file for the configurations that have them) rewritten to
 * one of the folder's prepared files, chosen by the original value (a good
 * key, an empty one, one with spaces, one too long, a world-readable one,
 * a missing one; whole, partial and broken template sets; the shop files),
 * and secret_key_env to one of two variables the harness owns; a top-level
 * templates_dir is added when missing (the default is the installed one).
 * A part that does not parse is written as it is: config_load refuses it
 * before opening anything else. Checked: a refusal says why, within the
 * error buffer; a loaded configuration has valid, distinct shop ids, its
 * keys are the prepared one, and it frees cleanly (LeakSanitizer). */
#include <jansson.h>
#include <stdbool.h>

#include "config.h"
#include "fuzz.h"
#include "fuzz_fs.h"

#define GOOD_KEY "sk_test_fuzz_0123456789"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_fs_init("config");
    fuzz_mkdir("keys");
    fuzz_write("keys/good", GOOD_KEY "\n", strlen(GOOD_KEY) + 1, 0600);
    fuzz_write("keys/empty", "", 0, 0600);
    fuzz_write("keys/spaces", "  sk test \n", 11, 0600);
    char long_key[400];
    memset(long_key, 'k', sizeof long_key);
    fuzz_write("keys/long", long_key, sizeof long_key, 0600);
    fuzz_write("keys/world", GOOD_KEY "\n", strlen(GOOD_KEY) + 1, 0644);
    fuzz_write("keys/lines", "\n" GOOD_KEY "\n", strlen(GOOD_KEY) + 2, 0600);
    for (int i = 0; i < 4; i++) { /* the tenants' own keys: shops/sN.json is the shop sN, its key keys/sN */
        char rel[16];
        snprintf(rel, sizeof rel, "keys/s%d", i);
        fuzz_write(rel, GOOD_KEY "\n", strlen(GOOD_KEY) + 1, 0600);
    }
    fuzz_write_templates("tpl", 0);
    fuzz_write_templates("tpl-partial", 3);
    fuzz_mkdir("tpl-bad");
    fuzz_mkdir("tpl-bad/id");
    fuzz_write("tpl-bad/id/failed.html", "<html data-status=\"{{status}}\">{{nope}}</html>", 46, 0644);
    fuzz_mkdir("shops");
    fuzz_mkdir("shops-empty");
    fuzz_mkdir("state");
    setenv("KEMBALI_FUZZ_KEY", GOOD_KEY, 1);
    unsetenv("KEMBALI_FUZZ_UNSET");
    return 0;
}

static uint32_t str_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

/* Where a member naming a file may point. */
static const struct {
    const char *key;
    const char *to[7];
} rewrites[] = {
    {"secret_key_file", {"keys/good", "keys/empty", "keys/spaces", "keys/long", "keys/world", "keys/lines", "keys/missing"}},
    {"redis_password_file", {"keys/good", "keys/empty", "keys/missing"}},
    {"templates_dir", {"tpl", "tpl-partial", "tpl-bad", "missing", "tpl/"}},
    {"shop_templates_root", {"", "tpl", "missing"}},
    {"shops_dir", {"shops", "shops-empty", "missing", "keys/good"}},
    {"keys_dir", {"keys", "", "missing", "tpl"}},
    {"state_dir", {"state"}},
};

static void rewrite(json_t *j)
{
    if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v)
            rewrite(v);
        return;
    }
    if (!json_is_object(j))
        return;
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        if (strcmp(k, "secret_key_env") == 0 && json_is_string(v)) {
            json_string_set(v, str_hash(json_string_value(v)) % 2 ? "KEMBALI_FUZZ_KEY" : "KEMBALI_FUZZ_UNSET");
            continue;
        }
        bool done = false;
        for (size_t r = 0; r < sizeof rewrites / sizeof rewrites[0] && !done; r++) {
            if (strcmp(k, rewrites[r].key) != 0)
                continue;
            done = true;
            if (!json_is_string(v))
                break; /* refused by type, whatever it says */
            size_t n = 0;
            while (n < 7 && rewrites[r].to[n])
                n++;
            char p[PATH_MAX];
            fuzz_path(p, sizeof p, rewrites[r].to[str_hash(json_string_value(v)) % n]);
            json_string_set(v, p);
        }
        if (!done)
            rewrite(v);
    }
}

/* Write one part to rel, its paths pointed into the folder. */
static void write_part(const char *rel, const char *text, size_t len, bool top)
{
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, NULL);
    if (j == NULL) {
        fuzz_write(rel, text, len, 0600);
        return;
    }
    rewrite(j);
    if (top && json_is_object(j) && json_object_get(j, "templates_dir") == NULL) {
        char p[PATH_MAX];
        json_object_set_new(j, "templates_dir", json_string(fuzz_path(p, sizeof p, "tpl")));
    }
    if (top && json_is_object(j) && json_object_get(j, "state_dir") == NULL) {
        char p[PATH_MAX];
        json_object_set_new(j, "state_dir", json_string(fuzz_path(p, sizeof p, "state")));
    }
    char *s = json_dumps(j, JSON_ENCODE_ANY);
    FUZZ_CHECK(s != NULL);
    fuzz_write(rel, s, strlen(s), 0600);
    free(s);
    json_decref(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = {data, size};
    size_t len;
    char *main_cfg = fuzz_field(&in, 0xFF, &len);
    write_part("kembali.json", main_cfg, len, true);
    free(main_cfg);
    int nshops = 0;
    for (; nshops < 4 && in.left > 0; nshops++) {
        char rel[32];
        snprintf(rel, sizeof rel, "shops/s%d.json", nshops);
        char *part = fuzz_field(&in, 0xFF, &len);
        write_part(rel, part, len, false);
        free(part);
    }

    char path[PATH_MAX];
    fuzz_path(path, sizeof path, "kembali.json");
    size_t errlen = size % 2 ? 4096 : 97;
    char *err = malloc(errlen);
    FUZZ_CHECK(err != NULL);
    memset(err, 'E', errlen);
    struct config *c = config_load(path, err, errlen);
    FUZZ_CHECK(strnlen(err, errlen) < errlen);
    if (c == NULL) {
        FUZZ_CHECK(err[0] != '\0');
    } else {
        /* every file of shops_dir may be skipped: kembali then serves unknown_shop */
        FUZZ_CHECK((c->nshops >= 1 || c->nskipped >= 1) && c->default_tpl != NULL);
        for (int i = 0; i < c->nskipped; i++)
            FUZZ_CHECK(c->skipped[i].why[0] != '\0' && (c->skipped[i].collides == NULL ||
                                                        ids_valid_id(c->skipped[i].collides)));
        for (int i = 0; i < c->nshops; i++) {
            const struct shop *s = &c->shops[i];
            FUZZ_CHECK(ids_valid_id(s->id));
            FUZZ_CHECK(s->secret != NULL && strcmp(s->secret, GOOD_KEY) == 0);
            FUZZ_CHECK(s->tpl != NULL && s->read_budget >= 1);
            FUZZ_CHECK(ids_valid_id(s->id_param));
            for (int k = i + 1; k < c->nshops; k++)
                FUZZ_CHECK(strcmp(s->id, c->shops[k].id) != 0);
            FUZZ_CHECK(config_pick_shop(c, s->id, NULL) == s);
            for (int h = 0; h < s->nhosts; h++)
                FUZZ_CHECK(config_pick_shop(c, NULL, s->hosts[h]) == s);
        }
        FUZZ_CHECK(config_pick_shop(c, "no-such-shop-id-at-all", NULL) == NULL);
        config_unref(config_ref(c));
        config_unref(c);
    }
    free(err);
    for (int i = 0; i < nshops; i++) {
        char rel[32];
        snprintf(rel, sizeof rel, "shops/s%d.json", i);
        fuzz_unlink(rel);
    }
    return 0;
}
