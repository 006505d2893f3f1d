#!/usr/bin/env python3
"""templates.py - the pages, assembled from one chrome per locale and a card
per page.

templates/chrome/LOC.html is everything a page of locale LOC shares (the
head, the stylesheet, the shop's name, the footer), with three marker lines:
`@title@` inside <title>, a line `@style@` where a page's own style rules go
and a line `@card@` where its card goes. templates/chrome/LOC/WORD.html is
the page WORD's own part: header lines `@title TEXT` and `@style RULE`
(any number), then the card. The pages kembali serves,
templates/LOC/WORD.html, are assembled from the two and kept in the tree
(what `make install` installs, what a tenant copies to start a page of its
own). Edit the chrome or a card, then run `make templates`; `make check`
fails (tests/layout/check_templates) while a page differs from what its
chrome and card give.

Usage: templates.py [--check] TOP_SRCDIR
Exits 0; with --check, 1 and the pages that differ. Standard library only."""
import os
import sys


def assemble(chrome, card):
    """The page from the chrome's text and the card's text."""
    title, styles, body = None, [], []
    for line in card.splitlines(keepends=True):
        if not body and line.startswith("@title "):
            title = line[len("@title "):].rstrip("\n")
        elif not body and line.startswith("@style "):
            styles.append(line[len("@style "):])
        else:
            body.append(line)
    if title is None:
        raise ValueError("no @title line")
    out = []
    for line in chrome.splitlines(keepends=True):
        if line == "@style@\n":
            out += styles
        elif line == "@card@\n":
            out += body
        else:
            out.append(line.replace("@title@", title))
    return "".join(out)


def pages(top):
    """[(page path, assembled text)] for every card of every locale."""
    base = os.path.join(top, "templates", "chrome")
    out = []
    for f in sorted(os.listdir(base)):
        if not f.endswith(".html"):
            continue
        loc = f[:-len(".html")]
        with open(os.path.join(base, f), encoding="utf-8") as fh:
            chrome = fh.read()
        for card in sorted(os.listdir(os.path.join(base, loc))):
            with open(os.path.join(base, loc, card), encoding="utf-8") as fh:
                text = assemble(chrome, fh.read())
            out.append((os.path.join(top, "templates", loc, card), text))
    return out


def main(argv):
    check = "--check" in argv
    args = [a for a in argv[1:] if a != "--check"]
    if len(args) != 1:
        print(__doc__.split("\n\n")[-2], file=sys.stderr)
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
