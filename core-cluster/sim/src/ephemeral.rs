//! Ephemeral containers (`kubectl debug`): the kubelet of a running pod starts each
//! container added to its `spec.ephemeralContainers` and reports it in
//! `status.ephemeralContainerStatuses` (`pkg/kubelet/kuberuntime/kuberuntime_manager.go
//! computePodActions`, `EphemeralContainersToStart`), from then on attachable like the
//! pod's other containers. As no process runs, a started ephemeral container stays running.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

use crate::Shared;

/// The `ephemeralContainerStatuses` of `pod` once its ephemeral containers not yet reported
/// are started, or `None` when every one is reported.
pub(crate) fn statuses(pod: &Pod, now: &str) -> Option<Value> {
    let spec = pod.spec.as_ref()?;
    let declared = spec.ephemeral_containers.as_deref().unwrap_or_default();
    let reported = pod
        .status
        .as_ref()
        .and_then(|s| s.ephemeral_container_statuses.clone())
        .unwrap_or_default();
    let missing: Vec<_> = declared
        .iter()
        .filter(|c| !reported.iter().any(|r| r.name == c.name))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let uid = pod.uid().unwrap_or_default();
    let mut all: Vec<Value> = reported
        .iter()
        .filter_map(|r| serde_json::to_value(r).ok())
        .collect();
    all.extend(missing.iter().map(|c| {
        let running = json!({"running": {"startedAt": now}});
        crate::pods::container_status(&uid, &c.name, c.image.as_deref(), false, None, running)
    }));
    Some(json!(all))
}

/// Starts the ephemeral containers of a running `pod` that are not reported yet (its
/// status patched by its node, idempotently: a repeated start writes the same list).
pub(crate) fn start(shared: &Arc<Shared>, node: &str, pod: &Pod) {
    let now = shared.clock.now().to_string();
    let Some(statuses) = statuses(pod, &now) else {
        return;
    };
    let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let api: Api<Pod> = Api::namespaced(shared.client_for(node), &ns);
    tokio::spawn(async move {
        let patch = json!({"status": {"ephemeralContainerStatuses": statuses}});
        if let Err(error) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(pod = %format!("{ns}/{name}"), %error, "starting ephemeral containers failed");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the ephemeral containers without a status are started; the reported ones are
    /// kept as they are.
    #[test]
    fn unreported_ephemeral_containers_are_started() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "uid": "u1"},
            "spec": {"containers": [{"name": "app"}],
                     "ephemeralContainers": [{"name": "old", "image": "busybox"},
                                             {"name": "new", "image": "alpine"}]},
            "status": {"ephemeralContainerStatuses": [{"name": "old", "image": "busybox",
                "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0}}}]},
        }))
        .unwrap();
        let s = statuses(&pod, "2026-01-01T00:00:00Z").unwrap();
        assert_eq!(s.as_array().unwrap().len(), 2);
        assert_eq!(s[0]["state"]["terminated"]["exitCode"], 0);
        assert_eq!(s[1]["name"], "new");
        assert_eq!(s[1]["image"], "alpine");
        assert_eq!(
            s[1]["state"]["running"]["startedAt"],
            "2026-01-01T00:00:00Z"
        );
        let mut done = pod.clone();
        done.status.as_mut().unwrap().ephemeral_container_statuses =
            Some(serde_json::from_value(s).unwrap());
        assert_eq!(statuses(&done, "x"), None);
    }
}
