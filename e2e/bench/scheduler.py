#!/usr/bin/env python3
"""Driver of `make bench-scheduler` (e2e/bench/scheduler.sh starts the control plane and calls this).

One shape on a fresh etcd + kube-apiserver + kube-scheduler with no kubelets:

    scheduler.py load   SLICES_JSON NODES DEVICECLASS_YAML...   Nodes (API only) and their slices
                        (SLICES_JSON `-`: Nodes only; on-demand plugins publish their own)
    scheduler.py ready  NODES GPUS [MIG]                         waits for the on-demand plugins
                        (and MIG pre-carved devices per node)
    scheduler.py restless SECONDS                                MigLayouts rewritten meanwhile
    scheduler.py run    SHAPE PODS SCHEDULER_PID SCHEDULER_PORT  claims and pods, then figures

`run` creates one ResourceClaim per pod (created up front, so only the scheduler is measured, not
the resourceclaim controller), then the pods, and times first pod created -> every pod bound
(spec.nodeName set). It prints `shape|<shape>|<key>|<value>` lines that scheduler.sh turns into
`sched|...` rows. Environment: APISERVER_PORT, ADMIN_TOKEN, CLUSTER_DIR (from cluster.sh);
SCHED_COST_PIDS (shapes ondemand*): `controller=PID plugins=PID,PID,...`, the processes whose CPU
over the same window is this mode's price.
"""
import copy
import http.client
import json
import os
import re
import ssl
import sys
import threading
import time

NS = "sched-bench"
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def conn():
    ctx = ssl.create_default_context(cafile=os.path.join(os.environ["CLUSTER_DIR"], "pki/apiserver.crt"))
    return http.client.HTTPSConnection("127.0.0.1", int(os.environ["APISERVER_PORT"]), context=ctx, timeout=120)


class Api:
    def __init__(self):
        self.c = conn()
        self.h = {"Authorization": "Bearer " + os.environ["ADMIN_TOKEN"], "Content-Type": "application/json"}

    def req(self, method, path, body=None, ok=(200, 201)):
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(5):
            try:
                self.c.request(method, path, body=data, headers=self.h)
                r = self.c.getresponse()
                out = r.read()
                break
            except (http.client.HTTPException, OSError):
                if attempt == 4:
                    raise
                self.c = conn()
                time.sleep(0.2)
        if r.status not in ok:
            raise RuntimeError(f"{method} {path}: {r.status} {out[:400]!r}")
        return json.loads(out) if out else None


def parallel(items, fn, workers=8):
    """fn(api, item) over items on `workers` keep-alive connections."""
    errors = []
    chunks = [items[i::workers] for i in range(workers)]

    def work(chunk):
        api = Api()
        try:
            for it in chunk:
                fn(api, it)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(c,)) for c in chunks if c]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def yaml_deviceclass(path):
    """The DeviceClass of one of our deviceclasses/*.yaml, read without a YAML library."""
    text = open(path, encoding="utf-8").read()
    name = re.search(r"^  name: (\S+)", text, re.M).group(1)
    exprs = re.findall(r'expression: "(.*)"', text)
    spec = {"selectors": [{"cel": {"expression": e.replace("\\'", "'")}} for e in exprs]}
    m = re.search(r"^  extendedResourceName: (\S+)", text, re.M)
    if m:
        spec["extendedResourceName"] = m.group(1)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def node(name):
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "sched-bench": "1"}},
        "status": {
            "capacity": {"cpu": "128", "memory": "1Ti", "pods": "110"},
            "allocatable": {"cpu": "128", "memory": "1Ti", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "bench", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        },
    }


def load(slices_json, nodes, classes):
    api = Api()
    for path in classes:
        dc = yaml_deviceclass(path)
        api.req("POST", "/apis/resource.k8s.io/v1/deviceclasses", dc, ok=(201, 409))
    api.req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
            ok=(201, 409))
    template = [] if slices_json == "-" else json.load(open(slices_json, encoding="utf-8"))["items"]
    tmpl = template[0]["spec"]["pool"]["name"] if template else ""
    names = [f"node-{i:04d}" for i in range(nodes)]
    start = time.monotonic()

    def create(api, name):
        n = api.req("POST", "/api/v1/nodes", node(name))
        if not n.get("status", {}).get("allocatable"):  # status dropped on create: set it
            n["status"] = node(name)["status"]
            api.req("PUT", f"/api/v1/nodes/{name}/status", n)
        for s in template:
            s = copy.deepcopy(s)
            s["metadata"] = {"name": s["metadata"]["name"].replace(tmpl, name, 1),
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                                  "uid": n["metadata"]["uid"]}]}
            s["spec"]["nodeName"] = name
            s["spec"]["pool"]["name"] = name
            api.req("POST", "/apis/resource.k8s.io/v1/resourceslices", s)

    parallel(names, create)
    if not template:
        print(f"  {nodes} nodes in {time.monotonic() - start:.1f}s", file=sys.stderr)
        return
    # What the API server kept: a gate the server lacks drops fields (sharedCounters) silently.
    got = json.dumps(api.req("GET", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3D"
                             + names[0])["items"])
    want = json.dumps(template)
    kept = all(k in got or k not in want for k in ("sharedCounters", "consumesCounters"))
    if not kept:
        sys.exit("the API server dropped sharedCounters/consumesCounters (DRAPartitionableDevices off?)")
    n0 = api.req("GET", "/api/v1/nodes/" + names[0])
    if not n0["status"].get("allocatable"):
        sys.exit("node status not kept")
    devices = sum(len(s["spec"].get("devices", [])) for s in template)
    print(f"  {nodes} nodes, {nodes * len(template)} slices ({devices} devices/node) in "
          f"{time.monotonic() - start:.1f}s", file=sys.stderr)


def ready(nodes, gpus, mig=0):
    """Waits until every on-demand plugin publishes its `gpus` whole GPUs (and `mig` MIG devices,
    pre-carved) and reports them in its MigLayout: before that the shaper has nothing to carve on
    and the scheduler nothing to place."""
    api = Api()
    start, deadline = time.monotonic(), time.monotonic() + 600
    while True:
        per_node, mig_node = {}, {}
        for s in api.req("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]:
            n = s["spec"].get("nodeName")
            devs = s["spec"].get("devices", [])
            per_node[n] = per_node.get(n, 0) + len(devs)
            mig_node[n] = mig_node.get(n, 0) + sum(1 for d in devs if "-mig-" in d["name"])
        published = sum(1 for n, v in per_node.items() if v >= gpus and mig_node[n] >= mig)
        layouts = api.req("GET", "/apis/nvidia.com/v1alpha1/miglayouts")["items"]
        reported = sum(1 for m in layouts if len((m.get("status") or {}).get("gpus") or []) == gpus)
        if published >= nodes and reported >= nodes:
            break
        if time.monotonic() > deadline:
            sys.exit(f"on-demand plugins: {published}/{nodes} publishing (with {mig} MIG devices), "
                     f"{reported}/{nodes} MigLayouts reported")
        time.sleep(1)
    what = f" with {mig} pre-carved MIG devices each" if mig else ""
    print(f"  {nodes} plugins publishing{what} and reporting in {time.monotonic() - start:.1f}s", file=sys.stderr)


def restless(seconds):
    """Prints the MigLayouts whose resourceVersion moved in SECONDS of an idle cluster (nothing
    pending, so nothing should write them)."""
    api = Api()
    rv = lambda: {m["metadata"]["name"]: m["metadata"]["resourceVersion"]  # noqa: E731
                  for m in api.req("GET", "/apis/nvidia.com/v1alpha1/miglayouts")["items"]}
    before = rv()
    time.sleep(seconds)
    after = rv()
    print(" ".join(sorted(n for n, v in after.items() if before.get(n) != v)))


def cost_pids():
    """{role: [pid]} from SCHED_COST_PIDS."""
    out = {}
    for part in os.environ.get("SCHED_COST_PIDS", "").split():
        role, pids = part.split("=", 1)
        out[role] = [int(p) for p in pids.split(",") if p]
    return out


def cpu_of(pids):
    return sum(proc(p)[0] for p in pids)


def claim(name, kind):
    if kind == "gpu":
        req = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    else:
        req = {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}]}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS}, "spec": {"devices": {"requests": [req]}}}


def pod(name):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/pause",
                                     "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                                   "claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                     "nodeSelector": {"sched-bench": "1"}}}


def proc(pid):
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICKS
    rss = hwm = 0
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return cpu, rss, hwm


def metrics(port):
    c = http.client.HTTPSConnection("127.0.0.1", port, context=ssl._create_unverified_context(), timeout=30)
    c.request("GET", "/metrics")
    r = c.getresponse()
    body = r.read().decode()
    if r.status != 200:
        raise RuntimeError(f"scheduler /metrics: {r.status} {body[:300]}")
    return body


def hist_sums(text, name, want):
    """{label value: (sum, count)} of histogram NAME, keyed by label WANT, over all other labels."""
    out = {}
    pat = re.compile(r"^" + name + r"_(sum|count)\{([^}]*)\} (\S+)$", re.M)
    for kind, labels, value in pat.findall(text):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = lab.get(want)
        if key is None:
            continue
        s, n = out.get(key, (0.0, 0.0))
        out[key] = (s + float(value), n) if kind == "sum" else (s, n + float(value))
    return out


def run(shape, pods, sched_pid, sched_port):
    api = Api()
    names = [f"p-{i:05d}" for i in range(pods)]
    alternate = shape in ("dynamic", "ondemand", "ondemand-precarve")
    kinds = {n: ("gpu" if shape == "whole" or (alternate and i % 2) else "mig") for i, n in enumerate(names)}
    parallel(names, lambda a, n: a.req("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims",
                                        claim(n, kinds[n])))
    m0 = metrics(sched_port)
    cpu0, _, _ = proc(sched_pid)
    costs = cost_pids()
    cost0 = {role: cpu_of(pids) for role, pids in costs.items()}
    if shape.startswith("ondemand"):  # what a node publishes before any carve for a claim
        s0 = api.req("GET", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-0000")
        print(f"shape|{shape}|slices_per_node|{len(s0['items'])}")
        print(f"shape|{shape}|devices_per_node|{sum(len(s['spec'].get('devices', [])) for s in s0['items'])}")
    t0 = time.monotonic()
    created = {}

    def create(a, n):
        a.req("POST", f"/api/v1/namespaces/{NS}/pods", pod(n))
        created[n] = time.monotonic()

    threading.Thread(target=parallel, args=(names, create, 4), daemon=True).start()
    bound, deadline = 0, t0 + float(os.environ.get("SCHED_TIMEOUT", "600"))
    while time.monotonic() < deadline:
        lst = api.req("GET", f"/api/v1/namespaces/{NS}/pods")["items"]
        bound = sum(1 for p in lst if p["spec"].get("nodeName"))
        if bound == pods:
            break
        time.sleep(0.05)
    t1 = time.monotonic()
    cpu1, rss, hwm = proc(sched_pid)
    cost1 = {role: cpu_of(pids) for role, pids in costs.items()}
    m1 = metrics(sched_port)
    created_s = max(created.values()) - t0 if created else 0
    if bound < pods:
        sys.exit(f"{shape}: only {bound}/{pods} pods bound after {t1 - t0:.0f}s")
    # Every claim allocated, on the node its pod went to.
    claims = api.req("GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"]
    unalloc = [c["metadata"]["name"] for c in claims if not c.get("status", {}).get("allocation")]
    if unalloc:
        sys.exit(f"{shape}: {len(unalloc)} claims bound pods but no allocation, e.g. {unalloc[:3]}")
    # The MIG claims got MIG devices (on-demand: ones carved for them), the others whole GPUs.
    wrong = [c["metadata"]["name"] for c in claims
             if any(("-mig-" in r["device"]) != (kinds[c["metadata"]["name"]] == "mig")
                    for r in c["status"]["allocation"]["devices"]["results"])]
    if wrong:
        sys.exit(f"{shape}: {len(wrong)} claims got the wrong kind of device, e.g. {wrong[:3]}")
    wall = t1 - t0
    emit = lambda k, v: print(f"shape|{shape}|{k}|{v}")  # noqa: E731
    emit("pods", pods)
    emit("wall_s", f"{wall:.2f}")
    emit("create_s", f"{created_s:.2f}")
    emit("pods_per_s", f"{pods / wall:.1f}")
    emit("cpu_s", f"{cpu1 - cpu0:.2f}")
    emit("cpu_ms_per_pod", f"{(cpu1 - cpu0) * 1000 / pods:.1f}")
    emit("rss_mib", f"{rss:.0f}")
    emit("hwm_mib", f"{hwm:.0f}")
    for role, pids in costs.items():
        emit(f"{role}_cpu_ms_per_pod", f"{(cost1[role] - cost0[role]) * 1000 / pods:.1f}")
        emit(f"{role}_count", len(pids))
        hwms = [proc(p)[2] for p in pids]
        emit(f"{role}_hwm_mib", f"{max(hwms):.0f}")
        emit(f"{role}_rss_mib_total", f"{sum(proc(p)[1] for p in pids):.0f}")
    for name, label, keys in (
        ("scheduler_framework_extension_point_duration_seconds", "extension_point",
         ("PreFilter", "Filter", "PostFilter", "PreScore", "Score", "Reserve", "PreBind", "Bind")),
        ("scheduler_plugin_execution_duration_seconds", "extension_point",
         ("PreFilter", "Filter", "PostFilter", "PreScore", "Score", "Reserve", "PreBind")),
    ):
        a, b = hist_sums(m0, name, label), hist_sums(m1, name, label)
        if name.startswith("scheduler_plugin"):
            a = hist_sums(only_plugin(m0, "DynamicResources"), name, label)
            b = hist_sums(only_plugin(m1, "DynamicResources"), name, label)
        for k in keys:
            s = b.get(k, (0, 0))[0] - a.get(k, (0, 0))[0]
            n = b.get(k, (0, 0))[1] - a.get(k, (0, 0))[1]
            if n > 0:
                tag = "ext" if name.startswith("scheduler_framework") else "dra"
                emit(f"{tag}_{k}_ms", f"{s * 1000 / n:.3f}")
                emit(f"{tag}_{k}_n", f"{n:.0f}")
    att = hist_sums(m1, "scheduler_scheduling_attempt_duration_seconds", "result")
    att0 = hist_sums(m0, "scheduler_scheduling_attempt_duration_seconds", "result")
    for k in ("scheduled", "unschedulable", "error"):
        n = att.get(k, (0, 0))[1] - att0.get(k, (0, 0))[1]
        emit(f"attempts_{k}", f"{n:.0f}")
        if k == "scheduled" and n:
            emit("attempt_ms", f"{(att[k][0] - att0.get(k, (0, 0))[0]) * 1000 / n:.2f}")


def only_plugin(text, plugin):
    return "\n".join(line for line in text.splitlines() if f'plugin="{plugin}"' in line)


if __name__ == "__main__":
    if sys.argv[1] == "load":
        load(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    elif sys.argv[1] == "ready":
        ready(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 0)
    elif sys.argv[1] == "restless":
        restless(float(sys.argv[2]))
    elif sys.argv[1] == "run":
        run(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(__doc__)
