#!/usr/bin/env bash
# `make bench-scheduler`: what our ResourceSlices cost the real kube-scheduler. For each shape (whole
# GPU, static MIG all-1g.10gb, dynamic MIG, on-demand MIG) and node count, a fresh etcd + kube-apiserver +
# kube-scheduler from e2e/controlplane (no kubelets, no controller manager), N Node objects with the
# slices `dra-plugin slices --backend simulated` prints for them, then P pods each with its own
# ResourceClaim; times first pod created -> all bound and reads the scheduler's /metrics and /proc.
# Shape ondemand runs the real components instead of printed slices: one `dra-plugin run
# --on-demand-mig` per node (no kubelet: it publishes and reconciles its MigLayout without one) and
# `dra-controller run` with a GPUCluster that turns on-demand MIG on, so created -> bound includes
# the controller writing MigLayouts and the plugins carving; their CPU is reported too. Shape
# ondemand-precarve is the same with `preCarve: [{profile: 1g.10gb, count: SCHED_PRECARVE}]` in the
# GPUCluster; the clock starts once every node publishes its pre-carved devices.
# Prints the `sched|...` rows tools/perf-table.py writes into docs/perf.md; method: docs/perf.md.
#
# Environment:
#   SCHED_PLUGIN_BIN (or E2E_PLUGIN_BIN)  a prebuilt dra-plugin (default: cargo build --release)
#   SCHED_CONTROLLER_BIN  a prebuilt dra-controller (default: cargo build --release)
#   SCHED_NODES (100; e.g. "100 1000"), SCHED_PODS (200),
#   SCHED_SHAPES (whole static dynamic ondemand ondemand-precarve)
#   SCHED_PRECARVE (2)  1g.10gb devices pre-carved per node in shape ondemand-precarve
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
SHAPES="${SCHED_SHAPES:-whole static dynamic ondemand ondemand-precarve}"
PRECARVE="${SCHED_PRECARVE:-2}"
PROFILE="${SCHED_PROFILE:-h100-80gb:8}"

echo "== binaries"
BIN="$(bash e2e/controlplane/build.sh | tail -n 1)"
PLUGIN_BIN="${SCHED_PLUGIN_BIN:-${E2E_PLUGIN_BIN:-}}"
if [ -z "$PLUGIN_BIN" ]; then
  nice cargo build --release -q -p dra-plugin
  PLUGIN_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/dra-plugin"
fi
CONTROLLER_BIN="${SCHED_CONTROLLER_BIN:-}"
if [ -z "$CONTROLLER_BIN" ] && [[ " $SHAPES " == *" ondemand"* ]]; then
  nice cargo build --release -q -p dra-controller
  CONTROLLER_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/dra-controller"
fi

# shellcheck source-path=SCRIPTDIR source=../controlplane/cluster.sh
source "$ROOT/e2e/controlplane/cluster.sh"
WORK="$(mktemp -d "${SCHED_WORK_ROOT:-/var/tmp}/gpu-dra-sched.XXXXXX")"
SCHED_PID=""
ONDEMAND_PIDS=() # the controller and the plugins of shapes ondemand*
stop_ondemand() {
  if [ "${#ONDEMAND_PIDS[@]}" -gt 0 ]; then
    kill "${ONDEMAND_PIDS[@]}" 2>/dev/null || true
    wait "${ONDEMAND_PIDS[@]}" 2>/dev/null || true
  fi
  ONDEMAND_PIDS=()
}
finish() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$SCHED_PID" ]; then kill "$SCHED_PID" 2>/dev/null || true; wait "$SCHED_PID" 2>/dev/null || true; fi
  stop_ondemand
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
    ondemand | ondemand-precarve) echo "--on-demand-mig" ;;
    *) echo "unknown shape $1" >&2; return 1 ;;
  esac
}

# The plugin of node I (0-based) of shapes ondemand*; its PID goes to ONDEMAND_PIDS[I + 1].
start_plugin() {
  local dir="$1" i="$2" name nd
  name=$(printf 'node-%04d' "$i")
  nd="$dir/nodes/$name"
  mkdir -p "$nd/registry" "$nd/plugin" "$nd/cdi"
  RUST_LOG=warn "$PLUGIN_BIN" run --node-name "$name" --kubeconfig "$dir/admin.kubeconfig" \
    --registrar-dir "$nd/registry" --plugin-dir "$nd/plugin" --cdi-root "$nd/cdi" \
    --metrics-port 0 --healthcheck-port 0 --backend simulated --profile "$PROFILE" --on-demand-mig \
    >>"$nd/plugin.log" 2>&1 &
  ONDEMAND_PIDS[i + 1]=$!
}

# Shapes ondemand*: Nodes without slices, our CRDs, one plugin per node (kubelet sockets in temp
# dirs that no kubelet reads), then the controller with a GPUCluster whose hold-down (1h) outlasts
# the run, so nothing merges back while pods arrive; PRECARVE 1g.10gb devices kept idle per node
# when PRECARVE > 0. Waits until every plugin publishes its GPUs (and the pre-carved devices) and
# reports them in its MigLayout. ONDEMAND_PIDS: the controller first, then the plugins.
start_ondemand() {
  local dir="$1" nodes="$2" precarve="$3" i gpus precarve_yaml=""
  gpus="${PROFILE##*:}"
  if [ "$precarve" -gt 0 ]; then
    precarve_yaml=", preCarve: [{profile: 1g.10gb, count: $precarve}]"
  fi
  export KUBECONFIG="$dir/admin.kubeconfig"
  kubectl apply --server-side -f deploy/crds/crds.yaml >/dev/null
  kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
  python3 e2e/bench/scheduler.py load - "$nodes" deviceclasses/*.yaml
  kubectl create namespace gpu-dra-driver >/dev/null
  "$CONTROLLER_BIN" run --namespace gpu-dra-driver --metrics-addr 127.0.0.1:0 --controllers gpucluster \
    >"$dir/logs/controller.log" 2>&1 &
  ONDEMAND_PIDS=("$!")
  for ((i = 0; i < nodes; i++)); do start_plugin "$dir" "$i"; done
  kubectl apply --server-side -f - >/dev/null <<YAML
apiVersion: nvidia.com/v1alpha1
kind: GPUCluster
metadata:
  name: gpu-cluster
spec:
  draDriver:
    gpus:
      onDemandMig: {enabled: true, policy: BinPack, holdDown: 1h$precarve_yaml}
    computeDomains: {enabled: false}
  migrationPool:
    nodeSelector: {matchLabels: {sched-bench-no-such-pool: "true"}}
YAML
  python3 e2e/bench/scheduler.py ready "$nodes" "$gpus" "$precarve"
  # On an idle cluster nothing writes MigLayouts; one that keeps changing means plugins answering
  # their own status writes, a stream of events that would distort every figure of this shape.
  local restless
  restless=$(python3 e2e/bench/scheduler.py restless 3)
  [ -z "$restless" ] || { echo "MigLayouts rewritten on an idle cluster: $restless" >&2; return 1; }
  local rss
  rss=$(for p in "${ONDEMAND_PIDS[@]:1}"; do awk '/^VmRSS:/ {print $2}' "/proc/$p/status"; done |
    awk '{s += $1} END {printf "%.0f MiB in all, %.1f MiB each", s / 1024, s / 1024 / NR}')
  echo "  $nodes plugins running: RSS $rss"
  unset KUBECONFIG
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
    if [ "$shape" = ondemand ]; then
      start_ondemand "$dir" "$nodes" 0
    elif [ "$shape" = ondemand-precarve ]; then
      start_ondemand "$dir" "$nodes" "$PRECARVE"
    else
      python3 e2e/bench/scheduler.py load "$WORK/slices-$shape.json" "$nodes" deviceclasses/*.yaml
    fi
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
    cost=""
    if [[ "$shape" == ondemand* ]]; then
      cost="controller=${ONDEMAND_PIDS[0]} plugins=$(IFS=,; echo "${ONDEMAND_PIDS[*]:1}")"
    fi
    SCHED_COST_PIDS="$cost" python3 e2e/bench/scheduler.py run "$shape" "$PODS" "$SCHED_PID" "$port" |
      sed "s/^shape|/shape|$nodes|/" | tee -a "$RESULTS"
    if [[ "$shape" == ondemand* ]]; then
      # Counted from the API before the pods (scheduler.py run): the slices file is not what ran.
      kill "$SCHED_PID" 2>/dev/null || true
      wait "$SCHED_PID" 2>/dev/null || true
      SCHED_PID=""
      stop_ondemand
      cluster_stop
      continue
    fi
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
# On-demand MIG, without and with pre-carving, beside whole GPU and dynamic MIG (the odm table): the
# scheduler's figures as above, then what the mode adds: the controller and all plugins over the
# same window. Each on-demand variant gets its ratio to whole GPU and its verdict on the goal.
odm_rows = [r for r in rows if r[0] != "dra_Filter_ms"] + [
    ("attempts_unschedulable", "scheduling attempts that found no device", "{}"),
    ("controller_cpu_ms_per_pod", "dra-controller CPU per pod (MIG shaper)", "{} ms"),
    ("controller_hwm_mib", "dra-controller peak RSS", "{} MiB"),
    ("plugins_cpu_ms_per_pod", "dra-plugin CPU per pod, all nodes together", "{} ms"),
    ("plugins_rss_mib_total", "dra-plugin RSS, all nodes together", "{} MiB"),
]
odm_shapes = (("ondemand", "on-demand"), ("ondemand-precarve", "pre-carved"))
for nodes in sorted({k[0] for k in vals if k[1] in dict(odm_shapes)}, key=int):
    for key, label, fmt in odm_rows:
        cells = []
        for shape in ("whole", "dynamic", "ondemand", "ondemand-precarve"):
            v = vals.get((nodes, shape, key))
            if key == "devices_per_node" and v is not None:
                v = f"{v} / {vals.get((nodes, shape, 'slices_per_node'), '?')}"
            elif v is not None:
                v = fmt.format(v)
            cells.append(v or "—")
        ratios, goals = [], []
        for shape, name in odm_shapes:
            w, o = vals.get((nodes, "whole", key)), vals.get((nodes, shape, key))
            try:
                r = float(o) / float(w)
                ratios.append(f"{r:.2f}")
            except (TypeError, ValueError, ZeroDivisionError):
                r = None
                ratios.append("—")
            if key == "cpu_ms_per_pod" and r is not None:
                goals.append(f"{name} met" if r <= 2 else f"{name} MISSED, {r / 2:.2f}× over")
        goal = "≤ 2×: " + "; ".join(goals) if goals else "—"
        print(f"odm|{label}, {nodes} nodes, {pods} pods|{'|'.join(cells)}|{'|'.join(ratios)}|{goal}")
EOF
