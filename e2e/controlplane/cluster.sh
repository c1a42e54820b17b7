# shellcheck shell=bash
# Sourced by e2e/run.sh. Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler on
# loopback with free ports in a work directory, and stops them again.
#
#   cluster_start BIN_DIR WORK_DIR   -> writes WORK_DIR/admin.kubeconfig, logs in WORK_DIR/logs/
#   cluster_stop                     -> stops every process cluster_start started (by pid)

CLUSTER_PIDS=()
ADMIN_TOKEN="e2e-admin-$RANDOM$RANDOM"

# A loopback TCP port nobody listens on. Ports are probed randomly below the kernel's ephemeral range
# (ip_local_port_range, 32768+ by default): a port there may be the local end of some outgoing
# connection, which a connect probe cannot see but which makes the later bind fail.
_USED_PORTS=" "
_EPHEMERAL_LOW=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "${_EPHEMERAL_LOW:-0}" -gt 21000 ] 2>/dev/null || _EPHEMERAL_LOW=32768
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM) % (_EPHEMERAL_LOW - 20000) ))
    case "$_USED_PORTS" in *" $p "*) continue ;; esac
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      _USED_PORTS="$_USED_PORTS$p "
      echo "$p"
      return 0
    fi
  done
  echo "no free port found" >&2
  return 1
}

# wait_for NAME PID TIMEOUT_S CMD...: polls CMD until it succeeds; fails if PID dies or time runs out.
wait_for() {
  local name=$1 pid=$2 timeout=$3; shift 3
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name exited during startup; last log lines:" >&2
      tail -n 30 "$CLUSTER_DIR/logs/$name.log" >&2 || true
      return 1
    fi
    if (( SECONDS - start > timeout )); then
      echo "$name not ready after ${timeout}s; last log lines:" >&2
      tail -n 30 "$CLUSTER_DIR/logs/$name.log" >&2 || true
      return 1
    fi
    sleep 0.5
  done
  echo "  $name ready after $(( SECONDS - start ))s"
}

_start() { # NAME CMD... (background, logs to logs/NAME.log, pid remembered)
  local name=$1; shift
  "$@" >"$CLUSTER_DIR/logs/$name.log" 2>&1 &
  local pid=$!
  CLUSTER_PIDS+=("$pid")
  eval "PID_${name//-/_}=$pid"
}

_readyz() { # URL_PATH
  curl -sf --cacert "$CLUSTER_DIR/pki/apiserver.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    "https://127.0.0.1:$APISERVER_PORT$1" | grep -qx ok
}

# The API server runs under a small supervisor so a test can stop it for a while and bring it back on
# the same port and etcd: create $CLUSTER_DIR/kube-apiserver.hold, kill the pid in
# $CLUSTER_DIR/kube-apiserver.pid, and remove the hold file to restart it.
_apiserver_supervisor() {
  local apid=""
  # Test data only: no graceful shutdown needed (and it can hang once etcd is gone).
  trap '[ -n "$apid" ] && kill -9 "$apid" 2>/dev/null; wait 2>/dev/null; exit 0' TERM INT
  while :; do
    "$CLUSTER_BIN/kube-apiserver" \
      --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
      --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" \
      --cert-dir="$CLUSTER_DIR/pki" \
      --service-account-issuer=https://kubernetes.default.svc \
      --service-account-key-file="$CLUSTER_DIR/sa.key" \
      --service-account-signing-key-file="$CLUSTER_DIR/sa.key" \
      --token-auth-file="$CLUSTER_DIR/tokens.csv" \
      --authorization-mode=RBAC --allow-privileged=true \
      --endpoint-reconciler-type=none \
      --disable-admission-plugins=ServiceAccount,TaintNodesByCondition \
      --service-cluster-ip-range=10.0.0.0/24 \
      --runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true \
      --v=1 &
    apid=$!
    echo "$apid" >"$CLUSTER_DIR/kube-apiserver.pid"
    wait "$apid" || true
    [ -e "$CLUSTER_DIR/kube-apiserver.hold" ] || exit 1
    echo "=== kube-apiserver stopped on request; waiting for $CLUSTER_DIR/kube-apiserver.hold to go"
    while [ -e "$CLUSTER_DIR/kube-apiserver.hold" ]; do sleep 0.2; done
    echo "=== restarting kube-apiserver"
  done
}

cluster_start() {
  CLUSTER_BIN=$1
  CLUSTER_DIR=$2
  mkdir -p "$CLUSTER_DIR/logs" "$CLUSTER_DIR/pki" "$CLUSTER_DIR/etcd"
  # $(free_port) runs in a subshell, so its memory of handed-out ports is lost: keep them distinct here.
  ETCD_PORT=$(free_port)
  APISERVER_PORT=$(free_port)
  while [ "$APISERVER_PORT" = "$ETCD_PORT" ]; do APISERVER_PORT=$(free_port); done
  SCHEDULER_PORT=$(free_port)
  while [ "$SCHEDULER_PORT" = "$ETCD_PORT" ] || [ "$SCHEDULER_PORT" = "$APISERVER_PORT" ]; do SCHEDULER_PORT=$(free_port); done
  export ETCD_PORT APISERVER_PORT SCHEDULER_PORT ADMIN_TOKEN CLUSTER_DIR CLUSTER_BIN

  openssl genrsa -out "$CLUSTER_DIR/sa.key" 2048 2>/dev/null
  echo "$ADMIN_TOKEN,e2e-admin,e2e-admin,\"system:masters\"" >"$CLUSTER_DIR/tokens.csv"

  echo "starting control plane in $CLUSTER_DIR (etcd :$ETCD_PORT, apiserver :$APISERVER_PORT)"
  _start etcd "$CLUSTER_BIN/etcd" --data-dir "$CLUSTER_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls http://127.0.0.1:0 --unsafe-no-fsync --log-level warn
  wait_for etcd "$PID_etcd" 60 curl -sf "http://127.0.0.1:$ETCD_PORT/health"

  _start kube-apiserver _apiserver_supervisor
  wait_for kube-apiserver "$PID_kube_apiserver" 120 _readyz /readyz

  cat >"$CLUSTER_DIR/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $CLUSTER_DIR/pki/apiserver.crt
users:
- name: e2e-admin
  user:
    token: $ADMIN_TOKEN
contexts:
- name: e2e
  context:
    cluster: e2e
    user: e2e-admin
current-context: e2e
EOF

  # Controllers that need no kubelet: claims from templates, reservedFor cleanup and deallocation,
  # garbage collection of owner-referenced objects (ResourceSlices of deleted Nodes), namespace deletion,
  # ResourceQuota usage (the recount after claims go away).
  _start kube-controller-manager "$CLUSTER_BIN/kube-controller-manager" \
    --kubeconfig="$CLUSTER_DIR/admin.kubeconfig" --leader-elect=false --secure-port=0 \
    --kube-api-qps=200 --kube-api-burst=400 \
    --controllers=resourceclaim-controller,garbage-collector-controller,namespace-controller,resourcequota-controller \
    --v=1
  _start kube-scheduler "$CLUSTER_BIN/kube-scheduler" \
    --kubeconfig="$CLUSTER_DIR/admin.kubeconfig" --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" --v=2 \
    --kube-api-qps=200 --kube-api-burst=400
  wait_for kube-scheduler "$PID_kube_scheduler" 60 \
    curl -skf "https://127.0.0.1:$SCHEDULER_PORT/healthz"
  # The controller manager serves nothing; it is ready once it runs and the API answers.
  sleep 1
  kill -0 "$PID_kube_controller_manager" || { tail -n 30 "$CLUSTER_DIR/logs/kube-controller-manager.log" >&2; return 1; }
  echo "control plane up; kubeconfig: $CLUSTER_DIR/admin.kubeconfig"
}

cluster_stop() {
  # Reverse start order, one at a time, so etcd goes last.
  local pid i
  for (( i=${#CLUSTER_PIDS[@]}-1; i>=0; i-- )); do
    pid=${CLUSTER_PIDS[$i]}
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  CLUSTER_PIDS=()
}
