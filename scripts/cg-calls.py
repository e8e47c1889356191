#!/usr/bin/env python3
"""Counts in callgrind dumps, for the scripts that turn them into figures.

    python3 scripts/cg-calls.py PATTERN DUMP...

Of the dumps given (one per thread), takes the one with the most
instructions (the busiest thread) and prints one line:

    FILE TOTAL CALLS LOOPS

TOTAL: its instructions; CALLS: the calls of functions whose name matches
the regular expression PATTERN; LOOPS: the reactor's loops (calls of
Reactor::poll_once). Exits 1 when no dump was readable.
"""
import re
import sys


def count(path, pat):
    names, total, calls, loops, cfn = {}, 0, 0, 0, None

    def name(s):
        m = re.match(r"\((\d+)\)(?: (.*))?", s)
        if not m:
            return s
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), "?")

    for line in open(path, errors="replace"):
        if line.startswith(("summary:", "totals:")):
            total = max(total, int(line.split()[1]))
        elif line.startswith(("fn=", "fl=", "fi=", "fe=")) and line[3] == "(":
            name(line[3:].strip())
        elif line.startswith("cfn="):
            cfn = name(line[4:].strip())
        elif line.startswith("calls=") and cfn:
            n = int(line[6:].split()[0])
            if pat.search(cfn):
                calls += n
            if cfn.endswith("Reactor::poll_once"):
                loops += n
    return total, calls, loops


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    pat = re.compile(sys.argv[1])
    best = None
    for path in sys.argv[2:]:
        try:
            total, calls, loops = count(path, pat)
        except OSError:
            continue
        if best is None or total > best[1]:
            best = (path, total, calls, loops)
    if best is None:
        sys.exit("cg-calls: no callgrind dump")
    print(*best)


main()
