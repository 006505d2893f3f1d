/* config_keys.c - the keys of the configuration file: see config.h. */
#include "config.h"

#include <stddef.h>

#include "stream.h"

#ifndef KEMBALI_TEMPLATES_DIR
#define KEMBALI_TEMPLATES_DIR "/usr/local/share/kembali/templates"
#endif
#ifndef KEMBALI_STATE_DIR
#define KEMBALI_STATE_DIR "/var/lib/kembali"
#endif

#define TOP(n) .name = n, .scope = CONFIG_TOP
#define SHOP(n) .name = n, .scope = CONFIG_SHOP
#define FILLS(field, type) .at = offsetof(struct config, field), .size = sizeof(type)

const struct config_key config_keys[CK_COUNT] = {
    [CK_API_BASE] = {TOP("api_base"), .type = CONFIG_STRING, .def_str = "https://pay.kasera.id",
                     .help = "Kasera's API"},
    [CK_STATE_DIR] = {TOP("state_dir"), .type = CONFIG_STRING, .def_str = KEMBALI_STATE_DIR,
                      .def_doc = "`$localstatedir/lib/kembali`", .help = "where the processes of one host share state"},
    [CK_TEMPLATES_DIR] = {TOP("templates_dir"), .type = CONFIG_STRING, .def_str = KEMBALI_TEMPLATES_DIR,
                          .def_doc = "`$pkgdatadir/templates`", .help = "the pages"},
    [CK_SHOPS] = {TOP("shops"), .type = CONFIG_OBJECTS, .help = "the shops"},
    [CK_SHOPS_DIR] = {TOP("shops_dir"), .type = CONFIG_STRING, .help = "a folder of tenants' shop files"},
    [CK_SCHEDULE_MS] = {TOP("schedule_ms"), .type = CONFIG_LIST, .help = "the waits before each read"},
    [CK_READ_TIMEOUT_MS] = {TOP("read_timeout_ms"), .type = CONFIG_INT, .lo = 100, .hi = 30000,
                            .def = STATE_READ_TIMEOUT_MS_DEFAULT, FILLS(read_timeout_ms, long),
                            .help = "one API read, connect included"},
    [CK_FIRST_PAINT_MS] = {TOP("first_paint_ms"), .type = CONFIG_INT, .lo = STREAM_FIRST_PAINT_MS_MIN,
                           .hi = STREAM_FIRST_PAINT_MS_MAX, .def = STREAM_FIRST_PAINT_MS_DEFAULT,
                           FILLS(first_paint_ms, long), .help = "the streamed page's top goes out by then"},
    [CK_STATE_SLOTS] = {TOP("state_slots"), .type = CONFIG_INT, .lo = 16, .hi = 4194304, .def = STATE_SLOTS_DEFAULT,
                        FILLS(state_slots, int), .help = "transactions tracked at once"},
    [CK_STATE_SLOTS_PER_KEY] = {TOP("state_slots_per_key"), .type = CONFIG_INT, .lo = 1,
                                .def_doc = "`state_slots / 4`", .help = "the most of them one key may take"},
    [CK_READ_PLANNING] = {TOP("read_planning"), .type = CONFIG_BOOL, .def = 1,
                          .help = "plan a budget that cannot pay for every schedule"},
    [CK_AUTH_FAILURES_PER_MINUTE] = {TOP("auth_failures_per_minute"), .type = CONFIG_INT, .lo = RULES_AUTH_FAILS_MIN,
                                     .hi = RULES_AUTH_FAILS_MAX, .def = RULES_AUTH_FAILS_DEFAULT,
                                     FILLS(auth_failures_per_minute, int),
                                     .help = "reads that may end in 401 per host in any 60 s"},
    [CK_KEYS_DIR] = {TOP("keys_dir"), .type = CONFIG_STRING, .help = "the folder every key file lies in"},
    [CK_SHOP_TEMPLATES_ROOT] = {TOP("shop_templates_root"), .type = CONFIG_STRING,
                                .help = "the folder a tenant's templates_dir lies in"},
    [CK_MAX_HELD] = {TOP("max_held"), .type = CONFIG_INT, .lo = 1, .hi = CONFIG_MAX_HELD_MAX,
                     .def = CONFIG_MAX_HELD_DEFAULT, .help = "requests held at once by one process"},
    [CK_MAX_HELD_PER_SHOP] = {TOP("max_held_per_shop"), .type = CONFIG_INT, .lo = 1, .hi = CONFIG_MAX_HELD_MAX,
                              .def_doc = "half of `max_held`", .help = "requests held at once for one shop"},
    [CK_REDIS] = {TOP("redis"), .type = CONFIG_STRING, .help = "the Redis every process shares its state in"},
    [CK_REDIS_PASSWORD_FILE] = {TOP("redis_password_file"), .type = CONFIG_STRING, .help = "the Redis password"},
    [CK_REDIS_SENTINEL_PASSWORD_FILE] = {TOP("redis_sentinel_password_file"), .type = CONFIG_STRING,
                                         .help = "the Sentinels' password"},
    [CK_REDIS_PREFIX] = {TOP("redis_prefix"), .type = CONFIG_STRING, .def_str = "kembali:",
                         .help = "the prefix of every Redis key"},
    [CK_REDIS_HOSTS] = {TOP("redis_hosts"), .type = CONFIG_INT, .lo = 1, .hi = CONFIG_REDIS_HOSTS_MAX, .def = 2,
                        .help = "how many hosts share the keys' budgets"},

    [CK_SHOP_ID] = {SHOP("id"), .type = CONFIG_STRING, .def_doc = "required", .help = "the shop's id"},
    [CK_SHOP_NAME] = {SHOP("name"), .type = CONFIG_STRING, .def_doc = "the id", .help = "shown on the pages"},
    [CK_SHOP_HOSTS] = {SHOP("hosts"), .type = CONFIG_LIST, .def_doc = "`[]`", .help = "the shop's host names"},
    [CK_SHOP_SECRET_KEY_FILE] = {SHOP("secret_key_file"), .type = CONFIG_STRING, .def_doc = "one required",
                                 .help = "the secret key's file"},
    [CK_SHOP_SECRET_KEY_ENV] = {SHOP("secret_key_env"), .type = CONFIG_STRING, .def_doc = "one required",
                                .help = "the secret key's environment variable"},
    [CK_SHOP_NOTIFY_SECRET_FILE] = {SHOP("notify_secret_file"), .type = CONFIG_STRING, .def_doc = "none",
                                    .help = "the secret that signs what the shop tells"},
    [CK_SHOP_SHOP_URL] = {SHOP("shop_url"), .type = CONFIG_STRING, .def_str = "/", .help = "the back-to-shop link"},
    [CK_SHOP_LOCALE] = {SHOP("locale"), .type = CONFIG_STRING, .def_str = "id", .help = "id or en"},
    [CK_SHOP_READ_BUDGET] = {SHOP("read_budget_per_minute"), .type = CONFIG_INT, .lo = 1, .hi = STATE_BUDGET_MAX,
                             .def = 120, .help = "the most reads with this key in any 60 s"},
    [CK_SHOP_CORS_ORIGINS] = {SHOP("cors_origins"), .type = CONFIG_LIST, .def_doc = "none",
                              .help = "origins allowed to read the JSON answer"},
    [CK_SHOP_TEMPLATES_DIR] = {SHOP("templates_dir"), .type = CONFIG_STRING, .def_doc = "the global one",
                               .help = "the shop's own pages"},
    [CK_SHOP_ID_PARAM] = {SHOP("id_param"), .type = CONFIG_STRING, .def_str = "id",
                          .help = "the query parameter carrying the id"},
    [CK_SHOP_PROGRESSIVE] = {SHOP("progressive"), .type = CONFIG_BOOL, .def = 1,
                             .help = "a browser may get the streamed page"},
};
