#!/usr/bin/env bash
# Builds the kubelet e2e helpers (fake-cri, kubelet-dial, fake-device-plugin) and the peer
# benchmark driver (peer-bench) into OUT_DIR from the Go module proxy or cache. Go's build cache
# makes a rebuild without changes take a second or two.
# Usage: build.sh OUT_DIR
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUT_DIR" >&2; exit 2; }
out="$(realpath -m "$1")"
cd "$(dirname "$0")"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod GOSUMDB=off
mkdir -p "$out"
go build -trimpath -o "$out/" ./cmd/fake-cri ./cmd/kubelet-dial ./cmd/fake-device-plugin ./cmd/peer-bench
