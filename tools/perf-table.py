#!/usr/bin/env python3
"""Keeps docs/perf.md, the tables of benchmark figures, up to date.

Reads a bench's output on stdin, echoes it, and takes every line of the form
`perf|figure|goal|value` as a row of the first table, and every `peer|figure|ours|theirs|ratio|goal`
as a row of the second (ours beside the peer plugins), and every
`sched|figure|whole GPU|static MIG|dynamic MIG|ratio` as a row of the third (what our slices cost
kube-scheduler), and every `odm|figure|whole GPU|dynamic MIG|on-demand MIG|pre-carved|ratio
on-demand|ratio pre-carved|goal` as a row of the fourth (on-demand MIG beside them; a line without
the two pre-carved fields, `odm|figure|whole GPU|dynamic MIG|on-demand MIG|ratio|goal`, gets `—`
there): the row of the same figure in its table is replaced (others are kept), with this machine
and today's date beside it.

    cargo bench -p dra-plugin --bench prepare | python3 tools/perf-table.py docs/perf.md
"""
import datetime
import os
import sys

HEADER = """# Benchmark figures

Written by the bench commands (`make bench`, `make bench-plugin`, `make bench-sim`,
`make bench-peers`, `make bench-scheduler`, `make bench-controller`) through `tools/perf-table.py`;
a run replaces the rows of the figures it measured. A ratio beside the Go code is measured in the
same run on the same machine.

| figure | goal | value | machine | date |
|---|---|---|---|---|
"""
PEER_HEADER = """
## Side by side with the peers

Written by `make bench-peers` (`e2e/bench/peers.sh`; method, flags and what is not measured in
[peers.md](peers.md)): our kubelet plugin and dra-example-driver v0.4.0, each on its own node of
one real kube-apiserver, driven in the same minutes through the kubelet's gRPC client. Ratio is
ours ÷ theirs; trust it over the absolute figures, which move with the machine's load.

| figure | ours | theirs | ratio | goal | machine | date |
|---|---|---|---|---|---|---|
"""
PEER_HEADING = "## Side by side with the peers"
SCHED_HEADER = """
## What our slices cost the scheduler

Written by `make bench-scheduler` (`e2e/bench/scheduler.sh`; method in
[scheduler-bench.md](scheduler-bench.md)): the real kube-scheduler 1.37.2, no kubelets, Nodes
with the slices `dra-plugin slices --backend simulated --profile h100-80gb:8` prints for them,
one ResourceClaim per pod. Static MIG is the all-1g.10gb layout; dynamic MIG publishes every
placement and its pods alternate 1g.10gb and whole-GPU claims. Ratio is dynamic ÷ whole GPU.

| figure | whole GPU | static MIG | dynamic MIG | ratio dynamic/whole | machine | date |
|---|---|---|---|---|---|---|
"""
SCHED_HEADING = "## What our slices cost the scheduler"
ODM_HEADER = """
## On-demand MIG beside whole GPUs

Written by `make bench-scheduler` with shape `ondemand` (method in
[scheduler-bench.md](scheduler-bench.md)), in the same run as the table above: whole-GPU and
dynamic-MIG columns are the same measurements. On-demand MIG runs the real `dra-plugin run
--on-demand-mig` per node (no kubelet) and `dra-controller`; its pods alternate 1g.10gb and whole-GPU
claims, and every 1g.10gb must be carved first, so created -> bound includes the MIG shaper and the
plugins. The pre-carved column is the same with `preCarve` keeping 1g.10gb devices idle on every
node, carved before the clock starts. Ratios are ÷ whole GPU; the goal (issue 32) is scheduler CPU
per pod within 2×.
The "pod creation -> Running" rows come from `make bench-mig-latency` (stock kubelets, a 3g.40gb
to create per pod): the dynamic-MIG column is publish every placement (created at prepare).

| figure | whole GPU | dynamic MIG | on-demand MIG | on-demand MIG, pre-carved | ratio on-demand/whole | ratio pre-carved/whole | goal | machine | date |
|---|---|---|---|---|---|---|---|---|---|
"""
ODM_HEADING = "## On-demand MIG beside whole GPUs"
# Input lines: prefix -> (table, number of fields after the prefix).
KINDS = {"perf|": ("main", 3), "peer|": ("peer", 5), "sched|": ("sched", 5), "odm|": ("odm", 8)}
ODM_OLD = 6  # fields (figure included) of an odm line without the pre-carved column and ratio


def odm_widen(cells):
    """An odm row of the old width with `—` for the pre-carved column and its ratio."""
    return cells[:4] + ("—",) + cells[4:5] + ("—",) + cells[5:]


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
    """The rows of every table, by figure: each table is the one after its heading."""
    rows = {"main": {}, "peer": {}, "sched": {}, "odm": {}}
    if not os.path.exists(path):
        return rows
    table = "main"
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line == PEER_HEADING:
                table = "peer"
            if line == SCHED_HEADING:
                table = "sched"
            if line == ODM_HEADING:
                table = "odm"
            if not (line.startswith("| ") and line.endswith(" |")):
                continue
            cells = tuple(c.strip() for c in line[2:-2].split(" | "))
            if cells[0] not in ("figure", "---") and not cells[0].startswith("---"):
                if table == "odm" and len(cells) == ODM_OLD + 2:  # + machine, date
                    cells = odm_widen(cells)
                rows[table][cells[0]] = cells
    return rows


def parse(line, here, today):
    """(table, row) for a `perf|`, `peer|`, `sched|` or `odm|` line of the right length, else None."""
    for prefix, (table, n) in KINDS.items():
        if line.startswith(prefix):
            parts = line.rstrip("\n").split("|")[1:]
            if table == "odm" and len(parts) == ODM_OLD:
                parts = list(odm_widen(tuple(parts)))
            if len(parts) == n:
                return table, tuple(p.strip() for p in parts) + (here, today)
    return None


def write(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write(HEADER)
        for row in rows["main"].values():
            f.write("| " + " | ".join(row) + " |\n")
        if rows["peer"]:
            f.write(PEER_HEADER)
            for row in rows["peer"].values():
                f.write("| " + " | ".join(row) + " |\n")
        if rows["sched"]:
            f.write(SCHED_HEADER)
            for row in rows["sched"].values():
                f.write("| " + " | ".join(row) + " |\n")
        if rows["odm"]:
            f.write(ODM_HEADER)
            for row in rows["odm"].values():
                f.write("| " + " | ".join(row) + " |\n")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: perf-table.py docs/perf.md < bench output")
    path = sys.argv[1]
    rows = read_rows(path)
    here, today, seen = machine(), datetime.date.today().isoformat(), 0
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        parsed = parse(line, here, today)
        if parsed:
            table, row = parsed
            rows[table][row[0]] = row
            seen += 1
    write(path, rows)
    print(f"perf-table: {seen} figures written to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
