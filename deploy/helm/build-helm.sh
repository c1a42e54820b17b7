#!/usr/bin/env bash
# Builds the helm CLI from the Go module proxy into the e2e cache (next to the control plane binaries),
# as bin/helm-<version>, so that checkouts pinning different versions share one cache. Reuses the
# binary when it already reports the pinned version. Prints the binary's path last (progress goes to
# stderr). e2e/run.sh runs it and exports E2E_HELM_BIN.
#
#   HELM_VERSION (default below)  E2E_CACHE (default ~/.cache/gpu-dra-e2e)
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.1}"
CACHE="${E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-e2e}"
BIN="$CACHE/bin"
HELM="$BIN/helm-$HELM_VERSION"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

command -v go >/dev/null || { echo "go not found: Go is needed to build helm" >&2; exit 1; }
mkdir -p "$BIN"
# One build at a time per cache; a second caller waits and then finds the binary cached.
if command -v flock >/dev/null; then
  exec 9>"$CACHE/.build-helm.lock"
  flock 9
fi

have_helm() {
  [ -x "$HELM" ] && [ "$("$HELM" version --template '{{.Version}}' 2>/dev/null)" = "$HELM_VERSION" ]
}

if have_helm; then
  echo "helm $HELM_VERSION: cached as $HELM" >&2
else
  echo "building helm $HELM_VERSION (~2 min on 2 cores when the Go caches hold an earlier helm, measured; longer from empty caches)" >&2
  start=$(date +%s)
  mod="$CACHE/helm-$HELM_VERSION"
  rm -rf "$mod" && mkdir -p "$mod" && cd "$mod"
  go mod init example.invalid/helmbin >/dev/null 2>&1
  go get -tool "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
  go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
    -o "$HELM.tmp" helm.sh/helm/v3/cmd/helm >&2
  mv "$HELM.tmp" "$HELM"
  have_helm || { echo "built helm does not report $HELM_VERSION" >&2; exit 1; }
  echo "built helm $HELM_VERSION in $(( $(date +%s) - start ))s" >&2
fi
echo "$HELM"
