#!/usr/bin/env python3
"""Keeps docs/perf.md, the one table of benchmark figures, up to date.

Reads a bench's output on stdin, echoes it, and takes every line of the form
`perf|figure|goal|value` as a row: the row of the same figure in the table is replaced (others
are kept), with this machine and today's date beside it.

    cargo bench -p dra-plugin --bench prepare | python3 tools/perf-table.py docs/perf.md
"""
import datetime
import os
import re
import sys

HEADER = """# Benchmark figures

Written by the bench commands (`make bench`, `make bench-plugin`, `make bench-sim`) through
`tools/perf-table.py`; a run replaces the rows of the figures it measured. A ratio beside the
Go code is measured in the same run on the same machine.

| figure | goal | value | machine | date |
|---|---|---|---|---|
"""
ROW = re.compile(r"^\| (.+?) \| (.*?) \| (.*?) \| (.*?) \| (.*?) \|$")


def machine():
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = 0
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            mem_gib = round(int(f.readline().split()[1]) / 1024 / 1024)
    except (OSError, ValueError, IndexError):
        pass
    return f"{model}, {os.cpu_count()} cores, {mem_gib} GiB"


def read_rows(path):
    rows = {}
    if not os.path.exists(path):
        return rows
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = ROW.match(line.rstrip("\n"))
            if m and m.group(1) not in ("figure", "---"):
                rows[m.group(1)] = m.groups()
    return rows


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: perf-table.py docs/perf.md < bench output")
    path = sys.argv[1]
    rows = read_rows(path)
    here, today, seen = machine(), datetime.date.today().isoformat(), 0
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        if line.startswith("perf|"):
            parts = line.rstrip("\n").split("|")
            if len(parts) == 4:
                figure, goal, value = (p.strip().replace("|", "/") for p in parts[1:])
                rows[figure] = (figure, goal, value, here, today)
                seen += 1
    with open(path, "w", encoding="utf-8") as f:
        f.write(HEADER)
        for row in rows.values():
            f.write("| " + " | ".join(row) + " |\n")
    print(f"perf-table: {seen} figures written to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
