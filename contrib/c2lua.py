#!/usr/bin/env python3
"""c2lua.py - the budget plan's C, translated into Redis's Lua.

Redis decides a claim across hosts in Lua (src/state_redis_lua.c), and it
must decide as src/plan.c does. The Lua is not written by hand: this
translates plan.c's functions, and the ones of src/pace.c and
src/rules.c the scripts share with the C, into Lua 5.1 and writes them,
as a C string, to src/plan_lua.inc, which plan_lua() (plan_lua.h) gives
the scripts. Edit the C, then run `make plan-lua`; `make check` fails
(tests/layout/check_plan_lua) while src/plan_lua.inc differs from what
the C gives.

The C it takes is a plain subset, and anything else is refused with the
file and line: statements if/else, while, for, return, break, blocks,
declarations and assignments (=, +=, -=, ++, --); expressions of names,
integer numbers, calls, ->, ., [], casts, unary ! and -, the binary
arithmetic, comparison and logical operators, and ?: whose first branch
is a number. Every condition must be a truth value (a comparison, a bool
variable, field or function): Lua holds 0 true. Translated so:

  - a struct pointer is a table with the struct's fields; an array is a
    table indexed from 0, as in C (its length passed, as in C), of Lua's
    booleans for a bool array;
  - `/` truncates, as C's integer division (c_div);
  - INT64_MAX and INT64_MIN are math.huge and -math.huge;
  - a name in capitals is a constant: the Lua takes it as a local that
    plan_lua() writes in from the C (PLAN_LUA_CONSTANTS), so the Lua
    holds no number the C does not give it.

Usage: c2lua.py [--check] TOP_SRCDIR
Exits 0; with --check, 1 when src/plan_lua.inc differs; 2 on a wrong
command line or C outside the subset. Standard library only."""
import os
import re
import sys

# What is translated: (file, the functions taken from it, in Lua's order:
# each after the ones it calls). None: every function in the file.
SOURCES = [
    ("src/pace.c", ["pace_sum", "pace_in_episode", "pace_wait", "pace_next_read"]),
    ("src/rules.c", ["rules_floor", "rules_raise", "rules_next_read", "rules_nf_free", "rules_nf_until",
                     "rules_held", "rules_client_blocked", "rules_client_next", "rules_client_blocks", "rules_budget_free",
                     "rules_read_current", "rules_read_records"]),
    ("src/plan.c", None),
]
# the headers of the structs the translated functions take (their bool
# fields are truth values in the Lua)
HEADERS = ["src/pace.h", "src/plan.h", "src/rules.h"]
OUTPUT = "src/plan_lua.inc"

TYPES = {"int", "int64_t", "bool", "size_t", "long", "unsigned", "const", "struct", "enum"}
LUA_WORDS = {"and", "elseif", "end", "function", "in", "local", "nil", "not", "or", "repeat", "then", "until"}
SPECIAL = {"INT64_MAX": "math.huge", "INT64_MIN": "(-math.huge)", "true": "true", "false": "false"}
C_DIV = ("local function c_div(a, b)\n"
         "  local q = a / b\n"
         "  if q < 0 then return math.ceil(q) end\n"
         "  return math.floor(q)\n"
         "end\n")


class Refused(Exception):
    pass


TOKEN = re.compile(r"\s*(?:(?P<num>\d+)[uUlL]*|(?P<id>[A-Za-z_]\w*)|"
                   r"(?P<op>->|\+\+|--|\+=|-=|\*=|<=|>=|==|!=|&&|\|\||[-+*/%<>=!?:;,(){}\[\].&]))")


def strip_comments(text):
    """text with its comments blanked (newlines kept, for line numbers)."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r"/\*.*?\*/|//[^\n]*", blank, text, flags=re.S)


def tokens(text, where, first_line):
    """[(kind, text, line)] of C text."""
    out, pos, line = [], 0, first_line
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            rest = text[pos:].lstrip()
            if not rest:
                break
            line += text[pos:len(text) - len(rest)].count("\n")
            raise Refused("%s:%d: cannot read %r" % (where, line, rest[:20]))
        line += text[pos:m.start(m.lastgroup)].count("\n")
        out.append((m.lastgroup, m.group(m.lastgroup), line))
        pos = m.end()
    return out


class Func:
    def __init__(self, name, ret, params, body, where, line):
        self.name, self.ret, self.params, self.body, self.where, self.line = name, ret, params, body, where, line


def functions(path, text):
    """{name: Func} of the function definitions in a C file's text."""
    text = strip_comments(text)
    out = {}
    for m in re.finditer(r"^(?P<ret>[A-Za-z_][\w \*]*?)\b(?P<name>\w+)\((?P<params>[^)]*)\)\n\{", text, re.M):
        start = m.end() - 1
        depth, i = 0, start
        while True:
            c = text[i]
            depth += c == "{"
            depth -= c == "}"
            i += 1
            if depth == 0:
                break
        params = []
        for p in m.group("params").split(","):
            p = p.strip()
            if p and p != "void":
                words = re.findall(r"\w+", p)
                params.append((words[-1], "bool" in words[:-1] and "*" not in p, "bool" in words[:-1] and "*" in p))
        line = text.count("\n", 0, start) + 1
        out[m.group("name")] = Func(m.group("name"), m.group("ret").split(), params,
                                    text[start + 1:i - 1], path, line)
    return out


def bool_fields(text):
    """The names of the struct fields declared bool in a header's text."""
    return set(re.findall(r"^\s*bool\s+(\w+);", strip_comments(text), re.M))


class Translator:
    """One function's body, C tokens in, Lua text out."""

    def __init__(self, func, bools, bool_funcs, consts, emitted=None):
        self.f, self.toks, self.i = func, tokens(func.body, func.where, func.line), 0
        self.emitted = emitted if emitted is not None else {}  # name: Func, translated before this one
        self.bools = set(n for n, b, _ in func.params if b)
        self.bool_arrays = set(n for n, _, a in func.params if a)
        self.bool_fields, self.bool_funcs, self.consts = bools, bool_funcs, consts
        self.uses_div = False

    # ---- tokens ----
    def peek(self, k=0):
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ("end", "", self.toks[-1][2] if self.toks else 0)

    def take(self, want=None):
        t = self.peek()
        if want is not None and t[1] != want:
            self.refuse("%r where %r belongs" % (t[1], want))
        self.i += 1
        return t

    def refuse(self, why):
        raise Refused("%s:%d: %s: %s" % (self.f.where, self.peek()[2], self.f.name, why))

    # ---- expressions: (lua text, is a truth value) ----
    BINARY = [("||",), ("&&",), ("==", "!="), ("<", "<=", ">", ">="), ("+", "-"), ("*", "/", "%")]
    LUA_OP = {"||": "or", "&&": "and", "!=": "~="}

    def expr(self):
        cond = self.binary(0)
        if self.peek()[1] != "?":
            return cond
        self.take("?")
        a = self.expr()
        self.take(":")
        b = self.expr()
        self.truth(cond, "?:")
        if a[1] or a[0] in ("nil", "false"):
            self.refuse("the first branch of ?: must be a number (Lua's `and`/`or` would pass over false)")
        self.number(b, "?:")
        return ("(%s and %s or %s)" % (cond[0], a[0], b[0]), False)

    def binary(self, level):
        if level == len(self.BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek()[1] in self.BINARY[level]:
            op = self.take()[1]
            right = self.binary(level + 1)
            if op in ("||", "&&"):
                self.truth(left, op)
                self.truth(right, op)
                left = ("(%s %s %s)" % (left[0], self.LUA_OP[op], right[0]), True)
            elif op == "%":
                self.refuse("% is not translated")
            elif op in ("==", "!="):
                if left[1] != right[1]:
                    self.refuse("%s compares a truth value with a number (Lua's true is not 1)" % op)
                left = ("(%s %s %s)" % (left[0], self.LUA_OP.get(op, op), right[0]), True)
            else:
                self.number(left, op)
                self.number(right, op)
                if op == "/":
                    self.uses_div = True
                    left = ("c_div(%s, %s)" % (left[0], right[0]), False)
                else:
                    left = ("(%s %s %s)" % (left[0], op, right[0]), op in ("<", "<=", ">", ">="))
        return left

    def truth(self, e, where):
        if not e[1]:
            self.refuse("%s takes %s, not a truth value: compare it (Lua holds 0 true)" % (where, e[0]))

    def number(self, e, where):
        if e[1]:
            self.refuse("%s takes %s, a truth value, where C would count it as 0 or 1" % (where, e[0]))

    def typed(self, e, want_truth, where):
        """e where a truth value (want_truth) or a number belongs."""
        if want_truth:
            self.truth(e, where)
        else:
            self.number(e, where)

    def unary(self):
        t = self.peek()
        if t[1] == "!":
            self.take()
            e = self.unary()
            self.truth(e, "!")
            return ("(not %s)" % e[0], True)
        if t[1] == "-":
            self.take()
            e = self.unary()
            self.number(e, "-")
            return ("(-%s)" % e[0], False)
        if t[1] == "(" and self.peek(1)[1] in TYPES:
            while self.take()[1] != ")":
                pass
            return self.unary()
        return self.postfix()

    def postfix(self, target=False):
        t = self.take()
        if t[0] == "num":
            if re.match(r"0\d", t[1]):
                self.i -= 1
                self.refuse("an octal number")
            e = (t[1], False)
        elif t[1] == "(":
            e = self.expr()
            self.take(")")
            e = ("(%s)" % e[0], e[1])
        elif t[0] == "id" and t[1] in SPECIAL:
            e = (SPECIAL[t[1]], t[1] in ("true", "false"))
        elif t[0] == "id" and t[1] in LUA_WORDS:
            self.i -= 1
            self.refuse("%r is a word of Lua's: rename it" % t[1])
        elif t[0] == "id":
            if re.fullmatch(r"[A-Z][A-Z0-9_]*", t[1]):
                self.consts.add(t[1])
            e = (t[1], t[1] in self.bools)
        else:
            self.i -= 1
            self.refuse("unexpected %r" % t[1])
        while True:
            t = self.peek()
            if t[1] == "(":
                callee = self.emitted.get(e[0])
                if callee is None:
                    self.refuse("calls %s, which is not translated before it" % e[0])
                self.take()
                args = []
                while self.peek()[1] != ")":
                    a = self.expr()
                    if len(args) < len(callee.params):
                        _, is_bool, is_array = callee.params[len(args)]
                        if not is_array:
                            self.typed(a, is_bool, "%s's argument %d" % (e[0], len(args) + 1))
                    args.append(a[0])
                    if self.peek()[1] == ",":
                        self.take()
                self.take(")")
                e = ("%s(%s)" % (e[0], ", ".join(args)), e[0] in self.bool_funcs)
            elif t[1] in ("->", "."):
                self.take()
                name = self.take()[1]
                e = ("%s.%s" % (e[0], name), name in self.bool_fields)
            elif t[1] == "[":
                self.take()
                idx = self.expr()
                self.take("]")
                e = ("%s[%s]" % (e[0], idx[0]), e[0] in self.bool_arrays)
            elif t[1] in ("++", "--") and not target:
                self.refuse("++ and -- only as a statement")
            else:
                return e

    # ---- statements: lines of Lua at a depth ----
    def is_decl(self):
        return self.peek()[1] in TYPES

    def decl(self, depth):
        """A declaration's lines (the ; taken by the caller)."""
        btype = False
        while self.peek()[1] in TYPES:
            word = self.take()[1]
            btype = btype or word == "bool"
            if word in ("struct", "enum"):
                self.take()
        lines = []
        while True:
            if self.peek()[1] == "*":
                self.refuse("pointers are not declared")
            name = self.take()[1]
            if name in LUA_WORDS:
                self.refuse("%r is a word of Lua's: rename it" % name)
            if btype:
                self.bools.add(name)
            if self.peek()[1] == "=":
                self.take()
                e = self.expr()
                self.typed(e, btype, "%s's value" % name)
                lines.append("  " * depth + "local %s = %s" % (name, e[0]))
            else:
                lines.append("  " * depth + "local %s" % name)
            if self.peek()[1] != ",":
                return lines
            self.take()

    def simple(self, depth):
        """An expression statement (assignment, ++, call); no ; taken."""
        pad = "  " * depth
        if self.peek()[1] in ("++", "--"):
            op = self.take()[1]
            target = self.postfix(True)[0]
            return [pad + "%s = %s %s 1" % (target, target, op[0])]
        target = self.postfix(True)
        t = self.peek()[1]
        if t in ("++", "--"):
            self.take()
            return [pad + "%s = %s %s 1" % (target[0], target[0], t[0])]
        if t == "=":
            self.take()
            e = self.expr()
            self.typed(e, target[1], "the value of " + target[0])
            return [pad + "%s = %s" % (target[0], e[0])]
        if t in ("+=", "-=", "*="):
            self.take()
            e = self.expr()
            self.number(target, t)
            self.number(e, t)
            return [pad + "%s = %s %s (%s)" % (target[0], target[0], t[0], e[0])]
        if target[0].endswith(")"):
            return [pad + target[0]]
        self.refuse("a statement that does nothing")

    def body(self, depth):
        """A statement that is the body of if, else, while or for: a block's
        statements at depth (the Lua's block is the if's or the loop's)."""
        if self.peek()[1] != "{":
            return self.stmt(depth)
        self.take()
        out = []
        while self.peek()[1] != "}":
            out += self.stmt(depth)
        self.take("}")
        return out

    def stmt(self, depth):
        t = self.peek()
        pad = "  " * depth
        if t[1] == "{":  # a block of its own: a scope of its own
            return [pad + "do"] + self.body(depth + 1) + [pad + "end"]
        if t[1] == "if":
            self.take()
            self.take("(")
            c = self.expr()
            self.truth(c, "if")
            self.take(")")
            out = [pad + "if %s then" % c[0]] + self.body(depth + 1)
            if self.peek()[1] == "else":
                self.take()
                out += [pad + "else"] + self.body(depth + 1)
            return out + [pad + "end"]
        if t[1] == "while":
            self.take()
            self.take("(")
            c = self.expr()
            self.truth(c, "while")
            self.take(")")
            return [pad + "while %s do" % c[0]] + self.body(depth + 1) + [pad + "end"]
        if t[1] == "for":
            self.take()
            self.take("(")
            init = []
            if self.peek()[1] != ";":
                init = self.decl(depth + 1) if self.is_decl() else self.simple(depth + 1)
            self.take(";")
            cond = "true"
            if self.peek()[1] != ";":
                c = self.expr()
                self.truth(c, "for")
                cond = c[0]
            self.take(";")
            step = []
            if self.peek()[1] != ")":
                step = self.simple(depth + 2)
            self.take(")")
            # the body in a scope of its own, so that the step sees the loop's names
            body = self.body(depth + 3)
            return ([pad + "do"] + init + ["  " * (depth + 1) + "while %s do" % cond, "  " * (depth + 2) + "do"] +
                    body + ["  " * (depth + 2) + "end"] + step + ["  " * (depth + 1) + "end", pad + "end"])
        if t[1] == "return":
            self.take()
            if self.peek()[1] == ";":
                self.take()
                return [pad + "do return end"]
            e = self.expr()
            self.typed(e, "bool" in self.f.ret, "%s's answer" % self.f.name)
            self.take(";")
            return [pad + "do return %s end" % e[0]]
        if t[1] == "break":
            self.take()
            self.take(";")
            return [pad + "do break end"]
        if t[1] in ("continue", "goto", "switch", "do"):
            self.refuse("`%s` is not translated (Lua 5.1 has no continue)" % t[1])
        out = self.decl(depth) if self.is_decl() else self.simple(depth)
        self.take(";")
        return out

    def function(self):
        lines = []
        while self.peek()[0] != "end":
            lines += self.stmt(1)
        # a return or a break ends its block in Lua: `do return x end` and
        # `do break end` only where more follows
        for k, line in enumerate(lines):
            m = (re.fullmatch(r"(\s*)do (return) (.*) end", line) or re.fullmatch(r"(\s*)do (return)() end", line)
                 or re.fullmatch(r"(\s*)do (break)() end", line))
            if m:
                nxt = lines[k + 1] if k + 1 < len(lines) else ""
                if k + 1 == len(lines) or re.match(r"\s*(end|else)\b", nxt):
                    lines[k] = m.group(1) + m.group(2) + (" " + m.group(3) if m.group(3) else "")
        params = ", ".join(n for n, _, _ in self.f.params)
        return "local function %s(%s)\n%s\nend\n" % (self.f.name, params, "\n".join(lines))


def translate(top):
    """(the Lua text, the constants it names, sorted)."""
    bools = set()
    for h in HEADERS:
        with open(os.path.join(top, h)) as f:
            bools |= bool_fields(f.read())
    chosen = []
    for path, names in SOURCES:
        with open(os.path.join(top, path)) as f:
            funcs = functions(path, f.read())
        if names is None:
            names = list(funcs)
        for n in names:
            if n not in funcs:
                raise Refused("%s: no function %s" % (path, n))
            chosen.append(funcs[n])
    bool_funcs = {f.name for f in chosen if "bool" in f.ret}
    consts, parts, div, emitted = set(), [], False, {}
    for f in chosen:
        tr = Translator(f, bools, bool_funcs, consts, emitted)
        parts.append(tr.function())
        emitted[f.name] = f
        div = div or tr.uses_div
    return (C_DIV if div else "") + "".join(parts), sorted(consts)


def c_string(text):
    out = []
    for line in text.splitlines(keepends=True):
        out.append('    "%s"' % line.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))
    return "\n".join(out)


def generate(top):
    lua, consts = translate(top)
    return ("/* plan_lua.inc - generated by contrib/c2lua.py from %s: do not edit.\n"
            " * The Lua of plan_lua() (plan_lua.h); `make plan-lua` writes it again. */\n"
            "#define PLAN_LUA_CONSTANTS(X) %s\n\n"
            "static const char plan_lua_text[] =\n%s;\n"
            % (", ".join(p for p, _ in SOURCES), " ".join("X(%s)" % c for c in consts), c_string(lua)))


def main(argv):
    args = argv[1:]
    check = bool(args) and args[0] == "--check"
    if check:
        args = args[1:]
    if len(args) != 1:
        sys.stderr.write("usage: c2lua.py [--check] TOP_SRCDIR\n")
        return 2
    top = args[0]
    try:
        text = generate(top)
    except Refused as e:
        sys.stderr.write("c2lua: %s\n" % e)
        return 2
    out = os.path.join(top, OUTPUT)
    if check:
        try:
            with open(out) as f:
                have = f.read()
        except OSError:
            have = None
        if have != text:
            sys.stderr.write("c2lua: %s is not what %s give: run `make plan-lua`\n"
                             % (OUTPUT, ", ".join(p for p, _ in SOURCES)))
            return 1
        return 0
    with open(out + ".tmp", "w") as f:
        f.write(text)
    os.replace(out + ".tmp", out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
