/* plan_lua.h - the budget plan's decisions in Redis's Lua, translated from
 * the C, for the Redis store's scripts (state_redis_lua.c), which must
 * decide as the mapped-file store does.
 *
 * The Lua is not written by hand: contrib/c2lua.py translates plan.c's
 * functions, pace.c's pace_sum, pace_in_episode, pace_wait and
 * pace_next_read, and rules.c's rules_floor, rules_raise, rules_next_read,
 * rules_nf_free, rules_nf_until, rules_held, rules_client_next,
 * rules_client_blocks, rules_budget_free, rules_read_current and
 * rules_read_records into src/plan_lua.inc (`make
 * plan-lua` after editing one of them; tests/layout/check_plan_lua fails
 * while it is behind the C). Each function keeps its C name and
 * parameters: a struct pointer is a table with the struct's fields (the
 * booleans Lua's), an array a table indexed from 0 with its length passed
 * as in C, INT64_MAX and INT64_MIN are math.huge and -math.huge, and
 * plan_may_read() answers PLAN_NO, PLAN_EARLY or PLAN_LAST_CHANCE. */
#ifndef KEMBALI_PLAN_LUA_H
#define KEMBALI_PLAN_LUA_H

#include <stddef.h>

/* A buffer this long holds plan_lua()'s text (test_plan asserts it). */
#define PLAN_LUA_MAX 16384

/* The translated functions, after a line that gives the constants they
 * name their values from the C (no number is typed in the Lua), into buf
 * (NUL-terminated). Returns the length, or -1 when buf is too small.
 * tests/unit/plan_vectors.txt holds the cases the C and the Lua must
 * decide alike (tests/unit/test_plan.c for the C,
 * tests/integration/test_plan_lua.py for the Lua on a real Redis). */
int plan_lua(char *buf, size_t len);

#endif
