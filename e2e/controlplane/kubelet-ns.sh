#!/usr/bin/env bash
# Runs the stock kubelet so that nothing it writes outside its node directory reaches the host.
# Started as `unshare --mount --propagation private bash kubelet-ns.sh NODE_DIR KUBELET ARGS...`:
# in that private mount namespace the host paths the kubelet writes regardless of --root-dir are
# bind-mounted over with directories of NODE_DIR, and the kernel tunables it would set are files
# that already hold the values it wants, so it reads them and writes nothing to the kernel.
set -euo pipefail
node_dir=$1
shift
host="$node_dir/host"
mkdir -p "$host/var-lib" "$host/var-log" "$host/sysctl"
# /var/lib/kubelet/device-plugins (the device manager's socket, fixed path), /var/log/pods and
# /var/log/containers (log symlinks). Whole /var/lib and /var/log, so no mount point is created.
mount --bind "$host/var-lib" /var/lib
mount --bind "$host/var-log" /var/log
# The tunables of the kubelet's setupKernelTunables (container_manager_linux.go), with the values
# it wants; these are not namespaced, so it would change them for the whole host.
for setting in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
  kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
  key=${setting%%=*}
  file="$host/sysctl/${key//\//.}"
  echo "${setting#*=}" >"$file"
  mount --bind "$file" "/proc/sys/$key"
done
exec "$@"
