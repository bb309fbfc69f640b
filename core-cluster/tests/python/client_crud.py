"""Drives core-cluster's API server with the official Kubernetes Python client (PyPI
`kubernetes`), as users do: through the kubeconfig the server generated (TLS, the admin's
client certificate), with models that leave `kind` and `apiVersion` unset, so the server must
default them from the URL as kube-apiserver does.

Run by core-cluster/tests/python_client.rs:

    python client_crud.py KUBECONFIG NAMESPACE

Each step prints `ok <step>`; the last line is `PASS`. Any failed expectation raises, so the
script exits non-zero with a traceback.
"""

import sys

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

WATCH_TIMEOUT_SECONDS = 20
NODE = "python-node"
CONFIG_MAP = "python-config"
KEPT = "python-kept"
ACCOUNT = "python-sa"


def step(name):
    print(f"ok {name}", flush=True)


def expect(condition, what):
    if not condition:
        raise AssertionError(what)


def merge_patch(api_client, path, body, response_type):
    """A JSON merge patch (RFC 7386): this client version sends dict patches as strategic merge
    patches, so the merge patch goes through its generic `call_api`."""
    return api_client.call_api(
        path,
        "PATCH",
        header_params={
            "Content-Type": "application/merge-patch+json",
            "Accept": "application/json",
        },
        body=body,
        response_type=response_type,
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
    )


def events(list_call, resource_version, name, count, **kwargs):
    """The first `count` watch events of object `name` from `resource_version`, or fewer
    if the watch times out first."""
    w = watch.Watch()
    seen = []
    for event in w.stream(
        list_call,
        resource_version=resource_version,
        field_selector=f"metadata.name={name}",
        timeout_seconds=WATCH_TIMEOUT_SECONDS,
        **kwargs,
    ):
        seen.append(event)
        if len(seen) == count:
            w.stop()
    return seen


def nodes(core, api_client):
    start = core.list_node().metadata.resource_version
    node = core.create_node(
        client.V1Node(metadata=client.V1ObjectMeta(name=NODE, labels={"tier": "py"}))
    )
    expect(node.metadata.name == NODE and node.metadata.uid, f"created node: {node.metadata}")
    expect(node.kind == "Node" and node.api_version == "v1", f"defaulted: {node.kind} {node.api_version}")
    step("create node without kind")

    patched = merge_patch(
        api_client,
        f"/api/v1/nodes/{NODE}",
        {"metadata": {"labels": {"merge": "yes", "tier": None}}},
        "V1Node",
    )
    expect(patched.metadata.labels == {"merge": "yes"}, f"merge-patched labels: {patched.metadata.labels}")
    step("merge patch node")

    def owner(uid):
        return {"apiVersion": "v1", "kind": "ConfigMap", "name": f"owner-{uid}", "uid": uid}

    core.patch_node(
        NODE,
        {
            "metadata": {"ownerReferences": [owner("uid-a")]},
            "spec": {"taints": [{"key": "python", "value": "a", "effect": "NoSchedule"}]},
        },
    )
    patched = core.patch_node(
        NODE,
        {
            "metadata": {"ownerReferences": [owner("uid-b")]},
            "spec": {"taints": [{"key": "python2", "effect": "NoExecute"}]},
        },
    )
    # Strategic merge as upstream's struct tags say: ownerReferences merge by uid;
    # NodeSpec.taints has no patch strategy, so a patch replaces the list.
    uids = sorted(o.uid for o in patched.metadata.owner_references or [])
    expect(uids == ["uid-a", "uid-b"], f"strategic-merged ownerReferences: {uids}")
    keys = [t.key for t in patched.spec.taints or []]
    expect(keys == ["python2"], f"strategic-patched taints: {keys}")
    step("strategic merge patch node")

    listed = [n.metadata.name for n in core.list_node(label_selector="merge=yes").items]
    expect(listed == [NODE], f"listed nodes: {listed}")
    step("list nodes")

    core.delete_node(NODE)
    try:
        core.read_node(NODE)
        raise AssertionError("node still there after delete")
    except ApiException as e:
        expect(e.status == 404, f"read after delete: {e.status}")
    step("delete node")

    seen = events(core.list_node, start, NODE, 5)
    types = [e["type"] for e in seen]
    expect(
        types == ["ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"],
        f"node watch events: {types}",
    )
    expect(all(e["object"].metadata.name == NODE for e in seen), "node watch objects")
    expect(isinstance(seen[0]["object"], client.V1Node), f"decoded as {type(seen[0]['object'])}")
    step("watch nodes")


def config_maps(core, api_client, ns):
    start = core.list_namespaced_config_map(ns).metadata.resource_version
    created = core.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=CONFIG_MAP), data={"a": "1"})
    )
    expect(created.kind == "ConfigMap" and created.api_version == "v1", "configmap defaulted")
    expect(created.data == {"a": "1"}, f"created data: {created.data}")
    step("create configmap without kind")

    patched = merge_patch(
        api_client,
        f"/api/v1/namespaces/{ns}/configmaps/{CONFIG_MAP}",
        {"data": {"b": "2", "a": None}},
        "V1ConfigMap",
    )
    expect(patched.data == {"b": "2"}, f"merge-patched data: {patched.data}")
    step("merge patch configmap")

    patched = core.patch_namespaced_config_map(
        CONFIG_MAP, ns, {"metadata": {"labels": {"strategic": "yes"}}, "data": {"c": "3"}}
    )
    expect(patched.data == {"b": "2", "c": "3"}, f"strategic data: {patched.data}")
    expect(patched.metadata.labels == {"strategic": "yes"}, f"strategic labels: {patched.metadata.labels}")
    step("strategic merge patch configmap")

    # Replace (PUT) without kind: the object read back, kind and apiVersion cleared.
    current = core.read_namespaced_config_map(CONFIG_MAP, ns)
    current.kind = None
    current.api_version = None
    current.data["d"] = "4"
    replaced = core.replace_namespaced_config_map(CONFIG_MAP, ns, current)
    expect(replaced.data == {"b": "2", "c": "3", "d": "4"}, f"replaced data: {replaced.data}")
    step("replace configmap without kind")

    listed = core.list_namespaced_config_map(ns, label_selector="strategic=yes").items
    expect([c.metadata.name for c in listed] == [CONFIG_MAP], f"listed: {listed}")
    step("list configmaps")

    core.delete_namespaced_config_map(CONFIG_MAP, ns)
    names = [c.metadata.name for c in core.list_namespaced_config_map(ns).items]
    expect(CONFIG_MAP not in names, f"still listed after delete: {names}")
    step("delete configmap")

    seen = events(core.list_namespaced_config_map, start, CONFIG_MAP, 5, namespace=ns)
    types = [e["type"] for e in seen]
    expect(
        types == ["ADDED", "MODIFIED", "MODIFIED", "MODIFIED", "DELETED"],
        f"configmap watch events: {types}",
    )
    expect(seen[-2]["object"].data == {"b": "2", "c": "3", "d": "4"}, "watched data")
    step("watch configmaps")

    # One object left for the Rust side to check through kube-rs.
    core.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=KEPT), data={"from": "python"})
    )
    core.patch_namespaced_config_map(KEPT, ns, {"metadata": {"labels": {"client": "python"}}})
    step("leave configmap for kube-rs")


def tokens_and_reviews(core, ns):
    core.create_namespaced_service_account(
        ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=ACCOUNT))
    )
    request = core.create_namespaced_service_account_token(
        ACCOUNT, ns, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    )
    token = request.status.token
    expect(token and request.kind == "TokenRequest", f"token request: {request.kind}")
    step("token request without kind")

    review = client.AuthenticationV1Api().create_token_review(
        client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))
    )
    expect(review.status.authenticated, f"token review: {review.status}")
    expect(
        review.status.user.username == f"system:serviceaccount:{ns}:{ACCOUNT}",
        f"token review user: {review.status.user.username}",
    )
    step("token review without kind")

    access = client.AuthorizationV1Api().create_self_subject_access_review(
        client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(verb="delete", resource="nodes")
            )
        )
    )
    expect(access.status.allowed, f"self subject access review: {access.status}")
    step("self subject access review without kind")


def main():
    kubeconfig, ns = sys.argv[1], sys.argv[2]
    config.load_kube_config(config_file=kubeconfig)
    api_client = client.ApiClient()
    core = client.CoreV1Api(api_client)
    nodes(core, api_client)
    config_maps(core, api_client, ns)
    tokens_and_reviews(core, ns)
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
