#!/usr/bin/env python3
"""The differential harness: the same requests to kube-apiserver and to core-cluster, compared.

    python3 tests/differential/harness.py --upstream KUBECONFIG.json --core KUBECONFIG.json

scripts/differential starts both servers (each with upstream's kube-controller-manager) and
runs this; README.md beside this file describes the corpus, the normalisation and the
report. Standard library only (CI has Python 3, nothing else is installed for it).
"""

import argparse
import base64
import concurrent.futures
import copy
import fnmatch
import http.client
import json
import os
import re
import socket
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
CASES_DIR = os.path.join(HERE, "cases")
EXPLAINED = os.path.join(HERE, "EXPLAINED.md")

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"
PROTOBUF = "application/vnd.kubernetes.protobuf"
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

# ---- HTTP ------------------------------------------------------------------------------------


class Server:
    """One API server: its address and credentials from a kubeconfig (as JSON)."""

    def __init__(self, name, kubeconfig_path):
        self.name = name
        with open(kubeconfig_path) as f:
            kc = json.load(f)
        ctx_name = kc.get("current-context")
        ctx = next(c["context"] for c in kc["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in kc["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in kc["users"] if u["name"] == ctx["user"])
        url = urllib.parse.urlparse(cluster["server"])
        self.host, self.port = url.hostname, url.port or 443
        self.tmp = tempfile.mkdtemp(prefix=f"differential-{name}-")
        ctx_ssl = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            ctx_ssl.check_hostname = False
            ctx_ssl.verify_mode = ssl.CERT_NONE
        else:
            ca = os.path.join(self.tmp, "ca.crt")
            with open(ca, "wb") as f:
                f.write(base64.b64decode(cluster["certificate-authority-data"]))
            ctx_ssl.load_verify_locations(ca)
            ctx_ssl.check_hostname = False
        # A client names itself: the User-Agent's first word is the field manager of writes
        # that give none (kubectl's, client-go's); a case without it sets it empty.
        self.headers = {"User-Agent": "differential/v1.35.4 (linux/amd64) ccm-rs/harness"}
        if "token" in user:
            self.headers["Authorization"] = "Bearer " + user["token"]
        if "client-certificate-data" in user:
            crt, key = os.path.join(self.tmp, "user.crt"), os.path.join(self.tmp, "user.key")
            with open(crt, "wb") as f:
                f.write(base64.b64decode(user["client-certificate-data"]))
            with open(key, "wb") as f:
                f.write(base64.b64decode(user["client-key-data"]))
            ctx_ssl.load_cert_chain(crt, key)
        ctx_ssl.set_alpn_protocols(["http/1.1"])
        self.ssl = ctx_ssl
        self.local = threading.local()
        self.count = 0
        self.lock = threading.Lock()

    def _conn(self, fresh=False):
        conn = getattr(self.local, "conn", None)
        if conn is None or fresh:
            if conn is not None:
                conn.close()
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.ssl, timeout=60)
            self.local.conn = conn
        return conn

    def request(self, method, path, body=None, headers=None, stream=False):
        """Returns (status, [(header, value)], body bytes)."""
        with self.lock:
            self.count += 1
        hdrs = dict(self.headers)
        hdrs.update(headers or {})
        for attempt in range(2):
            conn = self._conn(fresh=attempt > 0 or stream)
            try:
                conn.request(method, path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
                if stream or resp.getheader("Connection", "").lower() == "close":
                    conn.close()
                    self.local.conn = None
                return resp.status, resp.getheaders(), data
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if attempt == 1:
                    raise
            except socket.timeout:
                conn.close()
                self.local.conn = None
                return 0, [], b"client timeout"
        raise RuntimeError("unreachable")


# ---- the corpus ------------------------------------------------------------------------------


def deep_merge(base, patch):
    """JSON merge patch (RFC 7386) of patch onto a copy of base."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base) if isinstance(base, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = deep_merge(out.get(k), v)
    return out


def collection_path(res, ns="{{ns}}"):
    g, v = res.get("group", ""), res["version"]
    prefix = f"/api/{v}" if g == "" else f"/apis/{g}/{v}"
    if res.get("namespaced", True):
        return f"{prefix}/namespaces/{ns}/{res['resource']}"
    return f"{prefix}/{res['resource']}"


def api_version(res):
    g = res.get("group", "")
    return res["version"] if g == "" else f"{g}/{res['version']}"


def resource_cases(res):
    """The standard sequence for one resource definition (cases/<group>/<resource>.json)."""
    name = res["resource"]
    gid = res.get("group") or "core"
    cid = f"{gid}/{res['version']}/{name}"
    namespaced = res.get("namespaced", True)
    base = collection_path(res)
    av, kind = api_version(res), res["kind"]
    skip = set(res.get("skip", []))
    verbs = set(res.get("verbs", ["create", "get", "list", "watch", "update", "patch", "delete"]))
    builtin = res.get("builtin", True)
    # Cluster-scoped names carry the case's prefix so cases do not meet; namespaced ones are
    # alone in their namespace.
    p = "{{p}}"

    def obj(n, labels=None, extra=None):
        o = {"apiVersion": av, "kind": kind, "metadata": {"name": p + n}}
        if namespaced:
            o["metadata"]["namespace"] = "{{ns}}"
        o["metadata"]["labels"] = dict({"diff": "{{case}}"}, **(labels or {}))
        o = deep_merge(o, copy.deepcopy(res.get("template", {})))
        if extra:
            o = deep_merge(o, extra)
        return o

    def item(n):
        return f"{base}/{p}{n}"

    sel = {"labelSelector": "diff={{case}}"}
    settle = res.get("settle")  # polled before a compared GET of an object controllers write

    def get(sid, n, **kw):
        s = {"id": sid, "method": "GET", "path": item(n)}
        if settle:
            s["settle"] = settle
        s.update(kw)
        return s

    update = res.get("update", {"metadata": {"annotations": {"updated": "yes"}}})
    patch = res.get("patch", {"metadata": {"annotations": {"patched": "yes"}}})
    cases = []

    # crud: the verbs, the patch types, apply, Table and protobuf, dry run, the subresources,
    # delete with preconditions and each propagation policy.
    s = []
    if "create" in verbs:
        s += [
            {"id": "create-a", "method": "POST", "path": base, "body": obj("a", {"tier": "x"}),
             "save": {"a": "", "a_uid": "metadata.uid", "a_rv": "metadata.resourceVersion"}},
            {"id": "create-b", "method": "POST", "path": base, "body": obj("b", {"tier": "y"})},
            {"id": "create-c", "method": "POST", "path": base, "body": obj("c", {"tier": "x"})},
        ]
    if "get" in verbs:
        s += [get("get-a", "a", save={"a": ""})]
    if "list" in verbs:
        lsel = {} if namespaced else dict(sel)
        s += [
            {"id": "list", "method": "GET", "path": base, "query": lsel,
             "save": {"list_rv": "metadata.resourceVersion"}},
            {"id": "list-label", "method": "GET", "path": base,
             "query": {"labelSelector": "diff={{case}},tier=x"}},
            {"id": "list-label-set", "method": "GET", "path": base,
             "query": {"labelSelector": "diff={{case}},tier in (x,y),tier!=z"}},
            {"id": "list-label-exists", "method": "GET", "path": base,
             "query": {"labelSelector": "diff,!nothere"}},
            {"id": "list-field-name", "method": "GET", "path": base,
             "query": dict(lsel, fieldSelector=f"metadata.name={p}a")},
            {"id": "list-field-not", "method": "GET", "path": base,
             "query": dict(lsel, fieldSelector=f"metadata.name!={p}a")},
            {"id": "list-limit", "method": "GET", "path": base, "query": dict(sel, limit="1"),
             "save": {"cont": "metadata.continue"}},
            {"id": "list-continue", "method": "GET", "path": base,
             "query": dict(sel, limit="1", **{"continue": "{{cont}}"}),
             "save": {"cont2": "metadata.continue"}},
            {"id": "list-continue-2", "method": "GET", "path": base,
             "query": dict(sel, limit="5", **{"continue": "{{cont2}}"})},
            {"id": "list-rv0", "method": "GET", "path": base,
             "query": dict(sel, resourceVersion="0")},
            {"id": "list-notolderthan", "method": "GET", "path": base,
             "query": dict(sel, resourceVersion="{{list_rv}}", resourceVersionMatch="NotOlderThan")},
            {"id": "list-exact", "method": "GET", "path": base,
             "query": dict(sel, resourceVersion="{{list_rv}}", resourceVersionMatch="Exact")},
            {"id": "list-table", "method": "GET", "path": base, "query": sel,
             "headers": {"Accept": TABLE}},
            {"id": "list-table-object", "method": "GET", "path": base,
             "query": dict(sel, includeObject="Object"), "headers": {"Accept": TABLE}},
            {"id": "list-partial-metadata", "method": "GET", "path": base, "query": sel,
             "headers": {"Accept": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io"}},
        ]
        if namespaced:
            s += [{"id": "list-field-namespace", "method": "GET", "path": base,
                   "query": {"fieldSelector": "metadata.namespace={{ns}}"}}]
            s += [{"id": "list-all-namespaces", "method": "GET",
                   "path": collection_path(res).replace("/namespaces/{{ns}}", ""), "query": sel}]
        if res.get("protobuf", builtin):
            s += [{"id": "list-protobuf", "method": "GET", "path": base, "query": sel,
                   "headers": {"Accept": PROTOBUF}}]
    if "get" in verbs:
        s += [
            get("get-table", "a", headers={"Accept": TABLE}),
            get("get-partial-metadata", "a",
                headers={"Accept": "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"}),
        ]
        if res.get("protobuf", builtin):
            s += [get("get-protobuf", "a", headers={"Accept": PROTOBUF})]
            s += [get("get-protobuf-fallback", "a",
                      headers={"Accept": PROTOBUF + ", application/json"})]
    if "update" in verbs:
        s += [
            {"id": "update", "method": "PUT", "path": item("a"), "edit": {"from": "a", "merge": update},
             "save": {"a2": ""}},
            {"id": "update-stale", "method": "PUT", "path": item("a"),
             "edit": {"from": "a", "merge": {"metadata": {"annotations": {"stale": "yes"}}}}},
            {"id": "update-no-rv", "method": "PUT", "path": item("a"),
             "edit": {"from": "a2", "merge": {"metadata": {"resourceVersion": None,
                                                         "annotations": {"norv": "yes"}}}}},
        ]
    if "patch" in verbs:
        s += [
            {"id": "patch-json", "method": "PATCH", "path": item("a"),
             "content_type": "application/json-patch+json",
             "body": res.get("json_patch", [{"op": "add", "path": "/metadata/labels/jp", "value": "1"}])},
            {"id": "patch-json-test", "method": "PATCH", "path": item("a"),
             "content_type": "application/json-patch+json",
             "body": [{"op": "test", "path": "/metadata/labels/jp", "value": "1"},
                      {"op": "replace", "path": "/metadata/labels/jp", "value": "2"}]},
            {"id": "patch-merge", "method": "PATCH", "path": item("a"),
             "content_type": "application/merge-patch+json",
             "body": deep_merge({"metadata": {"labels": {"mp": "1"}}}, patch)},
            {"id": "patch-merge-null", "method": "PATCH", "path": item("a"),
             "content_type": "application/merge-patch+json",
             "body": {"metadata": {"labels": {"mp": None}}}},
        ]
        if builtin:
            s += [{"id": "patch-strategic", "method": "PATCH", "path": item("a"),
                   "content_type": "application/strategic-merge-patch+json",
                   "body": deep_merge({"metadata": {"labels": {"sp": "1"}}},
                                      res.get("strategic", patch))}]
            s += [{"id": "patch-strategic-delete", "method": "PATCH", "path": item("a"),
                   "content_type": "application/strategic-merge-patch+json",
                   "body": {"metadata": {"labels": {"sp": None}, "$setElementOrder/finalizers": []}}}]
        s += [
            {"id": "patch-merge-stale", "method": "PATCH", "path": item("a"),
             "content_type": "application/merge-patch+json",
             "body": {"metadata": {"resourceVersion": "{{a_rv}}", "labels": {"stale": "1"}}}},
            {"id": "apply-create", "method": "PATCH", "path": item("d"),
             "query": {"fieldManager": "diff-a"}, "content_type": "application/apply-patch+yaml",
             "body": obj("d", {"tier": "x"}), "save": {"d": ""}},
            {"id": "apply-same", "method": "PATCH", "path": item("d"),
             "query": {"fieldManager": "diff-a"}, "content_type": "application/apply-patch+yaml",
             "body": obj("d", {"tier": "x"})},
            {"id": "apply-conflict", "method": "PATCH", "path": item("d"),
             "query": {"fieldManager": "diff-b"}, "content_type": "application/apply-patch+yaml",
             "body": obj("d", {"tier": "y"})},
            {"id": "apply-force", "method": "PATCH", "path": item("d"),
             "query": {"fieldManager": "diff-b", "force": "true"},
             "content_type": "application/apply-patch+yaml", "body": obj("d", {"tier": "y"})},
            {"id": "apply-shared", "method": "PATCH", "path": item("d"),
             "query": {"fieldManager": "diff-c"}, "content_type": "application/apply-patch+yaml",
             "body": obj("d", {"tier": "y", "other": "c"})},
            {"id": "apply-drop-field", "method": "PATCH", "path": item("d"),
             "query": {"fieldManager": "diff-c"}, "content_type": "application/apply-patch+yaml",
             "body": obj("d", {"tier": "y"})},
            {"id": "apply-yaml", "method": "PATCH", "path": item("d"),
             "query": {"fieldManager": "diff-d"}, "content_type": "application/apply-patch+yaml",
             "raw": "apiVersion: " + av + "\nkind: " + kind + "\nmetadata:\n  name: " + p + "d\n"
             + ("  namespace: {{ns}}\n" if namespaced else "")
             + "  annotations:\n    yaml: \"yes\"\n"},
            {"id": "update-after-apply", "method": "PUT", "path": item("d"),
             "edit": {"from": "d", "merge": {"metadata": {"resourceVersion": None,
                                                        "annotations": {"by-update": "yes"}}}}},
            get("get-d", "d"),
        ]
    if "create" in verbs:
        s += [
            {"id": "dryrun-create", "method": "POST", "path": base, "query": {"dryRun": "All"},
             "body": obj("e")},
            {"id": "dryrun-create-get", "method": "GET", "path": item("e")},
        ]
    if "update" in verbs:
        s += [{"id": "dryrun-update", "method": "PUT", "path": item("a"), "query": {"dryRun": "All"},
               "edit": {"from": "a2", "merge": {"metadata": {"resourceVersion": None,
                                                           "annotations": {"dry": "yes"}}}}}]
    if "patch" in verbs:
        s += [{"id": "dryrun-patch", "method": "PATCH", "path": item("a"), "query": {"dryRun": "All"},
               "content_type": "application/merge-patch+json",
               "body": {"metadata": {"annotations": {"dry": "patch"}}}}]
    if "delete" in verbs:
        s += [{"id": "dryrun-delete", "method": "DELETE", "path": item("a"), "query": {"dryRun": "All"}}]
    if "get" in verbs:
        s += [get("get-after-dryrun", "a")]
    st = res.get("status")
    if st is not None and "status" not in skip:
        s += [
            {"id": "status-get", "method": "GET", "path": item("a") + "/status", "save": {"st": ""}},
            {"id": "status-patch-merge", "method": "PATCH", "path": item("a") + "/status",
             "content_type": "application/merge-patch+json", "body": st},
            {"id": "status-patch-ignores-spec", "method": "PATCH", "path": item("a") + "/status",
             "content_type": "application/merge-patch+json",
             "body": {"metadata": {"labels": {"via-status": "1"}},
                      **res.get("status_spec_change", {})}},
            {"id": "status-apply", "method": "PATCH", "path": item("a") + "/status",
             "query": {"fieldManager": "diff-status"}, "content_type": "application/apply-patch+yaml",
             "body": deep_merge({"apiVersion": av, "kind": kind, "metadata": {"name": p + "a"}}, st)},
            {"id": "status-put-stale", "method": "PUT", "path": item("a") + "/status",
             "edit": {"from": "st", "merge": {}}},
            get("status-get-after", "a"),
        ]
    if res.get("scale") and "scale" not in skip:
        s += [
            {"id": "scale-get", "method": "GET", "path": item("a") + "/scale", "save": {"sc": ""}},
            {"id": "scale-patch", "method": "PATCH", "path": item("a") + "/scale",
             "content_type": "application/merge-patch+json", "body": {"spec": {"replicas": 2}}},
            {"id": "scale-put-stale", "method": "PUT", "path": item("a") + "/scale",
             "edit": {"from": "sc", "merge": {"spec": {"replicas": 3}}}},
            {"id": "scale-put", "method": "PUT", "path": item("a") + "/scale",
             "edit": {"from": "sc", "merge": {"metadata": {"resourceVersion": None},
                                              "spec": {"replicas": 0}}}},
            {"id": "scale-get-after", "method": "GET", "path": item("a") + "/scale"},
            {"id": "scale-protobuf", "method": "GET", "path": item("a") + "/scale",
             "headers": {"Accept": PROTOBUF}},
        ]
    if "delete" in verbs:
        s += [
            {"id": "delete-precondition-uid", "method": "DELETE", "path": item("a"),
             "body": {"kind": "DeleteOptions", "apiVersion": "v1",
                      "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}}},
            {"id": "delete-precondition-rv", "method": "DELETE", "path": item("a"),
             "body": {"kind": "DeleteOptions", "apiVersion": "v1",
                      "preconditions": {"resourceVersion": "{{a_rv}}"}}},
            {"id": "delete-orphan", "method": "DELETE", "path": item("b"),
             "query": {"propagationPolicy": "Orphan"}},
            {"id": "delete-orphan-gone", "method": "GET", "path": item("b"), "until": {"code": 404}},
            {"id": "delete-foreground", "method": "DELETE", "path": item("c"),
             "body": {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"}},
            {"id": "delete-foreground-gone", "method": "GET", "path": item("c"),
             "until": {"code": 404}},
            {"id": "delete-background", "method": "DELETE", "path": item("a"),
             "query": {"propagationPolicy": "Background"}},
            {"id": "delete-background-gone", "method": "GET", "path": item("a"),
             "until": {"code": 404}},
            {"id": "delete-precondition-match", "method": "DELETE", "path": item("d"),
             "body": {"kind": "DeleteOptions", "apiVersion": "v1",
                      "preconditions": {"uid": "{{d.metadata.uid}}"}}},
            {"id": "delete-gone", "method": "GET", "path": item("d"), "until": {"code": 404}},
            {"id": "delete-missing", "method": "DELETE", "path": item("d")},
        ]
        if "list" in verbs:
            s += [{"id": "list-after", "method": "GET", "path": base, "query": sel}]
    if res.get("deletecollection", True) and "delete" in verbs and "create" in verbs:
        s += [
            {"id": "create-f", "method": "POST", "path": base, "body": obj("f", {"tier": "f"})},
            {"id": "deletecollection-dryrun", "method": "DELETE", "path": base,
             "query": {"labelSelector": "diff={{case}},tier=f", "dryRun": "All"}},
            {"id": "deletecollection", "method": "DELETE", "path": base,
             "query": {"labelSelector": "diff={{case}},tier=f"}},
            {"id": "deletecollection-gone", "method": "GET", "path": item("f"), "until": {"code": 404}},
        ]
    s += res.get("crud_extra", [])
    cases.append({"id": f"{cid}/crud", "res": res, "steps": s})

    # errors: what each status code's Status says.
    if "create" in verbs:
        e = [
            {"id": "get-missing", "method": "GET", "path": item("missing")},
            {"id": "create", "method": "POST", "path": base, "body": obj("a"), "save": {"a": ""}},
            {"id": "create-exists", "method": "POST", "path": base, "body": obj("a")},
            {"id": "create-invalid-label", "method": "POST", "path": base,
             "body": obj("bad", {"bad key!": "-x-"})},
            {"id": "create-invalid-name", "method": "POST", "path": base,
             "body": deep_merge(obj("x"), {"metadata": {"name": "Not_A_Name"}})},
            {"id": "create-no-name", "method": "POST", "path": base,
             "body": deep_merge(obj("x"), {"metadata": {"name": None}})},
            {"id": "create-generate-name", "method": "POST", "path": base,
             "body": deep_merge(obj("x"), {"metadata": {"name": None, "generateName": p + "gen-"}})},
            {"id": "create-malformed", "method": "POST", "path": base, "raw": '{"apiVersion": "v1", '},
            {"id": "create-not-json", "method": "POST", "path": base, "raw": "not json at all"},
            {"id": "create-wrong-kind", "method": "POST", "path": base,
             "body": deep_merge(obj("w"), {"kind": "Wrong"})},
            {"id": "create-wrong-version", "method": "POST", "path": base,
             "body": deep_merge(obj("w"), {"apiVersion": "v9"})},
            {"id": "create-no-kind", "method": "POST", "path": base,
             "body": deep_merge(obj("nk"), {"kind": None, "apiVersion": None})},
            {"id": "create-unsupported-media", "method": "POST", "path": base,
             "content_type": "text/plain", "raw": "hello"},
            {"id": "create-list-kind", "method": "POST", "path": base,
             "body": {"apiVersion": "v1", "kind": "List", "items": []}},
            {"id": "create-wrong-name-in-path", "method": "POST", "path": item("a"), "body": obj("a")},
            {"id": "put-collection", "method": "PUT", "path": base, "body": obj("a")},
            {"id": "patch-collection", "method": "PATCH", "path": base,
             "content_type": "application/merge-patch+json", "body": {}},
        ]
        for i, inv in enumerate(res.get("invalid", [])):
            e.append({"id": f"create-invalid-{i}", "method": "POST", "path": base,
                      "body": obj(f"inv{i}", extra=inv)})
        if namespaced:
            e += [{"id": "create-namespace-mismatch", "method": "POST", "path": base,
                   "body": deep_merge(obj("m"), {"metadata": {"namespace": "other"}})},
                  {"id": "create-in-missing-namespace", "method": "POST",
                   "path": collection_path(res, "no-such-namespace"),
                   "body": deep_merge(obj("m"), {"metadata": {"namespace": "no-such-namespace"}})}]
        if "update" in verbs:
            e += [
                {"id": "update-name-mismatch", "method": "PUT", "path": item("a"),
                 "edit": {"from": "a", "merge": {"metadata": {"name": p + "other"}}}},
                {"id": "update-missing", "method": "PUT", "path": item("missing"),
                 "body": deep_merge(obj("missing"), {"metadata": {"resourceVersion": "1"}})},
                {"id": "update-create", "method": "PUT", "path": item("upd"), "body": obj("upd")},
                {"id": "update-malformed", "method": "PUT", "path": item("a"), "raw": "{"},
                {"id": "update-invalid-label", "method": "PUT", "path": item("a"),
                 "edit": {"from": "a", "merge": {"metadata": {"labels": {"-bad": "x"}}}}},
                {"id": "update-change-uid", "method": "PUT", "path": item("a"),
                 "edit": {"from": "a", "merge": {"metadata": {
                     "uid": "00000000-0000-0000-0000-000000000000"}}}},
            ]
        if "patch" in verbs:
            e += [
                {"id": "patch-unsupported-type", "method": "PATCH", "path": item("a"),
                 "content_type": "text/plain", "raw": "{}"},
                {"id": "patch-missing", "method": "PATCH", "path": item("missing"),
                 "content_type": "application/merge-patch+json", "body": {"metadata": {"labels": {"x": "y"}}}},
                {"id": "patch-json-test-fails", "method": "PATCH", "path": item("a"),
                 "content_type": "application/json-patch+json",
                 "body": [{"op": "test", "path": "/metadata/name", "value": "nope"}]},
                {"id": "patch-json-bad-path", "method": "PATCH", "path": item("a"),
                 "content_type": "application/json-patch+json",
                 "body": [{"op": "replace", "path": "/metadata/nothere/x", "value": "1"}]},
                {"id": "patch-json-bad-op", "method": "PATCH", "path": item("a"),
                 "content_type": "application/json-patch+json",
                 "body": [{"op": "frobnicate", "path": "/metadata/labels/x", "value": "1"}]},
                {"id": "patch-json-not-array", "method": "PATCH", "path": item("a"),
                 "content_type": "application/json-patch+json", "body": {"op": "add"}},
                {"id": "patch-merge-malformed", "method": "PATCH", "path": item("a"),
                 "content_type": "application/merge-patch+json", "raw": "{"},
                {"id": "patch-merge-invalid", "method": "PATCH", "path": item("a"),
                 "content_type": "application/merge-patch+json",
                 "body": {"metadata": {"labels": {"bad key!": "x"}}}},
                {"id": "patch-merge-name", "method": "PATCH", "path": item("a"),
                 "content_type": "application/merge-patch+json",
                 "body": {"metadata": {"name": p + "renamed"}}},
                {"id": "apply-no-manager", "method": "PATCH", "path": item("a"),
                 "content_type": "application/apply-patch+yaml", "body": obj("a")},
                {"id": "apply-malformed-yaml", "method": "PATCH", "path": item("a"),
                 "query": {"fieldManager": "diff"}, "content_type": "application/apply-patch+yaml",
                 "raw": "metadata: [unclosed"},
                {"id": "apply-wrong-name", "method": "PATCH", "path": item("a"),
                 "query": {"fieldManager": "diff"}, "content_type": "application/apply-patch+yaml",
                 "body": obj("zz")},
                {"id": "apply-force-not-apply", "method": "PATCH", "path": item("a"),
                 "query": {"force": "true"}, "content_type": "application/merge-patch+json",
                 "body": {}},
            ]
            if not builtin:
                e += [{"id": "patch-strategic-custom", "method": "PATCH", "path": item("a"),
                       "content_type": "application/strategic-merge-patch+json", "body": {}}]
        e += [
            {"id": "post-item", "method": "POST", "path": item("a") + "/", "body": obj("a")},
            {"id": "unknown-subresource", "method": "GET", "path": item("a") + "/nosuchthing"},
            {"id": "list-bad-label-selector", "method": "GET", "path": base,
             "query": {"labelSelector": "a in (b"}},
            {"id": "list-bad-field-selector", "method": "GET", "path": base,
             "query": {"fieldSelector": "spec.nosuchfield=x"}},
            {"id": "list-bad-limit", "method": "GET", "path": base, "query": {"limit": "x"}},
            {"id": "list-bad-continue", "method": "GET", "path": base,
             "query": {"limit": "1", "continue": "bm90IGEgdG9rZW4="}},
            {"id": "list-rv-match-without-rv", "method": "GET", "path": base,
             "query": {"resourceVersionMatch": "NotOlderThan"}},
            {"id": "list-bad-rv", "method": "GET", "path": base, "query": {"resourceVersion": "abc"}},
            {"id": "get-bad-accept", "method": "GET", "path": item("a"),
             "headers": {"Accept": "application/x-nothing"}},
            {"id": "get-yaml", "method": "GET", "path": item("a"),
             "headers": {"Accept": "application/yaml"}},
            {"id": "delete-bad-propagation", "method": "DELETE", "path": item("a"),
             "query": {"propagationPolicy": "Sideways"}},
            {"id": "delete-negative-grace", "method": "DELETE", "path": item("a"),
             "query": {"gracePeriodSeconds": "-5"}},
            {"id": "delete-malformed-options", "method": "DELETE", "path": item("a"), "raw": "{"},
            {"id": "delete-both-orphan-and-policy", "method": "DELETE", "path": item("a"),
             "body": {"kind": "DeleteOptions", "apiVersion": "v1", "orphanDependents": True,
                      "propagationPolicy": "Background"}},
            {"id": "dryrun-bad", "method": "POST", "path": base, "query": {"dryRun": "Some"},
             "body": obj("dr")},
        ]
        e += res.get("errors_extra", [])
        cases.append({"id": f"{cid}/errors", "res": res, "steps": e})

        # field validation: an unknown and a duplicate field under each mode, on each write.
        unknown = res.get("unknown_field", {"bogusField": 1, "metadata": {"bogusMeta": "x"}})
        v = []
        for mode in ["Strict", "Warn", "Ignore", None]:
            q = {"fieldValidation": mode} if mode else {}
            tag = (mode or "default").lower()
            v.append({"id": f"create-unknown-{tag}", "method": "POST", "path": base, "query": q,
                      "body": deep_merge(obj(f"u-{tag}"), unknown)})
            v.append({"id": f"create-duplicate-{tag}", "method": "POST", "path": base, "query": q,
                      "raw": json.dumps(obj(f"dup-{tag}"))[:-1] + ', "kind": "' + kind + '"}'})
        v.append({"id": "create-base", "method": "POST", "path": base, "body": obj("v"),
                  "save": {"v": ""}})
        for mode in ["Strict", "Warn", "Ignore"]:
            q = {"fieldValidation": mode}
            tag = mode.lower()
            if "update" in verbs:
                v.append({"id": f"update-unknown-{tag}", "method": "PUT", "path": item("v"), "query": q,
                          "edit": {"from": "v", "merge": deep_merge(
                              {"metadata": {"resourceVersion": None}}, unknown)}})
            if "patch" in verbs:
                v.append({"id": f"patch-merge-unknown-{tag}", "method": "PATCH", "path": item("v"),
                          "query": q, "content_type": "application/merge-patch+json", "body": unknown})
                v.append({"id": f"patch-json-unknown-{tag}", "method": "PATCH", "path": item("v"),
                          "query": q, "content_type": "application/json-patch+json",
                          "body": [{"op": "add", "path": "/bogusField", "value": 1}]})
                if builtin:
                    v.append({"id": f"patch-strategic-unknown-{tag}", "method": "PATCH",
                              "path": item("v"), "query": q,
                              "content_type": "application/strategic-merge-patch+json",
                              "body": unknown})
                v.append({"id": f"apply-unknown-{tag}", "method": "PATCH", "path": item("v"),
                          "query": dict(q, fieldManager="diff-v"),
                          "content_type": "application/apply-patch+yaml",
                          "body": deep_merge(obj("v"), unknown)})
        v.append({"id": "create-bad-mode", "method": "POST", "path": base,
                  "query": {"fieldValidation": "Loose"}, "body": obj("bad-mode")})
        cases.append({"id": f"{cid}/validation", "res": res, "steps": v})

    # watch: events in order from a resourceVersion, then the watch-list protocol.
    if "watch" in verbs and "create" in verbs:
        wq = {"labelSelector": "diff={{case}}"}
        w = [
            {"id": "list", "method": "GET", "path": base, "query": wq,
             "save": {"rv": "metadata.resourceVersion"}},
            {"id": "create-w1", "method": "POST", "path": base, "body": obj("w1")},
            {"id": "patch-w1", "method": "PATCH", "path": item("w1"),
             "content_type": "application/merge-patch+json",
             "body": {"metadata": {"annotations": {"w": "1"}}}},
            {"id": "create-w2", "method": "POST", "path": base, "body": obj("w2", {"second": "yes"})},
            {"id": "delete-w1", "method": "DELETE", "path": item("w1"),
             "query": {"gracePeriodSeconds": "0"}},
            {"id": "w1-gone", "method": "GET", "path": item("w1"), "until": {"code": 404}},
            {"id": "watch-from-rv", "method": "GET", "path": base, "watch": True,
             "query": dict(wq, watch="true", resourceVersion="{{rv}}", timeoutSeconds="1")},
            {"id": "watch-selector", "method": "GET", "path": base, "watch": True,
             "query": {"labelSelector": "diff={{case}},second=yes", "watch": "1",
                       "resourceVersion": "{{rv}}", "timeoutSeconds": "1"}},
            {"id": "watch-field-selector", "method": "GET", "path": base, "watch": True,
             "query": dict(wq, fieldSelector=f"metadata.name={p}w1", watch="true",
                           resourceVersion="{{rv}}", timeoutSeconds="1")},
            {"id": "watch-bookmarks", "method": "GET", "path": base, "watch": True,
             "query": dict(wq, watch="true", resourceVersion="{{rv}}", timeoutSeconds="1",
                           allowWatchBookmarks="true")},
            {"id": "watch-initial-events", "method": "GET", "path": base, "watch": True,
             "query": dict(wq, watch="true", sendInitialEvents="true",
                           resourceVersionMatch="NotOlderThan", allowWatchBookmarks="true",
                           timeoutSeconds="1")},
            {"id": "watch-initial-events-no-bookmarks", "method": "GET", "path": base, "watch": True,
             "query": dict(wq, watch="true", sendInitialEvents="true",
                           resourceVersionMatch="NotOlderThan", timeoutSeconds="1")},
            {"id": "watch-rv0", "method": "GET", "path": base, "watch": True,
             "query": dict(wq, watch="true", resourceVersion="0", timeoutSeconds="1")},
            {"id": "watch-item", "method": "GET", "path": base, "watch": True,
             "query": {"fieldSelector": f"metadata.name={p}w2", "watch": "true",
                       "timeoutSeconds": "1"}},
            {"id": "watch-too-old", "method": "GET", "path": base, "watch": True,
             "query": dict(wq, watch="true", resourceVersion="1", timeoutSeconds="1")},
            {"id": "watch-table", "method": "GET", "path": base, "watch": True,
             "headers": {"Accept": TABLE},
             "query": dict(wq, watch="true", resourceVersion="{{rv}}", timeoutSeconds="1")},
        ]
        if res.get("protobuf", builtin):
            w.append({"id": "watch-protobuf", "method": "GET", "path": base, "watch": True,
                      "headers": {"Accept": PROTOBUF},
                      "query": dict(wq, watch="true", resourceVersion="{{rv}}", timeoutSeconds="1")})
        cases.append({"id": f"{cid}/watch", "res": res, "steps": w})

    for extra in res.get("cases", []):
        extra = dict(extra)
        extra["id"] = f"{cid}/{extra['id']}"
        extra["res"] = res
        cases.append(extra)
    return cases


def load_corpus():
    cases = []
    for root, _dirs, files in sorted(os.walk(CASES_DIR)):
        for fn in sorted(files):
            if not fn.endswith(".json"):
                continue
            path = os.path.join(root, fn)
            with open(path) as f:
                try:
                    doc = json.load(f)
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}: {e}")
            if "resource" in doc:
                cases += resource_cases(doc)
            for c in doc.get("plain_cases", []):
                cases.append(c)
    return cases


# ---- running a case on one server ------------------------------------------------------------

VAR = re.compile(r"\{\{([^}]+)\}\}")


def lookup(vars_, dotted):
    cur = vars_
    for part in dotted.split("."):
        if isinstance(cur, dict):
            cur = cur.get(part)
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur


def subst(value, vars_):
    if isinstance(value, str):
        m = VAR.fullmatch(value)
        if m and m.group(1).startswith("@"):
            return copy.deepcopy(lookup(vars_, m.group(1)[1:]))
        return VAR.sub(lambda m: str(lookup(vars_, m.group(1)) or ""), value)
    if isinstance(value, list):
        return [subst(v, vars_) for v in value]
    if isinstance(value, dict):
        return {subst(k, vars_): subst(v, vars_) for k, v in value.items()}
    return value


def run_step(server, step, vars_):
    method = step.get("method", "GET")
    path = subst(step["path"], vars_)
    query = subst(step.get("query", {}), vars_)
    headers = subst(step.get("headers", {}), vars_)
    body = None
    if "edit" in step:
        src = copy.deepcopy(vars_.get(step["edit"]["from"]) or {})
        src.pop("status", None) if step["edit"].get("drop_status") else None
        body = json.dumps(deep_merge(src, subst(step["edit"].get("merge", {}), vars_))).encode()
    elif "raw" in step:
        body = subst(step["raw"], vars_).encode()
    elif "body" in step:
        body = json.dumps(subst(step["body"], vars_)).encode()
    if body is not None:
        headers.setdefault("Content-Type", step.get("content_type", "application/json"))
    headers.setdefault("Accept", "application/json")
    if query:
        path += "?" + urllib.parse.urlencode(query)
    until = step.get("until")
    deadline = time.time() + (until or {}).get("timeout", 60)
    while True:
        status, hdrs, data = server.request(method, path, body, headers, stream=step.get("watch"))
        if not until or until_met(until, status, data) or time.time() > deadline:
            break
        time.sleep(0.5)
    out = {"code": status, "headers": hdrs, "body": data, "path": path, "method": method}
    if step.get("save"):
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        for var, dotted in step["save"].items():
            vars_[var] = doc if dotted == "" else lookup(doc or {}, dotted)
    return out


def until_met(until, status, data):
    if "code" in until and status != until["code"]:
        return False
    if "path" in until:
        try:
            doc = json.loads(data)
        except ValueError:
            return False
        got = lookup(doc, until["path"])
        if "equals" in until and got != until["equals"]:
            return False
        if "equals_path" in until and got != lookup(doc, until["equals_path"]):
            return False
        if until.get("exists") and got is None:
            return False
    return True


def settle(server, step, vars_):
    """Waits (uncompared GETs) until the controllers are done with an object, so that a
    compared GET does not race them."""
    cond = step.get("settle")
    if not cond:
        return
    path = subst(step["path"], vars_)
    deadline = time.time() + cond.get("timeout", 20)
    while time.time() < deadline:
        status, _h, data = server.request("GET", path, None, {"Accept": "application/json"})
        if status != 200 or until_met(cond, status, data):
            return
        time.sleep(0.3)


def namespace_ready(server, ns):
    """The namespace exists and kube-controller-manager has given it its default
    ServiceAccount and kube-root-ca.crt ConfigMap (so both servers' namespaces start alike)."""
    deadline = time.time() + 60
    while time.time() < deadline:
        a = server.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0]
        b = server.request("GET", f"/api/v1/namespaces/{ns}/configmaps/kube-root-ca.crt")[0]
        if a == 200 and b == 200:
            return True
        time.sleep(0.3)
    return False


# A run's own token in every namespace and cluster-scoped name, so a run against servers that
# an earlier run used starts from the same state on both.
RUN = os.urandom(2).hex()


def case_namespace(case_id):
    short = re.sub(r"[^a-z0-9]+", "-", case_id.lower()).strip("-")
    short = short.replace("core-v1-", "").replace("-k8s-io", "")
    if len(short) > 50:
        import hashlib

        short = short[:41] + "-" + hashlib.sha1(case_id.encode()).hexdigest()[:8]
    return f"d{RUN}-{short}"


def run_case_on(server, case):
    ns = case_namespace(case["id"])
    res = case.get("res") or {}
    vars_ = {"ns": ns, "case": ns, "p": "" if res.get("namespaced", True) else ns + "-"}
    results = []
    if case.get("namespace", bool(res) and res.get("namespaced", True)):
        r = run_step(server, {"method": "POST", "path": "/api/v1/namespaces",
                              "body": {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": ns}}}, vars_)
        r["id"] = "namespace-create"
        results.append(r)
        namespace_ready(server, ns)
    for step in case["steps"]:
        if step.get("sleep"):
            time.sleep(step["sleep"])
        settle(server, step, vars_)
        r = run_step(server, step, vars_)
        r["id"] = step["id"]
        results.append(r)
    return results


# ---- normalisation ---------------------------------------------------------------------------

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
IPV4 = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b")
RV_IN_TEXT = re.compile(r"((?:resource ?version|ResourceVersion)\D{0,30}?)\d+", re.I)
PEM = re.compile(r"-----BEGIN ([A-Z ]+)-----.*?-----END [A-Z ]+-----", re.S)
AGE = re.compile(r"^(\d+[smhdy])+$|^<invalid>$|^<unknown>$")
JWT = re.compile(r"^eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
IP_KEYS = {"clusterIP", "clusterIPs", "podIP", "podIPs", "hostIP", "hostIPs", "ip", "loadBalancerIP"}
PORT_KEYS = {"nodePort", "healthCheckNodePort"}
TIME_KEYS = {"creationTimestamp", "deletionTimestamp", "time", "lastTransitionTime",
             "lastHeartbeatTime", "lastProbeTime", "lastUpdateTime", "startTime", "completionTime",
             "firstTimestamp", "lastTimestamp", "eventTime", "renewTime", "acquireTime",
             "expirationTimestamp", "lastScaleTime", "timestamp"}


class Normaliser:
    """Per server and case: generated names seen so far become `<prefix><generated>`."""

    def __init__(self):
        self.generated = {}

    def learn(self, value):
        if isinstance(value, dict):
            md = value.get("metadata")
            if isinstance(md, dict) and md.get("generateName") and isinstance(md.get("name"), str):
                if md["name"].startswith(md["generateName"]):
                    self.generated[md["name"]] = md["generateName"] + "<generated>"
            for v in value.values():
                self.learn(v)
        elif isinstance(value, list):
            for v in value:
                self.learn(v)

    def text(self, s):
        for gen, rep in self.generated.items():
            if gen in s:
                s = s.replace(gen, rep)
        if RFC3339.match(s):
            return "<time>"
        if "-----BEGIN " in s:
            return PEM.sub(r"-----BEGIN \1-----<pem>-----END \1-----", s)
        if JWT.match(s):
            return "<token>"
        s = UUID.sub("<uid>", s)
        s = RV_IN_TEXT.sub(lambda m: m.group(1) + "<rv>", s)
        return s

    def norm(self, v, key=None, parent=None):
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                if k == "selfLink":
                    continue
                out[k] = self.norm(x, k, v)
            if "cells" in out and isinstance(out["cells"], list):
                pass
            return out
        if isinstance(v, list):
            return [self.norm(x, key, parent) for x in v]
        if isinstance(v, str):
            if key == "uid":
                return "<uid>"
            if key == "resourceVersion" and v not in ("", "0"):
                return "<rv>"
            if key == "continue" and v:
                return "<continue>"
            if key in TIME_KEYS and v:
                return "<time>"
            if key in IP_KEYS and v not in ("None", "") and IPV4.search(v):
                return "<ip>"
            if key == "token" and len(v) > 40:
                return "<token>"
            return self.text(v)
        if isinstance(v, int) and not isinstance(v, bool):
            if key in PORT_KEYS and v:
                return "<port>"
            if key == "remainingItemCount":
                return v
        return v


def normalise_table(doc):
    """A Table's Age column (and any cell with an allocated address) says nothing here."""
    if not isinstance(doc, dict) or doc.get("kind") != "Table":
        return doc
    cols = [c.get("name", "") for c in doc.get("columnDefinitions") or []]
    cols += [""] * 64  # a watch's later Tables have no columns: ages are recognised by shape
    for row in doc.get("rows", []) or []:
        cells = row.get("cells", [])
        for i, name in enumerate(cols):
            if i < len(cells):
                if name in ("Age", "Last Seen", "Duration") or (name.endswith("Time")):
                    cells[i] = "<age>"
                elif isinstance(cells[i], str) and AGE.match(cells[i]):
                    cells[i] = "<age>"
                elif isinstance(cells[i], str):
                    cells[i] = re.sub(r"\b10\.(9[6-9]|1[01]\d)\.\d+\.\d+\b", "<ip>", cells[i])
                    cells[i] = re.sub(r":3\d{4}/", ":<port>/", cells[i])
    return doc


# ---- protobuf (schema-less) --------------------------------------------------------------------


def pb_varint(b, i):
    shift = result = 0
    while True:
        if i >= len(b):
            raise ValueError("truncated varint")
        c = b[i]
        i += 1
        result |= (c & 0x7F) << shift
        if not c & 0x80:
            return result, i
        shift += 7
        if shift > 70:
            raise ValueError("varint too long")


def pb_decode(b, depth=0):
    """A message as [(field, value)]: varints as ints, length-delimited as a nested message
    when it parses as one and is not printable text, else text (or bytes as hex)."""
    out, i = [], 0
    while i < len(b):
        key, i = pb_varint(b, i)
        field, wt = key >> 3, key & 7
        if field == 0:
            raise ValueError("field 0")
        if wt == 0:
            v, i = pb_varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8].hex(), i + 8
        elif wt == 5:
            v, i = b[i:i + 4].hex(), i + 4
        elif wt == 2:
            n, i = pb_varint(b, i)
            raw = b[i:i + n]
            if len(raw) != n:
                raise ValueError("truncated")
            i += n
            v = None
            if raw.startswith(b"k8s\x00"):
                try:
                    v = [(0, pb_decode(raw[4:], depth + 1))]
                except ValueError:
                    v = None
            if v is None:
                try:
                    txt = raw.decode("utf-8")
                    if all(c.isprintable() or c in "\n\t\r" for c in txt):
                        v = txt
                except UnicodeDecodeError:
                    pass
            if v is None and depth < 40:
                try:
                    v = pb_decode(raw, depth + 1)
                except ValueError:
                    v = None
            if v is None:
                v = "0x" + raw.hex()
        else:
            raise ValueError(f"wire type {wt}")
        out.append((field, v))
    return out


def pb_to_json(fields, norm):
    """[(field, value)] as {"<field>": value or [values]} in field order, normalised: times
    (seconds near now), UUIDs, resource versions (digit strings) and addresses."""
    out = {}
    for f, v in fields:
        if isinstance(v, list):
            v = pb_to_json(v, norm)
        elif v == "" or v == 0:
            continue  # Go writes every non-pointer field; an unset one decodes the same
        elif isinstance(v, int) and 1_500_000_000 < v < 2_500_000_000:
            v = "<time>"
        elif isinstance(v, str):
            v = norm.text(v)
            if v.isdigit() and len(v) >= 1:
                v = "<digits>"
            elif IPV4.fullmatch(v):
                v = "<ip>"
        k = str(f)
        if k in out:
            if not isinstance(out[k], list) or not out.get("_rep_" + k):
                out[k] = [out[k]]
                out["_rep_" + k] = True
            out[k].append(v)
        else:
            out[k] = v
    return {k: v for k, v in out.items() if not k.startswith("_rep_")}


def pb_body(data, norm, frame=False):
    if not frame and not data.startswith(b"k8s\x00"):
        return {"<not a protobuf envelope>": data[:40].hex()}
    try:
        env = pb_decode(data if frame else data[4:])
    except ValueError as e:
        return {"<undecodable>": str(e)}
    return pb_to_json(env, norm)


# ---- comparison ------------------------------------------------------------------------------


def hdr(headers, name):
    return [v for k, v in headers if k.lower() == name.lower()]


def parse_json(data):
    try:
        return json.loads(data), None
    except (ValueError, UnicodeDecodeError) as e:
        return None, str(e)


def parse_watch(data, content_type):
    """A watch stream as [{"type", "object"}]; protobuf frames are length-prefixed."""
    if content_type.startswith(PROTOBUF):
        events, i = [], 0
        while i + 4 <= len(data):
            n = int.from_bytes(data[i:i + 4], "big")
            frame = data[i + 4:i + 4 + n]
            i += 4 + n
            events.append({"frame": frame})
        return events
    events = []
    dec = json.JSONDecoder()
    text = data.decode("utf-8", "replace")
    i = 0
    while i < len(text):
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            break
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError:
            events.append({"type": "<unparsable>", "object": text[i:i + 200]})
            break
        events.append(obj)
    return events


def diff(a, b, path, out, limit=200):
    """Appends (path, a, b) for each difference of JSON values."""
    if len(out) >= limit:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        diff_keyed(a, b, lambda k: f"{path}.{k}", out, limit)
        return
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            # Lists keyed by name (items, conditions...) compare element-wise by key.
            ka, kb = list_keys(a), list_keys(b)
            if ka is not None and kb is not None:
                diff_keyed(ka, kb, lambda k: f"{path}[{k}]", out, limit)
                return
            out.append((f"{path}.length", len(a), len(b)))
        for i, (x, y) in enumerate(zip(a, b)):
            diff(x, y, f"{path}[{i}]", out, limit)
        return
    if a != b:
        out.append((path, a, b))


def diff_keyed(a, b, at, out, limit):
    """diff of two mappings: each key of both compared, each of one only reported absent from
    the other (`at(key)` is the key's path)."""
    for k in a:
        if k in b:
            diff(a[k], b[k], at(k), out, limit)
        else:
            out.append((at(k), a[k], "<absent>"))
    for k in b:
        if k not in a:
            out.append((at(k), "<absent>", b[k]))


def list_keys(items):
    keys = {}
    for x in items:
        if not isinstance(x, dict):
            return None
        k = None
        if isinstance(x.get("metadata"), dict):
            k = x["metadata"].get("name")
        elif "name" in x:
            k = x["name"]
        elif "type" in x and not isinstance(x.get("object"), dict):
            k = x["type"]
        elif "manager" in x:
            k = x["manager"] + "/" + str(x.get("operation")) + "/" + str(x.get("subresource", ""))
        if k is None or k in keys:
            return None
        keys[str(k)] = x
    return keys


def order_diffs(a, b, path, out):
    """Paths where both objects have the same keys in another order."""
    if isinstance(a, dict) and isinstance(b, dict):
        common_a = [k for k in a if k in b]
        common_b = [k for k in b if k in a]
        if common_a != common_b:
            out.append(path or "$")
        for k in common_a:
            order_diffs(a[k], b[k], f"{path}.{k}", out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            order_diffs(x, y, f"{path}[{i}]", out)


def discovery_index(doc):
    """Discovery documents keyed by what they list, so a resource core-cluster does not serve
    is counted apart instead of shifting every index."""
    if not isinstance(doc, dict):
        return doc, []
    kind = doc.get("kind")
    if kind == "APIResourceList":
        return {"kind": kind, "groupVersion": doc.get("groupVersion"),
                "resources": {r["name"]: r for r in doc.get("resources", [])}}, ["resources"]
    if kind == "APIGroupList":
        return {"kind": kind, "groups": {g["name"]: g for g in doc.get("groups", [])}}, ["groups"]
    if kind == "APIGroupDiscoveryList":
        out = {}
        for g in doc.get("items", []):
            gname = g.get("metadata", {}).get("name", "")
            for v in g.get("versions", []):
                for r in v.get("resources", []):
                    out[f"{gname}/{v['version']}/{r['resource']}"] = r
            out[f"{gname}/versions"] = [v["version"] for v in g.get("versions", [])]
        return {"kind": kind, "apiVersion": doc.get("apiVersion"), "items": out}, ["items"]
    return doc, []


def openapi_index(doc, path):
    """OpenAPI documents: paths and schemas keyed, so what core-cluster does not serve is
    counted apart."""
    if not isinstance(doc, dict):
        return doc, []
    if "paths" in doc and isinstance(doc["paths"], dict) and path.rstrip("/").endswith("/openapi/v3"):
        return {"paths": {k: {"serverRelativeURL": "<hash>"} for k in doc["paths"]}}, ["paths"]
    out = dict(doc)
    keys = []
    if "definitions" in doc:
        keys.append("definitions")
    if "components" in doc:
        out["schemas"] = doc["components"].get("schemas", {})
        out["components"] = {k: v for k, v in doc["components"].items() if k != "schemas"}
        keys.append("schemas")
    if "paths" in doc:
        keys.append("paths")
    return out, keys


class Comparison:
    def __init__(self, upstream_served, core_served):
        self.upstream_served = upstream_served
        self.core_served = core_served
        self.results = []  # one per step
        self.lock = threading.Lock()

    def served(self, path):
        """Whether core-cluster serves the resource of an API path that upstream serves:
        None for a path that is no resource's (discovery, OpenAPI, health)."""
        key = resource_of(path)
        if key is None or key not in self.upstream_served:
            return None
        return key in self.core_served

    def compare_case(self, case, up_results, core_results):
        nu, nc = Normaliser(), Normaliser()
        steps = {s["id"]: s for s in case["steps"]}
        for ru, rc in zip(up_results, core_results):
            step = steps.get(ru["id"], {})
            self.compare_step(case, step, ru, rc, nu, nc)

    def compare_step(self, case, step, ru, rc, nu, nc):
        sid = f"{case['id']}/{ru['id']}"
        entry = {"case": sid, "request": f"{ru['method']} {ru['path']}", "upstream_code": ru["code"],
                 "core_code": rc["code"], "diffs": [], "order": [], "not_served": False,
                 "missing_on_core": []}
        served = self.served(ru["path"].split("?")[0])
        if served is False and rc["code"] in (404, 405):
            entry["not_served"] = True
            self.add(entry)
            return
        mode = step.get("compare", "full")
        d = entry["diffs"]
        if mode == "none":
            self.add(entry)
            return
        for r, n in ((ru, nu), (rc, nc)):
            doc, _ = parse_json(r["body"])
            if doc is not None:
                n.learn(doc)
        if ru["code"] != rc["code"]:
            d.append(("code", describe(ru), describe(rc)))
            self.add(entry)
            return
        # headers clients read
        ct_u, ct_c = (hdr(ru["headers"], "Content-Type") or [""])[0], (hdr(rc["headers"], "Content-Type") or [""])[0]
        if ct_u.replace(" ", "").lower() != ct_c.replace(" ", "").lower():
            d.append(("header.Content-Type", ct_u, ct_c))
        wu = [nu.text(w) for w in hdr(ru["headers"], "Warning")]
        wc = [nc.text(w) for w in hdr(rc["headers"], "Warning")]
        if wu != wc:
            d.append(("header.Warning", wu, wc))
        if bool(hdr(ru["headers"], "Audit-Id")) != bool(hdr(rc["headers"], "Audit-Id")):
            d.append(("header.Audit-Id", bool(hdr(ru["headers"], "Audit-Id")),
                      bool(hdr(rc["headers"], "Audit-Id"))))
        if hdr(ru["headers"], "Retry-After") != hdr(rc["headers"], "Retry-After"):
            d.append(("header.Retry-After", hdr(ru["headers"], "Retry-After"),
                      hdr(rc["headers"], "Retry-After")))
        if mode == "code":
            self.add(entry)
            return
        # bodies
        if step.get("watch"):
            eu = parse_watch(ru["body"], ct_u)
            ec = parse_watch(rc["body"], ct_c)
            tu = [e.get("type", "<frame>") for e in eu]
            tc = [e.get("type", "<frame>") for e in ec]
            if tu != tc:
                d.append(("events.types", tu, tc))
            else:
                for i, (a, b) in enumerate(zip(eu, ec)):
                    if "frame" in a:
                        ja, jb = pb_body(a["frame"], nu, True), pb_body(b["frame"], nc, True)
                    else:
                        # A watch event's object is the Table (its ages normalised in place).
                        normalise_table(a.get("object"))
                        normalise_table(b.get("object"))
                        ja, jb = nu.norm(a), nc.norm(b)
                    diff(ja, jb, f"events[{i}]", d)
                    order_diffs(ja, jb, f"events[{i}]", entry["order"])
            self.add(entry)
            return
        if ct_u.startswith(PROTOBUF) and ct_c.startswith(PROTOBUF):
            ja, jb = pb_body(ru["body"], nu), pb_body(rc["body"], nc)
            diff(ja, jb, "pb", d)
            order_diffs(ja, jb, "pb", entry["order"])
            self.add(entry)
            return
        ja, ea = parse_json(ru["body"])
        jb, eb = parse_json(rc["body"])
        if ja is None or jb is None:
            if ja is None and jb is None:
                if ru["body"] != rc["body"]:
                    d.append(("body.text", ru["body"][:300].decode("utf-8", "replace"),
                              rc["body"][:300].decode("utf-8", "replace")))
            else:
                d.append(("body.json", ea or "json", eb or "json"))
            self.add(entry)
            return
        keyed = []
        if mode == "discovery":
            ja, keyed = discovery_index(ja)
            jb, _ = discovery_index(jb)
        elif mode == "openapi":
            ja, keyed = openapi_index(ja, ru["path"].split("?")[0])
            jb, _ = openapi_index(jb, rc["path"].split("?")[0])
        ja = nu.norm(normalise_table(ja))
        jb = nc.norm(normalise_table(jb))
        for k in keyed:
            # What upstream lists and core-cluster does not is "not served", counted apart.
            au, ac = ja.get(k) or {}, jb.get(k) or {}
            missing = [x for x in au if x not in ac]
            entry["missing_on_core"] = missing
            for x in missing:
                au.pop(x)
        diff(ja, jb, "body", d, limit=step.get("limit", 200))
        order_diffs(ja, jb, "body", entry["order"])
        self.add(entry)

    def add(self, entry):
        with self.lock:
            self.results.append(entry)


def describe(r):
    doc, _ = parse_json(r["body"])
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return {"code": r["code"], "reason": doc.get("reason"), "message": doc.get("message")}
    return {"code": r["code"]}


def resource_of(path):
    """`group/version/resource[/subresource]` of an API path, else None."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return None
    if parts[0] == "api" and len(parts) >= 2:
        gv, rest = parts[1], parts[2:]
    elif parts[0] == "apis" and len(parts) >= 3:
        gv, rest = parts[1] + "/" + parts[2], parts[3:]
    else:
        return None
    if not rest:
        return None
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
        if len(rest) == 1 and rest[0] in ("status", "finalize"):
            return f"{gv}/namespaces/{rest[0]}"
    elif rest[0] == "watch":
        rest = rest[1:]
    if rest[0] == "namespaces" and len(rest) >= 2 and False:
        pass
    if len(rest) >= 3:
        return f"{gv}/{rest[0]}/{rest[2]}"
    return f"{gv}/{rest[0]}"


def served_resources(server):
    """Every group/version/resource[/subresource] in a server's discovery."""
    out = set()
    status, _h, data = server.request("GET", "/api/v1")
    if status == 200:
        for r in json.loads(data)["resources"]:
            out.add("v1/" + r["name"])
    status, _h, data = server.request("GET", "/apis")
    if status == 200:
        for g in json.loads(data)["groups"]:
            for v in g["versions"]:
                gv = v["groupVersion"]
                st, _h, d = server.request("GET", f"/apis/{gv}")
                if st == 200:
                    for r in json.loads(d)["resources"]:
                        out.add(f"{gv}/{r['name']}")
    return out


def discovery_cases(up):
    """Discovery, OpenAPI and the health endpoints, from upstream's group versions."""
    steps = [
        {"id": "version", "path": "/version"},
        {"id": "api", "path": "/api", "compare": "discovery"},
        {"id": "apis", "path": "/apis", "compare": "discovery"},
        {"id": "api-v1", "path": "/api/v1", "compare": "discovery"},
        {"id": "api-aggregated", "path": "/api", "headers": {"Accept": AGGREGATED},
         "compare": "discovery"},
        {"id": "apis-aggregated", "path": "/apis", "headers": {"Accept": AGGREGATED},
         "compare": "discovery"},
        {"id": "apis-aggregated-fallback", "path": "/apis",
         "headers": {"Accept": AGGREGATED + ",application/json"}, "compare": "discovery"},
        {"id": "api-v1-protobuf", "path": "/api/v1", "headers": {"Accept": PROTOBUF}, "compare": "code"},
        {"id": "openapi-v2", "path": "/openapi/v2", "compare": "openapi", "limit": 400},
        {"id": "openapi-v2-protobuf", "path": "/openapi/v2",
         "headers": {"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"},
         "compare": "code"},
        {"id": "openapi-v3", "path": "/openapi/v3", "compare": "openapi"},
        {"id": "openapi-v3-missing", "path": "/openapi/v3/apis/nosuch.group/v1"},
        {"id": "healthz", "path": "/healthz", "headers": {"Accept": "*/*"}},
        {"id": "livez", "path": "/livez", "headers": {"Accept": "*/*"}},
        {"id": "readyz", "path": "/readyz", "headers": {"Accept": "*/*"}},
        {"id": "readyz-ping", "path": "/readyz/ping", "headers": {"Accept": "*/*"}},
        {"id": "not-found-path", "path": "/nothing/here"},
        {"id": "apis-missing-group", "path": "/apis/nosuch.group"},
        {"id": "apis-missing-version", "path": "/apis/apps/v9"},
        {"id": "api-missing-resource", "path": "/api/v1/nosuchthings"},
    ]
    status, _h, data = up.request("GET", "/apis")
    gvs = ["v1"]
    groups = []
    if status == 200:
        for g in json.loads(data)["groups"]:
            groups.append(g["name"])
            for v in g["versions"]:
                gvs.append(v["groupVersion"])
    for g in groups:
        steps.append({"id": f"group/{g}", "path": f"/apis/{g}", "compare": "discovery"})
    for gv in gvs:
        p = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        if gv != "v1":
            steps.append({"id": f"resources/{gv}", "path": p, "compare": "discovery"})
        oa = "/openapi/v3/api/v1" if gv == "v1" else f"/openapi/v3/apis/{gv}"
        steps.append({"id": f"openapi-v3/{gv}", "path": oa, "compare": "openapi", "limit": 400})
    for s in steps:
        s.setdefault("method", "GET")
        s.setdefault("headers", {"Accept": "application/json"})
    return [{"id": "discovery", "steps": steps, "namespace": False}]


# ---- explained differences -------------------------------------------------------------------


def load_explained():
    """Rows `| case glob | path glob | status | reason |` of EXPLAINED.md's tables."""
    rows = []
    if not os.path.exists(EXPLAINED):
        return rows
    with open(EXPLAINED) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("|") or line.startswith("|--") or line.startswith("| case"):
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) < 4:
                continue
            case, path, status = (c.strip("`") for c in cells[:3])
            rows.append({"case": case, "path": path, "status": status, "reason": cells[3],
                         "hits": 0})
    return rows


def unlinked_rows(rows):
    """Rows whose reason quotes a line of the README's table that is not there: every
    difference kept must say why where users read it."""
    readme_path = os.path.join(HERE, "..", "..", "README.md")
    with open(readme_path) as f:
        readme = f.read()
    bad = []
    for r in rows:
        m = re.search(r'README: "([^"]+)"', r["reason"])
        if not m or m.group(1) not in readme:
            bad.append(r)
    return bad


def classify(rows, case, path):
    for r in rows:
        if fnmatch.fnmatchcase(case, r["case"]) and fnmatch.fnmatchcase(path, r["path"]):
            r["hits"] += 1
            return r
    return None


# ---- main ------------------------------------------------------------------------------------


def short(v, n=160):
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=False)
    return s if len(s) <= n else s[:n] + "…"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="kube-apiserver's kubeconfig, as JSON")
    ap.add_argument("--core", required=True, help="core-cluster's kubeconfig, as JSON")
    ap.add_argument("--only", help="only the cases whose id matches this regular expression")
    ap.add_argument("--report", help="write the full report (JSON) here")
    ap.add_argument("--jobs", type=int, default=4, help="cases run at once (default 4)")
    ap.add_argument("--list", action="store_true", help="list the cases and their step counts")
    args = ap.parse_args()

    up, core = Server("upstream", args.upstream), Server("core", args.core)
    cases = discovery_cases(up) + load_corpus()
    if args.only:
        cases = [c for c in cases if re.search(args.only, c["id"])]
    if args.list:
        for c in cases:
            print(f"{c['id']}: {len(c['steps'])}")
        print(f"{sum(len(c['steps']) for c in cases)} steps in {len(cases)} cases")
        return 0
    cmp = Comparison(served_resources(up), served_resources(core))
    started = time.time()

    def run(case):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            fu = pool.submit(run_case_on, up, case)
            fc = pool.submit(run_case_on, core, case)
            ru, rc = fu.result(), fc.result()
        cmp.compare_case(case, ru, rc)
        return case["id"]

    failed = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run, c): c["id"] for c in cases}
        for f in concurrent.futures.as_completed(futures):
            try:
                f.result()
            except Exception as e:  # a harness error is a failure of its own
                failed.append((futures[f], repr(e)))
    elapsed = time.time() - started

    rows = load_explained()
    for r in unlinked_rows(rows):
        failed.append((f"EXPLAINED.md row {r['case']} {r['path']}",
                       "its reason quotes no line of the README's table of differences"))
    summary = {"requests": 0, "identical": 0, "content": 0, "order_only": 0, "not_served": 0,
               "explained": 0, "todo": 0, "unexplained": 0, "missing_on_core": 0}
    diffs = []
    for e in sorted(cmp.results, key=lambda e: e["case"]):
        summary["requests"] += 1
        summary["missing_on_core"] += len(e["missing_on_core"])
        if e["not_served"]:
            summary["not_served"] += 1
            continue
        if e["diffs"]:
            summary["content"] += 1
        elif e["order"]:
            summary["order_only"] += 1
        else:
            summary["identical"] += 1
        for path, a, b in e["diffs"]:
            row = classify(rows, e["case"], path)
            status = "unexplained" if row is None else (
                "explained" if row["status"].startswith("explained") else "todo")
            summary[status] += 1
            diffs.append({"case": e["case"], "request": e["request"], "path": path,
                          "upstream": a, "core": b, "status": status,
                          "reason": row["reason"] if row else None})
    summary["http_requests"] = up.count + core.count
    summary["seconds"] = round(elapsed, 1)

    unexplained = [d for d in diffs if d["status"] == "unexplained"]
    todo = [d for d in diffs if d["status"] == "todo"]
    for d in unexplained[:400]:
        print(f"UNEXPLAINED {d['case']}  {d['path']}\n    {d['request']}\n"
              f"    kube-apiserver: {short(d['upstream'])}\n    core-cluster:   {short(d['core'])}")
    if len(unexplained) > 400:
        print(f"... and {len(unexplained) - 400} more unexplained (the report has them all)")
    by_row = {}
    for d in todo:
        by_row.setdefault(d["reason"], 0)
        by_row[d["reason"]] += 1
    if by_row:
        print("\nknown, not yet fixed (EXPLAINED.md `unexplained: TODO`):")
        for reason, n in sorted(by_row.items(), key=lambda x: -x[1]):
            print(f"  {n:5d}  {reason[:150]}")
    stale = [r for r in rows if r["hits"] == 0]
    if stale and not args.only:
        print("\nEXPLAINED.md rows that matched nothing (fixed? remove them):")
        for r in stale:
            print(f"  {r['case']}  {r['path']}")
    for cid, err in failed:
        print(f"HARNESS ERROR in {cid}: {err}")
    s = summary
    print(f"\nrequests {s['requests']} ({s['http_requests']} HTTP requests to the two servers) "
          f"in {s['seconds']} s: identical {s['identical']}, differing in content {s['content']}, "
          f"only in field order {s['order_only']}, not served {s['not_served']} "
          f"(+{s['missing_on_core']} discovery/OpenAPI entries core-cluster lacks)")
    print(f"differences: {s['explained']} explained, {s['todo']} known TODO, "
          f"{s['unexplained']} unexplained")
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"summary": summary, "differences": diffs, "failed": failed,
                       "steps": [{k: v for k, v in e.items() if k != "diffs"} | {
                           "diffs": len(e["diffs"])} for e in cmp.results]}, f, indent=1,
                      default=str)
    # Known differences (`unexplained: TODO` rows, each with its reason in the README's table)
    # are reported, not failed on: a run fails on a difference no row names, or an error.
    return 1 if (unexplained or failed) else 0


if __name__ == "__main__":
    sys.exit(main())
