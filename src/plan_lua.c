/* plan_lua.c - see plan_lua.h. */
#include "plan_lua.h"

#include <stdio.h>

#include "pace.h"
#include "plan.h"
#include "rules.h"

/* plan_lua_text and the constants it names (PLAN_LUA_CONSTANTS), as
 * contrib/c2lua.py translates them from the C */
#include "plan_lua.inc"

int plan_lua(char *buf, size_t len)
{
#define PLAN_LUA_CONSTANT(c) {#c, (long long)(c)},
    static const struct {
        const char *name;
        long long value;
    } consts[] = {PLAN_LUA_CONSTANTS(PLAN_LUA_CONSTANT)};
#undef PLAN_LUA_CONSTANT
    size_t n_consts = sizeof consts / sizeof consts[0];
    size_t at = 0;
    for (size_t i = 0; i < 2 * n_consts + 1; i++) {
        /* "local A, B = 1, 2\n": the names, then the values */
        int n;
        if (i < n_consts)
            n = snprintf(buf + at, len - at, "%s%s", i == 0 ? "local " : ", ", consts[i].name);
        else if (i < 2 * n_consts)
            n = snprintf(buf + at, len - at, "%s%lld", i == n_consts ? " = " : ", ", consts[i - n_consts].value);
        else
            n = snprintf(buf + at, len - at, "\n%s", plan_lua_text);
        if (n < 0 || (size_t)n >= len - at)
            return -1;
        at += (size_t)n;
    }
    return (int)at;
}
