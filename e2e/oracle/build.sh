#!/usr/bin/env bash
# Builds the differential oracle from the Go module proxy or cache (same Kubernetes version and
# staging replace lines as e2e/controlplane/build.sh). Usage: build.sh <output binary>
set -euo pipefail
out="$(realpath -m "${1:-oracle}")"
cd "$(dirname "$0")"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod GOSUMDB=off
go build -trimpath -o "$out" .
