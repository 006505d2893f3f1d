/* fuzz_query.c - the query string, the transaction id and the shop's host.
 *
 * Input: 1 byte choosing the output capacity, then, separated by NUL bytes
 * (the web server's parameters are C strings): the query string
 * (QUERY_STRING), an id_param name, a host (HTTP_HOST) and a shop
 * (KEMBALI_SHOP). request_query_param() is asked for several names into a
 * buffer of exactly that capacity (ASan sees any byte written past it), and
 * what it returns goes through ids_valid_id(), checked against the
 * interface's rule: 1 to 64 characters of A-Z a-z 0-9 _ -. The host and
 * shop pick a shop of a fixed three-shop configuration (config_pick_shop),
 * checked against docs/configuration.md's rules ("Which shop a request
 * belongs to"). */
#include <stdbool.h>

#include <ctype.h>
#include <strings.h>

#include "config.h"
#include "ids.h"
#include "fuzz.h"
#include "fuzz_fs.h"
#include "request.h"

/* Loaded once by LLVMFuzzerInitialize, read-only afterwards. */
static struct config *shops;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_fs_init("query");
    fuzz_write_templates("tpl", 0);
    fuzz_write("key", "sk_test_q\n", 10, 0600);
    char cfg[4096], dir[PATH_MAX];
    fuzz_path(dir, sizeof dir, "");
    int n = snprintf(cfg, sizeof cfg,
                     "{\"templates_dir\": \"%stpl\", \"state_dir\": \"%sstate\", \"shops\": ["
                     "{\"id\": \"toko-a\", \"hosts\": [\"toko-a.example\", \"[2001:db8::1]\"], \"secret_key_file\": \"%skey\"},"
                     "{\"id\": \"toko-b\", \"hosts\": [\"toko-b.example\", \"192.0.2.7\"], \"secret_key_file\": \"%skey\"},"
                     "{\"id\": \"c\", \"secret_key_file\": \"%skey\"}]}",
                     dir, dir, dir, dir, dir);
    fuzz_write("kembali.json", cfg, (size_t)n, 0600);
    char err[2048];
    shops = config_load(fuzz_path(dir, sizeof dir, "kembali.json"), err, sizeof err);
    if (shops == NULL) {
        fprintf(stderr, "fuzz_query: %s", err);
        abort();
    }
    return 0;
}

/* docs/configuration.md, which shop a request belongs to: KEMBALI_SHOP by id (an unknown one matches nothing), else
 * the host without its port, case-insensitive, trailing dots ignored. */
static void pick(const char *host, const char *shop)
{
    const struct shop *s = config_pick_shop(shops, shop, host);
    if (shop != NULL && shop[0] != '\0') {
        FUZZ_CHECK(s == NULL ? strcmp(shop, "toko-a") && strcmp(shop, "toko-b") && strcmp(shop, "c")
                             : strcmp(s->id, shop) == 0);
        return;
    }
    if (s == NULL)
        return;
    FUZZ_CHECK(host != NULL);
    bool match = false;
    for (int i = 0; i < s->nhosts; i++)
        match = match || strncasecmp(host, s->hosts[i], strlen(s->hosts[i])) == 0;
    FUZZ_CHECK(match); /* three shops: no "only shop" fallback */
}

static const size_t caps[] = {1, 2, 3, 8, STATE_ID_MAX, STATE_ID_MAX + 1, STATE_ID_MAX + 2, 128, 4096};

static bool valid_id_reference(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static void ask(const char *q, const char *name, size_t cap)
{
    char *out = malloc(cap);
    FUZZ_CHECK(out != NULL);
    memset(out, 'Z', cap);
    if (request_query_param(q, name, out, cap)) {
        size_t n = strnlen(out, cap);
        FUZZ_CHECK(n < cap); /* NUL-terminated within cap */
        /* nothing decoded appears from nowhere: without escapes the value is
         * a piece of the query */
        if (strpbrk(q, "%+") == NULL)
            FUZZ_CHECK(strstr(q, out) != NULL);
        FUZZ_CHECK(ids_valid_id(out) == valid_id_reference(out));
    }
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    struct fuzz_in in = {data + 1, size - 1};
    size_t cap = caps[data[0] % (sizeof caps / sizeof caps[0])];
    char *q = fuzz_field(&in, 0, NULL);
    char *name = fuzz_field(&in, 0, NULL);
    char *host = fuzz_field(&in, 0, NULL);
    char *shop = fuzz_field(&in, 0, NULL);
    pick(host, shop);
    pick(host, NULL);
    pick(NULL, shop);

    static const char *const names[] = {"id", "format", "status", "i", ""};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        ask(q, names[i], cap);
    if (name[0] != '\0')
        ask(q, name, cap);
    FUZZ_CHECK(!request_query_param(NULL, "id", q, 1));
    FUZZ_CHECK(ids_valid_id(q) == valid_id_reference(q));
    FUZZ_CHECK(!ids_valid_id(NULL));

    free(q);
    free(name);
    free(host);
    free(shop);
    return 0;
}
