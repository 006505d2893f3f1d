/* test_metrics.c - unit tests of src/metrics.c: the page written from the
 * table is exposition text where every metric has one # HELP and one
 * # TYPE, counters end in _total and gauges do not, and every value comes
 * from the field its row names. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

#define MAX_FAMILIES 128

struct family {
    char name[128];
    int helps, types, samples;
    char type[16];
};

struct page {
    struct family f[MAX_FAMILIES];
    int n;
};

static struct family *family(struct page *pg, const char *name, size_t len)
{
    for (int i = 0; i < pg->n; i++)
        if (strlen(pg->f[i].name) == len && memcmp(pg->f[i].name, name, len) == 0)
            return &pg->f[i];
    assert_true(pg->n < MAX_FAMILIES);
    assert_true(len < sizeof pg->f[0].name);
    struct family *f = &pg->f[pg->n++];
    memset(f, 0, sizeof *f);
    memcpy(f->name, name, len);
    return f;
}

static size_t name_len(const char *p)
{
    size_t n = 0;
    if (!(isalpha((unsigned char)p[0]) || p[0] == '_' || p[0] == ':'))
        return 0;
    while (isalnum((unsigned char)p[n]) || p[n] == '_' || p[n] == ':')
        n++;
    return n;
}

static bool ends_with(const char *s, const char *tail)
{
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

/* Parse the page strictly enough to catch what promtool would: every line
 * ends in \n; comments are HELP or TYPE of a valid name; a TYPE comes before
 * its samples and its family's samples are together. */
static void parse(const char *text, struct page *pg)
{
    memset(pg, 0, sizeof *pg);
    assert_true(text[0] != '\0');
    assert_true(text[strlen(text) - 1] == '\n');
    struct family *current = NULL;
    for (const char *line = text; *line; line = strchr(line, '\n') + 1) {
        const char *eol = strchr(line, '\n');
        assert_non_null(eol);
        if (strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0) {
            size_t n = name_len(line + 7);
            assert_true(n > 0 && line[7 + n] == ' ');
            struct family *f = family(pg, line + 7, n);
            const char *rest = line + 7 + n + 1;
            assert_true(rest < eol); /* a HELP text or a type, never empty */
            if (line[2] == 'H') {
                f->helps++;
                for (const char *c = rest; c < eol; c++)
                    assert_true(*c != '\\');
            } else {
                f->types++;
                assert_true((size_t)(eol - rest) < sizeof f->type);
                memcpy(f->type, rest, (size_t)(eol - rest));
                assert_int_equal(f->samples, 0); /* TYPE before any sample */
            }
            current = f;
            continue;
        }
        assert_true(line[0] != '#');
        size_t n = name_len(line);
        assert_true(n > 0);
        assert_non_null(current);
        assert_int_equal(strlen(current->name), n); /* a sample of the family just announced */
        assert_memory_equal(current->name, line, n);
        current->samples++;
        const char *v = line + n;
        if (*v == '{') {
            v = strchr(v, '}');
            assert_true(v != NULL && v < eol);
            v++;
        }
        assert_true(*v == ' ');
        char *end;
        strtod(v + 1, &end);
        assert_ptr_equal(end, eol);
    }
}

/* Fill a source with distinct values: field i of each struct holds base+i. */
static void fill(struct app_metrics *am, struct metrics_src *src, bool redis)
{
    memset(am, 0, sizeof *am);
    memset(src, 0, sizeof *src);
    long n = 1000;
    atomic_long *a = (atomic_long *)am;
    for (size_t i = 0; i < sizeof *am / sizeof(atomic_long); i++)
        atomic_store(&a[i], n++);
    src->app = am;
    long *l = (long *)&src->state;
    for (size_t i = 0; i < sizeof src->state / sizeof(long); i++)
        l[i] = n++;
    src->front.connections = n++;
    src->front.accepted = n++;
    l = (long *)&src->held;
    for (size_t i = 0; i < sizeof src->held / sizeof(long); i++)
        l[i] = n++;
    src->has_redis = redis;
    l = (long *)&src->redis; /* its longs, up to the master's address */
    for (size_t i = 0; i < offsetof(struct state_redis_metrics, master) / sizeof(long); i++)
        l[i] = n++;
    src->redis.sentinel = 0;
}

/* fill(), with Sentinels that named the master `master` ("": none yet). */
static void fill_sentinel(struct app_metrics *am, struct metrics_src *src, const char *master)
{
    fill(am, src, true);
    src->redis.sentinel = 1;
    snprintf(src->redis.master, sizeof src->redis.master, "%s", master);
}

static char *render(const struct metrics_src *src)
{
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    assert_int_equal(metrics_render(src, &b), DYNBUF_OK);
    char *s = strdup(dynbuf_ptr(&b));
    dynbuf_free(&b);
    return s;
}

/* Every family of the page of src: one HELP, one TYPE, a sample at least,
 * counters and only they named _total; Redis's only with Redis, and the
 * Sentinels' (kembali_redis_master..., kembali_redis_sentinel_...) only
 * with Sentinels. Returns the page. */
static char *check_src(const struct metrics_src *src)
{
    char *text = render(src);
    struct page pg;
    parse(text, &pg);
    assert_true(pg.n >= 28);
    bool saw_redis = false, saw_sentinel = false;
    for (int i = 0; i < pg.n; i++) {
        struct family *f = &pg.f[i];
        if (f->helps != 1 || f->types != 1 || f->samples < 1)
            print_error("%s: %d HELP, %d TYPE, %d samples\n", f->name, f->helps, f->types, f->samples);
        assert_int_equal(f->helps, 1);
        assert_int_equal(f->types, 1);
        assert_true(f->samples >= 1);
        assert_true(strncmp(f->name, "kembali_", 8) == 0);
        if (strcmp(f->type, "counter") == 0) {
            assert_true(ends_with(f->name, "_total"));
        } else {
            assert_string_equal(f->type, "gauge");
            assert_false(ends_with(f->name, "_total"));
        }
        saw_redis |= strncmp(f->name, "kembali_redis_", 14) == 0;
        saw_sentinel |= strncmp(f->name, "kembali_redis_master", 20) == 0 ||
                        strncmp(f->name, "kembali_redis_sentinel_", 23) == 0;
    }
    assert_int_equal(saw_redis, src->has_redis);
    assert_int_equal(saw_sentinel, src->has_redis && src->redis.sentinel);
    return text;
}

static void check_page(bool redis)
{
    struct app_metrics am;
    struct metrics_src src;
    fill(&am, &src, redis);
    free(check_src(&src));
}

static void test_every_metric_has_help_and_type(void **unused)
{
    (void)unused;
    check_page(false);
    check_page(true);
}

/* With Sentinels, their rows: the master joined as a label (value 1), left
 * out, HELP and TYPE too, before the first join; the counts always. */
static void test_sentinel_rows(void **unused)
{
    (void)unused;
    struct app_metrics am;
    struct metrics_src src;
    fill_sentinel(&am, &src, "192.0.2.7:6380");
    char *text = check_src(&src);
    char want[256];
    assert_non_null(strstr(text, "\n# HELP kembali_redis_master The master (named by the Sentinels) last joined.\n"
                                 "# TYPE kembali_redis_master gauge\n"
                                 "kembali_redis_master{address=\"192.0.2.7:6380\"} 1\n"));
    snprintf(want, sizeof want, "\nkembali_redis_master_changes_total %ld\n", src.redis.master_changes);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof want, "\nkembali_redis_sentinel_asks_total %ld\n", src.redis.sentinel_asks);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof want, "\nkembali_redis_sentinel_failures_total %ld\n", src.redis.sentinel_failures);
    assert_non_null(strstr(text, want));
    free(text);

    fill_sentinel(&am, &src, "");
    text = check_src(&src);
    assert_null(strstr(text, "kembali_redis_master "));
    assert_null(strstr(text, "kembali_redis_master{"));
    assert_non_null(strstr(text, "\nkembali_redis_sentinel_asks_total "));
    free(text);

    src.has_redis = false; /* Sentinels configured, but no Redis part: nothing of them */
    free(check_src(&src));
}

/* The names dashboards and tests use, each with the value of its field. */
static void test_values_from_their_fields(void **unused)
{
    (void)unused;
    struct app_metrics am;
    struct metrics_src src;
    fill(&am, &src, true);
    char *text = render(&src);
    char want[256];
#define HAS(...)                                             \
    do {                                                     \
        snprintf(want, sizeof want, "\n" __VA_ARGS__);       \
        if (strstr(text, want) == NULL)                      \
            print_error("missing: %s", want + 1);            \
        assert_non_null(strstr(text, want));                 \
    } while (0)
    for (int w = 0; w < W_COUNT; w++)
        HAS("kembali_answers_total{status=\"%s\"} %ld\n", word_name((enum word)w), atomic_load(&am.requests[w]));
    for (int k = 0; k <= OUT_NO_ANSWER; k++)
        HAS("kembali_api_reads_total{outcome=\"%s\"} %ld\n", classify_outcome_name((enum outcome_kind)k),
            atomic_load(&am.reads[k]));
    static const char *const reasons[] = {"none", "pace", "retry_after", "key_paused", "host_paused", "budget",
                                          "full", "client"};
    assert_int_equal(sizeof reasons / sizeof reasons[0], WAIT_CLIENT + 1);
    for (int w = 0; w <= WAIT_CLIENT; w++)
        HAS("kembali_checking_answers_total{reason=\"%s\"} %ld\n", reasons[w], atomic_load(&am.checking[w]));
    HAS("kembali_budget_waits_total %ld\n", atomic_load(&am.budget_waits));
    HAS("kembali_json_answers_total %ld\n", atomic_load(&am.json_answers));
    HAS("kembali_held_answers_total %ld\n", atomic_load(&am.held_answered));
    long ms = atomic_load(&am.held_ms);
    HAS("kembali_held_answer_seconds_total %ld.%03ld\n", ms / 1000, ms % 1000);
    atomic_store(&am.held_ms, 12005); /* milliseconds shown as seconds, the thousandths kept */
    free(text);
    text = render(&src);
    HAS("kembali_held_answer_seconds_total 12.005\n");
    HAS("kembali_streamed_pages_total %ld\n", atomic_load(&am.streamed));
    HAS("kembali_streamed_pages_cut_total %ld\n", atomic_load(&am.streamed_cut));
    HAS("kembali_held_requests_max %ld\n", src.held.max_held);
    HAS("kembali_held_requests_per_shop_max %ld\n", src.held.max_held_per_shop);
    HAS("kembali_held_requests_busiest_shop %ld\n", src.held.busiest_shop);
    HAS("kembali_shops_active %ld\n", src.held.shops_active);
    HAS("kembali_host_paused %ld\n", src.state.host_paused);
    HAS("kembali_method_not_allowed_total %ld\n", atomic_load(&am.method_not_allowed));
    HAS("kembali_api_reads_started_total %ld\n", atomic_load(&am.reads_started));
    HAS("kembali_api_connections_total %ld\n", atomic_load(&am.connections));
    HAS("kembali_held_requests %ld\n", atomic_load(&am.held));
    HAS("kembali_held_requests_peak %ld\n", atomic_load(&am.held_peak));
    HAS("kembali_answers_without_wait_total %ld\n", atomic_load(&am.cache_answers));
    HAS("kembali_probe_answers_total %ld\n", atomic_load(&am.probes_refused));
    HAS("kembali_held_cap_answers_total %ld\n", atomic_load(&am.over_cap));
    HAS("kembali_fastcgi_connections %ld\n", src.front.connections);
    HAS("kembali_fastcgi_connections_total %ld\n", src.front.accepted);
    HAS("kembali_state_entries %ld\n", src.state.tx_used);
    HAS("kembali_state_slots %ld\n", src.state.tx_slots);
    HAS("kembali_state_evictions_total %ld\n", src.state.evictions);
    HAS("kembali_state_full_total %ld\n", src.state.full);
    HAS("kembali_reads_reserved %ld\n", src.state.reserved);
    HAS("kembali_last_chance_reads_total %ld\n", src.state.last_chance_reads);
    HAS("kembali_state_recoveries_total %ld\n", src.state.recoveries);
    HAS("kembali_state_repairs_total %ld\n", src.state.repairs);
    HAS("kembali_state_stale_locks_total %ld\n", src.state.stale_locks);
    HAS("kembali_state_keys %ld\n", src.state.key_used);
    HAS("kembali_state_key_slots %ld\n", src.state.key_slots);
    HAS("kembali_state_key_evictions_total %ld\n", src.state.key_evictions);
    HAS("kembali_state_key_full_total %ld\n", src.state.key_full);
    HAS("kembali_clients_blocked %ld\n", src.state.clients_blocked);
    HAS("kembali_client_blocks_total %ld\n", src.state.client_blocks);
    HAS("kembali_client_full_total %ld\n", src.state.client_full);
    HAS("kembali_redis_up %ld\n", src.redis.up);
    HAS("kembali_redis_joins_total %ld\n", src.redis.joins);
    HAS("kembali_redis_leaves_total %ld\n", src.redis.leaves);
    HAS("kembali_redis_round_trips_total %ld\n", src.redis.round_trips);
    HAS("kembali_redis_pings_total %ld\n", src.redis.pings);
    HAS("kembali_redis_claims_total %ld\n", src.redis.claims);
    HAS("kembali_redis_claims_granted_total %ld\n", src.redis.granted);
    HAS("kembali_redis_messages_total %ld\n", src.redis.messages);
    HAS("kembali_redis_written_back_total %ld\n", src.redis.written_back);
    HAS("kembali_redis_seeded_total %ld\n", src.redis.seeded);
#undef HAS
    free(text);
}

/* The shops in use, one sample each per shop row, labelled with the id;
 * none listed: the shop rows are left out, HELP and TYPE too. */
static void test_shop_rows(void **unused)
{
    (void)unused;
    struct app_metrics am;
    struct metrics_src src;
    fill(&am, &src, false);
    char *text = check_src(&src);
    assert_null(strstr(text, "kembali_shop_"));
    free(text);

    const struct metrics_shop shops[] = {
        {.id = "toko-a", .reads = 7, .budget = 120, .paused = 0},
        {.id = "toko_b-2", .reads = 0, .budget = 60, .paused = 1},
    };
    src.shops = shops;
    src.nshops = 2;
    text = check_src(&src);
    assert_non_null(strstr(text, "\n# TYPE kembali_shop_reads_last_minute gauge\n"
                                 "kembali_shop_reads_last_minute{shop=\"toko-a\"} 7\n"
                                 "kembali_shop_reads_last_minute{shop=\"toko_b-2\"} 0\n"));
    assert_non_null(strstr(text, "\nkembali_shop_read_budget{shop=\"toko-a\"} 120\n"
                                 "kembali_shop_read_budget{shop=\"toko_b-2\"} 60\n"));
    assert_non_null(strstr(text, "\nkembali_shop_key_paused{shop=\"toko-a\"} 0\n"
                                 "kembali_shop_key_paused{shop=\"toko_b-2\"} 1\n"));
    free(text);
}

/* METRICS_SHOPS_MAX shops with the longest ids fit the page's ceiling
 * (the front's 1 MiB) with room to spare. */
static void test_most_shops_fit(void **unused)
{
    (void)unused;
    struct app_metrics am;
    struct metrics_src src;
    fill(&am, &src, true);
    static char ids[METRICS_SHOPS_MAX][65];
    static struct metrics_shop shops[METRICS_SHOPS_MAX];
    for (int i = 0; i < METRICS_SHOPS_MAX; i++) {
        snprintf(ids[i], sizeof ids[i], "%064d", i);
        shops[i] = (struct metrics_shop){.id = ids[i], .reads = 300, .budget = 300, .paused = 1};
    }
    src.shops = shops;
    src.nshops = METRICS_SHOPS_MAX;
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    assert_int_equal(metrics_render(&src, &b), DYNBUF_OK);
    assert_true(dynbuf_len(&b) < (1 << 20) / 2);
    dynbuf_free(&b);
}

/* A page that does not fit its buffer is an error, never a cut page. */
static void test_too_small_a_buffer(void **unused)
{
    (void)unused;
    struct app_metrics am;
    struct metrics_src src;
    fill(&am, &src, true);
    struct dynbuf b;
    dynbuf_init(&b, 1000);
    assert_int_equal(metrics_render(&src, &b), DYNBUF_TOO_BIG);
    assert_int_equal(dynbuf_len(&b), 0);
    dynbuf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_metric_has_help_and_type),
        cmocka_unit_test(test_values_from_their_fields),
        cmocka_unit_test(test_sentinel_rows),
        cmocka_unit_test(test_shop_rows),
        cmocka_unit_test(test_most_shops_fit),
        cmocka_unit_test(test_too_small_a_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
