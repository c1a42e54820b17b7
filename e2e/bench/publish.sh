#!/usr/bin/env bash
# `make bench-publish`: what publishing one node costs the cluster (issue 31 §3, plugin side). A
# fresh etcd + kube-apiserver from e2e/controlplane (no scheduler, controller manager or kubelet),
# one Node, and `dra-plugin run --backend simulated` with the largest B200 node. publish.py
# watches that node's slices (JSON and protobuf, as a kubelet or scheduler would), starts the
# plugin and measures start -> all slices on the watch, the slices' bytes, watch bytes while
# publishing, at idle and over a restart, and ResourceSlice requests per window. Prints `perf|...`
# rows for tools/perf-table.py; method in docs/peers.md ("Publishing a node").
#
# Environment:
#   PUBLISH_PROFILE (b200:8), PUBLISH_GATES (DynamicMIG=true), PUBLISH_IDLE_S (30), PUBLISH_RESTART_S (10)
#   PUBLISH_PLUGIN_BIN (or E2E_PLUGIN_BIN)  a prebuilt dra-plugin (default: cargo build --release)
#   PUBLISH_WORK_ROOT (/var/tmp), PUBLISH_KEEP_WORKDIR=1
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PROFILE="${PUBLISH_PROFILE:-b200:8}"
GATES="${PUBLISH_GATES:-DynamicMIG=true}"
NODE=publish-node

echo "== binaries"
BIN="$(bash e2e/controlplane/build.sh | tail -n 1)"
PLUGIN_BIN="${PUBLISH_PLUGIN_BIN:-${E2E_PLUGIN_BIN:-}}"
if [ -z "$PLUGIN_BIN" ]; then
  nice cargo build --release -q -p dra-plugin
  PLUGIN_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/dra-plugin"
fi

# shellcheck source=../controlplane/cluster.sh
source "$ROOT/e2e/controlplane/cluster.sh"
WORK="$(mktemp -d "${PUBLISH_WORK_ROOT:-/var/tmp}/gpu-dra-publish.XXXXXX")"
finish() {
  local rc=$?
  trap - EXIT INT TERM
  cluster_stop
  if [ "$rc" = 0 ] && [ "${PUBLISH_KEEP_WORKDIR:-0}" != 1 ]; then rm -rf "$WORK"; else echo "work dir kept: $WORK"; fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

cluster_start "$BIN" "$WORK"
# Only etcd and the API server: nothing else may read or write slices in the windows measured.
kill "$PID_kube_scheduler" "$PID_kube_controller_manager" 2>/dev/null || true
KUBECONFIG_FILE="$WORK/admin.kubeconfig"
curl -sf --cacert "$CLUSTER_DIR/pki/apiserver.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
  -H 'Content-Type: application/json' -X POST \
  --data "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"$NODE\"}}" \
  "https://127.0.0.1:$APISERVER_PORT/api/v1/nodes" >/dev/null

D="$WORK/node"
mkdir -p "$D/registry" "$D/plugins" "$D/cdi"
"$PLUGIN_BIN" slices --backend simulated --profile "$PROFILE" --feature-gates "$GATES" \
  --node-name "$NODE" --kubernetes-version 1.37 -o json >"$WORK/sent.json"

echo "== publish ($PROFILE $GATES)"
python3 e2e/bench/publish.py --kubeconfig "$KUBECONFIG_FILE" --node "$NODE" --sent "$WORK/sent.json" \
  --label "$PROFILE $GATES" --idle "${PUBLISH_IDLE_S:-30}" --restart "${PUBLISH_RESTART_S:-10}" \
  --log "$D/plugin.log" -- \
  "$PLUGIN_BIN" run --backend simulated --profile "$PROFILE" --feature-gates "$GATES" \
  --node-name "$NODE" --kubeconfig "$KUBECONFIG_FILE" --registrar-dir "$D/registry" \
  --plugin-dir "$D/plugins/gpu.nvidia.com" --cdi-root "$D/cdi" --metrics-port 0 --healthcheck-port 0
