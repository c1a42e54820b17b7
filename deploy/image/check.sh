#!/usr/bin/env bash
# Checks an image from deploy/image/build.sh without a container runtime: unpacks the oci-archive
# rootlessly with umoci and runs both binaries inside the unpacked root filesystem (chroot, or a user
# namespace and chroot when not root), so that nothing comes from this host:
#   - the image config: user 65532, entrypoint, PATH, the org.opencontainers.image.* labels;
#   - dra-controller --version / --help, as user 65532, and `simulate` on the README's claim;
#   - dra-plugin --version / --help and `slices` with the simulated backend;
#   - dra-plugin `slices --backend nvml` with the mock libnvidia-ml.so.1 (mock-nvml/) at the driver
#     root the controller's DaemonSet mounts (/driver-root), and again at the path where the NVIDIA
#     container toolkit injects it (/usr/lib/<multiarch>), loaded by the dynamic loader's search
#     path; both must publish exactly what the simulated backend publishes.
# Fails on the first check that does not hold. Where chroot is impossible (no root, no user
# namespaces) it runs the binaries through the image's own ELF interpreter and libraries and says so.
#
#   bash deploy/image/check.sh [ARCHIVE]   default: build the image (deploy/image/build.sh, with
#                                          IMAGE_PROFILE etc.) and check that
#   UMOCI             use this umoci binary instead of building it
#   IMAGE_CHECK_MODE  chroot, userns or loader: how to run inside the image (default: the first
#                     of these that works here)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
start=$SECONDS
UMOCI="${UMOCI:-$(bash deploy/image/build-umoci.sh | tail -n 1)}"
export UMOCI
ARCHIVE="${1:-$(bash deploy/image/build.sh | tail -n 1)}"
[ -f "$ARCHIVE" ] || { echo "check: no image archive at $ARCHIVE" >&2; exit 1; }
for tool in python3 readelf make gcc tar; do
  command -v "$tool" >/dev/null || { echo "check: missing $tool on this machine" >&2; exit 1; }
done

fail() { echo "check: FAIL: $*" >&2; exit 1; }
ok() { echo "check: ok: $*"; }

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-dra-image-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir "$WORK/layout"
tar -C "$WORK/layout" -xf "$ARCHIVE"

# ---- the image config, read from the layout as a runtime would
TAG="$(python3 - "$WORK/layout" <<'EOF'
import json, sys, os
layout = sys.argv[1]
def blob(d):
    alg, h = d["digest"].split(":")
    with open(os.path.join(layout, "blobs", alg, h)) as f:
        return json.load(f)
with open(os.path.join(layout, "index.json")) as f:
    index = json.load(f)
[desc] = index["manifests"]
tag = desc["annotations"]["org.opencontainers.image.ref.name"]
cfg = blob(blob(desc)["config"])
c = cfg["config"]
errors = []
def want(what, got, expected):
    if got != expected:
        errors.append(f"{what} is {got!r}, want {expected!r}")
want("os", cfg.get("os"), "linux")
want("user", c.get("User"), "65532:65532")
want("entrypoint", c.get("Entrypoint"), ["/usr/local/bin/dra-controller"])
if not any(e.startswith("PATH=") and "/usr/local/bin" in e for e in c.get("Env", [])):
    errors.append(f"no PATH with /usr/local/bin in {c.get('Env')}")
labels = c.get("Labels") or {}
for k in ("title", "version", "revision", "created", "licenses", "description"):
    if not labels.get("org.opencontainers.image." + k):
        errors.append(f"label org.opencontainers.image.{k} missing")
if errors:
    sys.exit("check: FAIL: image config: " + "; ".join(errors))
print(tag)
EOF
)" || exit 1
ok "image config of tag $TAG (user 65532:65532, entrypoint dra-controller, PATH, labels)"

"$UMOCI" unpack --rootless --image "$WORK/layout:$TAG" "$WORK/bundle" >/dev/null
RFS="$WORK/bundle/rootfs"
for b in dra-controller dra-plugin; do
  [ -x "$RFS/usr/local/bin/$b" ] || fail "/usr/local/bin/$b missing or not executable in the image"
done
UNPACKED_KIB="$(du -sk "$RFS" | cut -f1)"
ok "unpacked rootlessly: /usr/local/bin/dra-controller, /usr/local/bin/dra-plugin"

# ---- how to run a command inside the image
INTERP="$(readelf -l "$RFS/usr/local/bin/dra-plugin" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')"
LIBC="$(cd "$RFS" && find usr/lib -name libc.so.6 | head -n 1)"
[ -n "$LIBC" ] || fail "no libc.so.6 under /usr/lib in the image"
LIBDIR="/$(dirname "$LIBC")"
CHROOT="$(command -v chroot || true)"
UNSHARE="$(command -v unshare || true)"
if [ -n "${IMAGE_CHECK_MODE:-}" ]; then
  MODE="$IMAGE_CHECK_MODE"
elif [ -n "$CHROOT" ] && [ "$(id -u)" = 0 ]; then
  MODE=chroot
elif [ -n "$CHROOT" ] && [ -n "$UNSHARE" ] && "$UNSHARE" -r true 2>/dev/null; then
  MODE=userns
else
  MODE=loader
  echo "check: no root and no user namespaces here: running the binaries through the image's" \
    "own ELF interpreter and libraries ($LIBDIR), not chrooted"
fi
# P: what an absolute path inside the image is from where the command runs.
if [ "$MODE" = loader ]; then P="$RFS"; else P=""; fi
# in_image [--nonroot] BIN ARGS...: BIN from /usr/local/bin of the image, with only the image's PATH.
in_image() {
  local user=()
  if [ "$1" = --nonroot ]; then
    shift
    [ "$MODE" = chroot ] && user=(--userspec=65532:65532)
  fi
  local bin=$1
  shift
  case "$MODE" in
    chroot) env -i PATH=/usr/local/bin:/usr/bin:/bin "${EXTRA_ENV[@]}" "$CHROOT" "${user[@]}" "$RFS" "/usr/local/bin/$bin" "$@" ;;
    userns) env -i PATH=/usr/local/bin:/usr/bin:/bin "${EXTRA_ENV[@]}" "$UNSHARE" -r "$CHROOT" "$RFS" "/usr/local/bin/$bin" "$@" ;;
    loader) env -i "${EXTRA_ENV[@]}" "$RFS$LIBDIR/$(basename "$INTERP")" --library-path "$RFS$LIBDIR" "$RFS/usr/local/bin/$bin" "$@" ;;
  esac
}
EXTRA_ENV=()
ok "running inside the image by $MODE"

# ---- the controller
v="$(in_image --nonroot dra-controller --version)" || fail "dra-controller --version did not run in the image"
in_image --nonroot dra-controller --help >/dev/null || fail "dra-controller --help did not run in the image"
mkdir -p "$RFS/tmp/check"
cp examples/claims/inference-gpu.yaml "$RFS/tmp/check/"
sim="$(in_image --nonroot dra-controller simulate "$P/tmp/check/inference-gpu.yaml")" \
  || fail "dra-controller simulate did not run in the image"
grep -q 'gpu-0-mig-3g40gb' <<<"$sim" || fail "dra-controller simulate gave an unexpected answer: $sim"
ok "$v: --version, --help and simulate (as user 65532 where chrooted)"

# ---- the plugin, simulated backend
v="$(in_image dra-plugin --version)" || fail "dra-plugin --version did not run in the image"
in_image dra-plugin --help >/dev/null || fail "dra-plugin --help did not run in the image"
HW=(--profile h100-80gb:8 --node-name node-1 --feature-gates DynamicMIG=true -o yaml)
in_image dra-plugin slices --backend simulated "${HW[@]}" >"$WORK/sim.yaml" \
  || fail "dra-plugin slices --backend simulated did not run in the image"
devices=$(grep -cE '^ +name: gpu-[0-9]+(-mig-.*)?$' "$WORK/sim.yaml" || true)
[ "$devices" -gt 0 ] || fail "dra-plugin slices --backend simulated published no devices"
ok "$v: --version, --help, slices --backend simulated ($devices devices)"

# ---- the plugin, NVML backend: dlopen of libnvidia-ml.so.1 from inside the image
make -s -C mock-nvml OUT="$WORK/mock-build" >/dev/null
cp "$WORK/mock-build/usr/lib64/libnvidia-ml.so.1" "$RFS/tmp/check/"
# The image's own plugin writes the mock driver root, so its paths are the image's.
in_image dra-plugin mock-nvml-root --profile h100-80gb:8 --node-name node-1 \
  --library "$P/tmp/check/libnvidia-ml.so.1" --out "$P/tmp/check/mock" >/dev/null \
  || fail "dra-plugin mock-nvml-root did not run in the image"
# As the controller's DaemonSet runs it: the host's driver installation mounted at /driver-root.
ln -s /tmp/check/mock/root "$RFS/driver-root"
[ "$MODE" = loader ] && ln -sfn "$RFS/tmp/check/mock/root" "$RFS/driver-root"
EXTRA_ENV=(NVIDIA_DRIVER_ROOT="$P/driver-root" HOST_SYSFS_ROOT="$P/tmp/check/mock/sys")
in_image dra-plugin slices --backend nvml "${HW[@]}" >"$WORK/nvml.yaml" 2>"$WORK/nvml.err" \
  || fail "dra-plugin slices --backend nvml (driver root /driver-root) failed in the image: $(cat "$WORK/nvml.err")"
# The plugin logs the library it opened; the slices alone could not tell which copy that was.
grep -qF "NVML session open library=$P/driver-root/usr/lib64/libnvidia-ml.so.1 " "$WORK/nvml.err" \
  || fail "dra-plugin did not open /driver-root/usr/lib64/libnvidia-ml.so.1: $(cat "$WORK/nvml.err")"
diff -u "$WORK/sim.yaml" "$WORK/nvml.yaml" >&2 || fail "NVML slices differ from the simulated backend's"
ok "dra-plugin slices --backend nvml, libnvidia-ml.so.1 from /driver-root/usr/lib64: same slices as simulated"
# As the NVIDIA container toolkit injects it: into the image's library directory, found by the loader.
cp "$RFS/tmp/check/mock/root/usr/lib64/libnvidia-ml.so.1" "$RFS/tmp/check/mock/root/usr/lib64/mock-nvml.conf" "$RFS$LIBDIR/"
EXTRA_ENV=(HOST_SYSFS_ROOT="$P/tmp/check/mock/sys")
in_image dra-plugin slices --backend nvml "${HW[@]}" >"$WORK/nvml2.yaml" 2>"$WORK/nvml.err" \
  || fail "dra-plugin slices --backend nvml (libnvidia-ml.so.1 in $LIBDIR) failed in the image: $(cat "$WORK/nvml.err")"
grep -qF "NVML session open library=libnvidia-ml.so.1 " "$WORK/nvml.err" \
  || fail "dra-plugin did not open libnvidia-ml.so.1 by the loader's search path: $(cat "$WORK/nvml.err")"
diff -u "$WORK/sim.yaml" "$WORK/nvml2.yaml" >&2 || fail "NVML slices differ from the simulated backend's"
ok "dra-plugin slices --backend nvml, libnvidia-ml.so.1 in $LIBDIR (toolkit injection): same slices"
EXTRA_ENV=()

echo "check: image $TAG: $(du -k "$ARCHIVE" | cut -f1) KiB compressed (oci-archive)," \
  "$UNPACKED_KIB KiB unpacked; check took $(( SECONDS - start ))s"
