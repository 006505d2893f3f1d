#!/usr/bin/env python3
"""templates.py - the pages, assembled from one chrome and a card per page.

templates/chrome/page.html is everything the pages share (the head, the
stylesheet, the footer), with marker lines: `@lang@` and `@footer@` take
the locale's words, `@title@` (inside <title>) the page's title, a line
`@style@` the page's own style rules and a line `@card@` its card.
templates/chrome/LOC/locale.txt gives a locale's words (`@lang CODE`,
`@footer TEXT`); templates/chrome/LOC/WORD.html is the page WORD's own
part: header lines `@title TEXT` and `@style RULE` (any number), then the
card; templates/chrome/WORD.css, when there is one, holds style rules of the
page WORD in every locale (they come before its @style lines). The pages kembali serves, templates/LOC/WORD.html, are assembled from
these and kept in the tree (what `make install` installs, what a tenant
copies to start a page of its own). Edit the chrome, a locale or a card,
then run `make templates`; `make check` fails (tests/layout/check_templates)
while a page differs from what they give.

Usage: templates.py [--check] TOP_SRCDIR
Exits 0; with --check, 1 and the pages that differ; 2 on a wrong command
line. Standard library only."""
import os
import sys


def headers(text, names):
    """The leading `@NAME VALUE` lines of text whose NAME is in names, as
    {NAME: [VALUE...]}, and the rest of text's lines."""
    got = {n: [] for n in names}
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith("@") and lines[i][1:].split(" ", 1)[0] in names:
        name, value = lines[i][1:].split(" ", 1)
        got[name].append(value)
        i += 1
    return got, lines[i:]


def assemble(chrome, locale, card, css=""):
    """The page from the chrome's, its locale's and its card's texts, and
    the style rules its word has in every locale (css)."""
    loc, _ = headers(locale, ("lang", "footer"))
    own, body = headers(card, ("title", "style"))
    own["style"] = css.splitlines(keepends=True) + own["style"]
    if len(loc["lang"]) != 1 or len(loc["footer"]) != 1:
        raise ValueError("a locale needs one @lang and one @footer line")
    if len(own["title"]) != 1:
        raise ValueError("a card needs one @title line")
    words = {"@lang@": loc["lang"][0].rstrip("\n"), "@footer@": loc["footer"][0].rstrip("\n"),
             "@title@": own["title"][0].rstrip("\n")}
    out = []
    for line in chrome.splitlines(keepends=True):
        if line == "@style@\n":
            out += own["style"]
        elif line == "@card@\n":
            out += body
        else:
            for marker, value in words.items():
                line = line.replace(marker, value)
            out.append(line)
    return "".join(out)


def pages(top):
    """[(page path, assembled text)] for every card of every locale."""
    base = os.path.join(top, "templates", "chrome")

    def read(*parts):
        with open(os.path.join(base, *parts), encoding="utf-8") as fh:
            return fh.read()

    chrome = read("page.html")
    out = []
    for loc in sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d))):
        locale = read(loc, "locale.txt")
        for card in sorted(f for f in os.listdir(os.path.join(base, loc)) if f.endswith(".html")):
            css = card[:-len(".html")] + ".css"
            css = read(css) if os.path.exists(os.path.join(base, css)) else ""
            out.append((os.path.join(top, "templates", loc, card), assemble(chrome, locale, read(loc, card), css)))
    return out


def main(argv):
    check = "--check" in argv
    args = [a for a in argv[1:] if a != "--check"]
    if len(args) != 1:
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 2
    bad = []
    for path, text in pages(args[0]):
        try:
            with open(path, encoding="utf-8") as fh:
                same = fh.read() == text
        except FileNotFoundError:
            same = False
        if same:
            continue
        if check:
            bad.append(path)
        else:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
    for p in bad:
        print("%s differs from its chrome and card (make templates)" % p)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
