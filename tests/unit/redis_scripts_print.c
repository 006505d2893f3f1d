/* redis_scripts_print.c - print one of the Redis store's scripts (its text as
 * kembali loads it: the rules' prelude, plan_lua() and the body), for
 * tests/bench/redis_plan.py and tests/integration/test_redis_scripts.py.
 * Usage: redis-scripts claim|finish|tell|held|left|seed */
#include <stdio.h>
#include <string.h>

#include "state_redis_private.h"

int main(int argc, char **argv)
{
    static const char *const names[SCRIPT_N] = {"claim", "finish", "tell", "held", "left", "seed"};
    for (int i = 0; argc == 2 && i < SCRIPT_N; i++) {
        if (strcmp(argv[1], names[i]) != 0)
            continue;
        char *text = state_redis_script_text(i);
        if (text == NULL)
            return 1;
        fputs(text, stdout);
        free(text);
        return 0;
    }
    fprintf(stderr, "usage: redis-scripts claim|finish|tell|held|left|seed\n");
    return 2;
}
