/* redis_scripts_print.c - print one of the Redis store's scripts (its text as
 * kembali loads it: the rules' prelude, plan_lua(), its keys' locals and the
 * body), or the keys kembali passes it, for tests/bench/redis_plan.py and
 * tests/integration/test_redis_scripts.py.
 * Usage: redis-scripts NAME
 *        redis-scripts keys NAME VPREFIX K ID [TIER...]
 * NAME: claim, finish, tell, held, left or seed. The second form prints
 * the names of the keys the script takes (state_redis_script_keys), one a
 * line, for the API key named K (32 hex in kembali; any word here) under
 * VPREFIX and transaction ID, then those of a client with the TIERs (the
 * claim and the finish only). */
#include <stdio.h>
#include <string.h>

#include "state_redis_private.h"
#include "util.h"

static int script_of(const char *name)
{
    for (int i = 0; i < SCRIPT_N; i++)
        if (strcmp(name, state_redis_script_name(i)) == 0)
            return i;
    return -1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && script_of(argv[1]) >= 0) {
        char *text = state_redis_script_text(script_of(argv[1]));
        if (text == NULL)
            return 1;
        fputs(text, stdout);
        free(text);
        return 0;
    }
    if (argc >= 6 && argc <= 6 + STATE_CLIENT_TIERS && strcmp(argv[1], "keys") == 0 && script_of(argv[2]) >= 0) {
        struct state_redis_id k;
        struct state_redis_client client = {.n = argc - 6};
        util_copy(k.hex, sizeof k.hex, argv[4]);
        for (int t = 0; t < client.n; t++)
            util_copy(client.tier[t].hex, sizeof client.tier[t].hex, argv[6 + t]);
        char names[STATE_REDIS_SCRIPT_KEYS_MAX][STATE_REDIS_KEY_MAX];
        int n = state_redis_script_keys(script_of(argv[2]), argv[3], &k, argv[5], client.n ? &client : NULL, names);
        for (int i = 0; i < n; i++)
            puts(names[i]);
        return 0;
    }
    fprintf(stderr, "usage: redis-scripts claim|finish|tell|held|left|seed\n"
                    "       redis-scripts keys NAME VPREFIX K ID [TIER...]\n");
    return 2;
}
