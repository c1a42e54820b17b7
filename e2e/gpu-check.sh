#!/usr/bin/env bash
# The check on a real NVIDIA GPU, in one go and read-only: never changes MIG mode, never creates
# MIG instances, never resets a GPU, never changes compute mode or any other setting.
#
#   bash e2e/gpu-check.sh
#
# 1. prints the machine and, when nvidia-smi is there, its read-only query of the GPUs;
# 2. builds the plugin (cargo build -p dra-plugin) and the check (tests/nvml_gpu_check.rs);
# 3. runs the check: it prints what `dra-plugin slices --backend nvml` publishes on this machine and
#    compares every GPU with NVML's own view (name, UUID, memory, MIG mode and MIG devices).
# The whole output also goes to target/gpu-check-<host>-<time>.log (paste it in the closing note).
#
# Environment:
#   NVIDIA_DRIVER_ROOT   driver root for operator-installed drivers (e.g. /run/nvidia/driver);
#                        used by the plugin and by the check alike
#   CARGO_PROFILE_FLAGS  e.g. --release
#   GPU_CHECK_LOG        where the log goes
#
# Without an NVIDIA GPU (no /dev/nvidia<N> and no NVIDIA_DRIVER_ROOT) it stops at once with exit 2;
# if NVML cannot be initialised the check fails saying so.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LOG="${GPU_CHECK_LOG:-${CARGO_TARGET_DIR:-$ROOT/target}/gpu-check-$(hostname -s 2>/dev/null || echo host)-$(date +%Y%m%d-%H%M%S).log}"
mkdir -p "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1

echo "== gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) ($(uname -srm))"
echo "   repo: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (dirty)')"

shopt -s nullglob
devs=(/dev/nvidia[0-9]*)
shopt -u nullglob
if [ "${#devs[@]}" -eq 0 ] && [ -z "${NVIDIA_DRIVER_ROOT:-}" ]; then
  echo "gpu-check: FAILED: no NVIDIA GPU on this machine (no /dev/nvidia<N> device nodes, NVIDIA_DRIVER_ROOT unset)."
  echo "gpu-check: this check needs a machine with an NVIDIA GPU and its driver; the mock tests"
  echo "           (cargo test -p dra-plugin --test nvml_mock --test nvml_e2e) are the bar without one."
  exit 2
fi
echo "   device nodes: ${devs[*]:-none} NVIDIA_DRIVER_ROOT=${NVIDIA_DRIVER_ROOT:-unset}"

if command -v nvidia-smi >/dev/null 2>&1; then
  echo "== nvidia-smi (read-only queries)"
  nvidia-smi --query-gpu=index,name,uuid,memory.total,mig.mode.current,mig.mode.pending,driver_version,pci.bus_id \
    --format=csv || echo "   (nvidia-smi query failed: $?)"
  nvidia-smi -L || true
else
  echo "== nvidia-smi not found; NVML's view comes from the check below"
fi

echo "== building dra-plugin and the check"
# shellcheck disable=SC2086
cargo build ${CARGO_PROFILE_FLAGS:-} -p dra-plugin --bin dra-plugin
# shellcheck disable=SC2086
cargo test ${CARGO_PROFILE_FLAGS:-} -p dra-plugin --test nvml_gpu_check --no-run

echo "== dra-plugin slices --backend nvml vs NVML (read-only)"
set +e
# shellcheck disable=SC2086
cargo test ${CARGO_PROFILE_FLAGS:-} -p dra-plugin --test nvml_gpu_check -- \
  --ignored --exact published_slices_agree_with_nvml_on_this_gpu --nocapture --test-threads=1
rc=$?
set -e
if [ "$rc" = 0 ]; then
  echo "gpu-check: PASSED: the published slices agree with NVML (log: $LOG)"
else
  echo "gpu-check: FAILED (exit $rc): see the output above (log: $LOG)"
fi
exit "$rc"
