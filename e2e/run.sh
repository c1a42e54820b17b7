#!/usr/bin/env bash
# End-to-end tests against a real control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler), stock kubelets with a fake container runtime, dra-plugin processes per node and,
# for the older scenarios, a kubelet-role harness (crate `e2e`).
#
#   bash e2e/run.sh [FILTER]    build what is needed, start the cluster, run the scenarios whose test
#                               name contains FILTER (e.g. s3, s7_many_pods), tear everything down.
#   E2E_KEEP=1 bash e2e/run.sh [FILTER]
#                               same, but keep the cluster up afterwards (prints the kubeconfig path)
#                               until Ctrl-C.
#   bash e2e/run.sh --up        only start the cluster and keep it up (no tests).
#
# Environment:
#   E2E_TEST_TARGETS   cargo target selection, default --tests (every tests/*.rs of the e2e crate),
#                      e.g. "--test scenarios"
#   E2E_PLUGIN_BIN     use this dra-plugin binary instead of building it
#   E2E_KEEP_WORKDIR=1 keep the work dir (all logs) after a passing run too
#   E2E_HELM_BIN       use this helm binary instead of building it (deploy/helm/build-helm.sh)
#   E2E_CACHE          control-plane and helm binary cache (default ~/.cache/gpu-dra-e2e)
#   E2E_LOGS           where a failed run's work dir is kept (default /tmp/gpu-dra-e2e-logs)
#   CARGO_PROFILE_FLAGS e.g. --release
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FILTER="${1:-}"
UP_ONLY=false
if [ "$FILTER" = "--up" ]; then UP_ONLY=true; FILTER=""; E2E_KEEP=1; fi
KEEP="${E2E_KEEP:-0}"
LOGS_ROOT="${E2E_LOGS:-/tmp/gpu-dra-e2e-logs}"
t0=$SECONDS

echo "== control-plane binaries"
bstart=$SECONDS
BIN="$(bash e2e/controlplane/build.sh | tail -n 1)"
echo "   ($(( SECONDS - bstart ))s)"

echo "== helm (deploy/helm/build-helm.sh: tests/helm_install.rs and controller.rs c5 run it)"
bstart=$SECONDS
if [ -z "${E2E_HELM_BIN:-}" ]; then
  E2E_HELM_BIN="$(bash deploy/helm/build-helm.sh | tail -n 1)"
  export E2E_HELM_BIN
fi
echo "   $E2E_HELM_BIN ($(( SECONDS - bstart ))s)"

echo "== fake container runtime and kubelet-dial (e2e/kubelet-tools)"
bstart=$SECONDS
TOOLS="$BIN/../kubelet-tools"
bash e2e/kubelet-tools/build.sh "$TOOLS"
echo "   ($(( SECONDS - bstart ))s)"

echo "== NVIDIA's driver module (its public manifests, read by tests/nvidia_manifests.rs)"
# Through the Go module proxy into the module cache, never into this repository. Outside CI a
# failed download only makes that test skip (it says why).
NVIDIA_MODULE="sigs.k8s.io/dra-driver-nvidia-gpu@v0.5.0"
if NV_JSON="$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "$NVIDIA_MODULE" 2>&1)"; then
  E2E_NVIDIA_DRIVER_DIR="$(printf '%s\n' "$NV_JSON" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' | head -n 1)"
  export E2E_NVIDIA_DRIVER_DIR
  echo "   $E2E_NVIDIA_DRIVER_DIR"
elif [ "${CI:-}" = true ]; then
  echo "e2e: downloading $NVIDIA_MODULE failed:"; echo "$NV_JSON"; exit 1
else
  echo "   download of $NVIDIA_MODULE failed; nvidia_manifests will skip:"; echo "$NV_JSON" | tail -n 3
fi

echo "== building dra-plugin, dra-controller and the e2e harness"
bstart=$SECONDS
PROFILE_DIR=debug
case "${CARGO_PROFILE_FLAGS:-}" in *--release*) PROFILE_DIR=release ;; esac
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
if [ -n "${E2E_PLUGIN_BIN:-}" ]; then
  PLUGIN_BIN="$E2E_PLUGIN_BIN"   # a prebuilt plugin: use as is
else
  # shellcheck disable=SC2086
  cargo build ${CARGO_PROFILE_FLAGS:-} -p dra-plugin
  PLUGIN_BIN="$TARGET_DIR/$PROFILE_DIR/dra-plugin"
fi
if [ -z "${E2E_CONTROLLER_BIN:-}" ]; then
  # shellcheck disable=SC2086
  cargo build ${CARGO_PROFILE_FLAGS:-} -p dra-controller --bin dra-controller
  export E2E_CONTROLLER_BIN="$TARGET_DIR/$PROFILE_DIR/dra-controller"
fi
# Every test target of the e2e crate by default (tests/*.rs); E2E_TEST_TARGETS="--test scenarios"
# narrows it to one file.
TARGETS="${E2E_TEST_TARGETS:---tests}"
# shellcheck disable=SC2086
cargo test ${CARGO_PROFILE_FLAGS:-} -p e2e $TARGETS --no-run
echo "   ($(( SECONDS - bstart ))s)"

# shellcheck source=controlplane/cluster.sh
source "$ROOT/e2e/controlplane/cluster.sh"
WORK="$(mktemp -d /tmp/gpu-dra-e2e.XXXXXX)"
STATUS=1

# What the stock kubelets could change on the host if kubelet-ns.sh failed to keep them in their
# node directories: checked again when the run ends.
host_state() {
  local p k
  for p in /var/lib/kubelet /var/log/pods /var/log/containers; do
    [ -e "$p" ] && echo "$p exists" || echo "$p absent"
  done
  for k in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops \
    kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
    echo "$k=$(cat "/proc/sys/$k" 2>/dev/null)"
  done
}
HOST_BEFORE="$(host_state)"

finish() {
  local rc=$? pid pidf
  [ "$STATUS" = 0 ] || STATUS=$rc
  trap - EXIT INT TERM
  # Plugins started by the harness die with it; anything left from a killed harness goes here.
  if [ -d "$WORK/nodes" ]; then
    for pidf in "$WORK"/nodes/*/plugin.pid; do
      [ -e "$pidf" ] || continue
      pid=$(cat "$pidf")
      # Only a plugin of this run (its command line names the work dir), never a reused pid.
      if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--registrar-dir $WORK/"; then
        kill -9 "$pid" 2>/dev/null || true
      fi
    done
  fi
  cluster_stop
  # Kubelets first: their processes hold the node directories' bind mounts.
  pkill -9 -f -- "--root-dir=$WORK/" 2>/dev/null || true
  pkill -9 -f -- "--listen $WORK/" 2>/dev/null || true
  # The workload controllers a test starts beside the control plane (e2e/src/manifests.rs), left
  # running when its harness was killed.
  pkill -9 -f -- "kube-controller-manager --kubeconfig=$WORK/" 2>/dev/null || true
  local host_after
  host_after="$(host_state)"
  if [ "$host_after" != "$HOST_BEFORE" ]; then
    echo "e2e: the host changed during the run:"
    diff <(echo "$HOST_BEFORE") <(echo "$host_after") || true
    STATUS=1
  else
    echo "== host unchanged (kubelet paths under /var, kernel tunables)"
  fi
  if [ "$STATUS" = 0 ] && [ "${E2E_KEEP_WORKDIR:-0}" != 1 ]; then
    rm -rf "$WORK"
  elif [ "$STATUS" = 0 ]; then
    echo "work dir kept: $WORK"
  else
    mkdir -p "$LOGS_ROOT"
    local keep
    keep="$LOGS_ROOT/run-$(date +%Y%m%d-%H%M%S)"
    rm -rf "$WORK/etcd"
    mv "$WORK" "$keep"
    echo "e2e FAILED (exit $STATUS); logs kept in $keep (scenarios.log, logs/ control plane, nodes/*/plugin.log)"
  fi
  echo "== e2e wall time $(( SECONDS - t0 ))s"
  exit "$STATUS"
}
trap finish EXIT
trap 'echo "interrupted"; STATUS=130; exit 130' INT TERM

cluster_start "$BIN" "$WORK"

export E2E_KUBECONFIG="$WORK/admin.kubeconfig"
export E2E_WORKDIR="$WORK"
export E2E_PLUGIN_BIN="$PLUGIN_BIN"
export E2E_REPO_ROOT="$ROOT"
export E2E_KUBELET_BIN="$BIN/kubelet"
export E2E_KUBELET_TOOLS="$TOOLS"
# The stock kubelet refuses a loopback node IP: the first address of this machine.
E2E_NODE_IP="${E2E_NODE_IP:-$(hostname -I 2>/dev/null | awk '{print $1}')}"
export E2E_NODE_IP="${E2E_NODE_IP:-192.0.2.2}"

if ! $UP_ONLY; then
  echo "== scenarios ${FILTER:+(filter: $FILTER)}"
  sstart=$SECONDS
  # Scenarios one at a time (they share the cluster and the 2 cores); every test file runs even
  # when an earlier one failed.
  # shellcheck disable=SC2086
  cargo test ${CARGO_PROFILE_FLAGS:-} -p e2e $TARGETS --no-fail-fast -- --test-threads=1 --nocapture ${FILTER:+"$FILTER"} \
    2>&1 | tee "$WORK/scenarios.log"
  echo "== scenarios took $(( SECONDS - sstart ))s"
fi
STATUS=0

if [ "$KEEP" = 1 ]; then
  echo "cluster kept up. kubeconfig: $E2E_KUBECONFIG"
  echo "  kubectl --kubeconfig $E2E_KUBECONFIG get nodes,resourceslices,resourceclaims -A"
  echo "Ctrl-C to tear down."
  trap 'exit 0' INT TERM
  while :; do sleep 3600 & wait $! || true; done
fi
