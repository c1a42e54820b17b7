#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and etcd from the Go module proxy
# into a cache outside the git tree. Reuses the binaries when they already report the pinned versions.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"
CACHE="${E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-dra-e2e}"
BIN="$CACHE/bin"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

# Every staging module of k8s.io/kubernetes is required at v0.0.0; a consumer must pin each one.
STAGING="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api cri-client
cri-streaming csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics mount-utils pod-security-admission
sample-apiserver sample-cli-plugin sample-controller streaming"

command -v go >/dev/null || { echo "go not found: Go >= 1.26 is needed to build the control plane" >&2; exit 1; }
mkdir -p "$BIN"
# One build at a time per cache; a second caller waits and then finds the binaries cached.
if command -v flock >/dev/null; then
  exec 9>"$CACHE/.build.lock"
  flock 9
fi
staging_version="v0.${K8S_VERSION#v1.}"

have_k8s() {
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    [ -x "$BIN/$b" ] && "$BIN/$b" --version 2>/dev/null | grep -qx "Kubernetes $K8S_VERSION" || return 1
  done
}
have_etcd() {
  [ -x "$BIN/etcd" ] && "$BIN/etcd" --version 2>/dev/null | grep -q "etcd Version: ${ETCD_VERSION#v}$"
}

if have_k8s; then
  echo "control plane $K8S_VERSION: cached in $BIN"
else
  echo "building kube-apiserver, kube-controller-manager, kube-scheduler, kubelet $K8S_VERSION (cold: ~6-7 min on 2 cores, measured)"
  start=$(date +%s)
  mod="$CACHE/k8s-$K8S_VERSION"
  rm -rf "$mod" && mkdir -p "$mod" && cd "$mod"
  go mod init example.invalid/k8sbins >/dev/null 2>&1
  for m in $STAGING; do go mod edit -replace="k8s.io/$m=k8s.io/$m@$staging_version"; done
  go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION"
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  go build -trimpath -ldflags "$ld" -o "$BIN/" k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubelet
  echo "built control plane $K8S_VERSION in $(( $(date +%s) - start ))s"
fi

if have_etcd; then
  echo "etcd $ETCD_VERSION: cached in $BIN"
else
  echo "building etcd $ETCD_VERSION"
  start=$(date +%s)
  mod="$CACHE/etcd-$ETCD_VERSION"
  rm -rf "$mod" && mkdir -p "$mod" && cd "$mod"
  go mod init example.invalid/etcdbin >/dev/null 2>&1
  go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
  echo "built etcd $ETCD_VERSION in $(( $(date +%s) - start ))s"
fi
echo "$BIN"
