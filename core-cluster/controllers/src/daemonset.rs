//! The DaemonSet controller: one pod on every eligible node.
//!
//! # What upstream does (`pkg/controller/daemon`)
//!
//! - A node is eligible when the daemon pod would pass the scheduler's `NodeAffinity`
//!   (nodeSelector, required node affinity) and `TaintToleration` (NoSchedule and NoExecute
//!   taints) filters, the pod carrying the tolerations of `AddOrUpdateDaemonPodTolerations`:
//!   `node.kubernetes.io/not-ready` and `unreachable` NoExecute with no
//!   `tolerationSeconds`, `disk-pressure`, `memory-pressure`, `pid-pressure` and
//!   `unschedulable` NoSchedule, and `network-unavailable` NoSchedule for hostNetwork pods.
//!   A cordoned node is thus still eligible.
//! - An eligible node without a daemon pod gets one, pinned by a required node affinity
//!   term `matchFields metadata.name In [node]` and bound by the default scheduler. A pod
//!   already on a node that is no longer eligible keeps running as long as it tolerates the
//!   node's NoExecute taints (`shouldContinueRunning`: a new NoSchedule taint does not
//!   evict, it only counts the pod as misscheduled); otherwise it is deleted. Extra pods and
//!   failed pods are deleted (failed ones then recreated where the node is eligible).
//! - RollingUpdate (maxUnavailable 1, maxSurge 0 by default): pods whose
//!   `controller-revision-hash` is not the template's are deleted while no more than
//!   `maxUnavailable` eligible nodes lack an available pod; OnDelete leaves them.
//! - Status: `desiredNumberScheduled`, `currentNumberScheduled`, `numberMisscheduled`,
//!   `numberReady`, `numberAvailable`, `numberUnavailable`, `updatedNumberScheduled`,
//!   `observedGeneration`.
//!
//! # Where we differ
//!
//! - No ControllerRevision objects: the revision hash is the template's hash.
//! - No `maxSurge` rolling updates, no backoff before recreating failed pods.

use std::{collections::HashMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Node, Pod, PodTemplateSpec, Taint, Toleration},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{
    deployment::pod_template_hash,
    scheduler::fit::{matches_node_selector, untolerated_taint},
    taint_eviction::tolerates,
    workload::{
        EventSink, Expectations, Reconcile, availability, controlled_by, controller_key,
        controller_ref, counts_differ, create_pod, delete_pod, drive, is_ready, key_of,
        patch_status, phase, pod_from_template, select, watch,
    },
};
use crate::{clock::WallClock, registry::workloads::defaulted_template};

/// The label carrying the template revision of a daemon pod.
pub const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";

/// The tolerations upstream adds to every daemon pod (`AddOrUpdateDaemonPodTolerations`).
pub fn add_daemon_tolerations(template: &mut PodTemplateSpec) {
    let Some(spec) = template.spec.as_mut() else {
        return;
    };
    let mut wanted = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if spec.host_network == Some(true) {
        wanted.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for (key, effect) in wanted {
        // Replaces any toleration of the same key and effect (so a NoExecute one keeps no
        // tolerationSeconds), as upstream's `AddOrUpdateTolerationInPodSpec`.
        tolerations
            .retain(|t| !(t.key.as_deref() == Some(key) && t.effect.as_deref() == Some(effect)));
        tolerations.push(Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(effect.into()),
            ..Toleration::default()
        });
    }
}

/// Where a daemon pod belongs (upstream `NodeShouldRunDaemonPod`'s two answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// A daemon pod should run on the node (`shouldRun`): node name, node affinity and the
    /// NoSchedule and NoExecute taints all admit it.
    pub run: bool,
    /// A daemon pod already there may stay (`shouldContinueRunning`): node name and
    /// affinity admit it and it tolerates every NoExecute taint.
    pub keep: bool,
}

/// Whether a daemon pod from `template` should run on `node`, and whether one already
/// there may stay (upstream `NodeShouldRunDaemonPod`).
pub fn should_run(template: &PodTemplateSpec, node: &Node) -> Placement {
    let pod = Pod {
        metadata: Default::default(),
        spec: template.spec.clone(),
        status: None,
    };
    let taints: &[Taint] = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let tolerations = template
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    if !matches_node_selector(&pod, node) {
        return Placement {
            run: false,
            keep: false,
        };
    }
    let run = untolerated_taint(taints, tolerations).is_none();
    let keep = run
        || !taints
            .iter()
            .any(|t| t.effect == "NoExecute" && !tolerations.iter().any(|tol| tolerates(tol, t)));
    Placement { run, keep }
}

/// The node a daemon pod is for: its `nodeName`, else its `matchFields` affinity target.
fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|r| r.key == "metadata.name" && r.operator == "In")
        .and_then(|r| r.values.as_ref()?.first().cloned())
}

/// The DaemonSet controller.
pub struct DaemonSetController {
    client: Client,
}

impl std::fmt::Debug for DaemonSetController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonSetController")
            .finish_non_exhaustive()
    }
}

impl DaemonSetController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (sets, ds_events) = watch(Api::<DaemonSet>::all(self.client.clone()), |ds| {
            vec![key_of(ds)]
        });
        let all_sets = sets.clone();
        let (nodes, node_events) = watch(Api::<Node>::all(self.client.clone()), move |_| {
            all_sets.state().iter().map(|ds| key_of(&**ds)).collect()
        });
        let (pods, pod_events) = watch(Api::<Pod>::all(self.client.clone()), |p| {
            controller_key(p, "DaemonSet")
        });
        let events = EventSink::spawn(
            self.client.clone(),
            "daemonset-controller",
            shutdown.clone(),
        );
        let sync = Sync {
            client: self.client,
            sets,
            nodes,
            pods,
            events,
            expectations: Expectations::default(),
            clock: WallClock::new(),
        };
        drive(sync, vec![ds_events, node_events, pod_events], shutdown).await;
    }
}

struct Sync {
    client: Client,
    sets: Store<DaemonSet>,
    nodes: Store<Node>,
    pods: Store<Pod>,
    events: EventSink,
    expectations: Expectations,
    clock: WallClock,
}

#[async_trait]
impl Reconcile for Sync {
    fn name(&self) -> &'static str {
        "daemonset"
    }

    async fn reconcile(&mut self, key: &str) -> Result<Option<Duration>, kube::Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let Some(ds) = self.sets.get(&ObjectRef::new(name).within(ns)) else {
            self.expectations.forget(key);
            return Ok(None);
        };
        let uid = ds.uid().unwrap_or_default();
        let spec = ds.spec.clone().unwrap_or_default();
        let owner = ds.object_ref(&());
        let defaulted =
            defaulted_template(&serde_json::to_value(&spec.template).unwrap_or_default());
        let mut template: PodTemplateSpec =
            serde_json::from_value(defaulted).map_err(kube::Error::SerdeError)?;
        let hash = pod_template_hash(&template, None);
        add_daemon_tolerations(&mut template);
        let min_ready = i64::from(spec.min_ready_seconds.unwrap_or(0));
        let now = self.clock.now();
        let pods = select(&self.pods, |p| {
            p.namespace().as_deref() == Some(ns) && controlled_by(p, &uid)
        });
        let mut by_node: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
        for p in &pods {
            if p.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if let Some(n) = target_node(p) {
                by_node.entry(n).or_default().push(p.clone());
            }
        }
        let nodes = self.nodes.state();
        let mut create_on = Vec::new();
        let mut delete = Vec::new();
        let (mut desired, mut current, mut misscheduled, mut ready, mut available, mut updated) =
            (0, 0, 0, 0, 0, 0);
        let mut again: Option<Duration> = None;
        let mut old_pods = Vec::new();
        for node in &nodes {
            let node_name = node.name_any();
            let mut here = by_node.remove(&node_name).unwrap_or_default();
            let placement = should_run(&template, node);
            // Failed daemon pods are deleted (and recreated on the next pass).
            let (failed, mut live): (Vec<_>, Vec<_>) =
                here.drain(..).partition(|p| phase(p) == "Failed");
            delete.extend(failed);
            if !placement.run {
                if !live.is_empty() {
                    misscheduled += 1;
                }
                if placement.keep {
                    // Still tolerated: only the duplicates go, the oldest stays.
                    live.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
                    delete.extend(live.into_iter().skip(1));
                } else {
                    delete.extend(live);
                }
                continue;
            }
            desired += 1;
            if live.is_empty() {
                create_on.push(node_name);
                continue;
            }
            current += 1;
            live.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
            delete.extend(live.drain(1..));
            let pod = &live[0];
            if is_ready(pod) {
                ready += 1;
            }
            match availability(pod, min_ready, now) {
                Ok(()) => available += 1,
                Err(Some(d)) => again = Some(again.map_or(d, |a| a.min(d))),
                Err(None) => {}
            }
            if pod.labels().get(CONTROLLER_REVISION_HASH) == Some(&hash) {
                updated += 1;
            } else {
                old_pods.push(pod.clone());
            }
        }
        // Pods for nodes that no longer exist.
        delete.extend(by_node.into_values().flatten());
        let rolling = spec
            .update_strategy
            .as_ref()
            .and_then(|s| s.type_.as_deref())
            .unwrap_or("RollingUpdate")
            == "RollingUpdate";
        if rolling && !old_pods.is_empty() {
            let max_unavailable = match spec
                .update_strategy
                .as_ref()
                .and_then(|s| s.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.as_ref())
            {
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i)) => *i,
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s)) => {
                    let p: f64 = s.trim_end_matches('%').parse().unwrap_or(0.0);
                    ((p * f64::from(desired) / 100.0).floor() as i32).max(1)
                }
                None => 1,
            };
            let unavailable = desired - available;
            // Old pods that are not available anyway go first.
            old_pods.sort_by_key(|p| availability(p, min_ready, now).is_ok());
            // Saturating: `maxUnavailable` is the user's int32.
            let mut budget = max_unavailable.saturating_sub(unavailable);
            for p in old_pods {
                if availability(&p, min_ready, now).is_err() {
                    delete.push(p);
                } else if budget > 0 {
                    budget -= 1;
                    delete.push(p);
                }
            }
        }
        if self.expectations.satisfied(key, &self.pods, ns)
            && ds.metadata.deletion_timestamp.is_none()
        {
            for node_name in create_on {
                let mut t = template.clone();
                pin_to_node(&mut t, &node_name);
                let pod = pod_from_template(
                    &t,
                    controller_ref(&*ds),
                    ns,
                    name,
                    &[(CONTROLLER_REVISION_HASH, hash.clone())],
                );
                let created = create_pod(&self.client, &self.events, &owner, &pod).await?;
                self.expectations.expect(key, created, true);
            }
            for p in delete {
                self.expectations.expect(key, p.name_any(), false);
                delete_pod(&self.client, &self.events, &owner, &p).await?;
            }
        }
        let status = json!({
            "desiredNumberScheduled": desired,
            "currentNumberScheduled": current,
            "numberMisscheduled": misscheduled,
            "numberReady": ready,
            "numberAvailable": available,
            "numberUnavailable": desired - available,
            "updatedNumberScheduled": updated,
            "observedGeneration": ds.metadata.generation,
        });
        let before =
            serde_json::to_value(ds.status.clone().unwrap_or_default()).unwrap_or_default();
        let changed = status
            .as_object()
            .is_some_and(|m| counts_differ(&before, &status, m.keys().map(String::as_str)));
        if changed {
            let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), ns);
            patch_status(&api, name, status).await?;
        }
        Ok(again)
    }
}

/// Adds the required node affinity term that pins a daemon pod to `node` (upstream
/// `ReplaceDaemonSetPodNodeNameNodeAffinity`).
fn pin_to_node(template: &mut PodTemplateSpec, node: &str) {
    let Some(spec) = template.spec.as_mut() else {
        return;
    };
    let mut affinity =
        serde_json::to_value(spec.affinity.clone().unwrap_or_default()).unwrap_or_default();
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!({
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    });
    spec.affinity = serde_json::from_value::<Value>(affinity)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok());
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(spec: Value) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": "n1", "labels": {"role": "edge"}}, "spec": spec}),
        )
        .unwrap()
    }

    fn template(spec: Value) -> PodTemplateSpec {
        let mut t: PodTemplateSpec = serde_json::from_value(json!({"spec": spec})).unwrap();
        add_daemon_tolerations(&mut t);
        t
    }

    /// Upstream `AddOrUpdateDaemonPodTolerations` and `NodeShouldRunDaemonPod`: daemon
    /// pods tolerate not-ready/unreachable (forever), the pressure conditions and cordons,
    /// but not other taints; nodeSelector still applies; a pod already on a node may stay
    /// while it tolerates the node's NoExecute taints (`shouldContinueRunning`).
    #[test]
    fn eligibility_with_default_tolerations() {
        let t = template(json!({"containers": [{"name": "c"}],
            "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]}));
        let tolerations = t.spec.as_ref().unwrap().tolerations.clone().unwrap();
        assert_eq!(tolerations.len(), 6);
        assert!(
            tolerations.iter().all(|t| t.toleration_seconds.is_none()),
            "NoExecute ones have no seconds"
        );
        let tainted =
            |key: &str, effect: &str| node(json!({"taints": [{"key": key, "effect": effect}]}));
        let run = Placement {
            run: true,
            keep: true,
        };
        let stay = Placement {
            run: false,
            keep: true,
        };
        let leave = Placement {
            run: false,
            keep: false,
        };
        assert_eq!(
            should_run(&t, &tainted("node.kubernetes.io/not-ready", "NoExecute")),
            run
        );
        assert_eq!(
            should_run(&t, &tainted("node.kubernetes.io/unreachable", "NoExecute")),
            run
        );
        assert_eq!(
            should_run(
                &t,
                &tainted("node.kubernetes.io/unschedulable", "NoSchedule")
            ),
            run
        );
        assert_eq!(should_run(&t, &node(json!({"unschedulable": true}))), run);
        // shouldContinueRunning: an untolerated NoSchedule taint does not evict.
        assert_eq!(should_run(&t, &tainted("dedicated", "NoSchedule")), stay);
        assert_eq!(
            should_run(&t, &tainted("node.kubernetes.io/unreachable", "NoSchedule")),
            stay
        );
        assert_eq!(
            should_run(
                &t,
                &tainted("node.kubernetes.io/network-unavailable", "NoSchedule")
            ),
            stay
        );
        assert_eq!(should_run(&t, &tainted("dedicated", "NoExecute")), leave);
        let host = template(json!({"containers": [{"name": "c"}], "hostNetwork": true}));
        assert_eq!(
            should_run(
                &host,
                &tainted("node.kubernetes.io/network-unavailable", "NoSchedule")
            ),
            run
        );
        let picky =
            template(json!({"containers": [{"name": "c"}], "nodeSelector": {"role": "core"}}));
        assert_eq!(should_run(&picky, &node(json!({}))), leave);
    }

    #[test]
    fn pinned_pods_name_their_node() {
        let mut t = template(json!({"containers": [{"name": "c"}]}));
        pin_to_node(&mut t, "n7");
        let pod = Pod {
            metadata: Default::default(),
            spec: t.spec,
            status: None,
        };
        assert_eq!(target_node(&pod).as_deref(), Some("n7"));
    }
}
