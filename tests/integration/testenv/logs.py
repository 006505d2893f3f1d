"""kembali's ``key=value`` log lines, and Prometheus text."""

from __future__ import annotations

import re


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "0": "\0"}


def parse_log_line(line: str) -> dict:
    """``a=1 msg="x \\"y\\"" b=`` -> {"a": "1", "msg": 'x "y"', "b": "", "_raw": line}.
    Bare words without ``=`` are ignored; ``\\xHH`` and ``\\uHHHH`` escapes are decoded."""
    out: dict = {"_raw": line}
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i].isspace():
            i += 1
        start = i
        while i < n and not line[i].isspace() and line[i] != "=":
            i += 1
        key = line[start:i]
        if i >= n or line[i] != "=":
            continue  # a bare word
        i += 1
        if i < n and line[i] == '"':
            i += 1
            val = []
            while i < n and line[i] != '"':
                c = line[i]
                if c == "\\" and i + 1 < n:
                    e = line[i + 1]
                    if e in _ESCAPES:
                        val.append(_ESCAPES[e])
                        i += 2
                        continue
                    width = {"x": 2, "u": 4}.get(e)
                    if width and re.fullmatch(r"[0-9a-fA-F]{%d}" % width, line[i + 2:i + 2 + width]):
                        val.append(chr(int(line[i + 2:i + 2 + width], 16)))
                        i += 2 + width
                        continue
                    val.append(e)
                    i += 2
                    continue
                val.append(c)
                i += 1
            i += 1  # the closing quote (or the end of an unterminated value)
            value = "".join(val)
        else:
            start = i
            while i < n and not line[i].isspace():
                i += 1
            value = line[start:i]
        if key:
            out[key] = value
    return out


def parse_log(text: str) -> list[dict]:
    return [parse_log_line(l) for l in text.splitlines() if l.strip()]


def _matches(d: dict, match: dict) -> bool:
    return all(k in d and d[k] == (v if isinstance(v, str) else str(v)) for k, v in match.items())


def find_lines(text: str, **match) -> list[dict]:
    """The log lines of ``text`` whose given keys have the given values."""
    return [d for d in parse_log(text) if _matches(d, match)]


_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)")


def parse_metrics(text: str) -> dict:
    """Prometheus text -> {'name{labels}': float} (comments skipped)."""
    out = {}
    for line in text.splitlines():
        m = _METRIC_LINE.match(line)
        if m and not line.startswith("#"):
            try:
                out[m.group(1)] = float(m.group(2))
            except ValueError:
                pass
    return out
