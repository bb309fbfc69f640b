//! One node's kubelet: registration, Lease renewals, status posts.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{
            Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSwapStatus, NodeSystemInfo,
        },
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time},
    },
};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{
    NodeState, PROVIDED_NODE_IP_ANNOTATION, Shared, SimConfig, agent_tunnel, bump, kubelet_api,
};

/// Namespace of node Leases.
pub(super) const LEASE_NAMESPACE: &str = "kube-node-lease";
/// kubelet's `maxUpdateRetries`.
const MAX_UPDATE_RETRIES: usize = 5;
/// First wait of `backoffEnsureLease`.
const LEASE_BACKOFF_START: Duration = Duration::from_millis(200);
/// kubelet's `maxBackoff`.
const LEASE_BACKOFF_MAX: Duration = Duration::from_secs(7);
/// `wait.JitterUntil` jitter factor of the lease controller and the status loop.
const LEASE_JITTER: f64 = 0.04;

/// Ready message while a graceful shutdown runs.
pub(super) const SHUTTING_DOWN_MESSAGE: &str = "node is shutting down";

fn status_err(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn resources(r: &super::NodeResources) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_owned(), Quantity(r.cpu.clone())),
        ("memory".to_owned(), Quantity(r.memory.clone())),
        ("pods".to_owned(), Quantity(r.pods.clone())),
        (
            "ephemeral-storage".to_owned(),
            Quantity(r.ephemeral_storage.clone()),
        ),
    ])
}

/// The node's conditions as kubelet reports them.
pub(super) fn conditions(
    now: jiff::Timestamp,
    since: jiff::Timestamp,
    ready_since: jiff::Timestamp,
    shutting_down: bool,
    disk_pressure: bool,
) -> Vec<NodeCondition> {
    let c = |type_: &str, status: &str, reason: &str, message: &str, since| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(since)),
    };
    vec![
        c(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
            since,
        ),
        if disk_pressure {
            c(
                "DiskPressure",
                "True",
                "KubeletHasDiskPressure",
                "kubelet has disk pressure",
                since,
            )
        } else {
            c(
                "DiskPressure",
                "False",
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
                since,
            )
        },
        c(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
            since,
        ),
        if shutting_down {
            c(
                "Ready",
                "False",
                "KubeletNotReady",
                SHUTTING_DOWN_MESSAGE,
                ready_since,
            )
        } else {
            c(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
                ready_since,
            )
        },
    ]
}

/// The Node kubelet registers (`initialNode` + `setNodeStatus`).
fn initial_node(config: &SimConfig, node: &NodeState, now: jiff::Timestamp) -> Node {
    let info = &config.node_info;
    let mut labels = config.node_labels.clone();
    labels.insert("kubernetes.io/hostname".into(), node.name.clone());
    labels.insert("kubernetes.io/os".into(), info.operating_system.clone());
    labels.insert("kubernetes.io/arch".into(), info.architecture.clone());
    labels.insert(
        "beta.kubernetes.io/os".into(),
        info.operating_system.clone(),
    );
    labels.insert("beta.kubernetes.io/arch".into(), info.architecture.clone());
    if let Some(zone) = &node.zone {
        labels.insert("topology.kubernetes.io/zone".into(), zone.clone());
    }
    let mut annotations = BTreeMap::from([(
        "volumes.kubernetes.io/controller-managed-attach-detach".to_owned(),
        "true".to_owned(),
    )]);
    if config.external_cloud_provider && node.explicit_ip {
        annotations.insert(PROVIDED_NODE_IP_ANNOTATION.into(), node.ip.to_string());
    }
    Node {
        metadata: ObjectMeta {
            name: Some(node.name.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!config.register_with_taints.is_empty())
                .then(|| config.register_with_taints.clone()),
            provider_id: config
                .provider_id_prefix
                .as_ref()
                .map(|p| format!("{p}{}", node.name)),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(resources(&config.capacity)),
            allocatable: Some(resources(&config.allocatable)),
            conditions: Some(conditions(now, now, now, false, false)),
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: node.ip.to_string(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: node.name.clone(),
                },
            ]),
            node_info: Some(NodeSystemInfo {
                architecture: info.architecture.clone(),
                boot_id: format!("sim-boot-{}", node.name),
                container_runtime_version: info.container_runtime_version.clone(),
                kernel_version: info.kernel_version.clone(),
                kube_proxy_version: info.kubelet_version.clone(),
                kubelet_version: info.kubelet_version.clone(),
                machine_id: format!("sim-machine-{}", node.name),
                operating_system: info.operating_system.clone(),
                os_image: info.os_image.clone(),
                system_uuid: format!("sim-{}", node.name),
                // setters.go MachineInfo, with the NodeSwap feature gate (on by default).
                swap: config
                    .swap
                    .node_info_capacity()
                    .map(|capacity| NodeSwapStatus {
                        capacity: Some(capacity),
                    }),
            }),
            ..Default::default()
        }),
    }
}

/// Per-node kubelet state that lives in its task.
struct Kubelet {
    shared: Arc<Shared>,
    node: Arc<NodeState>,
    shutdown: CancellationToken,
    lease: Option<Lease>,
    /// When conditions last changed (`lastTransitionTime`).
    since: jiff::Timestamp,
    ready_since: jiff::Timestamp,
    last_ready_shutting_down: bool,
    last_status_post: Instant,
    /// The image list version last posted in `status.images`.
    last_images_version: u64,
}

/// The task of one node: registers it, then heartbeats until shutdown.
pub(super) async fn run_node(
    shared: Arc<Shared>,
    node: Arc<NodeState>,
    shutdown: CancellationToken,
) {
    let span = tracing::info_span!("sim_node", node = %node.name);
    async move {
        let now = shared.clock.now();
        let mut k = Kubelet {
            shared,
            node,
            shutdown,
            lease: None,
            since: now,
            ready_since: now,
            last_ready_shutting_down: false,
            last_status_post: Instant::now(),
            last_images_version: 0,
        };
        // NewContainerManager: under failSwapOn a machine with swap stops kubelet before
        // it registers.
        if let Some(error) = k.node.config.swap.startup_error() {
            tracing::error!(error, "failed to run Kubelet");
            k.node.ctl.lock().startup_error = Some(error.to_owned());
            return;
        }
        crate::swap::announce_startup(&k.shared, &k.node.name, &k.node.config.swap).await;
        // The kubelet API listens before registration, so the Node advertises it.
        if let Err(e) = kubelet_api::start(&k.shared, &k.node, &k.shutdown).await {
            tracing::warn!(error = %e, "the kubelet API did not start");
        }
        agent_tunnel::start(&k.shared, &k.node.name, &k.shutdown);
        if !k.register().await {
            return;
        }
        kubelet_api::advertise(&k.shared, &k.node.name).await;
        k.heartbeat_loop().await;
    }
    .instrument(span)
    .await
}

impl Kubelet {
    fn config(&self) -> &SimConfig {
        &self.node.config
    }

    /// Waits `d` unless shutdown comes first (then false).
    async fn wait(&self, d: Duration) -> bool {
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = sleep(d) => true,
        }
    }

    /// Registers the node (retrying with kubelet's 100 ms → 7 s backoff) and creates its
    /// Lease. False on shutdown.
    async fn register(&mut self) -> bool {
        let api: Api<Node> = Api::all(self.shared.client_for(&self.node.name));
        let mut backoff = LEASE_BACKOFF_START;
        loop {
            if self.shutdown.is_cancelled() {
                return false;
            }
            let permit = tokio::select! {
                _ = self.shutdown.cancelled() => return false,
                p = self.shared.registrations.acquire() => p,
            };
            let Ok(_permit) = permit else { return false };
            let result = if self.config().register_node {
                let node = initial_node(self.config(), &self.node, self.shared.clock.now());
                match api.create(&PostParams::default(), &node).await {
                    Ok(n) => Ok(Some(n)),
                    // Already registered (a restart): kubelet keeps the existing Node.
                    Err(e) if status_err(&e) == Some(409) => api.get_opt(&self.node.name).await,
                    Err(e) => Err(e),
                }
            } else {
                api.get_opt(&self.node.name).await
            };
            match result {
                Ok(Some(_)) => {
                    // The Lease comes with registration (the lease controller starts with
                    // kubelet); a failure here is retried by the heartbeat loop.
                    match self.ensure_lease().await {
                        Ok((lease, _)) => self.lease = Some(lease),
                        Err(e) => {
                            bump(&self.shared.counters.lease_errors);
                            tracing::debug!(error = %e, "lease create at registration failed");
                        }
                    }
                    bump(&self.shared.counters.registered);
                    tracing::debug!("registered");
                    return true;
                }
                Ok(None) => tracing::debug!("node not found, waiting for it"),
                Err(e) => tracing::warn!(error = %e, "registration failed"),
            }
            drop(_permit);
            if !self.wait(backoff).await {
                return false;
            }
            backoff = (backoff * 2).min(LEASE_BACKOFF_MAX);
        }
    }

    fn jittered(&self, d: Duration) -> Duration {
        d.mul_f64(1.0 + fastrand::f64() * LEASE_JITTER)
    }

    async fn heartbeat_loop(&mut self) {
        let renew = self.config().lease_renew_interval();
        let update = self.config().node_status_update_frequency;
        let start = Instant::now();
        // Spread the nodes' phases uniformly over the interval.
        let mut next_lease = start + renew.mul_f64(fastrand::f64());
        let mut next_status = start + update.mul_f64(fastrand::f64());
        let mut was_stopped = false;
        loop {
            let now = Instant::now();
            let (stopped, flap_change) = self.shared.stopped_now(&self.node);
            if stopped != was_stopped {
                tracing::info!(stopped, "heartbeats");
                if !stopped {
                    // Back: renew and look at status at once.
                    next_lease = now;
                    next_status = now;
                }
                was_stopped = stopped;
            }
            if !stopped {
                if now >= next_lease {
                    self.sync_lease().await;
                    // The next renewal counts from the scheduled time, not from when this
                    // one finished (kubelet's JitterUntil is sliding): with thousands of
                    // nodes in one process, a stall of the API server would otherwise line
                    // up every delayed node on the same phase and the renewals would come
                    // in bursts from then on. A node a whole interval behind is re-spread.
                    let done = Instant::now();
                    next_lease += self.jittered(renew);
                    if next_lease <= done {
                        next_lease = done + renew.mul_f64(fastrand::f64());
                    }
                }
                if now >= next_status {
                    self.sync_status().await;
                    next_status += self.jittered(update);
                    let done = Instant::now();
                    if next_status <= done {
                        next_status = done + update.mul_f64(fastrand::f64());
                    }
                }
            }
            if self.shutdown.is_cancelled() || self.node.ctl.lock().powered_off {
                return;
            }
            let wake = if stopped {
                flap_change
            } else {
                Some(flap_change.map_or(next_lease.min(next_status), |f| {
                    f.min(next_lease).min(next_status)
                }))
            };
            let sleeper = async {
                match wake {
                    Some(w) => sleep_until(w).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = self.node.notify.notified() => {}
                _ = sleeper => {}
            }
        }
    }

    fn lease_api(&self) -> Api<Lease> {
        Api::namespaced(self.shared.client_for(&self.node.name), LEASE_NAMESPACE)
    }

    /// The lease controller's `sync`: PUT the cached Lease; otherwise ensure it exists
    /// (with backoff) and PUT that.
    async fn sync_lease(&mut self) {
        if let Some(base) = self.lease.take()
            && let Some(l) = self.retry_update_lease(base).await
        {
            self.lease = Some(l);
            return;
        }
        let Some((lease, created)) = self.backoff_ensure_lease().await else {
            return;
        };
        if created {
            self.lease = Some(lease);
            return;
        }
        self.lease = self.retry_update_lease(lease).await;
    }

    /// `retryUpdateLease`: up to 5 PUTs; a conflict re-GETs the Lease.
    async fn retry_update_lease(&mut self, mut base: Lease) -> Option<Lease> {
        let api = self.lease_api();
        for _ in 0..MAX_UPDATE_RETRIES {
            let mut lease = base.clone();
            let spec = lease.spec.get_or_insert_with(Default::default);
            spec.holder_identity = Some(self.node.name.clone());
            spec.lease_duration_seconds = Some(self.config().node_lease_duration.as_secs() as i32);
            spec.renew_time = Some(MicroTime(self.shared.clock.now()));
            let permit = self.shared.heartbeats.acquire().await;
            let result = api
                .replace(&self.node.name, &PostParams::default(), &lease)
                .await;
            drop(permit);
            match result {
                Ok(l) => {
                    bump(&self.shared.counters.lease_renewals);
                    return Some(l);
                }
                Err(e) => {
                    bump(&self.shared.counters.lease_errors);
                    tracing::debug!(error = %e, "lease update failed");
                    if status_err(&e) == Some(409) {
                        base = self.backoff_ensure_lease().await?.0;
                    } else if status_err(&e) == Some(404) {
                        // Deleted: recreate it (the caller's ensure step).
                        return None;
                    }
                }
            }
        }
        None
    }

    /// `backoffEnsureLease`: GET, or create on NotFound, retried with waits of 200 ms
    /// doubling to 7 s. None when heartbeats stop or on shutdown.
    async fn backoff_ensure_lease(&mut self) -> Option<(Lease, bool)> {
        let mut backoff = LEASE_BACKOFF_START;
        loop {
            if self.shared.heartbeat_stopped(&self.node) {
                return None;
            }
            let permit = self.shared.heartbeats.acquire().await;
            let result = self.ensure_lease().await;
            drop(permit);
            match result {
                Ok(r) => return Some(r),
                Err(e) => {
                    bump(&self.shared.counters.lease_errors);
                    tracing::warn!(error = %e, retry_in = ?backoff, "failed to ensure lease exists, will retry");
                }
            }
            if !self.wait(backoff).await {
                return None;
            }
            backoff = (backoff * 2).min(LEASE_BACKOFF_MAX);
        }
    }

    /// `ensureLease`: GET, or create with an ownerReference to the Node.
    async fn ensure_lease(&self) -> Result<(Lease, bool), kube::Error> {
        let api = self.lease_api();
        if let Some(l) = api.get_opt(&self.node.name).await? {
            return Ok((l, false));
        }
        // SetNodeOwnerFunc: the owner must exist; without it the create is skipped.
        let nodes: Api<Node> = Api::all(self.shared.client_for(&self.node.name));
        let node = nodes.get(&self.node.name).await?;
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.node.name.clone()),
                namespace: Some(LEASE_NAMESPACE.into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.node.name.clone(),
                    uid: node.metadata.uid.unwrap_or_default(),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.node.name.clone()),
                lease_duration_seconds: Some(self.config().node_lease_duration.as_secs() as i32),
                renew_time: Some(MicroTime(self.shared.clock.now())),
                ..Default::default()
            }),
        };
        let created = api.create(&PostParams::default(), &lease).await?;
        bump(&self.shared.counters.lease_creates);
        Ok((created, true))
    }

    /// Every `node_status_update_frequency`: post status if it differs from what the API
    /// shows, or if `node_status_report_frequency` has passed since the last post.
    async fn sync_status(&mut self) {
        let (shutting_down, observed) = {
            let c = self.node.ctl.lock();
            (c.shutting_down, c.observed_conditions.clone())
        };
        let disk_pressure = self.node.eviction.lock().disk_pressure;
        let now = self.shared.clock.now();
        if shutting_down != self.last_ready_shutting_down {
            self.ready_since = now;
            self.last_ready_shutting_down = shutting_down;
        }
        // Where the API shows another status (e.g. Unknown, set by the node lifecycle
        // controller), posting ours is a transition, as in kubelet's setters.
        let differs = |d: &NodeCondition| {
            observed
                .as_ref()
                .is_some_and(|obs| !obs.iter().any(|(t, s)| *t == d.type_ && *s == d.status))
        };
        let draft = conditions(
            now,
            self.since,
            self.ready_since,
            shutting_down,
            disk_pressure,
        );
        let changed = draft.iter().any(differs);
        if draft.iter().any(|d| d.type_ == "Ready" && differs(d)) {
            self.ready_since = now;
        }
        if draft.iter().any(|d| d.type_ != "Ready" && differs(d)) {
            self.since = now;
        }
        let desired = conditions(
            now,
            self.since,
            self.ready_since,
            shutting_down,
            disk_pressure,
        );
        let due = self.last_status_post.elapsed() >= self.config().node_status_report_frequency;
        let image_gc = &self.node.config.image_gc;
        let images = image_gc.enabled.then(|| {
            let store = self.node.images.lock();
            (
                store.version(),
                store.status_images(image_gc.node_status_max_images),
            )
        });
        let images_changed = images
            .as_ref()
            .is_some_and(|(v, _)| *v != self.last_images_version);
        if !changed && !due && !images_changed {
            return;
        }
        let mut patch = json!({"conditions": desired});
        if let Some((_, list)) = &images {
            patch["images"] = json!(list);
        }
        let permit = self.shared.heartbeats.acquire().await;
        let posted = post_status_value(&self.shared, &self.node.name, patch).await;
        drop(permit);
        if posted {
            self.last_status_post = Instant::now();
            if let Some((v, _)) = images {
                self.last_images_version = v;
            }
        }
    }
}

/// Posts the node's conditions (strategic merge: other conditions such as
/// NetworkUnavailable are kept).
pub(super) async fn post_status(
    shared: &Shared,
    node: &str,
    conditions: Vec<NodeCondition>,
) -> bool {
    post_status_value(shared, node, json!({"conditions": conditions})).await
}

/// Posts `status` (strategic merge).
pub(super) async fn post_status_value(shared: &Shared, node: &str, status: Value) -> bool {
    let api: Api<Node> = Api::all(shared.client_for(node));
    let mut patch = json!({ "status": status });
    if let Some(endpoints) = kubelet_api::daemon_endpoints(shared, node) {
        patch["status"]["daemonEndpoints"] = endpoints;
    }
    match api
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => {
            bump(&shared.counters.status_posts);
            true
        }
        Err(e) => {
            tracing::warn!(node, error = %e, "node status post failed");
            false
        }
    }
}
