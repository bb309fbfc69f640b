#!/usr/bin/env python3
"""Issue 39, item 5: the descriptors idle data-path connections hold in the embedded default.

For each binary (`--before`, `--after`), interleaved, `--runs` times (medians reported): start
the embedded default (`ccm --sim-nodes 3`, so the fake cloud's load balancers and the
simulated nodes' node ports share the API server's process), expose one pod through a
LoadBalancer Service, open `--connections` idle TCP connections to its external IP and count
the process's open descriptors (`/proc/PID/fd`) before, and 5, 30, 55 and 75 s after the last
connection was opened (each connect waits at most 1 s; after 20 failures in a row the rest
count as failed: a process out of descriptors stops accepting and its backlog fills). While
they are held, `kubectl get --raw /readyz` (a new connection to the API server) is tried once. At the end, the client sockets the server has not closed are
counted.

`--nofile N` starts ccm with `ulimit -n N` (soft and hard), to show the API server keeping
its descriptors when the data path is bounded by a share of a small limit.

Needs kubectl on PATH. Usage:

  scripts/bench/data-path-fds.py --before /tmp/ccm-before-dp --after target/debug/ccm \\
      [--runs 3] [--connections 2000] [--nofile 1024]
"""

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SAMPLES = (5, 30, 55, 75)


def kubectl(kubeconfig, *args, timeout=20):
    return subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for(what, check, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            value = check()
        except (subprocess.TimeoutExpired, OSError):
            value = None
        if value:
            return value
        time.sleep(1)
    sys.exit(f"timed out waiting for {what}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def still_open(sock):
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""  # data would be a surprise; b"" is a close
    except BlockingIOError:
        return True
    except OSError:
        return False


def run_once(binary, connections, nofile):
    with tempfile.TemporaryDirectory(prefix="dp-fds-") as tmp:
        kc = os.path.join(tmp, "kc")
        limits = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))) if nofile else None
        log = open(os.path.join(tmp, "ccm.log"), "w")
        ccm = subprocess.Popen(
            [binary, "--sim-nodes", "3", "--data-dir", os.path.join(tmp, "emb"),
             "--write-kubeconfig", kc, "--listen", f"127.0.0.1:{free_port()}",
             "--secure-port", str(free_port())],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=limits,
        )
        try:
            wait_for("the API server", lambda: os.path.exists(kc)
                     and kubectl(kc, "get", "--raw", "/readyz").returncode == 0, 180)
            kubectl(kc, "run", "web", "--image=nginx", "--port=80")
            kubectl(kc, "expose", "pod", "web", "--name", "weblb", "--type=LoadBalancer",
                    "--port=8080", "--target-port=80")

            def answering():
                out = kubectl(kc, "get", "svc", "weblb", "-o",
                              "jsonpath={.status.loadBalancer.ingress[0].ip}").stdout.strip()
                if not out:
                    return None
                with socket.create_connection((out, 8080), timeout=2) as s:
                    s.sendall(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
                    return out if s.recv(64).startswith(b"HTTP/1.1 200") else None

            ip = wait_for("the load balancer", answering, 180)
            time.sleep(2)
            soft = [l for l in open(f"/proc/{ccm.pid}/limits")
                    if l.startswith("Max open files")][0].split()[3]
            before = open_fds(ccm.pid)
            socks, failed, in_a_row = [], 0, 0
            for _ in range(connections):
                # A process out of descriptors stops accepting: once its backlog is full,
                # connects time out. Twenty in a row end the attempt (the rest count as failed).
                if in_a_row >= 20:
                    failed += 1
                    continue
                try:
                    socks.append(socket.create_connection((ip, 8080), timeout=1))
                    in_a_row = 0
                except OSError:
                    failed += 1
                    in_a_row += 1
            start = time.monotonic()
            samples = {}
            readyz = None
            for at in SAMPLES:
                time.sleep(max(0.0, start + at - time.monotonic()))
                samples[at] = open_fds(ccm.pid)
                if readyz is None:
                    try:
                        readyz = kubectl(kc, "get", "--raw", "/readyz").returncode == 0
                    except subprocess.TimeoutExpired:
                        readyz = False
            alive = sum(still_open(s) for s in socks)
            for s in socks:
                s.close()
            return {"soft": soft, "before": before, "samples": samples, "failed": failed,
                    "alive": alive, "readyz": readyz}
        finally:
            ccm.terminate()
            try:
                ccm.wait(20)
            except subprocess.TimeoutExpired:
                ccm.kill()
                ccm.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--nofile", type=int, default=0)
    args = parser.parse_args()
    # The client holds as many sockets as it opens.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    results = {"before": [], "after": []}
    for run in range(args.runs):
        for label in ("before", "after"):
            r = run_once(getattr(args, label), args.connections, args.nofile)
            results[label].append(r)
            print(f"{label} run {run + 1}: RLIMIT_NOFILE soft {r['soft']}, fds before {r['before']}, "
                  + ", ".join(f"{a} s: {n}" for a, n in r["samples"].items())
                  + f"; connects failed {r['failed']}, client sockets still open at 75 s {r['alive']},"
                  f" readyz during the hold {'ok' if r['readyz'] else 'FAILED'}", flush=True)
    for label, rs in results.items():
        med = lambda f: statistics.median(f(r) for r in rs)
        print(f"{label} median: fds before {med(lambda r: r['before'])}, "
              + ", ".join(f"{a} s: {med(lambda r, a=a: r['samples'][a])}" for a in SAMPLES)
              + f"; client sockets open at 75 s {med(lambda r: r['alive'])};"
              f" readyz ok in {sum(bool(r['readyz']) for r in rs)}/{len(rs)}")


if __name__ == "__main__":
    main()
