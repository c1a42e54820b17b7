#!/usr/bin/env bash
# `make bench-controller`: dra-controller at cluster scale (issue 31 §2). A fresh etcd +
# kube-apiserver from e2e/controlplane (no scheduler, controller manager or kubelets), N Node objects
# (nvidia.com/gpu.present=true on all, gpu-pool=dra on POOL of them) with the slices
# `dra-plugin slices --backend simulated` prints for them, our CRDs, then `dra-controller run
# --controllers gpucluster,computedomain`, a GPUCluster whose migration pool selects the POOL nodes,
# CDS ComputeDomains and a feature-gate flip. Measures: GPUCluster create and spec change -> DaemonSet,
# DeviceClasses, pool labels and status reconciled; the controller's RSS (peak and steady); API
# requests per minute while idle (apiserver_request_total, which has no per-client label, so the
# same idle window is measured once before the controller starts and the difference is the
# controller's). Also tries to fetch NVIDIA's compute-domain-controller. Prints `perf|...` rows for
# tools/perf-table.py; method: docs/controller-bench.md.
#
# Environment:
#   CTRL_NODES (1000), CTRL_POOL (500), CTRL_CDS (100), CTRL_IDLE_S (120)
#   CTRL_SHAPE  dynamic (default: the 9 slices a node of 8 H100 with DynamicMIG publishes) or whole
#               (1 slice of 8 whole GPUs). Dynamic MIG at 1,000 nodes makes kube-apiserver hold GiBs.
#   CTRL_CONTROLLER_BIN  a prebuilt dra-controller (default: target/release, rebuilt by cargo if stale)
#   CTRL_CONTROLLER_WRAP a command line our controller runs under, e.g. `heaptrack -o FILE` (profiles)
#   CTRL_PLUGIN_BIN      a prebuilt dra-plugin (default: target/debug/dra-plugin, built if missing)
#   CTRL_TRY_NVIDIA=0    skip NVIDIA's compute-domain-controller
#   CTRL_WORK_ROOT (/var/tmp), CTRL_KEEP_WORKDIR=1
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
NODES="${CTRL_NODES:-1000}"
POOL="${CTRL_POOL:-500}"
CDS="${CTRL_CDS:-100}"
IDLE_S="${CTRL_IDLE_S:-120}"
SHAPE="${CTRL_SHAPE:-dynamic}"
PROFILE="${CTRL_PROFILE:-h100-80gb:8}"
NVIDIA_VERSION="${CTRL_NVIDIA_VERSION:-v0.5.0}"
CACHE="${E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-e2e}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"

# NVIDIA's compute-domain-controller from the module proxy, built beside the control plane (never in
# our tree). It reads its templates from the absolute path /templates; the build rewrites that path
# to the module copy's templates/ so it runs without a container. Prints the binary's path on the
# last line when it built, else what stopped it.
NV_SRC="$CACHE/dra-driver-nvidia-gpu-$NVIDIA_VERSION"
try_nvidia() {
  [ "${CTRL_TRY_NVIDIA:-1}" = 1 ] || return 0
  local bin="$CACHE/bin/nvidia-compute-domain-controller" stamp="$CACHE/bin/.nvidia-compute-domain-controller.version"
  if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$NVIDIA_VERSION" ] && [ -d "$NV_SRC/templates" ]; then
    echo "NVIDIA compute-domain-controller $NVIDIA_VERSION: cached"; echo "$bin"; return 0
  fi
  local mod="$CACHE/dra-driver-nvidia-cd-probe" out
  rm -rf "$mod" && mkdir -p "$mod"
  if out=$(cd "$mod" && go mod init example.invalid/nvcdprobe >/dev/null 2>&1 &&
    timeout 180 go get -tool "sigs.k8s.io/dra-driver-nvidia-gpu/cmd/compute-domain-controller@$NVIDIA_VERSION" 2>&1); then
    rm -rf "$NV_SRC" && cp -r "$(go env GOMODCACHE)/sigs.k8s.io/dra-driver-nvidia-gpu@$NVIDIA_VERSION" "$NV_SRC" &&
      chmod -R u+w "$NV_SRC" && sed -i "s#\"/templates/#\"$NV_SRC/templates/#" "$NV_SRC"/cmd/compute-domain-controller/*.go
    if out=$(cd "$NV_SRC" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice go build -trimpath -o "$bin" ./cmd/compute-domain-controller 2>&1); then
      echo "$NVIDIA_VERSION" >"$stamp"
      echo "NVIDIA compute-domain-controller $NVIDIA_VERSION: built (template path rewritten)"; echo "$bin"
    else
      echo "NVIDIA compute-domain-controller $NVIDIA_VERSION: modules resolve, build failed:"; tail -n 3 <<<"$out"
    fi
  else
    echo "NVIDIA compute-domain-controller $NVIDIA_VERSION does not build here:"
    { grep -E 'reading .*: [45][0-9][0-9] |not found|unknown revision' <<<"$out" || tail -n 3 <<<"$out"; } |
      sed 's/^[^:]*: //' | sort -u
  fi
  rm -rf "$mod"
}

echo "== binaries"
BIN="$(bash e2e/controlplane/build.sh | tail -n 1)"
CONTROLLER_BIN="${CTRL_CONTROLLER_BIN:-}"
if [ -z "$CONTROLLER_BIN" ]; then
  nice cargo build -q --release -p dra-controller
  CONTROLLER_BIN="$TARGET/release/dra-controller"
fi
PLUGIN_BIN="${CTRL_PLUGIN_BIN:-$TARGET/debug/dra-plugin}"
[ -x "$PLUGIN_BIN" ] || { nice cargo build -q -p dra-plugin; PLUGIN_BIN="$TARGET/debug/dra-plugin"; }
BUILD="debug"
case "$CONTROLLER_BIN" in */release/*) BUILD="release" ;; esac
read -r -a WRAP <<<"${CTRL_CONTROLLER_WRAP:-}"
[ -z "${CTRL_CONTROLLER_WRAP:-}" ] || BUILD="$BUILD, under ${WRAP[0]}"
echo "controller: $CONTROLLER_BIN ($BUILD build, $(git rev-parse --short HEAD)$(git diff --quiet -- dra-controller || echo ', tree modified'))"
NVIDIA_STATUS="$(try_nvidia)"
NV_BIN="${CTRL_NVIDIA_BIN:-}"
if [ -z "$NV_BIN" ] && [ -x "$(tail -n 1 <<<"$NVIDIA_STATUS")" ]; then NV_BIN="$(tail -n 1 <<<"$NVIDIA_STATUS")"; fi
NVIDIA_STATUS="$(grep -v '^/' <<<"$NVIDIA_STATUS" || true)"
[ -z "$NVIDIA_STATUS" ] || echo "$NVIDIA_STATUS"

# shellcheck source-path=SCRIPTDIR source=../controlplane/cluster.sh
source "$ROOT/e2e/controlplane/cluster.sh"
WORK="$(mktemp -d "${CTRL_WORK_ROOT:-/var/tmp}/gpu-dra-ctrl.XXXXXX")"
CTRL_PID=""
finish() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$CTRL_PID" ]; then kill "$CTRL_PID" 2>/dev/null || true; wait "$CTRL_PID" 2>/dev/null || true; fi
  cluster_stop
  if [ "$rc" = 0 ] && [ "${CTRL_KEEP_WORKDIR:-0}" != 1 ]; then rm -rf "$WORK"; else echo "work dir kept: $WORK"; fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

case "$SHAPE" in
  whole) shape_args=() ;;
  dynamic) shape_args=(--feature-gates DynamicMIG=true) ;;
  *) echo "CTRL_SHAPE: whole or dynamic" >&2; exit 2 ;;
esac
"$PLUGIN_BIN" slices --backend simulated --profile "$PROFILE" --node-name tmpl "${shape_args[@]}" \
  -o json >"$WORK/slices.json"

echo "== $NODES nodes ($POOL in the pool, $SHAPE slices), $CDS ComputeDomains"
dir="$WORK/cluster"
cluster_start "$BIN" "$dir"
# Only etcd and the API server are needed.
# shellcheck disable=SC2154 # set by cluster_start through eval
kill "$PID_kube_scheduler" "$PID_kube_controller_manager" 2>/dev/null || true
wait "$PID_kube_scheduler" "$PID_kube_controller_manager" 2>/dev/null || true
KUBECONFIG="$dir/admin.kubeconfig"
export KUBECONFIG CTRL_POOL="$POOL"
kubectl apply --server-side -f deploy/crds/crds.yaml >/dev/null
kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
python3 e2e/bench/controller.py load "$WORK/slices.json" "$NODES" "$POOL"
RESULTS="$WORK/results"
python3 e2e/bench/controller.py idle "$IDLE_S" | tee "$RESULTS"

port=$(free_port)
while [ "$port" = "$ETCD_PORT" ] || [ "$port" = "$APISERVER_PORT" ]; do port=$(free_port); done
${WRAP[@]+"${WRAP[@]}"} "$CONTROLLER_BIN" run --namespace gpu-dra-driver --metrics-addr "127.0.0.1:$port" \
  --controllers gpucluster,computedomain --identity bench >"$dir/logs/dra-controller.log" 2>&1 &
CTRL_PID=$!
wait_for dra-controller "$CTRL_PID" 60 curl -sf "http://127.0.0.1:$port/healthz"
# Under a wrapper the controller is a descendant of $CTRL_PID: measure (and stop) that process.
find_ctrl() { # PID
  local p
  [ "$(readlink -f "/proc/$1/exe" || true)" = "$(readlink -f "$CONTROLLER_BIN")" ] && { echo "$1"; return 0; }
  for p in $(pgrep -P "$1" || true); do find_ctrl "$p" && return 0; done
  return 1
}
MEAS_PID="$(find_ctrl "$CTRL_PID")" || { echo "no $CONTROLLER_BIN process under $CTRL_PID" >&2; exit 1; }
sleep 2
python3 e2e/bench/controller.py run "$MEAS_PID" "$CDS" "$IDLE_S" | tee -a "$RESULTS"
kill -0 "$MEAS_PID" || { echo "dra-controller exited; log: $dir/logs/dra-controller.log" >&2; exit 1; }
grep -c ' ERROR ' "$dir/logs/dra-controller.log" | sed 's/^/controller log ERROR lines: /' || true
kill "$MEAS_PID"; wait "$CTRL_PID" 2>/dev/null || true; CTRL_PID=""

# NVIDIA's compute-domain-controller on a fresh cluster with the same Nodes and its own CRDs: only
# the ComputeDomains part (it has no GPUCluster), the same idle window; no leader election (its
# default, so no Lease renewals), no metrics endpoint.
if [ -n "$NV_BIN" ]; then
  echo "== NVIDIA compute-domain-controller ($NV_BIN), $CDS ComputeDomains"
  cluster_stop
  dir="$WORK/cluster-nv"
  cluster_start "$BIN" "$dir"
  kill "$PID_kube_scheduler" "$PID_kube_controller_manager" 2>/dev/null || true
  wait "$PID_kube_scheduler" "$PID_kube_controller_manager" 2>/dev/null || true
  KUBECONFIG="$dir/admin.kubeconfig"
  kubectl apply --server-side -f "$NV_SRC/deployments/helm/dra-driver-nvidia-gpu/crds/" >/dev/null
  kubectl wait --for=condition=Established crd --all --timeout=60s >/dev/null
  python3 e2e/bench/controller.py load "$WORK/slices.json" "$NODES" "$POOL"
  "$NV_BIN" --kubeconfig "$KUBECONFIG" --namespace gpu-dra-driver --pod-name bench \
    --image-name nvcr.io/nvidia/k8s-dra-driver-gpu:"$NVIDIA_VERSION" --log-verbosity-cd-daemon 0 >"$dir/logs/nvidia-cd-controller.log" 2>&1 &
  CTRL_PID=$!
  sleep 3
  kill -0 "$CTRL_PID" || { echo "NVIDIA's controller exited:" >&2; tail -n 20 "$dir/logs/nvidia-cd-controller.log" >&2; exit 1; }
  python3 e2e/bench/controller.py nvidia "$CTRL_PID" "$CDS" "$IDLE_S" | tee -a "$RESULTS"
fi

echo "== figures"
python3 - "$RESULTS" "$NODES" "$POOL" "$CDS" "$SHAPE" "$BUILD" "$IDLE_S" "$(tr '\n' ' ' <<<"${NVIDIA_STATUS:-not tried}" | sed 's/ *$//')" <<'EOF2'
import sys
path, nodes, pool, cds, shape, build, idle, nvidia = sys.argv[1:]
v = {}
for line in open(path, encoding="utf-8"):
    p = line.rstrip("\n").split("|", 2)
    if len(p) == 3 and p[0] == "ctrl":
        v[p[1]] = p[2]
n = f"{int(nodes):,}"
where = f"{n} nodes, {int(pool):,} in the pool, {cds} ComputeDomains ({shape}-GPU slices, {build} build)" \
    if shape == "whole" else f"{n} nodes, {int(pool):,} in the pool, {cds} ComputeDomains (dynamic MIG slices, {build} build)"
hwm = float(v["hwm_mib"])
verdict = "met" if hwm <= 40 else f"MISSED by {hwm - 40:.1f} MiB, [profile](profiles/controller-memory.md)"
print(f"perf|controller: peak RSS (VmHWM), {where}|≤ 40 MiB|{hwm:.1f} MiB ({verdict}; "
      f"steady {float(v['rss_steady_mib']):.1f} MiB: {v.get('rss_split', '?')})")
print(f"perf|controller: GPUCluster create -> DaemonSet, DeviceClasses, {int(pool):,} pool labels, status, {n} nodes|—|{v['create_s']} s")
print(f"perf|controller: GPUCluster feature-gate flip -> DaemonSet and status, {n} nodes|—|{v['change_s']} s")
print(f"perf|controller: {cds} ComputeDomains created -> daemon DaemonSets and channel templates|—|{v['cds_s']} s")
steady = float(v["steady_rpm"]) - float(v["baseline_rpm"])
print(f"perf|controller: API requests per minute at steady state ({idle} s idle, less the API server's own)|≈ 0|"
      f"{steady:.1f} ({v['steady_rpm']} with, {v['baseline_rpm']} without the controller)")
if "nv_hwm_mib" in v:
    print(f"perf|NVIDIA compute-domain-controller: peak RSS (VmHWM), same nodes and {cds} ComputeDomains|—|"
          f"{float(v['nv_hwm_mib']):.1f} MiB (steady {float(v['nv_rss_steady_mib']):.1f} MiB; ours {hwm:.1f} MiB)")
    print(f"perf|NVIDIA compute-domain-controller: {cds} ComputeDomains created -> daemon DaemonSets and channel templates|—|"
          f"{v['nv_cds_s']} s (ours {v['cds_s']} s)")
    nv = float(v["nv_steady_rpm"]) - float(v["baseline_rpm"])
    print(f"perf|NVIDIA compute-domain-controller: API requests per minute at steady state, no leader election|—|"
          f"{nv:.1f} ({v['nv_steady_rpm']} with, {v['baseline_rpm']} without)")
else:
    print(f"perf|NVIDIA compute-domain-controller at the same scale|—|not measured: {nvidia}")
EOF2
echo "steady-state requests, top: $(grep '^ctrl|steady_top' "$RESULTS" | cut -d'|' -f3)"
[ -z "$NV_BIN" ] || echo "NVIDIA steady-state requests, top: $(grep '^ctrl|nv_steady_top' "$RESULTS" | cut -d'|' -f3)"
echo "baseline requests, top: $(grep '^ctrl|baseline_top' "$RESULTS" | cut -d'|' -f3)"
