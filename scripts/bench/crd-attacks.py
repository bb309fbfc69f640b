#!/usr/bin/env python3
"""Issue 39's measurements, two `ccm` binaries side by side in one run.

For each binary (`--before`, `--after`), interleaved, `--runs` times (median reported):

  pattern   server CPU seconds and wall time of one `kubectl create --dry-run=server` of a
            97 KB custom resource: 20,000 strings under a schema `pattern` (finding 3);
  split     the same for the finding 4 rule `self.s.split('').all(x, self.s.split('').all(y,
            y.size() < 5))` over a 2 KB string; where the definition itself is refused (its
            estimated cost), that is reported instead;
  latency   the median wall time of `kubectl get configmaps` while three of the `pattern`
            requests run at once;
  crds      the server's RSS after 1,000 distinct definitions are created, established and
            deleted (and before: at rest after start);
  cleanup   (only when asked for) the time a definition holding 3,000 objects takes to be
            deleted, its objects first (finding 6).

Each binary runs `ccm apiserver` on a fresh data directory on loopback. Needs kubectl on
PATH. Usage:

  scripts/bench/crd-attacks.py --before /tmp/ccm-before --after target/debug/ccm [--runs 3]
      [--only pattern,split,latency,crds,cleanup] [--crds 1000] [--objects 3000]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat; after the command name they are 11, 12.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Server:
    def __init__(self, binary):
        self.dir = tempfile.TemporaryDirectory(prefix="crd-attacks-")
        self.kc = os.path.join(self.dir.name, "kc")
        port = free_port()
        self.log = open(os.path.join(self.dir.name, "log"), "w")
        self.proc = subprocess.Popen(
            [binary, "apiserver", "--listen", f"127.0.0.1:{port}",
             "--data-dir", os.path.join(self.dir.name, "data"), "--write-kubeconfig", self.kc],
            stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(600):
            if os.path.exists(self.kc) and self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"{binary} did not become ready")

    def kubectl(self, *args, check=True, stdin=None, timeout=600):
        out = subprocess.run(["kubectl", "--kubeconfig", self.kc, *args], input=stdin,
                             capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()[-2000:]}")
        return out

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
        self.dir.cleanup()


def crd(name, group, plural, kind, schema):
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind,
                               "listKind": kind + "List"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": schema}}]}}


HOST_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def hostlists_crd():
    return crd("hostlists", "example.com", "hostlists", "HostList", {
        "type": "object", "properties": {"spec": {"type": "object", "properties": {
            "hosts": {"type": "array", "items": {"type": "string", "pattern": HOST_PATTERN}}}}}})


def splits_crd():
    return crd("splits", "example.com", "splits", "Split", {
        "type": "object", "properties": {"spec": {
            "type": "object",
            "x-kubernetes-validations": [
                {"rule": "self.s.split('').all(x, self.s.split('').all(y, y.size() < 5))"}],
            "properties": {"s": {"type": "string", "maxLength": 100000}}}}})


def apply(server, obj):
    return server.kubectl("apply", "-f", "-", stdin=json.dumps(obj), check=False)


def wait_served(server, resource):
    for _ in range(600):
        if server.kubectl("get", resource, check=False).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{resource} never served")


def timed_create(server, body):
    """Server CPU seconds, wall seconds and the outcome of one dry-run create."""
    before = cpu_seconds(server.proc.pid)
    start = time.monotonic()
    out = server.kubectl("create", "--dry-run=server", "-f", "-", stdin=body, check=False)
    wall = time.monotonic() - start
    return cpu_seconds(server.proc.pid) - before, wall, out


def pattern(server):
    apply(server, hostlists_crd()).check_returncode()
    wait_served(server, "hostlists")
    body = json.dumps({"apiVersion": "example.com/v1", "kind": "HostList",
                       "metadata": {"name": "h"}, "spec": {"hosts": ["a"] * 20000}})
    cpu, wall, out = timed_create(server, body)
    return {"cpu_s": cpu, "wall_s": wall, "ok": out.returncode == 0}


def split(server):
    made = apply(server, splits_crd())
    if made.returncode != 0:
        return {"refused": made.stderr.strip().splitlines()[-1][:200]}
    wait_served(server, "splits")
    body = json.dumps({"apiVersion": "example.com/v1", "kind": "Split",
                       "metadata": {"name": "s"}, "spec": {"s": "a" * 2000}})
    cpu, wall, out = timed_create(server, body)
    return {"cpu_s": cpu, "wall_s": wall, "outcome": (out.stdout + out.stderr).strip()[:200]}


def latency(server):
    apply(server, hostlists_crd()).check_returncode()
    wait_served(server, "hostlists")
    body = json.dumps({"apiVersion": "example.com/v1", "kind": "HostList",
                       "metadata": {"name": "h"}, "spec": {"hosts": ["a"] * 20000}})
    busy = [threading.Thread(target=timed_create, args=(server, body)) for _ in range(3)]
    for t in busy:
        t.start()
    time.sleep(0.5)
    samples = []
    for _ in range(5):
        start = time.monotonic()
        out = server.kubectl("get", "configmaps", "--request-timeout=60s", check=False)
        samples.append(time.monotonic() - start if out.returncode == 0 else float("inf"))
    for t in busy:
        t.join()
    return {"get_configmaps_median_s": statistics.median(samples)}


def crds(server, n):
    at_rest = rss_mb(server.proc.pid)
    docs = []
    for i in range(n):
        c = crd(f"things{i}", f"g{i}.bench.example.com", f"things{i}", f"Thing{i}", {
            "type": "object", "properties": {"spec": {"type": "object", "properties": {
                f"field{j}": {"type": "string", "maxLength": 64} for j in range(20)}}}})
        c["metadata"]["labels"] = {"bench": "crd-attacks"}
        docs.append(c)
    start = time.monotonic()
    for i in range(0, n, 100):
        # Client-side validation off: it needs /openapi/v2, which neither side serves.
        server.kubectl("apply", "--validate=false", "-f", "-",
                       stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                         "items": docs[i:i + 100]}))
    server.kubectl("wait", "--for=condition=Established", "crd", "-l", "bench=crd-attacks",
                   "--timeout=600s")
    created = rss_mb(server.proc.pid)
    server.kubectl("delete", "crd", "-l", "bench=crd-attacks", "--wait=true", "--timeout=600s")
    elapsed = time.monotonic() - start
    time.sleep(2)
    return {"rss_at_rest_mb": at_rest, "rss_with_crds_mb": created,
            "rss_after_delete_mb": rss_mb(server.proc.pid), "cycle_s": elapsed}


def cleanup(server, n):
    """Seconds from deleting a definition holding `n` objects until it is gone (its
    cleanup, upstream's finalizer `customresourcecleanup.apiextensions.k8s.io`, deletes
    them first)."""
    apply(server, crd("widgets", "example.com", "widgets", "Widget", {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True})).check_returncode()
    wait_served(server, "widgets")
    for i in range(0, n, 500):
        items = [{"apiVersion": "example.com/v1", "kind": "Widget",
                  "metadata": {"name": f"w{j}", "namespace": "default"}}
                 for j in range(i, min(n, i + 500))]
        server.kubectl("create", "--validate=false", "-f", "-",
                       stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    start = time.monotonic()
    server.kubectl("delete", "crd", "widgets.example.com", "--wait=true", "--timeout=900s")
    return {"delete_s": time.monotonic() - start}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True)
    p.add_argument("--after", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--only", default="pattern,split,latency,crds")
    p.add_argument("--crds", type=int, default=1000)
    p.add_argument("--objects", type=int, default=3000)
    args = p.parse_args()
    scenarios = {"pattern": pattern, "split": split, "latency": latency,
                 "crds": lambda s: crds(s, args.crds),
                 "cleanup": lambda s: cleanup(s, args.objects)}
    results = {}
    for name in args.only.split(","):
        for run in range(args.runs):
            for side, binary in (("before", args.before), ("after", args.after)):
                server = Server(binary)
                try:
                    r = scenarios[name](server)
                finally:
                    server.stop()
                print(f"{name} run {run + 1} {side}: {json.dumps(r)}", flush=True)
                results.setdefault((name, side), []).append(r)
    print("\nmedians:")
    for (name, side), rs in results.items():
        keys = [k for k, v in rs[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        medians = {k: round(statistics.median(r[k] for r in rs), 3) for k in keys}
        other = {k: v for k, v in rs[0].items() if k not in keys}
        print(f"  {name:8} {side:6} {json.dumps(medians)} {json.dumps(other) if other else ''}")


if __name__ == "__main__":
    sys.exit(main())
