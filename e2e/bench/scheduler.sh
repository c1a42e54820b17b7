#!/usr/bin/env bash
# `make bench-scheduler`: what our ResourceSlices cost the real kube-scheduler. For each shape (whole
# GPU, static MIG all-1g.10gb, dynamic MIG) and node count, a fresh etcd + kube-apiserver +
# kube-scheduler from e2e/controlplane (no kubelets, no controller manager), N Node objects with the
# slices `dra-plugin slices --backend simulated` prints for them, then P pods each with its own
# ResourceClaim; times first pod created -> all bound and reads the scheduler's /metrics and /proc.
# Prints the `sched|...` rows tools/perf-table.py writes into docs/perf.md; method: docs/perf.md.
#
# Environment:
#   SCHED_PLUGIN_BIN (or E2E_PLUGIN_BIN)  a prebuilt dra-plugin (default: cargo build --release)
#   SCHED_NODES (100; e.g. "100 1000"), SCHED_PODS (200), SCHED_SHAPES (whole static dynamic)
#   SCHED_PROFILE (h100-80gb:8)
#   SCHED_WORK_ROOT  where the work dirs go (default /var/tmp)
#   SCHED_KEEP_WORKDIR=1  keep them (component logs) after a passing run
# Ports: every component gets a free random loopback port (cluster.sh's free_port), so this runs
# beside e2e/run.sh or another bench.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
NODES_LIST="${SCHED_NODES:-100}"
PODS="${SCHED_PODS:-200}"
SHAPES="${SCHED_SHAPES:-whole static dynamic}"
PROFILE="${SCHED_PROFILE:-h100-80gb:8}"

echo "== binaries"
BIN="$(bash e2e/controlplane/build.sh | tail -n 1)"
PLUGIN_BIN="${SCHED_PLUGIN_BIN:-${E2E_PLUGIN_BIN:-}}"
if [ -z "$PLUGIN_BIN" ]; then
  nice cargo build --release -q -p dra-plugin
  PLUGIN_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/dra-plugin"
fi

# shellcheck source-path=SCRIPTDIR source=../controlplane/cluster.sh
source "$ROOT/e2e/controlplane/cluster.sh"
WORK="$(mktemp -d "${SCHED_WORK_ROOT:-/var/tmp}/gpu-dra-sched.XXXXXX")"
SCHED_PID=""
finish() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$SCHED_PID" ]; then kill "$SCHED_PID" 2>/dev/null || true; wait "$SCHED_PID" 2>/dev/null || true; fi
  cluster_stop
  if [ "$rc" = 0 ] && [ "${SCHED_KEEP_WORKDIR:-0}" != 1 ]; then rm -rf "$WORK"; else echo "work dir kept: $WORK"; fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

shape_args() { # SHAPE -> dra-plugin slices flags
  case "$1" in
    whole) echo "" ;;
    static) echo "--mig-layout all-1g.10gb" ;;
    dynamic) echo "--feature-gates DynamicMIG=true" ;;
    *) echo "unknown shape $1" >&2; return 1 ;;
  esac
}

RESULTS="$WORK/results"
: >"$RESULTS"
for nodes in $NODES_LIST; do
  for shape in $SHAPES; do
    echo "== $shape, $nodes nodes, $PODS pods"
    dir="$WORK/$shape-$nodes"
    # shellcheck disable=SC2046 # the flags split on purpose
    "$PLUGIN_BIN" slices --backend simulated --profile "$PROFILE" --node-name tmpl-node \
      $(shape_args "$shape") -o json >"$WORK/slices-$shape.json"
    cluster_start "$BIN" "$dir"
    # Our own scheduler below: the stock one's /metrics needs a token, the controller manager is not
    # needed (claims are created directly) and would only share the two cores.
    # shellcheck disable=SC2154 # set by cluster_start through eval
    kill "$PID_kube_scheduler" "$PID_kube_controller_manager" 2>/dev/null || true
    wait "$PID_kube_scheduler" "$PID_kube_controller_manager" 2>/dev/null || true
    python3 e2e/bench/scheduler.py load "$WORK/slices-$shape.json" "$nodes" deviceclasses/*.yaml
    port=$(free_port)
    while [ "$port" = "$ETCD_PORT" ] || [ "$port" = "$APISERVER_PORT" ]; do port=$(free_port); done
    "$BIN/kube-scheduler" --kubeconfig="$dir/admin.kubeconfig" --leader-elect=false \
      --bind-address=127.0.0.1 --secure-port="$port" --v=1 \
      --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
      --kube-api-qps=500 --kube-api-burst=1000 >"$dir/logs/bench-scheduler.log" 2>&1 &
    SCHED_PID=$!
    wait_for bench-scheduler "$SCHED_PID" 60 curl -skf "https://127.0.0.1:$port/readyz"
    # Let its informers fill (every slice listed) before the clock starts.
    sleep 3
    python3 e2e/bench/scheduler.py run "$shape" "$PODS" "$SCHED_PID" "$port" | sed "s/^shape|/shape|$nodes|/" |
      tee -a "$RESULTS"
    slices=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["items"]))' "$WORK/slices-$shape.json")
    devices=$(python3 -c 'import json,sys; print(sum(len(s["spec"].get("devices",[])) for s in json.load(open(sys.argv[1]))["items"]))' "$WORK/slices-$shape.json")
    echo "shape|$nodes|$shape|slices_per_node|$slices" >>"$RESULTS"
    echo "shape|$nodes|$shape|devices_per_node|$devices" >>"$RESULTS"
    kill "$SCHED_PID" 2>/dev/null || true
    wait "$SCHED_PID" 2>/dev/null || true
    SCHED_PID=""
    cluster_stop
  done
done

echo "== figures"
python3 - "$RESULTS" "$PODS" <<'EOF'
import sys
vals = {}
for line in open(sys.argv[1], encoding="utf-8"):
    parts = line.strip().split("|")
    if len(parts) == 5 and parts[0] == "shape":
        _, nodes, shape, key, value = parts
        vals[(nodes, shape, key)] = value
pods = sys.argv[2]
rows = [  # (key, label, format)
    ("devices_per_node", "devices / slices per node", None),
    ("pods_per_s", "pods/s, first created -> all bound", "{}"),
    ("wall_s", "seconds, first created -> all bound", "{} s"),
    ("attempt_ms", "scheduling + binding attempt, mean", "{} ms"),
    ("ext_PreFilter_ms", "PreFilter, mean per pod", "{} ms"),
    ("ext_Filter_ms", "Filter, mean per pod (all nodes)", "{} ms"),
    ("ext_Score_ms", "Score, mean per pod", "{} ms"),
    ("ext_Reserve_ms", "Reserve, mean per pod", "{} ms"),
    ("ext_PreBind_ms", "PreBind, mean per pod (claim status write)", "{} ms"),
    ("dra_Filter_ms", "DynamicResources Filter, mean per node (sampled)", "{} ms"),
    ("cpu_ms_per_pod", "scheduler CPU per pod", "{} ms"),
    ("hwm_mib", "scheduler peak RSS", "{} MiB"),
]
for nodes in sorted({k[0] for k in vals}, key=int):
    for key, label, fmt in rows:
        cells = []
        for shape in ("whole", "static", "dynamic"):
            v = vals.get((nodes, shape, key))
            if key == "devices_per_node" and v is not None:
                v = f"{v} / {vals.get((nodes, shape, 'slices_per_node'), '?')}"
            elif v is not None:
                v = fmt.format(v)
            cells.append(v or "—")
        w, d = vals.get((nodes, "whole", key)), vals.get((nodes, "dynamic", key))
        try:
            ratio = f"{float(d) / float(w):.2f}" if key != "devices_per_node" else f"{int(d) / int(w):.0f}"
        except (TypeError, ValueError, ZeroDivisionError):
            ratio = "—"
        print(f"sched|{label}, {nodes} nodes, {pods} pods|{'|'.join(cells)}|{ratio}")
EOF
