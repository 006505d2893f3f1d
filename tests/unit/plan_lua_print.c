/* plan_lua_print.c - print plan_lua() (plan.h), the budget plan's Lua (translated from the C),
 * for tests/integration/test_plan_lua.py to run on a real Redis. */
#include <stdio.h>

#include "plan_lua.h"

int main(void)
{
    char buf[PLAN_LUA_MAX];
    int n = plan_lua(buf, sizeof buf);
    if (n < 0) {
        fprintf(stderr, "plan_lua: the buffer is too small\n");
        return 1;
    }
    fputs(buf, stdout);
    return 0;
}
