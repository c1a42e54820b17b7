#!/usr/bin/env bash
# Runs NVIDIA's own manifests (sigs.k8s.io/dra-driver-nvidia-gpu@v0.5.0, from the Go module proxy)
# through the simulator: dra-sim/tests/nvidia_manifests.rs, with the module's directory passed in.
set -euo pipefail
module=sigs.k8s.io/dra-driver-nvidia-gpu@v0.5.0
dir=$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "$module" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
NVIDIA_DRA_DRIVER_DIR="$dir" cargo test -p dra-sim --test nvidia_manifests -- --nocapture
