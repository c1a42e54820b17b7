#!/usr/bin/env bash
# Builds umoci (the daemonless OCI image tool that deploy/image/build.sh and check.sh use) from the
# Go module proxy into the e2e cache as bin/umoci-<version>, the way deploy/helm/build-helm.sh builds
# helm: no root, no registry, pinned. Reuses the binary when it already reports the pinned version.
# Prints the binary's path last (progress goes to stderr).
#
#   UMOCI_VERSION (default below)  E2E_CACHE (default ~/.cache/gpu-dra-e2e)
set -euo pipefail

UMOCI_VERSION="${UMOCI_VERSION:-v0.6.0}"
CACHE="${E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-e2e}"
BIN="$CACHE/bin"
UMOCI="$BIN/umoci-$UMOCI_VERSION"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

command -v go >/dev/null || { echo "go not found: Go is needed to build umoci" >&2; exit 1; }
mkdir -p "$BIN"
# One build at a time per cache; a second caller waits and then finds the binary cached.
if command -v flock >/dev/null; then
  exec 9>"$CACHE/.build-umoci.lock"
  flock 9
fi

have_umoci() {
  # umoci embeds its VERSION file; the first line reads "umoci version 0.6.0".
  [ -x "$UMOCI" ] && [ "$("$UMOCI" --version 2>/dev/null | head -n 1)" = "umoci version ${UMOCI_VERSION#v}" ]
}

if have_umoci; then
  echo "umoci $UMOCI_VERSION: cached as $UMOCI" >&2
else
  echo "building umoci $UMOCI_VERSION from the Go module proxy" >&2
  start=$(date +%s)
  mod="$CACHE/umoci-$UMOCI_VERSION"
  rm -rf "$mod" && mkdir -p "$mod" && cd "$mod"
  go mod init example.invalid/umocibin >/dev/null 2>&1
  go get -tool "github.com/opencontainers/umoci/cmd/umoci@$UMOCI_VERSION" >&2
  go build -trimpath -ldflags "-s -w" -o "$UMOCI.tmp" github.com/opencontainers/umoci/cmd/umoci >&2
  mv "$UMOCI.tmp" "$UMOCI"
  have_umoci || { echo "built umoci does not report $UMOCI_VERSION" >&2; exit 1; }
  echo "built umoci $UMOCI_VERSION in $(( $(date +%s) - start ))s" >&2
fi
echo "$UMOCI"
