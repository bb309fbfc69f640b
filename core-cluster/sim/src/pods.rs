//! The pods of the simulated nodes: started, finished, shut down.

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr},
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions},
    runtime::{WatchStreamExt, reflector, watcher},
};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    NodeState, SimError, bump, node, shutdown,
    stages::{self, RunPlan},
};
use crate::Shared;

/// kubelet's graceful-shutdown pod status (v1.33 `nodeshutdown_manager`).
pub(super) const SHUTDOWN_REASON: &str = "Terminated";
/// kubelet's graceful-shutdown pod message.
pub(super) const SHUTDOWN_MESSAGE: &str =
    "Pod was terminated in response to imminent node shutdown.";
/// kubelet's container restart backoff: 10 s doubling to 5 minutes.
const RESTART_BACKOFF: Duration = Duration::from_secs(10);
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(300);

/// Pods being started or finished, by uid, so a pod is worked on once at a time.
#[derive(Debug, Default)]
pub(super) struct PodTracker {
    starting: Mutex<HashSet<String>>,
    finishing: Mutex<HashSet<String>>,
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// Watches all pods and handles those bound to simulated nodes; re-examines a node's pods
/// when its heartbeats resume.
pub(super) async fn run_pods(
    shared: Arc<Shared>,
    mut resumed: mpsc::UnboundedReceiver<String>,
    shutdown: CancellationToken,
) {
    let api: Api<Pod> = Api::all(shared.client.clone());
    let (store, writer) = reflector::store();
    let mut stream = reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .boxed();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(name) = resumed.recv() => {
                for pod in store.state() {
                    if node_of(&pod) == Some(name.as_str()) {
                        handle_pod(&shared, &pod, &shutdown);
                    }
                }
            }
            e = stream.next() => match e {
                Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                    handle_pod(&shared, &pod, &shutdown);
                }
                Some(Ok(watcher::Event::Delete(pod))) => {
                    let uid = pod.uid().unwrap_or_default();
                    release_images(&shared, &pod);
                    if let Some(node) = node_of(&pod).and_then(|n| shared.node(n).ok()) {
                        node.containers.lock().pod_deleted(&uid, tokio::time::Instant::now());
                        node.eviction.lock().pods.remove(&uid);
                        node.numa.lock().release(&uid);
                    }
                    shared.pods.starting.lock().remove(&uid);
                    shared.pods.finishing.lock().remove(&uid);
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::debug!(error = %e, "pod watch error"),
                None => return,
            },
        }
    }
}

/// The pod's images are no longer in use by it on its node.
fn release_images(shared: &Shared, pod: &Pod) {
    if !shared.config.image_gc.enabled {
        return;
    }
    if let Some(node) = node_of(pod).and_then(|n| shared.node(n).ok()) {
        node.images
            .lock()
            .stop_pod(&pod.uid().unwrap_or_default(), tokio::time::Instant::now());
    }
}

/// Decides what the kubelet of the pod's node does with it.
fn handle_pod(shared: &Arc<Shared>, pod: &Pod, shutdown: &CancellationToken) {
    let Some(node_name) = node_of(pod) else {
        return;
    };
    let Ok(node) = shared.node(node_name) else {
        return;
    };
    if shared.heartbeat_stopped(&node) {
        return;
    }
    let uid = pod.uid().unwrap_or_default();
    let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    if pod.metadata.deletion_timestamp.is_some() {
        if !shared.pods.finishing.lock().insert(uid.clone()) {
            return;
        }
        let grace = if shared.config.wait_pod_grace_period {
            Duration::from_secs(
                pod.metadata
                    .deletion_grace_period_seconds
                    .unwrap_or(0)
                    .max(0) as u64,
            )
        } else {
            Duration::ZERO
        };
        let (shared, shutdown) = (shared.clone(), shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(grace) => {}
            }
            let Ok(_permit) = shared.pod_writes.acquire().await else {
                return;
            };
            let api: Api<Pod> = Api::namespaced(shared.client_for(&node.name), &ns);
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => bump(&shared.counters.pods_finished),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "finishing pod failed");
                    shared.pods.finishing.lock().remove(&uid);
                }
            }
        });
        return;
    }
    if phase(pod) != "Pending" {
        shared.pods.starting.lock().remove(&uid);
        if matches!(phase(pod), "Succeeded" | "Failed") {
            // The CPU and memory managers' RemoveStaleState: an ended pod holds no NUMA node.
            node.numa.lock().release(&uid);
        }
        // What the running pod writes may change (its disk-usage annotation).
        if let Some(active) = node.eviction.lock().pods.get_mut(&uid) {
            *active = crate::eviction::ActivePod::of(pod);
        }
        if let Some(since) = ready_to_restore(pod) {
            restore_ready(shared, &node, pod, since);
        }
        if phase(pod) == "Running" {
            crate::ephemeral::start(shared, &node.name, pod);
        }
        return;
    }
    if !shared.pods.starting.lock().insert(uid.clone()) {
        return;
    }
    let active = crate::eviction::ActivePod::of(pod);
    // The eviction manager's admission handler rejects all but critical pods under disk
    // pressure (`eviction_manager.go` `Admit`).
    let disk_pressure =
        node.eviction.lock().disk_pressure && active.priority < shutdown::SYSTEM_CRITICAL_PRIORITY;
    let shutting_down = node.ctl.lock().shutting_down;
    // The TopologyManager's admit handler (`topology_manager.go` `Admit`), after the
    // eviction and shutdown managers' (kubelet's admit handlers run in that order and the
    // first refusal wins).
    let topology = if shutting_down || disk_pressure {
        Ok(())
    } else {
        node.numa.lock().admit(&node.config.topology, pod)
    };
    let status = if shutting_down {
        // The shutdown manager's admission handler rejects new pods.
        json!({"status": {
            "phase": "Failed",
            "reason": "NodeShutdown",
            "message": "Pod was rejected as the node is shutting down.",
        }})
    } else if disk_pressure {
        json!({"status": {
            "phase": "Failed",
            "reason": crate::eviction::EVICTED_REASON,
            "message": "The node had condition: [DiskPressure]. ",
        }})
    } else if let Err(message) = &topology {
        json!({"status": {
            "phase": "Failed",
            "reason": crate::topology::TOPOLOGY_AFFINITY_ERROR,
            "message": format!("Pod was rejected: {message}"),
        }})
    } else {
        running_status(shared, &node, pod)
    };
    let rejected = topology.as_ref().err().cloned();
    let shutting_down = shutting_down || disk_pressure || rejected.is_some();
    // LimitedSwap: each container's memory.swap.max, shown on the pod.
    let swap_annotation = if shutting_down {
        None
    } else {
        let memory = crate::quantity_in(&node.config.capacity.memory, 1_000_000_000);
        crate::swap::limit_annotation(&crate::swap::container_limits(
            &node.config.swap,
            u64::try_from(memory).unwrap_or(0),
            pod,
        ))
    };
    if !shutting_down {
        node.eviction.lock().pods.insert(uid.clone(), active);
    }
    if !shutting_down {
        let names = pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .map(|c| c.name.clone());
        node.containers
            .lock()
            .start_pod(&uid, names, tokio::time::Instant::now());
    }
    if !shutting_down && shared.config.image_gc.enabled {
        let images = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .filter_map(|c| c.image.clone())
            .collect();
        node.images
            .lock()
            .start_pod(&uid, images, tokio::time::Instant::now());
    }
    let plan = if shutting_down {
        RunPlan::Forever
    } else {
        stages::plan(
            &shared.config.run_rules,
            shared.config.default_run_duration,
            pod,
        )
    };
    let (shared, node, pod, shutdown) =
        (shared.clone(), node.clone(), pod.clone(), shutdown.clone());
    tokio::spawn(async move {
        let api: Api<Pod> = Api::namespaced(shared.client_for(&node.name), &ns);
        {
            let Ok(_permit) = shared.pod_writes.acquire().await else {
                return;
            };
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await
            {
                Ok(_) if !shutting_down => bump(&shared.counters.pods_started),
                Ok(_) => {
                    if let Some(message) = &rejected {
                        // kubelet's rejectPod records the refusal as a Warning Event.
                        crate::images::post_object_event(
                            &shared,
                            &node.name,
                            k8s_openapi::api::core::v1::ObjectReference {
                                api_version: Some("v1".into()),
                                kind: Some("Pod".into()),
                                namespace: Some(ns.clone()),
                                name: Some(name.clone()),
                                uid: Some(uid.clone()),
                                ..Default::default()
                            },
                            crate::topology::TOPOLOGY_AFFINITY_ERROR,
                            message,
                        )
                        .await;
                    }
                }
                Err(e) => {
                    tracing::warn!(node = %node.name, pod = %format!("{ns}/{name}"), error = %e, "pod status update failed");
                    shared.pods.starting.lock().remove(&uid);
                    return;
                }
            }
            if let Some(limits) = &swap_annotation {
                // Through the simulator's own client: NodeRestriction lets a kubelet
                // change a pod's status only.
                let fleet: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
                let patch = json!({"metadata": {"annotations": {
                    crate::swap::SWAP_LIMIT_ANNOTATION: limits,
                }}});
                if let Err(e) = fleet
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "swap limit annotation failed");
                }
            }
        }
        if let RunPlan::Exit {
            after: duration,
            code,
        } = plan
        {
            run_to_exit(
                &shared, &node, &api, &pod, status, duration, code, &shutdown,
            )
            .await;
        }
    });
}

/// When a running pod's containers are all ready but its `Ready` condition is not (the
/// node lifecycle controller's `MarkPodsNotReady` while the node was unreachable), the time
/// its containers became ready: kubelet's status manager writes its own view back
/// (`needsReconcile`), with the transition time it had cached.
fn ready_to_restore(pod: &Pod) -> Option<Value> {
    let status = pod.status.as_ref()?;
    if phase(pod) != "Running" {
        return None;
    }
    let conditions = status.conditions.as_deref()?;
    let find = |t: &str| conditions.iter().find(|c| c.type_ == t);
    let containers_ready = find("ContainersReady").filter(|c| c.status == "True")?;
    if find("Ready")?.status == "True" {
        return None;
    }
    let statuses = status.container_statuses.as_deref()?;
    if statuses.is_empty() || !statuses.iter().all(|c| c.ready) {
        return None;
    }
    Some(serde_json::to_value(&containers_ready.last_transition_time).unwrap_or(Value::Null))
}

/// Writes `Ready=True` back on a pod whose containers are ready (see [`ready_to_restore`]).
fn restore_ready(shared: &Arc<Shared>, node: &Arc<NodeState>, pod: &Pod, since: Value) {
    let uid = pod.uid().unwrap_or_default();
    if !shared.pods.starting.lock().insert(uid.clone()) {
        return;
    }
    let (ns, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let patch = json!({"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": null, "message": null, "lastTransitionTime": since},
    ]}});
    let (shared, node) = (shared.clone(), node.clone());
    tokio::spawn(async move {
        if let Ok(_permit) = shared.pod_writes.acquire().await {
            let api: Api<Pod> = Api::namespaced(shared.client_for(&node.name), &ns);
            if let Err(e) = api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                tracing::warn!(node = %node.name, pod = %format!("{ns}/{name}"), error = %e, "pod ready status update failed");
            }
        }
        shared.pods.starting.lock().remove(&uid);
    });
}

/// Lets the containers of a started pod run for `duration`, then exit with `code`: the pod
/// is `Succeeded` or `Failed` (restartPolicy `Never`), or its containers restart after
/// kubelet's backoff (`Always`; `OnFailure` when the code is not 0).
#[allow(clippy::too_many_arguments)]
async fn run_to_exit(
    shared: &Arc<Shared>,
    node: &Arc<NodeState>,
    api: &Api<Pod>,
    pod: &Pod,
    mut status: Value,
    duration: Duration,
    code: i32,
    shutdown: &CancellationToken,
) {
    let name = pod.name_any();
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into());
    let restart = policy == "Always" || (policy == "OnFailure" && code != 0);
    let mut restarts: i32 = 0;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(duration) => {}
        }
        // An unreachable kubelet reports nothing; the pod stays as the API last saw it.
        if shared.heartbeat_stopped(node) {
            return;
        }
        // Killed meanwhile (evicted, shut down, deleted): nothing more runs.
        let uid = pod.uid().unwrap_or_default();
        if !node.eviction.lock().pods.contains_key(&uid) {
            return;
        }
        let now = shared.clock.now().to_string();
        let terminated = json!({"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
            "startedAt": status["status"]["startTime"], "finishedAt": now});
        if let Some(cs) = status["status"]["containerStatuses"].as_array_mut() {
            for c in cs {
                c["ready"] = json!(false);
                c["started"] = json!(false);
                c["state"] = json!({"terminated": terminated});
            }
        }
        if !restart {
            let phase = if code == 0 { "Succeeded" } else { "Failed" };
            status["status"]["phase"] = json!(phase);
            if let Some(conds) = status["status"]["conditions"].as_array_mut() {
                for c in conds.iter_mut() {
                    if matches!(
                        c["type"].as_str(),
                        Some("Ready" | "ContainersReady" | "PodReadyToStartContainers")
                    ) {
                        c["status"] = json!("False");
                        c["reason"] = json!("PodCompleted");
                        c["lastTransitionTime"] = json!(now);
                    }
                }
            }
        } else {
            // The container restarts at once with its restart counted (kubelet's crash
            // loop backoff is applied before the next run).
            restarts += 1;
            if let Some(cs) = status["status"]["containerStatuses"].as_array_mut() {
                for c in cs {
                    c["lastState"] = json!({"terminated": terminated});
                    c["restartCount"] = json!(restarts);
                    c["ready"] = json!(true);
                    c["started"] = json!(true);
                    c["state"] = json!({"running": {"startedAt": now}});
                }
            }
        }
        let Ok(_permit) = shared.pod_writes.acquire().await else {
            return;
        };
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => return,
            Err(e) => {
                tracing::warn!(pod = %name, error = %e, "pod exit status update failed");
                return;
            }
        }
        node.containers
            .lock()
            .containers_exited(&uid, restart, tokio::time::Instant::now());
        if !restart {
            node.eviction.lock().pods.remove(&uid);
        }
        if !restart {
            release_images(shared, pod);
            return;
        }
        let backoff = RESTART_BACKOFF
            .saturating_mul(1u32.checked_shl(restarts as u32 - 1).unwrap_or(u32::MAX))
            .min(MAX_RESTART_BACKOFF);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
    }
}

/// A container's status as the simulated kubelet reports it: its name and image, no image
/// ID, `containerID` `sim://<pod uid>/<name>`, no restarts, `ready`, `started` (left out
/// where kubelet reports none: init and ephemeral containers) and `state`.
pub(crate) fn container_status(
    pod_uid: &str,
    name: &str,
    image: Option<&str>,
    ready: bool,
    started: Option<bool>,
    state: Value,
) -> Value {
    let mut status = json!({
        "name": name,
        "image": image.unwrap_or_default(),
        "imageID": "",
        "containerID": format!("sim://{pod_uid}/{name}"),
        "ready": ready,
        "restartCount": 0,
        "state": state,
    });
    if let Some(started) = started {
        status["started"] = json!(started);
    }
    status
}

/// The status of a pod whose containers all started and are ready.
fn running_status(shared: &Shared, node: &NodeState, pod: &Pod) -> Value {
    let now = shared.clock.now().to_string();
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let pod_ip = if host_network {
        node.ip
    } else {
        // 10.128.0.0/9, one address per started pod.
        let n = shared.pod_seq.fetch_add(1, Ordering::Relaxed) as u32;
        IpAddr::V4(Ipv4Addr::from(
            u32::from(Ipv4Addr::new(10, 128, 0, 1)) + (n & 0x7f_ffff),
        ))
    };
    let uid = pod.uid().unwrap_or_default();
    let containers: Vec<Value> = spec
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let running = json!({"running": {"startedAt": now}});
            container_status(&uid, &c.name, c.image.as_deref(), true, Some(true), running)
        })
        .collect();
    let init: Vec<Value> = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let completed = json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}});
            container_status(&uid, &c.name, c.image.as_deref(), true, None, completed)
        })
        .collect();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
    let mut status = json!({
        "phase": "Running",
        "hostIP": node.ip.to_string(),
        "hostIPs": [{"ip": node.ip.to_string()}],
        "podIP": pod_ip.to_string(),
        "podIPs": [{"ip": pod_ip.to_string()}],
        "startTime": now,
        "qosClass": "BestEffort",
        "conditions": [
            cond("PodReadyToStartContainers"),
            cond("Initialized"),
            cond("Ready"),
            cond("ContainersReady"),
            cond("PodScheduled"),
        ],
        "containerStatuses": containers,
    });
    if !init.is_empty() {
        status["initContainerStatuses"] = json!(init);
    }
    json!({ "status": status })
}

/// The status kubelet's shutdown manager gives a pod it kills.
fn shutdown_status(shared: &Shared, pod: &Pod) -> Value {
    killed_status(shared, pod, SHUTDOWN_REASON, SHUTDOWN_MESSAGE)
}

/// The status of a pod kubelet killed (`killPodFunc` with a status function): `Failed`
/// with `reason` and `message`, and the `DisruptionTarget` condition.
fn killed_status(shared: &Shared, pod: &Pod, reason: &str, message: &str) -> Value {
    let now = shared.clock.now().to_string();
    let uid = pod.uid().unwrap_or_default();
    let containers: Vec<Value> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let killed =
                json!({"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": now}});
            container_status(
                &uid,
                &c.name,
                c.image.as_deref(),
                false,
                Some(false),
                killed,
            )
        })
        .collect();
    let cond = |t: &str, s: &str| json!({"type": t, "status": s, "lastProbeTime": null, "lastTransitionTime": now});
    let mut disruption = cond("DisruptionTarget", "True");
    disruption["reason"] = json!("TerminationByKubelet");
    disruption["message"] = json!(message);
    json!({"status": {
        "phase": "Failed",
        "reason": reason,
        "message": message,
        "conditions": [
            disruption,
            cond("PodReadyToStartContainers", "False"),
            cond("Initialized", "True"),
            cond("Ready", "False"),
            cond("ContainersReady", "False"),
            cond("PodScheduled", "True"),
        ],
        "containerStatuses": containers,
    }})
}

/// Graceful node shutdown: Ready=False, then the pods by priority group, lowest first,
/// each group within its grace period (see [`shutdown`]).
#[tracing::instrument(name = "sim_shutdown", skip_all, fields(node = %node.name))]
pub(super) async fn graceful_shutdown(
    shared: &Arc<Shared>,
    node: &Arc<NodeState>,
) -> Result<(), SimError> {
    shared.change(node, |c| c.shutting_down = true);
    let now = shared.clock.now();
    let disk_pressure = node.eviction.lock().disk_pressure;
    node::post_status(
        shared,
        &node.name,
        node::conditions(now, now, now, true, disk_pressure),
    )
    .await;

    let api: Api<Pod> = Api::all(shared.client_for(&node.name));
    let pods = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", node.name)))
        .await?;
    let active: Vec<Pod> = pods
        .items
        .into_iter()
        .filter(|p| !matches!(phase(p), "Succeeded" | "Failed"))
        .collect();
    let groups = shutdown::shutdown_groups(&node.config);
    let periods: Vec<Duration> = groups.iter().map(|g| g.grace_period).collect();
    let grouped = shutdown::group_by_priority(&groups, active);
    tracing::info!(
        groups = ?grouped.iter().map(Vec::len).collect::<Vec<_>>(),
        "shutdown: terminating pods by priority group"
    );
    for (group, period) in grouped.into_iter().zip(periods) {
        let kills = group.iter().map(|pod| {
            let api: Api<Pod> = Api::namespaced(
                shared.client_for(&node.name),
                &pod.namespace().unwrap_or_default(),
            );
            let name = pod.name_any();
            // The containers use their grace period, capped by the group's
            // (`gracePeriodOverride`), when the simulator waits grace periods.
            let grace = if shared.config.wait_pod_grace_period {
                let own = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(30)
                    .max(0) as u64;
                Duration::from_secs(own).min(period)
            } else {
                Duration::ZERO
            };
            async move {
                tokio::time::sleep(grace).await;
                let status = shutdown_status(shared, pod);
                match api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                    .await
                {
                    Ok(_) => {
                        bump(&shared.counters.pods_shut_down);
                        node.eviction
                            .lock()
                            .pods
                            .remove(&pod.uid().unwrap_or_default());
                        node.containers.lock().containers_exited(
                            &pod.uid().unwrap_or_default(),
                            false,
                            tokio::time::Instant::now(),
                        );
                    }
                    Err(e) => {
                        tracing::warn!(pod = %name, error = %e, "shutdown: pod status failed")
                    }
                }
            }
        });
        futures::future::join_all(kills).await;
    }
    Ok(())
}

/// The eviction manager's `evictPod`: the pod is killed at once (a hard threshold), its
/// status `Failed` with reason `Evicted` and kubelet's message, and a Warning Event
/// `Evicted` is recorded on it.
pub(super) async fn evict(
    shared: &Arc<Shared>,
    node: &Arc<NodeState>,
    uid: &str,
    victim: &crate::eviction::ActivePod,
    message: &str,
) {
    let now = tokio::time::Instant::now();
    node.eviction.lock().pods.remove(uid);
    node.containers.lock().containers_exited(uid, false, now);
    node.images.lock().stop_pod(uid, now);
    let api: Api<Pod> = Api::namespaced(shared.client_for(&node.name), &victim.namespace);
    let Ok(_permit) = shared.pod_writes.acquire().await else {
        return;
    };
    let pod = match api.get_opt(&victim.name).await {
        Ok(Some(p)) if p.uid().as_deref() == Some(uid) => p,
        Ok(_) => return,
        Err(e) => {
            tracing::warn!(pod = %victim.name, error = %e, "eviction: pod lookup failed");
            return;
        }
    };
    let status = killed_status(shared, &pod, crate::eviction::EVICTED_REASON, message);
    if let Err(e) = api
        .patch_status(&victim.name, &PatchParams::default(), &Patch::Merge(status))
        .await
    {
        tracing::warn!(pod = %victim.name, error = %e, "eviction: pod status failed");
        return;
    }
    bump(&shared.counters.pods_evicted);
    crate::images::post_object_event(
        shared,
        &node.name,
        k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(victim.namespace.clone()),
            name: Some(victim.name.clone()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        crate::eviction::EVICTED_REASON,
        message,
    )
    .await;
}
