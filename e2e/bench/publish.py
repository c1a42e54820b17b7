#!/usr/bin/env python3
"""`make bench-publish`, the measuring side (e2e/bench/publish.sh starts the control plane).

Watches one node's ResourceSlices as the scheduler and the kubelet would (a watch with
`fieldSelector=spec.nodeName=NODE`, once as JSON and once as protobuf), starts the plugin, and
measures: start -> every expected slice seen on the watch, the bytes of the slices (JSON and
protobuf as the API server returns them, and JSON as the plugin sends them), the watch bytes while
publishing, at idle and over a restart of the plugin, and the API server's ResourceSlice requests
by verb in each window (apiserver_request_total). Prints `perf|figure|goal|value` rows for
tools/perf-table.py; method in docs/peers.md ("Publishing a node").

    publish.py --kubeconfig K --node N --sent SLICES.json --label TEXT --idle S --restart S -- PLUGIN ARGV...
"""
import argparse
import http.client
import json
import os
import re
import signal
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.parse

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PROTOBUF = "application/vnd.kubernetes.protobuf"


class Api:
    def __init__(self, kubeconfig):
        text = open(kubeconfig, encoding="utf-8").read()
        self.server = re.search(r"server: (\S+)", text).group(1)
        ca = re.search(r"certificate-authority: (\S+)", text).group(1)
        self.token = re.search(r"token: (\S+)", text).group(1)
        url = urllib.parse.urlparse(self.server)
        self.host, self.port = url.hostname, url.port
        self.ctx = ssl.create_default_context(cafile=ca)

    def conn(self, timeout=None):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def get(self, path, accept="application/json"):
        c = self.conn(timeout=30)
        c.request("GET", path, headers={"Authorization": f"Bearer {self.token}", "Accept": accept})
        r = c.getresponse()
        body = r.read()
        c.close()
        if r.status != 200:
            sys.exit(f"GET {path}: {r.status} {body[:200]!r}")
        return body

    def slice_requests(self):
        """apiserver_request_total for resourceslices, by verb (the server's own included)."""
        out = {}
        for line in self.get("/metrics", "text/plain").decode().splitlines():
            if line.startswith("apiserver_request_total{") and 'resource="resourceslices"' in line:
                verb = re.search(r'verb="([A-Z]+)"', line).group(1)
                out[verb] = out.get(verb, 0) + float(line.rsplit(" ", 1)[1])
        return out


class Watch(threading.Thread):
    """One watch on the node's slices; records (time, bytes, event type or None) per event."""

    def __init__(self, api, node, protobuf):
        super().__init__(daemon=True)
        self.api, self.protobuf = api, protobuf
        sel = urllib.parse.quote(f"spec.nodeName={node}")
        self.path = f"{SLICES}?watch=1&fieldSelector={sel}"
        self.events, self.names = [], set()
        self.ready = threading.Event()

    def run(self):
        c = self.api.conn()
        accept = f"{PROTOBUF};stream=watch" if self.protobuf else "application/json"
        c.request("GET", self.path, headers={"Authorization": f"Bearer {self.api.token}", "Accept": accept})
        r = c.getresponse()
        self.ready.set()
        while True:
            if self.protobuf:
                head = r.read(4)
                if len(head) < 4:
                    return
                frame = r.read(struct.unpack(">I", head)[0])
                self.events.append((time.monotonic(), 4 + len(frame), None))
            else:
                line = r.readline()
                if not line:
                    return
                ev = json.loads(line)
                self.names.add(ev["object"]["metadata"]["name"])
                self.events.append((time.monotonic(), len(line), ev["type"]))

    def since(self, t0, t1=float("inf")):
        got = [e for e in self.events if t0 <= e[0] < t1]
        return len(got), sum(e[1] for e in got)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_kib(pid):
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))


def kib(n):
    return f"{n / 1024:.1f} KiB"


def diff(after, before):
    d = {v: int(after.get(v, 0) - before.get(v, 0)) for v in after}
    return ", ".join(f"{v} {n}" for v, n in sorted(d.items()) if n) or "none"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--node", required=True)
    ap.add_argument("--sent", required=True, help="`dra-plugin slices -o json` of the same node")
    ap.add_argument("--label", required=True)
    ap.add_argument("--idle", type=float, default=30)
    ap.add_argument("--restart", type=float, default=10)
    ap.add_argument("--log", required=True)
    ap.add_argument("plugin", nargs="+")
    a = ap.parse_args()
    api = Api(a.kubeconfig)
    sent = json.load(open(a.sent, encoding="utf-8"))["items"]
    want = {s["metadata"]["name"] for s in sent}
    sent_bytes = sum(len(json.dumps(s, separators=(",", ":"))) for s in sent)
    devices = sum(len(s["spec"].get("devices") or []) for s in sent)

    watches = [Watch(api, a.node, False), Watch(api, a.node, True)]
    for w in watches:
        w.start()
        w.ready.wait(10)
    time.sleep(0.5)
    log = open(a.log, "ab")
    reqs0 = api.slice_requests()
    t0 = time.monotonic()
    plugin = subprocess.Popen(a.plugin, stdout=log, stderr=log)
    while not want <= watches[0].names:
        if plugin.poll() is not None or time.monotonic() - t0 > 120:
            sys.exit(f"plugin exited or timed out before publishing; saw {len(watches[0].names)} of {len(want)}")
        time.sleep(0.005)
    t_all = time.monotonic()
    publish_s = t_all - t0
    # Anything the publisher still does right after (its own watch, a second pass) counts too.
    time.sleep(2)
    t_pub_end = time.monotonic()
    cpu_pub, peak_pub = cpu_seconds(plugin.pid), peak_kib(plugin.pid)
    reqs1 = api.slice_requests()
    stored_json = json.loads(api.get(f"{SLICES}?fieldSelector={urllib.parse.quote('spec.nodeName=' + a.node)}"))
    items = stored_json["items"]
    stored_bytes = sum(len(json.dumps(s, separators=(",", ":"))) for s in items)
    stored_pb = len(api.get(f"{SLICES}?fieldSelector={urllib.parse.quote('spec.nodeName=' + a.node)}", PROTOBUF))
    pub_json = watches[0].since(t0, t_pub_end)
    pub_pb = watches[1].since(t0, t_pub_end)

    time.sleep(a.idle)
    t_idle_end = time.monotonic()
    idle_json = watches[0].since(t_pub_end, t_idle_end)
    idle_pb = watches[1].since(t_pub_end, t_idle_end)
    reqs2 = api.slice_requests()

    plugin.send_signal(signal.SIGTERM)
    plugin.wait(30)
    t_r = time.monotonic()
    plugin = subprocess.Popen(a.plugin, stdout=log, stderr=log)
    time.sleep(a.restart)
    t_r_end = time.monotonic()
    restart_json = watches[0].since(t_r, t_r_end)
    restart_pb = watches[1].since(t_r, t_r_end)
    reqs3 = api.slice_requests()
    cpu_restart = cpu_seconds(plugin.pid)
    plugin.send_signal(signal.SIGTERM)
    plugin.wait(30)
    after = json.loads(api.get(f"{SLICES}?fieldSelector={urllib.parse.quote('spec.nodeName=' + a.node)}"))["items"]
    rv_before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in items}
    rv_after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in after}
    changed = sum(1 for n, rv in rv_after.items() if rv_before.get(n) != rv) + len(set(rv_before) - set(rv_after))

    print(f"publish: {len(want)} slices, {devices} devices in {publish_s:.3f} s; plugin CPU {cpu_pub:.2f} s")
    print(f"slices: sent {sent_bytes} B JSON; stored {len(items)} objects, {stored_bytes} B JSON, {stored_pb} B protobuf")
    print(f"watch while publishing: JSON {pub_json[0]} events {pub_json[1]} B, protobuf {pub_pb[0]} events {pub_pb[1]} B")
    print(f"watch at idle ({a.idle:.0f} s): JSON {idle_json}, protobuf {idle_pb}")
    print(f"restart: JSON {restart_json}, protobuf {restart_pb}, slices changed {changed}")
    print(f"slice requests: publish {diff(reqs1, reqs0)}; idle {diff(reqs2, reqs1)}; restart {diff(reqs3, reqs2)}")

    L = a.label
    rows = [
        (f"plugin: publish every slice of a node, {L}, plugin start -> all on the watch", "—",
         f"{publish_s:.2f} s ({len(want)} slices, {devices} devices; plugin CPU {cpu_pub:.2f} s, "
         f"peak RSS {peak_pub / 1024:.1f} MiB)"),
        (f"plugin: a node's slices in the API server, {L}", "—",
         f"{len(items)} objects, {kib(stored_bytes)} JSON / {kib(stored_pb)} protobuf as served "
         f"({kib(sent_bytes)} JSON as sent)"),
        (f"plugin: watch bytes per node while publishing, {L}", "—",
         f"{kib(pub_json[1])} JSON / {kib(pub_pb[1])} protobuf ({pub_json[0]} events); "
         f"slice requests: {diff(reqs1, reqs0)}"),
        (f"plugin: watch bytes per node at idle, {L}, {a.idle:.0f} s", "0",
         f"{idle_json[1]} B JSON / {idle_pb[1]} B protobuf ({idle_json[0]} events); slice requests: {diff(reqs2, reqs1)}"),
        (f"plugin: restart with the same devices, {L}, {a.restart:.0f} s after start", "no writes",
         f"{restart_json[1]} B JSON / {restart_pb[1]} B protobuf on the watch ({restart_json[0]} events), "
         f"{changed} slices changed; slice requests: {diff(reqs3, reqs2)}; plugin CPU {cpu_restart:.2f} s"),
    ]
    for figure, goal, value in rows:
        print(f"perf|{figure}|{goal}|{value}")


if __name__ == "__main__":
    main()
