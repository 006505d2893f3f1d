/* test_config_redis.c - unit tests of src/config_redis.c: the shared
 * state's Redis (its URL forms, Sentinels, prefix, hosts, password file). */
#include "config_fixture.h"

/* A configuration with one good shop and the top-level members `top` (text). */
static struct config *load_top(const char *top)
{
    return load_fmt(HEAD "%s, \"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/key_b\"}]}", top, g_dir);
}

/* load_top with "redis": url; the load succeeds. */
static struct config *load_redis_ok(const char *url)
{
    char top[1000];
    snprintf(top, sizeof top, "\"redis\": \"%s\"", url);
    return expect_ok(load_top(top));
}

/* load_top with "redis": url; refused, the message names redis and `also`. */
static void expect_redis_error(const char *url, const char *also)
{
    char top[1000];
    snprintf(top, sizeof top, "\"redis\": \"%s\"", url);
    expect_error(load_top(top), g_cfg, "redis: ", also);
}

static void expect_address(const struct config_redis *r, const char *want)
{
    char buf[400];
    config_redis_address(r, buf, sizeof buf);
    assert_string_equal(buf, want);
}

/* load_top with redis and redis_password_file = g_dir/rel */
static struct config *load_password(const char *rel)
{
    char top[600];
    snprintf(top, sizeof top, "\"redis\": \"redis://127.0.0.1:6379\", \"redis_password_file\": \"%s/%s\"", g_dir,
             rel);
    return load_top(top);
}

static void test_redis_absent(void **unused)
{
    (void)unused;
    struct config *c = expect_ok(load_top("\"read_planning\": true"));
    assert_false(c->redis.on);
    assert_null(c->redis.password);
    assert_string_equal(c->redis.prefix, "kembali:");
    assert_int_equal(c->redis.hosts, 2);
    expect_address(&c->redis, "-");
    config_unref(c);
    /* null is absent */
    c = expect_ok(load_top("\"redis\": null"));
    assert_false(c->redis.on);
    config_unref(c);
}

static void test_redis_tcp_forms(void **unused)
{
    (void)unused;
    struct config *c = load_redis_ok("redis://127.0.0.1:6379");
    assert_true(c->redis.on);
    assert_false(c->redis.unix_socket);
    assert_string_equal(c->redis.host, "127.0.0.1");
    assert_int_equal(c->redis.port, 6379);
    assert_int_equal(c->redis.db, 0);
    assert_null(c->redis.password);
    assert_string_equal(c->redis.prefix, "kembali:");
    assert_int_equal(c->redis.hosts, 2);
    expect_address(&c->redis, "redis://127.0.0.1:6379");
    config_unref(c);

    c = load_redis_ok("redis://Redis-1.internal_b.example:6380/15");
    assert_string_equal(c->redis.host, "Redis-1.internal_b.example");
    assert_int_equal(c->redis.port, 6380);
    assert_int_equal(c->redis.db, 15);
    expect_address(&c->redis, "redis://Redis-1.internal_b.example:6380/15");
    config_unref(c);

    /* IPv6 in brackets, kept without them (as getaddrinfo takes it) */
    c = load_redis_ok("redis://[::1]:1/0");
    assert_string_equal(c->redis.host, "::1");
    assert_int_equal(c->redis.port, 1);
    assert_int_equal(c->redis.db, 0);
    expect_address(&c->redis, "redis://[::1]:1");
    config_unref(c);

    c = load_redis_ok("redis://[2001:db8::7]:65535/123456789");
    assert_string_equal(c->redis.host, "2001:db8::7");
    assert_int_equal(c->redis.port, 65535);
    assert_int_equal(c->redis.db, 123456789);
    expect_address(&c->redis, "redis://[2001:db8::7]:65535/123456789");
    config_unref(c);

    c = load_redis_ok("redis://localhost:06379");
    assert_string_equal(c->redis.host, "localhost");
    assert_int_equal(c->redis.port, 6379);
    config_unref(c);

    /* a short buffer: cut, terminated */
    c = load_redis_ok("redis://127.0.0.1:6379/2");
    char small[12];
    memset(small, 'x', sizeof small);
    config_redis_address(&c->redis, small, sizeof small);
    assert_string_equal(small, "redis://127");
    config_unref(c);
}

static void test_redis_unix_forms(void **unused)
{
    (void)unused;
    struct config *c = load_redis_ok("unix:///run/redis/redis-server.sock");
    assert_true(c->redis.on);
    assert_true(c->redis.unix_socket);
    assert_string_equal(c->redis.path, "/run/redis/redis-server.sock");
    assert_int_equal(c->redis.db, 0);
    expect_address(&c->redis, "unix:///run/redis/redis-server.sock");
    config_unref(c);

    c = load_redis_ok("unix:///tmp/r.sock?db=7");
    assert_string_equal(c->redis.path, "/tmp/r.sock");
    assert_int_equal(c->redis.db, 7);
    expect_address(&c->redis, "unix:///tmp/r.sock?db=7");
    config_unref(c);

    /* the longest path a Unix socket takes: 107 bytes */
    char url[200] = "unix://";
    size_t n = strlen(url);
    url[n++] = '/';
    while (n < 7 + 107)
        url[n++] = 'p';
    url[n] = '\0';
    c = load_redis_ok(url);
    assert_int_equal(strlen(c->redis.path), 107);
    config_unref(c);
    strcat(url, "p");
    expect_redis_error(url, "longer than 107 bytes");
}

static void test_redis_refused_urls(void **unused)
{
    (void)unused;
    static const struct {
        const char *url, *why;
    } cases[] = {
        {"http://127.0.0.1:6379", "must start with redis://, unix:// or redis-sentinel://"},
        {"127.0.0.1:6379", "must start with redis://, unix:// or redis-sentinel://"},
        {"REDIS://127.0.0.1:6379", "must start with redis://, unix:// or redis-sentinel://"},
        {"rediss://127.0.0.1:6379", "TLS (rediss://) is not supported"},
        {"redis://127.0.0.1", "the port is missing"},
        {"redis://127.0.0.1:", "the port is missing"},
        {"redis://127.0.0.1:/1", "the port is missing"},
        {"redis://127.0.0.1/1", "the port is missing"},
        {"redis://[::1]", "the port is missing"},
        {"redis://:6379", "the host is missing"},
        {"redis://", "the host is missing"},
        {"redis://127.0.0.1:0", "the port 0 is out of range (1-65535)"},
        {"redis://127.0.0.1:65536", "the port 65536 is out of range (1-65535)"},
        {"redis://127.0.0.1:99999999999999999999", "out of range (1-65535)"},
        {"redis://127.0.0.1:63a9", "the port \"63a9\" is not a number"},
        {"redis://127.0.0.1:-1", "the port \"-1\" is not a number"},
        {"redis://127.0.0.1:6379/x", "the db \"x\" after the port is not a number"},
        {"redis://127.0.0.1:6379/", "the db \"\" after the port is not a number"},
        {"redis://127.0.0.1:6379/-1", "the db \"-1\" after the port is not a number"},
        {"redis://127.0.0.1:6379/1/2", "the db \"1/2\" after the port is not a number"},
        {"redis://127.0.0.1:6379/1234567890", "is not a number"},
        {"redis://127.0.0.1:6379?db=1", "\"?db=1\" after the port is not accepted"},
        {"redis://127.0.0.1:6379#x", "after the port is not accepted"},
        {"redis://[::1:6379", "IPv6 address in brackets is not closed"},
        {"redis://[]:6379", "IPv6 address in brackets"},
        {"redis://[zz::1]:6379", "\"[zz::1]\" is not an IPv6 address"},
        {"redis://::1:6379", "the host is missing"},
        {"redis://a!b:6379", "the host \"a!b\" is not a host name"},
        {"redis://a b:6379", "must not contain spaces"},
        {"redis://a:6379\\n", "control characters"},
        {"unix://run/redis.sock", "the socket's path must be absolute"},
        {"unix://", "the socket's path must be absolute"},
        {"unix:///tmp/r.sock?db=x", "the db \"x\" is not a number"},
        {"unix:///tmp/r.sock?db=", "the db \"\" is not a number"},
        {"unix:///tmp/r.sock?db=1&x=2", "the db \"1&x=2\" is not a number"},
        {"unix:///tmp/r.sock?timeout=1", "the only query parameter is db"},
        {"unix:///tmp/r.sock#x", "fragment"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_redis_error(cases[i].url, cases[i].why);

    /* a password in the URL is refused without being quoted */
    expect_redis_error("redis://:hunter2@127.0.0.1:6379", "give the password in redis_password_file");
    assert_null(strstr(g_err, "hunter2"));
    expect_redis_error("redis://user:hunter2@127.0.0.1:6379/0", "user or password");
    assert_null(strstr(g_err, "hunter2"));

    /* not a string */
    expect_error(load_top("\"redis\": 6379"), g_cfg, "redis: ", "must be a non-empty string");
    expect_error(load_top("\"redis\": \"\""), g_cfg, "redis: ", "must be a non-empty string");
    expect_error(load_top("\"redis\": [\"redis://127.0.0.1:6379\"]"), g_cfg, "redis: ", "non-empty string");
}

static void test_redis_sentinel_forms(void **unused)
{
    (void)unused;
    struct config *c = load_redis_ok("redis-sentinel://127.0.0.1:26379/mymaster");
    assert_true(c->redis.on);
    assert_true(c->redis.sentinel);
    assert_false(c->redis.unix_socket);
    assert_int_equal(c->redis.nsentinels, 1);
    assert_string_equal(c->redis.sentinels[0].host, "127.0.0.1");
    assert_int_equal(c->redis.sentinels[0].port, 26379);
    assert_string_equal(c->redis.master, "mymaster");
    assert_int_equal(c->redis.db, 0);
    assert_null(c->redis.sentinel_password);
    expect_address(&c->redis, "redis-sentinel://127.0.0.1:26379/mymaster");
    config_unref(c);

    c = load_redis_ok("redis-sentinel://s1.example:26379,[::1]:26380,10.0.0.3:1/Shop_m-1.a:b?db=3");
    assert_int_equal(c->redis.nsentinels, 3);
    assert_string_equal(c->redis.sentinels[0].host, "s1.example");
    assert_string_equal(c->redis.sentinels[1].host, "::1");
    assert_int_equal(c->redis.sentinels[1].port, 26380);
    assert_string_equal(c->redis.sentinels[2].host, "10.0.0.3");
    assert_int_equal(c->redis.sentinels[2].port, 1);
    assert_string_equal(c->redis.master, "Shop_m-1.a:b");
    assert_int_equal(c->redis.db, 3);
    expect_address(&c->redis, "redis-sentinel://s1.example:26379,[::1]:26380,10.0.0.3:1/Shop_m-1.a:b?db=3");
    config_unref(c);

    /* the most Sentinels, and the longest master name */
    char url[800], name[80];
    memset(name, 'n', CONFIG_REDIS_MASTER_MAX);
    name[CONFIG_REDIS_MASTER_MAX] = '\0';
    int n = snprintf(url, sizeof url, "redis-sentinel://");
    for (int i = 0; i < CONFIG_REDIS_SENTINELS_MAX; i++)
        n += snprintf(url + n, sizeof url - (size_t)n, "%s127.0.0.%d:%d", i ? "," : "", i + 1, 26379 + i);
    snprintf(url + n, sizeof url - (size_t)n, "/%s", name);
    c = load_redis_ok(url);
    assert_int_equal(c->redis.nsentinels, CONFIG_REDIS_SENTINELS_MAX);
    assert_int_equal(c->redis.sentinels[CONFIG_REDIS_SENTINELS_MAX - 1].port, 26379 + CONFIG_REDIS_SENTINELS_MAX - 1);
    assert_string_equal(c->redis.master, name);
    config_unref(c);
    /* one more of each: refused */
    snprintf(url + n, sizeof url - (size_t)n, "/%sn", name);
    expect_redis_error(url, "the master's name is longer than 64 characters");
    snprintf(url + n, sizeof url - (size_t)n, ",127.0.0.9:1/m");
    expect_redis_error(url, "more than 8 Sentinels");
}

static void test_redis_sentinel_refused(void **unused)
{
    (void)unused;
    static const struct {
        const char *url, *why;
    } cases[] = {
        {"redis-sentinel://", "a Sentinel's HOST:PORT is missing"},
        {"redis-sentinel:///m", "a Sentinel's HOST:PORT is missing"},
        {"redis-sentinel://127.0.0.1:26379,/m", "a Sentinel's HOST:PORT is missing"},
        {"redis-sentinel://,127.0.0.1:26379/m", "a Sentinel's HOST:PORT is missing"},
        {"redis-sentinel://127.0.0.1/m", "the port is missing after \"127.0.0.1\""},
        {"redis-sentinel://127.0.0.1:26379,s2/m", "the port is missing after \"s2\""},
        {"redis-sentinel://127.0.0.1:26379,s2:x/m", "the port \"x\" is not a number"},
        {"redis-sentinel://127.0.0.1:0/m", "the port 0 is out of range"},
        {"redis-sentinel://[::1/m", "IPv6 address in brackets is not closed"},
        {"redis-sentinel://a!b:1/m", "the host \"a!b\" is not a host name"},
        {"redis-sentinel://127.0.0.1:26379", "the master's name is missing"},
        {"redis-sentinel://127.0.0.1:26379/", "the master's name is missing"},
        {"redis-sentinel://127.0.0.1:26379/?db=1", "the master's name is missing"},
        {"redis-sentinel://127.0.0.1:26379?db=1", "the master's name is missing"},
        {"redis-sentinel://127.0.0.1:26379/my/master", "the master's name \"my/master\" may only hold"},
        {"redis-sentinel://127.0.0.1:26379/m?db=x", "the db \"x\" is not a number"},
        {"redis-sentinel://127.0.0.1:26379/m?db=", "the db \"\" is not a number"},
        {"redis-sentinel://127.0.0.1:26379/m?timeout=1", "the only query parameter is db"},
        {"redis-sentinel://127.0.0.1:26379/m#x", "fragment"},
        {"redis-sentinel://127.0.0.1:26379 /m", "must not contain spaces"},
        {"Redis-Sentinel://127.0.0.1:26379/m", "must start with redis://, unix:// or redis-sentinel://"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_redis_error(cases[i].url, cases[i].why);
    /* a password in the URL is refused without being quoted */
    expect_redis_error("redis-sentinel://:hunter2@127.0.0.1:26379/m", "redis_sentinel_password_file");
    assert_null(strstr(g_err, "hunter2"));
}

static void test_redis_sentinel_password_file(void **unused)
{
    (void)unused;
    char top[700];
    put_file("redis_pw", "master-pw\n");
    put_file("sentinel_pw", " sentinel pw \n");
    snprintf(top, sizeof top,
             "\"redis\": \"redis-sentinel://127.0.0.1:26379/m\", \"redis_password_file\": \"%s/redis_pw\", "
             "\"redis_sentinel_password_file\": \"%s/sentinel_pw\"", g_dir, g_dir);
    struct config *c = expect_ok(load_top(top));
    assert_string_equal(c->redis.password, "master-pw");
    assert_string_equal(c->redis.sentinel_password, "sentinel pw");
    config_unref(c);
    /* the same rules as redis_password_file: a control character, a missing file */
    put_file("sentinel_pw", "zqx\001word\n");
    expect_error(load_top(top), g_cfg, "redis_sentinel_password_file", "without control characters");
    assert_null(strstr(g_err, "zqx"));
    snprintf(top, sizeof top,
             "\"redis\": \"redis-sentinel://127.0.0.1:26379/m\", \"redis_sentinel_password_file\": \"%s/nope_pw\"",
             g_dir);
    expect_error(load_top(top), g_cfg, "redis_sentinel_password_file", "nope_pw");
    /* without Sentinels, or without redis: refused */
    put_file("sentinel_pw", "pw\n");
    snprintf(top, sizeof top,
             "\"redis\": \"redis://127.0.0.1:6379\", \"redis_sentinel_password_file\": \"%s/sentinel_pw\"", g_dir);
    expect_error(load_top(top), g_cfg, "redis_sentinel_password_file", "redis names no Sentinels");
    snprintf(top, sizeof top, "\"redis_sentinel_password_file\": \"%s/sentinel_pw\"", g_dir);
    expect_error(load_top(top), g_cfg, "redis_sentinel_password_file", "is set but redis is not");
}

static void test_redis_prefix(void **unused)
{
    (void)unused;
    struct config *c = expect_ok(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"Shop_2-a.b:\""));
    assert_string_equal(c->redis.prefix, "Shop_2-a.b:");
    config_unref(c);

    char top[400], prefix[70];
    memset(prefix, 'p', 64);
    prefix[64] = '\0';
    snprintf(top, sizeof top, "\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"%s\"", prefix);
    c = expect_ok(load_top(top));
    assert_string_equal(c->redis.prefix, prefix);
    config_unref(c);
    strcat(prefix, "p");
    snprintf(top, sizeof top, "\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"%s\"", prefix);
    expect_error(load_top(top), g_cfg, "redis_prefix", "is 65 characters long: at most 64");

    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"kembali/\""), g_cfg,
                 "redis_prefix", "the character '/' (at 8) is not allowed");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"a b\""), g_cfg,
                 "redis_prefix", "a space (at 2) is not allowed");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"k\\u00e9\""), g_cfg,
                 "redis_prefix", "the byte 0xc3 (at 2) is not allowed");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"k*\""), g_cfg,
                 "redis_prefix", "only A-Z a-z 0-9 : _ - .");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"\""), g_cfg,
                 "redis_prefix", "non-empty string");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": 1"), g_cfg,
                 "redis_prefix", "non-empty string");
}

static void test_redis_hosts(void **unused)
{
    (void)unused;
    struct config *c = expect_ok(load_top("\"redis\": \"unix:///tmp/r.sock\", \"redis_hosts\": 1"));
    assert_int_equal(c->redis.hosts, 1);
    config_unref(c);
    c = expect_ok(load_top("\"redis\": \"unix:///tmp/r.sock\", \"redis_hosts\": 64"));
    assert_int_equal(c->redis.hosts, CONFIG_REDIS_HOSTS_MAX);
    config_unref(c);
    static const char *const bad[] = {"0", "65", "-1", "\"2\"", "2.5", "true"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char top[200];
        snprintf(top, sizeof top, "\"redis\": \"unix:///tmp/r.sock\", \"redis_hosts\": %s", bad[i]);
        expect_error(load_top(top), g_cfg, "redis_hosts", "must be an integer from 1 to 64");
    }
}

/* redis_password_file, redis_prefix and redis_hosts mean nothing without redis */
static void test_redis_keys_need_redis(void **unused)
{
    (void)unused;
    char top[600];
    snprintf(top, sizeof top, "\"redis_password_file\": \"%s/key_b\"", g_dir);
    expect_error(load_top(top), g_cfg, "redis_password_file", "is set but redis is not");
    expect_error(load_top("\"redis_prefix\": \"x:\""), g_cfg, "redis_prefix", "is set but redis is not");
    expect_error(load_top("\"redis_hosts\": 3"), g_cfg, "redis_hosts", "is set but redis is not");
    expect_error(load_top("\"redis\": null, \"redis_hosts\": 3"), g_cfg, "redis_hosts", "is set but redis is not");
    /* all three named at once */
    snprintf(top, sizeof top, "\"redis_password_file\": \"%s/key_b\", \"redis_prefix\": \"x:\", \"redis_hosts\": 3",
             g_dir);
    expect_error(load_top(top), g_cfg, "redis_password_file", "is set but redis is not");
    assert_non_null(strstr(g_err, "redis_prefix: is set"));
    assert_non_null(strstr(g_err, "redis_hosts: is set"));
    assert_null(strstr(g_err, "sk_test_bbb"));
}

static void test_redis_password_file(void **unused)
{
    (void)unused;
    /* the first line, trimmed; spaces inside are the password's */
    put_file("redis_pw", " \tpass word:x \t\r\nsecond line\n");
    struct config *c = expect_ok(load_password("redis_pw"));
    assert_string_equal(c->redis.password, "pass word:x");
    config_unref(c);
    put_file("redis_pw", "no-newline");
    c = expect_ok(load_password("redis_pw"));
    assert_string_equal(c->redis.password, "no-newline");
    config_unref(c);

    /* the longest: 512 bytes */
    char big[700];
    memset(big, 'w', 512);
    big[512] = '\n';
    big[513] = '\0';
    put_file("redis_pw", big);
    c = expect_ok(load_password("redis_pw"));
    assert_int_equal(strlen(c->redis.password), CONFIG_REDIS_PASSWORD_MAX);
    config_unref(c);
    /* longer: refused, never quoted */
    memset(big, 'w', 520);
    big[520] = '\n';
    big[521] = '\0';
    put_file("redis_pw", big);
    expect_error(load_password("redis_pw"), g_cfg, "redis_password_file", "must be 1-512 bytes");
    assert_null(strstr(g_err, "wwwwwwww"));
    memset(big, 'w', 650);
    big[650] = '\0';
    put_file("redis_pw", big);
    expect_error(load_password("redis_pw"), g_cfg, "redis_password_file", "longer than a password can be");
    assert_null(strstr(g_err, "wwwwwwww"));

    /* empty, blank, a control character */
    put_file("redis_pw", "");
    expect_error(load_password("redis_pw"), g_cfg, "redis_password_file", "is empty");
    put_file("redis_pw", "  \t\n");
    expect_error(load_password("redis_pw"), g_cfg, "redis_password_file", "must be 1-512 bytes");
    put_file("redis_pw", "zqx\001word\n");
    expect_error(load_password("redis_pw"), g_cfg, "redis_password_file", "without control characters");
    assert_null(strstr(g_err, "zqx"));

    /* missing: the message names the file */
    expect_error(load_password("no_such_password"), g_cfg, "redis_password_file", "no_such_password");
    /* not a regular file */
    expect_error(load_password(""), g_cfg, "redis_password_file", "is not a regular file");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_password_file\": \"\""), g_cfg,
                 "redis_password_file", "non-empty string");
}

/* The password file follows the key files' rules: others may not read it,
 * group and others may not write it; the message names the file. */
static void test_redis_password_file_modes(void **unused)
{
    (void)unused;
    const struct {
        mode_t mode;
        bool ok;
    } cases[] = {{0644, false}, {0660, false}, {0602, false}, {0604, false}, {0620, false}, {0666, false},
                 {0600, true}, {0640, true}, {0400, true}, {0440, true}};
    char path[512];
    snprintf(path, sizeof path, "%s/redis_pw_mode", g_dir);
    put_file("redis_pw_mode", "pw-mode-secret\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(chmod(path, cases[i].mode), 0);
        struct config *c = load_password("redis_pw_mode");
        if (cases[i].ok != (c != NULL))
            print_error("mode %04o: %s (%s)\n", (unsigned)cases[i].mode, c ? "accepted" : "refused", g_err);
        if (cases[i].ok) {
            assert_non_null(c);
            assert_string_equal(c->redis.password, "pw-mode-secret");
            config_unref(c);
        } else {
            expect_error(c, g_cfg, "redis_password_file", path);
            assert_non_null(strstr(g_err, "a password file must not be readable by others"));
            assert_null(strstr(g_err, "pw-mode-secret"));
        }
    }
    /* a FIFO is refused, never waited on */
    snprintf(path, sizeof path, "%s/redis_pw_fifo", g_dir);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    expect_error(load_password("redis_pw_fifo"), g_cfg, "redis_password_file", "not a regular file");
}

/* keys_dir confines the shops' keys, not the operator's Redis password */
static void test_redis_password_outside_keys_dir(void **unused)
{
    (void)unused;
    make_dir("rkeys");
    put_file("rkeys/key", "sk_test_rkeys\n");
    put_file("redis_pw_out", "outside-pw\n");
    struct config *c = expect_ok(load_fmt(
        HEAD "\"keys_dir\": \"%s/rkeys\", \"redis\": \"unix:///tmp/r.sock?db=1\", "
             "\"redis_password_file\": \"%s/redis_pw_out\", "
             "\"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/rkeys/key\"}]}",
        g_dir, g_dir, g_dir));
    assert_string_equal(c->redis.password, "outside-pw");
    assert_string_equal(c->shops[0].secret, "sk_test_rkeys");
    config_unref(c);
}

/* Every other error of a configuration with a password: the password is
 * never in the messages. */
static void test_redis_password_never_in_errors(void **unused)
{
    (void)unused;
    put_file("redis_pw_quiet", "quiet-password-42\n");
    struct config *c = load_fmt(HEAD "\"redis\": \"redis://127.0.0.1:0\", \"redis_password_file\": \"%s/redis_pw_quiet\", "
                                     "\"redis_prefix\": \"a b\", \"redis_hosts\": 0, \"colour\": 1, "
                                     "\"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/key_b\"}]}",
                                g_dir, g_dir);
    expect_error(c, g_cfg, "redis: the port 0 is out of range", NULL);
    assert_non_null(strstr(g_err, "redis_prefix"));
    assert_non_null(strstr(g_err, "redis_hosts"));
    assert_non_null(strstr(g_err, "colour"));
    assert_null(strstr(g_err, "quiet-password"));
}

/* A reload reads the password (and the rest) again; the serving
 * configuration keeps its own. */
static void test_redis_reload_reads_again(void **unused)
{
    (void)unused;
    put_file("redis_pw_reload", "first-pw\n");
    struct config *c1 = expect_ok(load_fmt(
        HEAD "\"redis\": \"redis://127.0.0.1:6379/1\", \"redis_password_file\": \"%s/redis_pw_reload\", "
             "\"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/key_b\"}]}",
        g_dir, g_dir));
    assert_string_equal(c1->redis.password, "first-pw");
    put_file("redis_pw_reload", "second-pw\n");
    FILE *f = fopen(g_cfg, "w");
    assert_non_null(f);
    fprintf(f, HEAD "\"redis\": \"unix:///tmp/r2.sock?db=2\", \"redis_password_file\": \"%s/redis_pw_reload\", "
                    "\"redis_prefix\": \"k2:\", \"redis_hosts\": 5, "
                    "\"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/key_b\"}]}",
            g_dir, g_dir);
    assert_int_equal(fclose(f), 0);
    struct config *c2 = expect_ok(config_reload(g_cfg, c1, g_err, sizeof g_err));
    assert_string_equal(c2->redis.password, "second-pw");
    assert_true(c2->redis.unix_socket);
    assert_string_equal(c2->redis.path, "/tmp/r2.sock");
    assert_int_equal(c2->redis.db, 2);
    assert_string_equal(c2->redis.prefix, "k2:");
    assert_int_equal(c2->redis.hosts, 5);
    assert_string_equal(c1->redis.password, "first-pw");
    assert_false(c1->redis.unix_socket);
    config_unref(c1);
    /* and without redis again: no password kept */
    f = fopen(g_cfg, "w");
    assert_non_null(f);
    fprintf(f, HEAD "\"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/key_b\"}]}", g_dir);
    assert_int_equal(fclose(f), 0);
    struct config *c3 = expect_ok(config_reload(g_cfg, c2, g_err, sizeof g_err));
    assert_false(c3->redis.on);
    assert_null(c3->redis.password);
    config_unref(c2);
    config_unref(c3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redis_absent),
        cmocka_unit_test(test_redis_tcp_forms),
        cmocka_unit_test(test_redis_unix_forms),
        cmocka_unit_test(test_redis_refused_urls),
        cmocka_unit_test(test_redis_sentinel_forms),
        cmocka_unit_test(test_redis_sentinel_refused),
        cmocka_unit_test(test_redis_sentinel_password_file),
        cmocka_unit_test(test_redis_prefix),
        cmocka_unit_test(test_redis_hosts),
        cmocka_unit_test(test_redis_keys_need_redis),
        cmocka_unit_test(test_redis_password_file),
        cmocka_unit_test(test_redis_password_file_modes),
        cmocka_unit_test(test_redis_password_outside_keys_dir),
        cmocka_unit_test(test_redis_password_never_in_errors),
        cmocka_unit_test(test_redis_reload_reads_again),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
