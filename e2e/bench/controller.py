#!/usr/bin/env python3
"""Driver of `make bench-controller` (e2e/bench/controller.sh starts etcd + kube-apiserver and the
controller and calls this). Reuses scheduler.py's API client and /proc reader.

    controller.py load  SLICES_JSON NODES POOL   Nodes (API only, gpu.present on all, the pool label
                                                 on the first POOL) and their slices
    controller.py idle  SECONDS                  API requests per minute with nothing but the apiserver
    controller.py run   CONTROLLER_PID CDS IDLE_S GPUCluster, ComputeDomains, a spec change, then idle
    controller.py nvidia PID CDS IDLE_S          NVIDIA's compute-domain-controller: ComputeDomains, idle

Prints `ctrl|<key>|<value>` lines that controller.sh turns into `perf|...` rows. Environment:
APISERVER_PORT, ADMIN_TOKEN, CLUSTER_DIR (from cluster.sh), CTRL_NS (driver namespace).
"""
import copy
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scheduler as sb  # noqa: E402

POOL_LABEL = "gpu-pool"
CD_NS = "ctrl-bench"
NS = os.environ.get("CTRL_NS", "gpu-dra-driver")
GC = "/apis/nvidia.com/v1alpha1/gpuclusters/gpu-cluster"
CLASSES = ("gpu.nvidia.com", "mig.nvidia.com", "compute-domain-daemon.nvidia.com",
           "compute-domain-default-channel.nvidia.com")


def load(slices_json, nodes, pool):
    api = sb.Api()
    for ns in (NS, CD_NS):
        api.req("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                ok=(201, 409))
    template = json.load(open(slices_json, encoding="utf-8"))["items"]
    tmpl = template[0]["spec"]["pool"]["name"]
    names = [f"node-{i:04d}" for i in range(nodes)]
    start = time.monotonic()

    def create(api, i_name):
        i, name = i_name
        body = sb.node(name)
        labels = body["metadata"]["labels"]
        del labels["sched-bench"]
        labels["nvidia.com/gpu.present"] = "true"
        if i < pool:
            labels[POOL_LABEL] = "dra"
        n = api.req("POST", "/api/v1/nodes", body)
        if not n.get("status", {}).get("allocatable"):
            n["status"] = sb.node(name)["status"]
            api.req("PUT", f"/api/v1/nodes/{name}/status", n)
        for s in template:
            s = copy.deepcopy(s)
            s["metadata"] = {"name": s["metadata"]["name"].replace(tmpl, name, 1),
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                                  "uid": n["metadata"]["uid"]}]}
            s["spec"]["nodeName"] = name
            s["spec"]["pool"]["name"] = name
            api.req("POST", "/apis/resource.k8s.io/v1/resourceslices", s)

    sb.parallel(list(enumerate(names)), create)
    print(f"  {nodes} nodes ({pool} in the pool), {nodes * len(template)} slices in "
          f"{time.monotonic() - start:.1f}s", file=sys.stderr)


def requests(api):
    """{(verb, resource): count} of apiserver_request_total, on a fresh connection (the API server
    closes keep-alive connections left idle for the window)."""
    api.c = sb.conn()
    api.c.request("GET", "/metrics", headers=api.h)
    r = api.c.getresponse()
    text = r.read().decode()
    out = {}
    for labels, value in re.findall(r"^apiserver_request_total\{([^}]*)\} (\S+)$", text, re.M):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = (lab.get("verb", "?"), lab.get("resource", "?") + ("/" + lab["subresource"] if lab.get("subresource") else ""))
        out[key] = out.get(key, 0) + float(value)
    return out


def window(api, seconds):
    """Requests per minute over SECONDS of idling, less this reader's own /metrics GET; and the top ones."""
    a = requests(api)
    time.sleep(seconds)
    b = requests(api)
    delta = {k: b[k] - a.get(k, 0) for k in b if b[k] - a.get(k, 0) > 0}
    delta[("GET", "")] = delta.get(("GET", ""), 0) - 1  # our own /metrics read
    total = sum(v for v in delta.values() if v > 0)
    top = sorted(((v, k) for k, v in delta.items() if v > 0), reverse=True)[:6]
    return total * 60 / seconds, ", ".join(f"{k[0]} {k[1] or '/metrics'} {v:.0f}" for v, k in top) or "none"


def idle(seconds):
    per_min, top = window(sb.Api(), seconds)
    print(f"ctrl|baseline_rpm|{per_min:.1f}")
    print(f"ctrl|baseline_top|{top}")


def wait(what, fn, timeout=600):
    start = time.monotonic()
    while True:
        try:
            if fn():
                return time.monotonic() - start
        except RuntimeError:
            pass
        if time.monotonic() - start > timeout:
            raise SystemExit(f"{what}: not reached after {timeout}s")
        time.sleep(0.1)


def run(pid, cds, idle_s):
    api = sb.Api()
    pool = int(os.environ.get("CTRL_POOL", "500"))
    gc = {"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster", "metadata": {"name": "gpu-cluster"},
          "spec": {"draDriver": {"featureGates": {"DynamicMIG": True}},
                   "migrationPool": {"nodeSelector": {"matchLabels": {POOL_LABEL: "dra"}}}}}
    t0 = time.monotonic()
    api.req("POST", "/apis/nvidia.com/v1alpha1/gpuclusters", gc)

    def ds_env():
        ds = api.req("GET", f"/apis/apps/v1/namespaces/{NS}/daemonsets/gpu-dra-kubelet-plugin", ok=(200,))
        return {e["name"]: e.get("value") for c in ds["spec"]["template"]["spec"]["containers"]
                for e in c.get("env", [])}

    def reconciled(gates):
        g = api.req("GET", GC)
        st = g.get("status") or {}
        if st.get("observedGeneration") != g["metadata"]["generation"] or st.get("poolNodes") != pool:
            return False
        if any(api.req("GET", f"/apis/resource.k8s.io/v1/deviceclasses/{c}", ok=(200, 404)).get("kind")
               != "DeviceClass" for c in CLASSES):
            return False
        if gates not in (ds_env().get("FEATURE_GATES") or ""):
            return False
        labelled = api.req("GET", "/api/v1/nodes?labelSelector=nvidia.com%2Fgpu.deploy.dra-driver%3Dtrue")
        return len(labelled["items"]) == pool

    # The poll itself goes through the same API server; it reads a handful of objects per 100 ms.
    t = wait("GPUCluster create", lambda: reconciled("DynamicMIG=true"))
    print(f"ctrl|create_s|{t:.2f}")
    _, rss, hwm = sb.proc(pid)
    print(f"ctrl|rss_after_create_mib|{rss:.1f}")

    start = time.monotonic()
    for i in range(cds):
        api.req("POST", f"/apis/resource.nvidia.com/v1beta1/namespaces/{CD_NS}/computedomains", {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": f"cd{i:03d}", "namespace": CD_NS},
            "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": f"cd{i:03d}-channel"}}}})

    def cds_done():
        ds = api.req("GET", "/apis/apps/v1/daemonsets?labelSelector="
                     "app.kubernetes.io%2Fcomponent%3Dcompute-domain-daemon")["items"]
        rct = api.req("GET", f"/apis/resource.k8s.io/v1/namespaces/{CD_NS}/resourceclaimtemplates")["items"]
        chan = [r for r in rct if r["metadata"]["name"].endswith("-channel")]
        return len(ds) >= cds and len(chan) >= cds
    t = wait("ComputeDomains", cds_done)
    print(f"ctrl|cds_s|{time.monotonic() - start:.2f}")

    # A spec change: flip a feature gate.
    time.sleep(5)
    t0 = time.monotonic()
    api.h["Content-Type"] = "application/merge-patch+json"
    api.req("PATCH", GC, {"spec": {"draDriver": {"featureGates": {"DynamicMIG": True, "TimeSlicingSettings": True}}}})
    api.h["Content-Type"] = "application/json"
    t = wait("GPUCluster change", lambda: reconciled("TimeSlicingSettings=true"))
    print(f"ctrl|change_s|{t:.2f}")

    time.sleep(10)  # let the debounced requeues settle
    per_min, top = window(api, idle_s)
    cpu, rss, hwm = sb.proc(pid)
    print(f"ctrl|steady_rpm|{per_min:.1f}")
    print(f"ctrl|steady_top|{top}")
    print(f"ctrl|rss_steady_mib|{rss:.1f}")
    print(f"ctrl|hwm_mib|{hwm:.1f}")
    print(f"ctrl|cpu_s|{cpu:.2f}")
    split = rss_split(pid)
    print(f"ctrl|rss_split|{', '.join(f'{k} {v:.1f}' for k, v in split.items())} MiB")


def rss_split(pid):
    """RssAnon (heap, stacks), RssFile (the binary's mapped pages) and RssShmem in MiB."""
    out = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("Rss") and line.split(":")[0] != "RssShmem":
                out[line.split(":")[0][3:].lower()] = int(line.split()[1]) / 1024
    return out


def nvidia(pid, cds, idle_s):
    """NVIDIA's compute-domain-controller: the same ComputeDomains, then the same idle window."""
    api = sb.Api()
    start = time.monotonic()
    for i in range(cds):
        api.req("POST", f"/apis/resource.nvidia.com/v1beta1/namespaces/{CD_NS}/computedomains", {
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": f"cd{i:03d}", "namespace": CD_NS},
            "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": f"cd{i:03d}-channel"}}}})

    def done():
        ds = api.req("GET", f"/apis/apps/v1/namespaces/{NS}/daemonsets")["items"]
        rct = api.req("GET", f"/apis/resource.k8s.io/v1/namespaces/{CD_NS}/resourceclaimtemplates")["items"]
        return len(ds) >= cds and len([r for r in rct if r["metadata"]["name"].endswith("-channel")]) >= cds
    wait("NVIDIA ComputeDomains", done, timeout=300)
    print(f"ctrl|nv_cds_s|{time.monotonic() - start:.2f}")
    time.sleep(10)
    per_min, top = window(api, idle_s)
    cpu, rss, hwm = sb.proc(pid)
    print(f"ctrl|nv_steady_rpm|{per_min:.1f}")
    print(f"ctrl|nv_steady_top|{top}")
    print(f"ctrl|nv_rss_steady_mib|{rss:.1f}")
    print(f"ctrl|nv_hwm_mib|{hwm:.1f}")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "load":
        load(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "idle":
        idle(int(sys.argv[2]))
    elif cmd == "nvidia":
        nvidia(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    elif cmd == "run":
        run(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(__doc__)
