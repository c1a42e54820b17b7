#!/usr/bin/env bash
# Builds the driver image (dra-controller and dra-plugin) with no base image, daemon or registry:
# the binaries and the glibc runtime they and NVIDIA's libnvidia-ml.so.1 need are copied from this
# (Debian) build host into one layer, written with umoci (deploy/image/build-umoci.sh). Why glibc
# and not a static musl binary: docs/image.md. Prints the oci-archive's path last.
#
#   IMAGE_PROFILE  release (default) or dev: the cargo profile of the binaries. dev takes the debug
#                  binaries that e2e/run.sh builds, so `make test` checks the image without a
#                  second build of the dependency tree.
#   IMAGE_TAG      default v<workspace version>, the chart's appVersion
#   IMAGE_OUT      default $CARGO_TARGET_DIR/image (target/image): the OCI layout (oci/), the
#                  oci-archive (gpu-dra-driver-<tag>.oci.tar) and the staged rootfs
#   IMAGE_BIN_DIR  take dra-controller and dra-plugin from this directory instead of building them
#   UMOCI          use this umoci binary instead of building it
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PROFILE="${IMAGE_PROFILE:-release}"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
OUT="${IMAGE_OUT:-$TARGET_DIR/image}"
VERSION="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
TAG="${IMAGE_TAG:-v$VERSION}"
NAME=gpu-dra-driver

case "$PROFILE" in
  release) CARGO_FLAGS=(--release); BIN_DIR="$TARGET_DIR/release" ;;
  dev) CARGO_FLAGS=(); BIN_DIR="$TARGET_DIR/debug" ;;
  *) echo "IMAGE_PROFILE must be release or dev, not $PROFILE" >&2; exit 2 ;;
esac
for tool in cargo readelf ldd; do
  command -v "$tool" >/dev/null || { echo "missing $tool on this machine" >&2; exit 1; }
done

UMOCI="${UMOCI:-$(bash deploy/image/build-umoci.sh | tail -n 1)}"

start=$SECONDS
if [ -n "${IMAGE_BIN_DIR:-}" ]; then
  BIN_DIR="$IMAGE_BIN_DIR"
else
  # The same two commands as e2e/run.sh, so that with IMAGE_PROFILE=dev they find everything built.
  cargo build "${CARGO_FLAGS[@]}" --locked -p dra-plugin >&2
  cargo build "${CARGO_FLAGS[@]}" --locked -p dra-controller --bin dra-controller >&2
  echo "image: binaries ($PROFILE) ready in $(( SECONDS - start ))s" >&2
fi

# ---- the root filesystem
ROOTFS="$OUT/rootfs"
rm -rf "$ROOTFS" && mkdir -p "$ROOTFS"/{usr/local/bin,usr/lib,usr/lib64,etc,tmp}
chmod 1777 "$ROOTFS/tmp"
# Merged /usr as on Debian: /lib/x86_64-linux-gnu and /lib64/ld-linux-x86-64.so.2 resolve too.
ln -s usr/lib "$ROOTFS/lib"
ln -s usr/lib64 "$ROOTFS/lib64"
install -m 0755 "$BIN_DIR/dra-controller" "$BIN_DIR/dra-plugin" "$ROOTFS/usr/local/bin/"

BINS=("$ROOTFS/usr/local/bin/dra-controller" "$ROOTFS/usr/local/bin/dra-plugin")
INTERP="$(readelf -l "${BINS[0]}" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')"
[ -n "$INTERP" ] || { echo "dra-controller is not dynamically linked; this script expects glibc" >&2; exit 1; }
LIBC="$(ldd "${BINS[0]}" | awk '$1 == "libc.so.6" { print $3 }')"
LIBDIR="$(dirname "$LIBC")"                     # /lib/x86_64-linux-gnu on Debian
MULTIARCH="$(basename "$LIBDIR")"
mkdir -p "$ROOTFS/usr/lib/$MULTIARCH"

# glibc's libraries that the driver's own binaries name (libnvidia-ml.so.1, which the plugin
# dlopens, and nvidia-cuda-mps-control, which it runs; libpthread, libdl and librt are stubs since
# glibc 2.34 but older builds still name them), then whatever our binaries link.
for lib in libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libgcc_s.so.1; do
  [ -e "$LIBDIR/$lib" ] || { echo "$lib not found in $LIBDIR" >&2; exit 1; }
  cp -L "$LIBDIR/$lib" "$ROOTFS/usr/lib/$MULTIARCH/$lib"
done
for b in "${BINS[@]}"; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r lib path; do
    [ -e "$ROOTFS/usr/lib/$MULTIARCH/$lib" ] || cp -L "$path" "$ROOTFS/usr/lib/$MULTIARCH/$lib"
  done
done
cp -L "$INTERP" "$ROOTFS/usr/lib/$MULTIARCH/$(basename "$INTERP")"
# The ELF interpreter path the binaries (and the host's NVIDIA tools, e.g. nvidia-cuda-mps-control) ask for.
mkdir -p "$ROOTFS/$(dirname "$INTERP")"
if [ ! -e "$ROOTFS$INTERP" ]; then
  ln -s "$(realpath -m --relative-to="$(dirname "$ROOTFS$INTERP")" "$ROOTFS/usr/lib/$MULTIARCH/$(basename "$INTERP")")" "$ROOTFS$INTERP"
fi

# The nonroot user the controller runs as (65532, as distroless images name it), and CA roots for
# kubeconfigs whose server certificate comes from a public CA.
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$ROOTFS/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$ROOTFS/etc/group"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$ROOTFS/etc/ssl/certs"
  cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/"
fi
# glibc and libgcc are LGPL / GPL with exceptions: their Debian copyright files travel with them.
for pkg in libc6 libgcc-s1 ca-certificates; do
  if [ -f "/usr/share/doc/$pkg/copyright" ]; then
    mkdir -p "$ROOTFS/usr/share/doc/$pkg"
    cp "/usr/share/doc/$pkg/copyright" "$ROOTFS/usr/share/doc/$pkg/"
  fi
done

# ---- the image
case "$(uname -m)" in
  x86_64) ARCH=amd64 ;;
  aarch64) ARCH=arm64 ;;
  *) ARCH="$(uname -m)" ;;
esac
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$REVISION" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then REVISION="$REVISION-dirty"; fi
# The commit's time rather than now, so that rebuilding a commit does not change the config's dates.
CREATED="$(git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || date -u +%Y-%m-%dT%H:%M:%SZ)"
export TZ=UTC

LAYOUT="$OUT/oci"
rm -rf "$LAYOUT"
"$UMOCI" init --layout "$LAYOUT"
"$UMOCI" new --image "$LAYOUT:$TAG"
# --rootless: the files go into the layer owned by root whoever runs this.
"$UMOCI" insert --rootless --image "$LAYOUT:$TAG" \
  --history.created "$CREATED" --history.created_by "deploy/image/build.sh" "$ROOTFS" /
"$UMOCI" config --image "$LAYOUT:$TAG" \
  --os linux --architecture "$ARCH" --created "$CREATED" --author "gpu-dra" \
  --config.user 65532:65532 \
  --config.entrypoint /usr/local/bin/dra-controller \
  --config.env PATH=/usr/local/bin:/usr/bin:/bin \
  --config.workingdir / \
  --config.label "org.opencontainers.image.title=$NAME" \
  --config.label "org.opencontainers.image.description=gpu.nvidia.com DRA driver: dra-controller and the dra-plugin kubelet plugin" \
  --config.label "org.opencontainers.image.version=$TAG" \
  --config.label "org.opencontainers.image.revision=$REVISION" \
  --config.label "org.opencontainers.image.created=$CREATED" \
  --config.label "org.opencontainers.image.licenses=Apache-2.0" \
  --history.created "$CREATED" --history.created_by "deploy/image/build.sh (config)"
"$UMOCI" gc --layout "$LAYOUT"

# An oci-archive is the layout directory as a tar (skopeo's and podman's oci-archive transport,
# `ctr images import`, `docker load` from Docker 25 on).
ARCHIVE="$OUT/$NAME-$TAG.oci.tar"
tar -C "$LAYOUT" --owner=0 --group=0 --numeric-owner -cf "$ARCHIVE.tmp" .
mv "$ARCHIVE.tmp" "$ARCHIVE"
echo "image: $NAME:$TAG ($PROFILE, $ARCH), $(du -k "$ARCHIVE" | cut -f1) KiB compressed, $(du -sk "$ROOTFS" | cut -f1) KiB unpacked; built in $(( SECONDS - start ))s" >&2
echo "$ARCHIVE"
