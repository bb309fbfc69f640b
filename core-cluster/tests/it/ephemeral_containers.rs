//! `pods/ephemeralcontainers` (`pkg/registry/core/pod/rest/subresources.go
//! EphemeralContainersREST`) and `kubectl debug` v1.32 against a simulated kubelet that
//! starts the ephemeral container and attaches to it.

use ccm_testkit::{eventually, kubectl::require_kubectl};
use core_cluster::sim::KubeletApiConfig;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::kubelet_api::{
    internal_ip_first, kubectl_with_input, running_pod, start, user_with_role,
};

/// `ValidatePodEphemeralContainersUpdate`: an ephemeral container is added through the
/// subresource (nothing else of the write is taken, `dropNonEphemeralContainerUpdates`),
/// the kubelet reports it running, and existing ones may be neither changed nor removed;
/// a new one with ports is refused with upstream's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_containers_are_added_started_and_never_changed() {
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["ec-a"]).await;
    running_pod(&c.client, "web", "ec-a").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let add = json!({"spec": {
        "containers": [{"name": "app", "image": "changed"}],
        "ephemeralContainers": [{"name": "debugger", "image": "busybox",
                                 "targetContainerName": "app", "stdin": true, "tty": true}]}});
    let pod = pods
        .patch_subresource(
            "ephemeralcontainers",
            "web",
            &PatchParams::default(),
            &Patch::Strategic(&add),
        )
        .await
        .unwrap();
    let spec = pod.spec.unwrap();
    assert_eq!(spec.containers[0].image.as_deref(), Some("nginx"));
    assert_eq!(spec.ephemeral_containers.unwrap()[0].name, "debugger");
    eventually(10, "the kubelet starts the ephemeral container", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("web").await.ok()?;
            let s = p.status?.ephemeral_container_statuses?;
            s.iter()
                .any(|c| {
                    c.name == "debugger" && c.state.as_ref().is_some_and(|st| st.running.is_some())
                })
                .then_some(())
        }
    })
    .await;
    let change =
        json!({"spec": {"ephemeralContainers": [{"name": "debugger", "image": "alpine"}]}});
    let err = pods
        .patch_subresource(
            "ephemeralcontainers",
            "web",
            &PatchParams::default(),
            &Patch::Strategic(&change),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("expected a Status, got {err:?}");
    };
    assert_eq!(status.code, 422);
    assert!(
        status
            .message
            .contains("existing ephemeral containers \"debugger\" may not be changed"),
        "{}",
        status.message
    );
    let ports = json!({"spec": {"ephemeralContainers": [
        {"name": "second", "image": "busybox", "ports": [{"containerPort": 80}]}]}});
    let err = pods
        .patch_subresource(
            "ephemeralcontainers",
            "web",
            &PatchParams::default(),
            &Patch::Strategic(&ports),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("expected a Status, got {err:?}");
    };
    assert_eq!(status.code, 422);
    assert!(
        status
            .message
            .contains("].ports: Forbidden: cannot be set for an Ephemeral Container"),
        "{}",
        status.message
    );
    let got = pods
        .get_subresource("ephemeralcontainers", "web")
        .await
        .unwrap();
    assert_eq!(got.spec.unwrap().ephemeral_containers.unwrap().len(), 1);
}

/// kubectl v1.32 `debug -i pod/web --image=busybox --target=app`: the ephemeral container
/// is added through the subresource, started by the kubelet, and attached to (what is typed
/// comes back from its simulated main process); RBAC: `get pods` alone cannot add one
/// (`patch pods/ephemeralcontainers`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_debug_starts_and_attaches_to_an_ephemeral_container() {
    require_kubectl("it runs `kubectl debug`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["ec-k"]).await;
    running_pod(&c.client, "web", "ec-k").await;
    let (code, out, err) = kubectl_with_input(
        &c,
        &c.kubeconfig,
        &[
            "debug",
            "-i",
            "web",
            "--image=busybox",
            "--target=app",
            "--container=dbg",
        ],
        "typed into the debugger\n",
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("typed into the debugger"), "{out}{err}");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pod = pods.get("web").await.unwrap();
    let ec = pod.spec.unwrap().ephemeral_containers.unwrap();
    assert_eq!(ec[0].name, "dbg");
    assert_eq!(ec[0].target_container_name.as_deref(), Some("app"));

    let bob_path = user_with_role(&c, "bob", "reader", &["pods"], &["get", "list", "watch"]).await;
    let (code, _, err) = kubectl_with_input(
        &c,
        &bob_path,
        &["debug", "-i", "web", "--image=busybox", "--container=dbg2"],
        "",
    )
    .await;
    assert_ne!(code, 0);
    assert!(
        err.contains("cannot patch resource \"pods/ephemeralcontainers\""),
        "{err}"
    );
}
