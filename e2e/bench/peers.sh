#!/usr/bin/env bash
# `make bench-peers`: our kubelet plugin side by side with kubernetes-sigs/dra-example-driver, each on
# its own node of one real control plane (etcd + kube-apiserver from e2e/controlplane), driven in the
# same minutes by kubelet-tools' peer-bench, which dials both as the kubelet does. Two pairings,
# one after the other: both writing the claims' status.devices, and neither writing it. Prints the
# `peer|...` rows tools/perf-table.py writes into docs/perf.md; method and flags: docs/peers.md.
#
# Environment:
#   PEER_PLUGIN_BIN (or E2E_PLUGIN_BIN)  a prebuilt dra-plugin (default: cargo build --release)
#   PEER_ROUNDS (3), PEER_PHASE (8s), PEER_IDLE_SETTLE (20s), PEER_CONCURRENCY (1,16,64)
#   PEER_LARGEST_PROFILE (rtx-pro-6000:8), PEER_LARGEST_GATES (DynamicMIG=true): our largest case
#                    for the idle RSS (248 devices in 9 slices, the most of any profile)
#   PEER_WORK_ROOT   where the work dir goes (default /var/tmp: a real disk, as both plugins sync)
#   PEER_KEEP_WORKDIR=1  keep it (plugin logs) after a passing run
#   PEER_TRY_NVIDIA=0    skip the attempt to build NVIDIA's gpu-kubelet-plugin
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
CACHE="${E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-e2e}"
EXAMPLE_VERSION=v0.4.0   # the newest the Go module proxy serves
NVIDIA_VERSION=v0.5.0
LARGEST_PROFILE="${PEER_LARGEST_PROFILE:-rtx-pro-6000:8}"
LARGEST_GATES="${PEER_LARGEST_GATES:-DynamicMIG=true}"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

# dra-example-kubeletplugin from the module proxy, cached beside the control plane (never in our tree).
build_example() {
  local bin="$CACHE/bin/dra-example-kubeletplugin" stamp="$CACHE/bin/.dra-example-kubeletplugin.version"
  if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$EXAMPLE_VERSION" ]; then
    echo "dra-example-driver $EXAMPLE_VERSION: cached in $CACHE/bin" >&2
    return
  fi
  echo "building dra-example-kubeletplugin $EXAMPLE_VERSION (~3 min on 2 cores)" >&2
  local mod="$CACHE/dra-example-driver-$EXAMPLE_VERSION"
  rm -rf "$mod" && mkdir -p "$mod"
  (cd "$mod" && go mod init example.invalid/peerbins >/dev/null 2>&1 &&
    go get -tool "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin@$EXAMPLE_VERSION" &&
    CGO_ENABLED=0 nice go build -trimpath -ldflags "-s -w" -o "$bin" \
      sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin) >&2
  echo "$EXAMPLE_VERSION" >"$stamp"
}

# NVIDIA's gpu-kubelet-plugin: tried each run and reported, not measured (docs/peers.md says why).
try_nvidia() {
  [ "${PEER_TRY_NVIDIA:-1}" = 1 ] || return 0
  local mod="$CACHE/dra-driver-nvidia-gpu-probe" out
  rm -rf "$mod" && mkdir -p "$mod"
  out=$(cd "$mod" && go mod init example.invalid/nvprobe >/dev/null 2>&1 &&
    timeout 180 go get -tool "sigs.k8s.io/dra-driver-nvidia-gpu/cmd/gpu-kubelet-plugin@$NVIDIA_VERSION" 2>&1) &&
    echo "NVIDIA gpu-kubelet-plugin $NVIDIA_VERSION: its modules resolve now; measuring it is not wired yet" ||
    { echo "NVIDIA gpu-kubelet-plugin $NVIDIA_VERSION does not build here (docs/peers.md):"
      grep -E 'reading .*: [45][0-9][0-9] ' <<<"$out" | sed 's/^[^:]*: //' | sort -u; }
  rm -rf "$mod"
}

echo "== binaries"
BIN="$(bash e2e/controlplane/build.sh | tail -n 1)"
TOOLS="$CACHE/kubelet-tools"
bash e2e/kubelet-tools/build.sh "$TOOLS"
build_example
PLUGIN_BIN="${PEER_PLUGIN_BIN:-${E2E_PLUGIN_BIN:-}}"
if [ -z "$PLUGIN_BIN" ]; then
  nice cargo build --release -q -p dra-plugin
  PLUGIN_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/dra-plugin"
fi
NVIDIA_STATUS="$(try_nvidia)"
[ -z "$NVIDIA_STATUS" ] || echo "$NVIDIA_STATUS"

# shellcheck source=../controlplane/cluster.sh
source "$ROOT/e2e/controlplane/cluster.sh"
WORK="$(mktemp -d "${PEER_WORK_ROOT:-/var/tmp}/gpu-dra-peers.XXXXXX")"
PIDS=()
finish() {
  local rc=$? pid
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  cluster_stop
  if [ "$rc" = 0 ] && [ "${PEER_KEEP_WORKDIR:-0}" != 1 ]; then rm -rf "$WORK"; else echo "work dir kept: $WORK"; fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

cluster_start "$BIN" "$WORK"
# Only etcd and the API server serve the bench: the rest would only share the two cores.
kill "$PID_kube_scheduler" "$PID_kube_controller_manager" 2>/dev/null || true
KUBECONFIG_FILE="$WORK/admin.kubeconfig"

api_post() { # PATH JSON
  curl -sf --cacert "$CLUSTER_DIR/pki/apiserver.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    -H 'Content-Type: application/json' -X POST --data "$2" "https://127.0.0.1:$APISERVER_PORT$1" >/dev/null
}

# node_dirs NODE: registrar, plugins and CDI directories of a simulated node, echoed as its root.
node_dirs() {
  local d="$WORK/nodes/$1"
  mkdir -p "$d/registry" "$d/plugins" "$d/cdi"
  api_post /api/v1/nodes "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"$1\"}}"
  echo "$d"
}

start_ours() { # NODE ARGS...
  local node=$1 d; shift
  d="$(node_dirs "$node")"
  "$PLUGIN_BIN" run --backend simulated --node-name "$node" --kubeconfig "$KUBECONFIG_FILE" \
    --registrar-dir "$d/registry" --plugin-dir "$d/plugins/gpu.nvidia.com" --cdi-root "$d/cdi" \
    --metrics-port 0 --healthcheck-port 0 "$@" >"$d/plugin.log" 2>&1 &
  PIDS+=("$!")
}

start_example() { # NODE [VAR=VALUE...]
  local node=$1 d; shift
  d="$(node_dirs "$node")"
  # Its API client defaults to 5 QPS, which caps it at ~5 pairs/s (one claim GET per prepare):
  # raised, as in the first baseline, so that the plugin and not its rate limiter is measured.
  env NODE_NAME="$node" NUM_DEVICES=8 CDI_ROOT="$d/cdi" KUBECONFIG="$KUBECONFIG_FILE" KUBE_API_QPS=1000 \
    KUBELET_REGISTRAR_DIRECTORY_PATH="$d/registry" KUBELET_PLUGINS_DIRECTORY_PATH="$d/plugins" "$@" \
    "$CACHE/bin/dra-example-kubeletplugin" >"$d/plugin.log" 2>&1 &
  PIDS+=("$!")
}

# Two like-for-like pairings on the same control plane: both plugins writing the claim's
# status.devices (ours by default, theirs with GPU_DEVICE_STATUS=true), and neither writing it.
echo "== plugins (work dir $WORK)"
start_ours peer-ours --profile h100-80gb:8
OURS_PID=${PIDS[-1]}
start_example peer-theirs-status GPU_DEVICE_STATUS=true
THEIRS_STATUS_PID=${PIDS[-1]}
start_ours peer-ours-nostatus --profile h100-80gb:8 --claim-device-status=false
OURS_NOSTATUS_PID=${PIDS[-1]}
start_example peer-theirs
THEIRS_PID=${PIDS[-1]}
start_ours peer-ours-largest --profile "$LARGEST_PROFILE" --feature-gates "$LARGEST_GATES"
LARGEST_PID=${PIDS[-1]}

peer_bench() { # LABEL OURS_NODE OURS_PID THEIRS_NODE THEIRS_PID [ARGS...]
  local label=$1 on=$2 op=$3 tn=$4 tp=$5; shift 5
  "$TOOLS/peer-bench" --kubeconfig "$KUBECONFIG_FILE" --label "$label" \
    --plugin "name=ours,registrar=$WORK/nodes/$on/registry,node=$on,pid=$op" \
    --plugin "name=theirs,registrar=$WORK/nodes/$tn/registry,node=$tn,pid=$tp" \
    --concurrency "${PEER_CONCURRENCY:-1,16,64}" --rounds "${PEER_ROUNDS:-3}" \
    --phase "${PEER_PHASE:-8s}" --apiserver-pid "$(cat "$CLUSTER_DIR/kube-apiserver.pid")" "$@"
}

echo "== peer-bench: both write status.devices"
peer_bench "both write status.devices" peer-ours "$OURS_PID" peer-theirs-status "$THEIRS_STATUS_PID" \
  --namespace peer-bench-status \
  --idle-plugin "name=ours-largest,registrar=$WORK/nodes/peer-ours-largest/registry,node=peer-ours-largest,pid=$LARGEST_PID" \
  --idle-label "$LARGEST_PROFILE $LARGEST_GATES" --idle-settle "${PEER_IDLE_SETTLE:-20s}"
# These two idled through the first pairing: their idle RSS needs no further wait.
echo "== peer-bench: neither writes status.devices"
peer_bench "neither writes status.devices" peer-ours-nostatus "$OURS_NOSTATUS_PID" peer-theirs "$THEIRS_PID" \
  --namespace peer-bench-nostatus --idle-settle 1s
