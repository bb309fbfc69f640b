#!/usr/bin/env python3
"""Scenario checks: real outcomes of a cluster's controllers, asserted through its API only.

    python3 tests/upstream-scenarios/scenarios.py --mode upstream-on-ours \
        --kubeconfig KUBECONFIG.json [--nodes 3] [--lb-cidr 127.2.0.0/16] [--only REGEX]

scripts/upstream-scenarios starts the cluster (which programs run against which API server
is the mode's: README.md beside this file) and runs this. The checks are the same for every
mode; only registering the Nodes differs (MODES below). Each check prints one line, PASS or
FAIL with the seconds it took, and a failure says what it observed; the exit status is 1 when
any check failed. Standard library only (CI has Python 3, nothing else is installed for it).
"""

import argparse
import base64
import concurrent.futures
import fnmatch
import ipaddress
import json
import os
import re
import ssl
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import uuid

UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"
LB_CLEANUP_FINALIZER = "service.kubernetes.io/load-balancer-cleanup"
ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# kwok manages the Nodes carrying this annotation (--manage-nodes-with-annotation-selector).
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
IMAGE = "registry.k8s.io/pause:3.10"


class CheckFailed(Exception):
    """A check's outcome was not reached: the message says what was observed."""


# ---- the API ---------------------------------------------------------------------------------


class Api:
    """The cluster's API server, with the credentials of a kubeconfig (as JSON)."""

    def __init__(self, kubeconfig_path):
        with open(kubeconfig_path) as f:
            kc = json.load(f)
        ctx_name = kc.get("current-context")
        ctx = next(c["context"] for c in kc["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in kc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in kc["users"] if u["name"] == ctx["user"])
        self.base = cluster["server"].rstrip("/")
        self.tmp = tempfile.mkdtemp(prefix="upstream-scenarios-")
        tls = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        else:
            ca = os.path.join(self.tmp, "ca.crt")
            with open(ca, "wb") as f:
                f.write(base64.b64decode(cluster["certificate-authority-data"]))
            tls.load_verify_locations(ca)
            tls.check_hostname = False
        self.headers = {"User-Agent": "upstream-scenarios/v1.35.4 ccm-rs/scenarios",
                        "Accept": "application/json"}
        if "token" in user:
            self.headers["Authorization"] = "Bearer " + user["token"]
        if "client-certificate-data" in user:
            crt, key = os.path.join(self.tmp, "user.crt"), os.path.join(self.tmp, "user.key")
            with open(crt, "wb") as f:
                f.write(base64.b64decode(user["client-certificate-data"]))
            with open(key, "wb") as f:
                f.write(base64.b64decode(user["client-key-data"]))
            tls.load_cert_chain(crt, key)
        self.opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=tls))

    def request(self, method, path, body=None, content_type="application/json"):
        """Returns (status, decoded JSON body or text)."""
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with self.opener.open(req, timeout=30) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        except (urllib.error.URLError, OSError) as e:
            return 0, f"no answer: {e}"
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def get(self, path):
        return self.request("GET", path)

    def must(self, method, path, body=None, ok=(200, 201, 202)):
        """A request that must succeed: else the check fails naming request and answer."""
        status, data = self.request(method, path, body)
        if status not in ok:
            raise CheckFailed(f"{method} {path} answered {status}: {short(data)}")
        return data

    def create(self, path, obj):
        return self.must("POST", path, obj, ok=(201, 200, 202))

    def delete(self, path, propagation=None):
        body = None
        if propagation:
            body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        return self.must("DELETE", path, body, ok=(200, 202))

    def items(self, path, selector=None):
        if selector:
            path += "?labelSelector=" + urllib.parse.quote(selector)
        return self.must("GET", path)["items"]


def short(value, n=400):
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= n else text[:n] + "…"


def wait_for(what, probe, timeout, interval=0.5):
    """Polls probe() -> (done, observed) until done; fails after timeout naming the last
    observation."""
    deadline = time.monotonic() + timeout
    while True:
        done, observed = probe()
        if done:
            return observed
        if time.monotonic() >= deadline:
            raise CheckFailed(f"{what}: not within {timeout:g} s; observed: {observed}")
        time.sleep(interval)


def gone(api, path):
    """A probe: the object at path answers 404."""
    def probe():
        status, data = api.get(path)
        if status == 404:
            return True, "404"
        if status != 200:
            return False, f"GET {path} answered {status}: {short(data, 200)}"
        meta = data.get("metadata", {})
        return False, (f"still there (deletionTimestamp {meta.get('deletionTimestamp')}, "
                       f"finalizers {meta.get('finalizers')})")
    return probe


class Watch:
    """Records the events of a watch (from a list's resourceVersion) in a thread of its own,
    for what polling would miss: an object's short last states."""

    def __init__(self, api, path, resource_version, timeout=90):
        self.events = []
        sep = "&" if "?" in path else "?"
        url = (f"{api.base}{path}{sep}watch=true&resourceVersion={resource_version}"
               f"&timeoutSeconds={timeout}")
        self.req = urllib.request.Request(url, headers=api.headers)
        self.api = api
        self.error = None
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            with self.api.opener.open(self.req, timeout=120) as resp:
                for line in resp:
                    if line.strip():
                        self.events.append(json.loads(line))
        except Exception as e:  # reported by whoever reads the events
            self.error = e


def namespace(api, name):
    """Creates namespace name (fresh) and waits for its `default` ServiceAccount, which Pods
    need and the serviceaccounts controller makes."""
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": name}})
    wait_for(f"the ServiceAccount {name}/default (the serviceaccounts controller's)",
             lambda: (api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200,
                      "no ServiceAccount default"), 30)
    return name


def pod_template(app):
    return {"metadata": {"labels": {"app": app}},
            "spec": {"containers": [{"name": "pause", "image": IMAGE}],
                     "terminationGracePeriodSeconds": 1}}


def deployment(name, replicas):
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": pod_template(name)}}


def pod_summary(pod):
    """One Pod's phase and node, and why it has none (its PodScheduled condition)."""
    status = pod.get("status", {})
    text = f"{pod['metadata']['name']}: {status.get('phase')}"
    node = pod.get("spec", {}).get("nodeName")
    if node:
        text += f" on {node}"
    else:
        cond = next((c for c in status.get("conditions", []) or [] if c.get("type") == "PodScheduled"), None)
        text += (" unscheduled, no PodScheduled condition (no scheduler has tried it)" if cond is None
                 else f" unscheduled, PodScheduled {cond.get('status')} {cond.get('reason')}: {cond.get('message')}")
    if pod["metadata"].get("deletionTimestamp"):
        text += " (deleting)"
    return text


def pods_summary(pods):
    return ", ".join(pod_summary(p) for p in pods) or "no pods"


def running_pods(api, ns, app, replicas, owner_uid=None):
    """Waits for replicas Running Pods of app (owned by owner_uid when given); returns them."""
    def probe():
        pods = [p for p in api.items(f"/api/v1/namespaces/{ns}/pods", f"app={app}")
                if not p["metadata"].get("deletionTimestamp")]
        if owner_uid:
            pods = [p for p in pods
                    if any(o.get("uid") == owner_uid for o in p["metadata"].get("ownerReferences", []))]
        running = [p for p in pods if p.get("status", {}).get("phase") == "Running"
                   and p.get("spec", {}).get("nodeName")]
        return len(running) == replicas and len(pods) == replicas, pods_summary(pods)
    return wait_for(f"{replicas} Running Pods app={app} in {ns}", probe, 60)


# ---- the modes: how the Nodes come --------------------------------------------------------


def register_nodes_for_kwok(api, count):
    """Mode upstream-on-ours: kwok plays the kubelets, so the Nodes are registered here as a
    kubelet with --cloud-provider=external registers its own (the uninitialized taint, the
    well-known labels), with kwok's annotation."""
    for i in range(count):
        name = f"kwok-node-{i}"
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", "type": "kwok"},
                "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {"taints": [{"key": UNINITIALIZED_TAINT, "value": "true",
                                 "effect": "NoSchedule"}]},
        }
        status, data = api.request("POST", "/api/v1/nodes", node)
        if status not in (200, 201, 409):
            sys.exit(f"registering Node {name}: POST /api/v1/nodes answered {status}: {short(data)}")


def nodes_registered_by_simulator(api, count):
    """Mode ours-on-upstream: core-cluster's node simulator registers its Nodes itself
    (`sim-node-0`…, as kubelets with --cloud-provider=external: scripts/upstream-scenarios'
    launch_ours_on_upstream starts it); the nodes-initialized check waits for them."""


MODES = {
    "upstream-on-ours": register_nodes_for_kwok,
    "upstream-on-upstream": register_nodes_for_kwok,  # the control: the same programs
    "ours-on-upstream": nodes_registered_by_simulator,
}

# The providerID the cloud controller manager gives a Node, by mode (a shell-style pattern,
# fnmatch): upstream's fake cloud (scripts/upstream/fake-ccm) names each instance as its Node;
# core-cluster's fake provider (`ccm --cloud-provider fake`) gives the instance's ID, which
# `ccm node-simulator --write-fake-cloud-config` numbers `i-<8 hex digits>`.
PROVIDER_IDS = {
    "upstream-on-ours": lambda name: f"fake://{name}",
    "upstream-on-upstream": lambda name: f"fake://{name}",
    "ours-on-upstream": lambda name: "fake://i-????????",
}


# ---- the checks ------------------------------------------------------------------------------


def check_nodes_initialized(api, opts):
    """(i) The cloud controller manager initializes every Node: its provider ID (the mode's
    PROVIDER_IDS), the uninitialized taint removed, zone and region labels set; and the Node
    becomes Ready."""
    def probe():
        nodes = api.items("/api/v1/nodes")
        problems = []
        for n in nodes:
            name = n["metadata"]["name"]
            labels = n["metadata"].get("labels", {})
            taints = [t.get("key") for t in n.get("spec", {}).get("taints", []) or []]
            ready = [c.get("status") for c in n.get("status", {}).get("conditions", []) or []
                     if c.get("type") == "Ready"]
            want = PROVIDER_IDS[opts.mode](name)
            if not fnmatch.fnmatchcase(n.get("spec", {}).get("providerID") or "", want):
                problems.append(f"{name}: providerID {n.get('spec', {}).get('providerID')!r}, not {want!r}")
            if UNINITIALIZED_TAINT in taints:
                problems.append(f"{name}: still tainted {UNINITIALIZED_TAINT} (taints {taints})")
            for label in (ZONE_LABEL, REGION_LABEL, INSTANCE_TYPE_LABEL):
                if not labels.get(label):
                    problems.append(f"{name}: no label {label}")
            if ready != ["True"]:
                problems.append(f"{name}: Ready condition {ready or 'absent'}")
        if len(nodes) < opts.nodes:
            problems.append(f"{len(nodes)} Nodes, not {opts.nodes}")
        return not problems, "; ".join(problems)
    wait_for("every Node initialized by the cloud controller manager and Ready", probe, 60)
    nodes = api.items("/api/v1/nodes")
    zones = sorted({n["metadata"]["labels"][ZONE_LABEL] for n in nodes})
    return f"{len(nodes)} Nodes, zones {zones}"


def check_load_balancer(api, opts):
    """(ii) A LoadBalancer Service gets an ingress IP from the cloud and the cleanup
    finalizer; deleting it deletes the cloud's load balancer, then the Service."""
    ns = namespace(api, "scenario-lb")
    path = f"/api/v1/namespaces/{ns}/services/web"
    api.create(f"/api/v1/namespaces/{ns}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "web"},
                 "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]}})

    def provisioned():
        status, svc = api.get(path)
        if status != 200:
            return False, f"GET answered {status}: {short(svc, 200)}"
        ingress = (svc.get("status", {}).get("loadBalancer", {}) or {}).get("ingress") or []
        finalizers = svc["metadata"].get("finalizers", [])
        ok = bool(ingress and ingress[0].get("ip")) and LB_CLEANUP_FINALIZER in finalizers
        return ok, f"status.loadBalancer {svc.get('status', {}).get('loadBalancer')}, finalizers {finalizers}"
    wait_for("status.loadBalancer.ingress[0].ip and the cleanup finalizer", provisioned, 60)
    svc = api.get(path)[1]
    ip = svc["status"]["loadBalancer"]["ingress"][0]["ip"]
    if opts.lb_cidr and ipaddress.ip_address(ip) not in ipaddress.ip_network(opts.lb_cidr):
        raise CheckFailed(f"ingress IP {ip} is not in the cloud's range {opts.lb_cidr}")

    api.delete(path)
    wait_for(f"the Service deleted (the controller removing {LB_CLEANUP_FINALIZER})",
             gone(api, path), 60)

    def deleted_event():
        events = api.items(f"/api/v1/namespaces/{ns}/events")
        reasons = [e.get("reason") for e in events
                   if e.get("involvedObject", {}).get("name") == "web"
                   and e.get("involvedObject", {}).get("kind") == "Service"]
        return "DeletedLoadBalancer" in reasons, f"the Service's events: {reasons}"
    wait_for("the Event DeletedLoadBalancer (the cloud's load balancer deleted)", deleted_event, 15)
    return f"ingress {ip}, deleted"


def check_deployment(api, opts):
    """(iii) A Deployment of 3 replicas makes a ReplicaSet and 3 Pods that kwok runs;
    the Deployment reports readyReplicas 3."""
    ns = namespace(api, "scenario-deployment")
    dep = api.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment("web", 3))

    def ready():
        status, d = api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/web")
        if status != 200:
            return False, f"GET answered {status}: {short(d, 200)}"
        st = d.get("status", {})
        done = st.get("readyReplicas") == 3 and st.get("availableReplicas") == 3
        pods = [] if done else api.items(f"/api/v1/namespaces/{ns}/pods", "app=web")
        return done, (f"status replicas {st.get('replicas')}, readyReplicas {st.get('readyReplicas')}, "
                      f"availableReplicas {st.get('availableReplicas')}; Pods: {pods_summary(pods)}")
    wait_for("the Deployment's readyReplicas == 3", ready, 60)
    rss = [rs for rs in api.items(f"/apis/apps/v1/namespaces/{ns}/replicasets", "app=web")
           if any(o.get("uid") == dep["metadata"]["uid"] for o in rs["metadata"].get("ownerReferences", []))]
    if len(rss) != 1:
        raise CheckFailed(f"{len(rss)} ReplicaSets owned by the Deployment, not 1: "
                          f"{[rs['metadata']['name'] for rs in rss]}")
    rs = rss[0]
    if rs.get("status", {}).get("readyReplicas") != 3:
        raise CheckFailed(f"ReplicaSet {rs['metadata']['name']} status {rs.get('status')}")
    pods = running_pods(api, ns, "web", 3, owner_uid=rs["metadata"]["uid"])
    return f"ReplicaSet {rs['metadata']['name']}, {pods}"


def check_namespace_deletion(api, opts):
    """(iv) Deleting a namespace with objects in it (running Pods among them) completes."""
    ns = namespace(api, "scenario-nsdelete")
    api.create(f"/api/v1/namespaces/{ns}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"k": "v"}})
    api.create(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}, "stringData": {"k": "v"}})
    api.create(f"/api/v1/namespaces/{ns}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}})
    api.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})
    api.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment("web", 2))
    running_pods(api, ns, "web", 2)
    pods = api.must("GET", f"/api/v1/namespaces/{ns}/pods")
    watch = Watch(api, f"/api/v1/namespaces/{ns}/pods", pods["metadata"]["resourceVersion"])

    start = time.monotonic()
    api.delete(f"/api/v1/namespaces/{ns}")

    def deleted():
        status, data = api.get(f"/api/v1/namespaces/{ns}")
        if status == 404:
            return True, "404"
        if status != 200:
            return False, f"GET answered {status}: {short(data, 200)}"
        left = []
        for kind, path in (("pods", f"/api/v1/namespaces/{ns}/pods"),
                           ("deployments", f"/apis/apps/v1/namespaces/{ns}/deployments"),
                           ("replicasets", f"/apis/apps/v1/namespaces/{ns}/replicasets"),
                           ("configmaps", f"/api/v1/namespaces/{ns}/configmaps")):
            st, lst = api.get(path)
            if st == 200 and lst.get("items"):
                left.append(f"{kind} {[i['metadata']['name'] for i in lst['items']]}")
        conds = [(c.get("type"), c.get("status"), c.get("message"))
                 for c in data.get("status", {}).get("conditions", []) or [] if c.get("status") == "True"]
        return False, (f"phase {data.get('status', {}).get('phase')}, finalizers "
                       f"{data.get('spec', {}).get('finalizers')}, conditions {conds}, left: {left}")
    wait_for(f"namespace {ns} deleted (404)", deleted, 60)
    took = time.monotonic() - start
    # The namespace controller deletes Pods as any client does, gracefully: each is marked
    # (deletionTimestamp, deletionGracePeriodSeconds) and its kubelet (kwok) stops it and
    # deletes it; a Pod removed at once would skip its kubelet's termination (preStop hooks,
    # SIGTERM and the grace period).
    time.sleep(0.5)
    if watch.error:
        raise CheckFailed(f"the watch of the namespace's Pods failed: {watch.error}")
    history = {}
    for ev in watch.events:
        meta = ev.get("object", {}).get("metadata", {})
        history.setdefault(meta.get("name"), []).append(
            (ev.get("type"), meta.get("deletionTimestamp") is not None, meta.get("deletionGracePeriodSeconds")))
    abrupt = {name: h for name, h in history.items()
              if not any(t == "MODIFIED" and marked and (grace or 0) > 0 for t, marked, grace in h)}
    if len(history) < 2 or abrupt:
        raise CheckFailed(f"the namespace was deleted in {took:.1f} s, but not every Pod was deleted "
                          f"gracefully (events per Pod: type, deletionTimestamp set, "
                          f"deletionGracePeriodSeconds): {abrupt or history}")
    return f"namespace gone {took:.1f} s after DELETE, its {len(history)} Pods terminated gracefully"


def check_gc_background(api, opts):
    """(v-a) Deleting a ReplicaSet with propagationPolicy Background: the garbage collector
    deletes its Pods (kwok finishes their deletion)."""
    ns = namespace(api, "scenario-gc-background")
    rs = api.create(f"/apis/apps/v1/namespaces/{ns}/replicasets", {
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "rs"}},
                 "template": pod_template("rs")}})
    uid = rs["metadata"]["uid"]
    running_pods(api, ns, "rs", 2, owner_uid=uid)
    api.delete(f"/apis/apps/v1/namespaces/{ns}/replicasets/rs", propagation="Background")
    wait_for("the ReplicaSet deleted", gone(api, f"/apis/apps/v1/namespaces/{ns}/replicasets/rs"), 30)

    def pods_gone():
        pods = [p for p in api.items(f"/api/v1/namespaces/{ns}/pods")
                if any(o.get("uid") == uid for o in p["metadata"].get("ownerReferences", []))]
        return not pods, pods_summary(pods)
    wait_for("the ReplicaSet's Pods deleted by the garbage collector", pods_gone, 60)
    return "2 Pods collected"


def check_gc_missing_owner(api, opts):
    """(v-b) A ConfigMap whose owner (by uid) was deleted, and one whose owner never existed,
    are deleted by the garbage collector."""
    ns = namespace(api, "scenario-gc-orphans")
    cms = f"/api/v1/namespaces/{ns}/configmaps"
    owner = api.create(cms, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}})
    api.delete(f"{cms}/owner")
    wait_for("the owner ConfigMap deleted", gone(api, f"{cms}/owner"), 30)
    dependents = {
        "dependent-of-deleted": {"name": "owner", "uid": owner["metadata"]["uid"]},
        "dependent-of-nonexistent": {"name": "never-existed", "uid": str(uuid.uuid4())},
    }
    for name, ref in dependents.items():
        api.create(cms, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", **ref}]}})
    # A control: one whose owner exists stays.
    live = api.create(cms, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "live-owner"}})
    api.create(cms, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "dependent-of-live", "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "live-owner",
            "uid": live["metadata"]["uid"]}]}})

    def collected():
        left = [n for n in dependents if api.get(f"{cms}/{n}")[0] != 404]
        return not left, f"still there: {left}"
    wait_for("the dependents of a missing owner deleted by the garbage collector", collected, 60)
    status, data = api.get(f"{cms}/dependent-of-live")
    if status != 200 or data["metadata"].get("deletionTimestamp"):
        raise CheckFailed(f"the dependent of a live owner was collected too: GET answered {status}: "
                          f"{short(data, 200)}")
    return "2 collected, the live owner's dependent kept"


def check_gc_foreground(api, opts):
    """(v-c) Foreground deletion of a Deployment leaves nothing: its ReplicaSet and Pods go
    first, then the Deployment."""
    ns = namespace(api, "scenario-gc-foreground")
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/fg"
    api.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment("fg", 2))
    running_pods(api, ns, "fg", 2)
    # The DELETE answers the object as it now is: being deleted, held by foregroundDeletion
    # until the garbage collector has deleted its dependents.
    answer = api.delete(path, propagation="Foreground")
    meta = (answer or {}).get("metadata", {})
    if not meta.get("deletionTimestamp") or "foregroundDeletion" not in (meta.get("finalizers") or []):
        raise CheckFailed(f"DELETE {path} (propagationPolicy Foreground) answered metadata "
                          f"{short(meta, 300)}: no deletionTimestamp and foregroundDeletion finalizer")
    wait_for("the Deployment deleted (after its dependents)", gone(api, path), 60)

    def nothing_left():
        rss = api.items(f"/apis/apps/v1/namespaces/{ns}/replicasets", "app=fg")
        pods = api.items(f"/api/v1/namespaces/{ns}/pods", "app=fg")
        return not rss and not pods, (f"ReplicaSets {[r['metadata']['name'] for r in rss]}, "
                                      f"Pods: {pods_summary(pods)}")
    # Foreground: the owner goes only after its dependents that block it (a ReplicaSet's
    # Pods and a Deployment's ReplicaSet are created with blockOwnerDeletion), so nothing may
    # be left once the Deployment is gone.
    done, observed = nothing_left()
    if not done:
        raise CheckFailed(f"the Deployment was deleted while dependents were left: {observed}")
    return "Deployment, ReplicaSet and Pods gone"


def bind_pods_stand_in(api, stop):
    """--bind-pods, for diagnosis only: binds every unscheduled Pod to a schedulable Node in
    turn (no filters, no scores), standing in for a kube-scheduler that cannot run, so the
    checks behind scheduling can be looked at. A PASS with it says nothing of scheduling."""
    turn = 0
    while not stop.is_set():
        try:
            nodes = [n["metadata"]["name"] for n in api.items("/api/v1/nodes")
                     if not any(t.get("effect") in ("NoSchedule", "NoExecute")
                                for t in n.get("spec", {}).get("taints") or [])]
            status, pods = api.get("/api/v1/pods?fieldSelector=" + urllib.parse.quote("spec.nodeName="))
            for pod in (pods or {}).get("items", []) if status == 200 and nodes else []:
                meta = pod["metadata"]
                if meta.get("deletionTimestamp"):
                    continue
                node = nodes[turn % len(nodes)]
                turn += 1
                api.request("POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                            {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": meta["name"]},
                             "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        except CheckFailed:
            pass
        stop.wait(0.5)


# The checks: the first runs alone (the others need initialized Nodes), the rest at once,
# each in its own namespace.
CHECKS = [
    ("nodes-initialized", check_nodes_initialized),
    ("load-balancer", check_load_balancer),
    ("deployment", check_deployment),
    ("namespace-deletion", check_namespace_deletion),
    ("gc-background", check_gc_background),
    ("gc-missing-owner", check_gc_missing_owner),
    ("gc-foreground", check_gc_foreground),
]


def run_check(api, opts, name, check, lock):
    start = time.monotonic()
    try:
        detail = check(api, opts)
        line = f"PASS {name:<20} {time.monotonic() - start:6.1f} s  {detail}"
        ok = True
    except CheckFailed as e:
        line = f"FAIL {name:<20} {time.monotonic() - start:6.1f} s  {e}"
        ok = False
    except Exception:  # a bug of the check itself: say so
        line = (f"FAIL {name:<20} {time.monotonic() - start:6.1f} s  error in the check:\n"
                + traceback.format_exc())
        ok = False
    with lock:
        print(line, flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", required=True, choices=sorted(MODES))
    ap.add_argument("--kubeconfig", required=True, help="the admin kubeconfig, as JSON")
    ap.add_argument("--nodes", type=int, default=3, help="how many Nodes the cluster has")
    ap.add_argument("--lb-cidr", help="the range load balancers' ingress IPs come from")
    ap.add_argument("--only", help="only the checks whose name matches (re.search)")
    ap.add_argument("--bind-pods", action="store_true",
                    help="diagnosis only: bind unscheduled Pods here, standing in for kube-scheduler")
    opts = ap.parse_args()

    api = Api(opts.kubeconfig)
    MODES[opts.mode](api, opts.nodes)
    stop = threading.Event()
    if opts.bind_pods:
        print("NOTE: --bind-pods: Pods are bound by the checks' stand-in, not by kube-scheduler",
              flush=True)
        threading.Thread(target=bind_pods_stand_in, args=(api, stop), daemon=True).start()
    selected = [(n, c) for n, c in CHECKS if not opts.only or re.search(opts.only, n)]
    lock = threading.Lock()
    total = time.monotonic()
    results = []
    if selected and selected[0][0] == "nodes-initialized":
        results.append(run_check(api, opts, *selected.pop(0), lock))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(selected))) as pool:
        results += list(pool.map(lambda nc: run_check(api, opts, *nc, lock), selected))
    stop.set()
    failures = results.count(False)
    print(f"{failures} of {len(results)} checks failed" if failures
          else f"all {len(results)} checks passed", f"({time.monotonic() - total:.1f} s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
