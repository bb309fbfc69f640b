//! The EndpointSlice controller: the endpoints of every Service with a selector, as
//! EndpointSlices of at most 100 endpoints each, per address family.
//!
//! # What upstream does (`pkg/controller/endpointslice`, `staging/src/k8s.io/endpointslice`)
//!
//! - The pods of a Service are those of its namespace its selector selects; a pod is an
//!   endpoint once it has an IP and while it is not terminal (`ShouldPodBeInEndpoints` with
//!   terminating pods included).
//! - One slice family per address type of the Service's `ipFamilies` (IPv4 and/or IPv6),
//!   holding the pod IPs of that family; endpoints whose target ports resolve alike share
//!   slices (a named `targetPort` is looked up among the pod's container ports, and a port
//!   a pod does not have is left out for it); at most `maxEndpointsPerSlice` (100) each.
//! - Each endpoint: `addresses`, `conditions` (`ready` = Ready and not terminating,
//!   `serving` = Ready, `terminating` = being deleted; with `publishNotReadyAddresses` ready
//!   and serving are always true), `nodeName`, `zone` (the node's
//!   `topology.kubernetes.io/zone`), `targetRef` to the pod, `hostname` when the pod's
//!   `subdomain` is the Service, and `hints.forZones` (its own zone) when the Service asks
//!   for `trafficDistribution: PreferClose`.
//! - Slices are named `<service>-<random>`, labelled `kubernetes.io/service-name` and
//!   `endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io` (plus the
//!   Service's labels), and owned by the Service (controller, blocking deletion), so the
//!   garbage collector removes them with it.
//!
//! # Where we differ
//!
//! - Slices are refilled in order (pods sorted by name) rather than by upstream's
//!   placement that minimises changed slices; an unchanged slice is never written.
//! - A Service is not synced while the slice cache lags this controller's own writes
//!   (upstream's `EndpointSliceTracker.StaleSlices`), so a stale cache never makes it
//!   create a slice twice; no trigger-time annotation, no metrics but the write counter
//!   [`SLICE_WRITES`].

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use async_trait::async_trait;
use k8s_openapi::{
    api::{
        core::v1::{Node, Pod, Service, ServicePort},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::{apis::meta::v1::OwnerReference, util::intstr::IntOrString},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, PostParams},
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::workload::{controller_ref, drive, is_ready, key_of, select, watch};

/// Upstream's default `--max-endpoints-per-slice`.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// The `kubernetes.io/service-name` label.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The `endpointslice.kubernetes.io/managed-by` label.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// This controller's value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";

/// EndpointSlice writes (creates, updates, deletes) by this process's slice controllers.
pub static SLICE_WRITES: AtomicU64 = AtomicU64::new(0);

/// The EndpointSlice controller.
pub struct EndpointSliceController {
    client: Client,
}

impl std::fmt::Debug for EndpointSliceController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointSliceController")
            .finish_non_exhaustive()
    }
}

/// The Service's selector when it has one (an empty one counts as none, as the stored
/// form of upstream has no empty map).
pub(crate) fn selector_of(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
}

/// Whether `selector` selects `labels` (a Service's equality selector).
pub(crate) fn selects(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The keys of the Services of `pod`'s namespace whose selector selects it.
pub(crate) fn services_of(services: &Store<Service>, pod: &Pod) -> Vec<String> {
    let ns = pod.namespace();
    services
        .state()
        .iter()
        .filter(|s| s.namespace() == ns)
        .filter(|s| selector_of(s).is_some_and(|sel| selects(sel, pod.labels())))
        .map(|s| key_of(&**s))
        .collect()
}

/// Upstream `ShouldPodBeInEndpoints`: an IP, not terminal, and not terminating unless
/// `include_terminating`.
pub(crate) fn should_be_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    let status = pod.status.as_ref();
    let has_ip = status
        .and_then(|s| s.pod_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty());
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
    has_ip
        && !matches!(phase, "Succeeded" | "Failed")
        && (include_terminating || pod.metadata.deletion_timestamp.is_none())
}

/// The pod's IPs (`podIPs`, else `podIP`).
pub(crate) fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if ips.is_empty()
        && let Some(ip) = status.pod_ip.as_deref().and_then(|ip| ip.parse().ok())
    {
        ips.push(ip);
    }
    ips
}

/// Upstream `podutil.FindPort`: the port a Service port targets on `pod`.
pub(crate) fn find_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    let protocol = port.protocol.as_deref().unwrap_or("TCP");
    match &port.target_port {
        Some(IntOrString::String(name)) => pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.as_deref().unwrap_or_default())
            .find(|p| {
                p.name.as_deref() == Some(name.as_str())
                    && p.protocol.as_deref().unwrap_or("TCP") == protocol
            })
            .map(|p| p.container_port),
        Some(IntOrString::Int(n)) if *n != 0 => Some(*n),
        _ => Some(port.port),
    }
}

/// The `ports` of a slice or subset for `pod` (its resolved target ports).
fn endpoint_ports(svc: &Service, pod: &Pod) -> Vec<Value> {
    let ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    ports
        .iter()
        .filter_map(|p| {
            let number = find_port(pod, p)?;
            let mut v = json!({
                "name": p.name.clone().unwrap_or_default(),
                "port": number,
                "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            });
            if let Some(app) = &p.app_protocol {
                v["appProtocol"] = json!(app);
            }
            Some(v)
        })
        .collect()
}

/// One desired slice: its address type, ports and endpoints.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DesiredSlice {
    pub(crate) address_type: String,
    pub(crate) ports: Vec<Value>,
    pub(crate) endpoints: Vec<Value>,
}

/// The Service's endpoints grouped into slices (see the module docs).
fn desired_slices(svc: &Service, pods: &[Arc<Pod>], nodes: &Store<Node>) -> Vec<DesiredSlice> {
    let spec = svc.spec.clone().unwrap_or_default();
    let families = spec
        .ip_families
        .clone()
        .unwrap_or_else(|| vec!["IPv4".into()]);
    let publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    let prefer_close = spec.traffic_distribution.as_deref() == Some("PreferClose");
    let svc_name = svc.name_any();
    let mut groups: BTreeMap<(String, String), (Vec<Value>, Vec<Value>)> = BTreeMap::new();
    let mut pods: Vec<&Arc<Pod>> = pods.iter().collect();
    pods.sort_by_key(|p| p.name_any());
    for pod in pods {
        if !should_be_in_endpoints(pod, true) {
            continue;
        }
        let ports = endpoint_ports(svc, pod);
        let ready = is_ready(pod);
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let zone = node_name
            .as_deref()
            .and_then(|n| nodes.get(&ObjectRef::new(n)))
            .and_then(|n| n.labels().get("topology.kubernetes.io/zone").cloned());
        for ip in pod_ips(pod) {
            let family = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
            if !families.iter().any(|f| f == family) {
                continue;
            }
            let mut endpoint = json!({
                "addresses": [ip.to_string()],
                "conditions": {
                    "ready": publish_not_ready || (ready && !terminating),
                    "serving": publish_not_ready || ready,
                    "terminating": terminating,
                },
                "targetRef": {
                    "kind": "Pod",
                    "namespace": pod.namespace().unwrap_or_default(),
                    "name": pod.name_any(),
                    "uid": pod.uid().unwrap_or_default(),
                },
            });
            if let Some(n) = &node_name {
                endpoint["nodeName"] = json!(n);
            }
            if let Some(z) = &zone {
                endpoint["zone"] = json!(z);
                if prefer_close {
                    endpoint["hints"] = json!({"forZones": [{"name": z}]});
                }
            }
            if let Some(spec) = pod.spec.as_ref()
                && spec.subdomain.as_deref() == Some(svc_name.as_str())
                && let Some(h) = &spec.hostname
            {
                endpoint["hostname"] = json!(h);
            }
            let group_key = (
                family.to_owned(),
                serde_json::to_string(&ports).unwrap_or_default(),
            );
            let group = groups
                .entry(group_key)
                .or_insert_with(|| (ports.clone(), Vec::new()));
            group.1.push(endpoint);
        }
    }
    let mut out = Vec::new();
    for ((family, _), (ports, endpoints)) in groups {
        for chunk in endpoints.chunks(MAX_ENDPOINTS_PER_SLICE) {
            out.push(DesiredSlice {
                address_type: family.clone(),
                ports: ports.clone(),
                endpoints: chunk.to_vec(),
            });
        }
    }
    if out.is_empty() {
        // Upstream keeps one empty placeholder slice per Service (of its first family).
        out.push(DesiredSlice {
            address_type: families.first().cloned().unwrap_or_else(|| "IPv4".into()),
            ports: Vec::new(),
            endpoints: Vec::new(),
        });
    }
    out
}

/// How long a Service waits for its slice cache to show this controller's writes before
/// syncing anyway (someone else deleted or rewrote the slice meanwhile).
const STALE_CACHE_TIMEOUT: Duration = Duration::from_secs(10);

/// The slices a controller wrote and has not yet seen in its cache, per owner key (upstream
/// `staging/src/k8s.io/endpointslice/endpointslice_tracker.go`): a slice created or
/// updated, with the resourceVersion written; a slice deleted, with `None`.
#[derive(Debug, Default)]
pub(crate) struct SliceTracker {
    expected: HashMap<String, (HashMap<String, Option<u64>>, tokio::time::Instant)>,
}

impl SliceTracker {
    /// Upstream `StaleSlices`: whether `cached` (the owner's slices in the cache) lags a
    /// write of this controller. What the cache shows is forgotten.
    pub(crate) fn stale(&mut self, key: &str, cached: &[Arc<EndpointSlice>]) -> bool {
        let Some((expected, since)) = self.expected.get_mut(key) else {
            return false;
        };
        expected.retain(|name, written| {
            let seen = cached.iter().find(|s| s.name_any() == *name);
            match (written, seen) {
                (Some(rv), Some(s)) => rv_of(s).is_some_and(|cached| cached < *rv),
                (Some(_), None) | (None, Some(_)) => true,
                (None, None) => false,
            }
        });
        if expected.is_empty() || since.elapsed() >= STALE_CACHE_TIMEOUT {
            self.expected.remove(key);
            return false;
        }
        true
    }

    /// Records what `write_slices` wrote for `key`.
    pub(crate) fn wrote(&mut self, key: &str, written: Vec<(String, Option<u64>)>) {
        if written.is_empty() {
            return;
        }
        let entry = self
            .expected
            .entry(key.to_owned())
            .or_insert_with(|| (HashMap::new(), tokio::time::Instant::now()));
        entry.1 = tokio::time::Instant::now();
        entry.0.extend(written);
    }

    /// Forgets `key` (its owner is gone).
    pub(crate) fn forget(&mut self, key: &str) {
        self.expected.remove(key);
    }
}

/// A slice's resourceVersion as a number (the store's are), for ordering.
fn rv_of(slice: &EndpointSlice) -> Option<u64> {
    slice.resource_version()?.parse().ok()
}

/// What writing the desired slices of one owner takes: who owns them, how they are
/// labelled.
pub(crate) struct SliceOwner<'a> {
    pub(crate) namespace: &'a str,
    pub(crate) service: &'a str,
    pub(crate) owner: OwnerReference,
    pub(crate) managed_by: &'static str,
    pub(crate) labels: BTreeMap<String, String>,
}

/// Brings the slices `existing` (those of the owner) to `desired`: unchanged ones are left
/// alone, changed ones updated in place, missing ones created and extra ones deleted. Each
/// write is added to `written` (name, resourceVersion written or `None` when deleted) as
/// it succeeds, for a [`SliceTracker`].
pub(crate) async fn write_slices(
    client: &Client,
    owner: &SliceOwner<'_>,
    desired: Vec<DesiredSlice>,
    mut existing: Vec<Arc<EndpointSlice>>,
    written: &mut Vec<(String, Option<u64>)>,
) -> Result<(), kube::Error> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), owner.namespace);
    existing.sort_by_key(|s| s.name_any());
    let mut labels = owner.labels.clone();
    labels.insert(SERVICE_NAME_LABEL.into(), owner.service.into());
    labels.insert(MANAGED_BY_LABEL.into(), owner.managed_by.into());
    let body = |d: &DesiredSlice, meta: Value| -> Result<EndpointSlice, kube::Error> {
        let mut v = json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": meta,
            "addressType": d.address_type,
            "endpoints": d.endpoints,
            "ports": d.ports,
        });
        v["metadata"]["labels"] = json!(labels);
        v["metadata"]["ownerReferences"] = json!([owner.owner]);
        serde_json::from_value(v).map_err(kube::Error::SerdeError)
    };
    let mut unmatched: Vec<DesiredSlice> = Vec::new();
    for d in desired {
        let want_ports = body(&d, json!({}))?.ports;
        let found = existing
            .iter()
            .position(|s| s.address_type == d.address_type && s.ports == want_ports);
        match found {
            Some(i) => {
                let current = existing.remove(i);
                let want = body(&d, json!({}))?;
                let same = current.endpoints == want.endpoints
                    && current.ports == want.ports
                    && current.labels() == &labels
                    && current.owner_references() == [owner.owner.clone()];
                if !same {
                    let meta = json!({
                        "name": current.name_any(),
                        "namespace": owner.namespace,
                        "resourceVersion": current.resource_version(),
                    });
                    let new = api
                        .replace(
                            &current.name_any(),
                            &PostParams::default(),
                            &body(&d, meta)?,
                        )
                        .await?;
                    SLICE_WRITES.fetch_add(1, Ordering::Relaxed);
                    written.extend(rv_of(&new).map(|rv| (new.name_any(), Some(rv))));
                }
            }
            None => unmatched.push(d),
        }
    }
    // Reuse slices of the wrong shape before creating new ones.
    for d in unmatched {
        if let Some(current) = existing.pop() {
            if current.address_type == d.address_type {
                let meta = json!({
                    "name": current.name_any(),
                    "namespace": owner.namespace,
                    "resourceVersion": current.resource_version(),
                });
                let new = api
                    .replace(
                        &current.name_any(),
                        &PostParams::default(),
                        &body(&d, meta)?,
                    )
                    .await?;
                SLICE_WRITES.fetch_add(1, Ordering::Relaxed);
                written.extend(rv_of(&new).map(|rv| (new.name_any(), Some(rv))));
                continue;
            }
            // The address type is immutable: the slice is replaced.
            delete_slice(&api, &current.name_any()).await?;
            written.push((current.name_any(), None));
        }
        let meta = json!({
            "generateName": format!("{}-", owner.service),
            "namespace": owner.namespace,
        });
        let new = api.create(&PostParams::default(), &body(&d, meta)?).await?;
        SLICE_WRITES.fetch_add(1, Ordering::Relaxed);
        written.extend(rv_of(&new).map(|rv| (new.name_any(), Some(rv))));
    }
    for extra in existing {
        delete_slice(&api, &extra.name_any()).await?;
        written.push((extra.name_any(), None));
    }
    Ok(())
}

async fn delete_slice(api: &Api<EndpointSlice>, name: &str) -> Result<(), kube::Error> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            SLICE_WRITES.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The `namespace/service` key of a slice managed by `managed_by`.
pub(crate) fn slice_key(slice: &EndpointSlice, managed_by: &str) -> Vec<String> {
    let labels = slice.labels();
    match (labels.get(SERVICE_NAME_LABEL), labels.get(MANAGED_BY_LABEL)) {
        (Some(svc), Some(m)) if m == managed_by => {
            vec![format!("{}/{}", slice.namespace().unwrap_or_default(), svc)]
        }
        _ => Vec::new(),
    }
}

/// The slices of `namespace/service` managed by `managed_by`.
pub(crate) fn slices_of(
    slices: &Store<EndpointSlice>,
    ns: &str,
    service: &str,
    managed_by: &str,
) -> Vec<Arc<EndpointSlice>> {
    select(slices, |s| {
        s.namespace().as_deref() == Some(ns)
            && s.labels().get(SERVICE_NAME_LABEL).map(String::as_str) == Some(service)
            && s.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(managed_by)
    })
}

impl EndpointSliceController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (services, service_events) = watch(Api::<Service>::all(self.client.clone()), |s| {
            vec![key_of(s)]
        });
        let of_pod = services.clone();
        let (pods, pod_events) = watch(Api::<Pod>::all(self.client.clone()), move |p| {
            services_of(&of_pod, p)
        });
        let (slices, slice_events) = watch(Api::<EndpointSlice>::all(self.client.clone()), |s| {
            slice_key(s, MANAGED_BY)
        });
        let (nodes, node_events) = watch(Api::<Node>::all(self.client.clone()), |_| Vec::new());
        let sync = Sync {
            client: self.client,
            services,
            pods,
            slices,
            nodes,
            tracker: SliceTracker::default(),
        };
        drive(
            sync,
            vec![service_events, pod_events, slice_events, node_events],
            shutdown,
        )
        .await;
    }
}

struct Sync {
    client: Client,
    services: Store<Service>,
    pods: Store<Pod>,
    slices: Store<EndpointSlice>,
    nodes: Store<Node>,
    tracker: SliceTracker,
}

#[async_trait]
impl super::workload::Reconcile for Sync {
    fn name(&self) -> &'static str {
        "endpointslice"
    }

    async fn reconcile(&mut self, key: &str) -> Result<Option<Duration>, kube::Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let existing = slices_of(&self.slices, ns, name, MANAGED_BY);
        let Some(svc) = self.services.get(&ObjectRef::new(name).within(ns)) else {
            // The garbage collector removes the slices of a deleted Service.
            self.tracker.forget(key);
            return Ok(None);
        };
        if self.tracker.stale(key, &existing) {
            // The slice watch brings our writes, and the key, back.
            return Ok(Some(Duration::from_millis(100)));
        }
        let external = svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName");
        let Some(selector) = selector_of(&svc).filter(|_| !external) else {
            if !existing.is_empty() {
                let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), ns);
                for s in existing {
                    delete_slice(&api, &s.name_any()).await?;
                }
            }
            return Ok(None);
        };
        let pods = select(&self.pods, |p| {
            p.namespace().as_deref() == Some(ns) && selects(selector, p.labels())
        });
        let desired = desired_slices(&svc, &pods, &self.nodes);
        let owner = SliceOwner {
            namespace: ns,
            service: name,
            owner: controller_ref(&*svc),
            managed_by: MANAGED_BY,
            labels: svc.labels().clone(),
        };
        let mut written = Vec::new();
        let result = write_slices(&self.client, &owner, desired, existing, &mut written).await;
        self.tracker.wrote(key, written);
        match result {
            Ok(()) => Ok(None),
            // A stale cache: the slice watch brings the change and the key back.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                Ok(Some(Duration::from_millis(200)))
            }
            Err(e) => Err(e),
        }
    }
}

/// The `targetRef` of a pod's endpoint address.
pub(crate) fn pod_kind_ref(pod: &Pod) -> Value {
    json!({
        "kind": "Pod",
        "namespace": pod.namespace().unwrap_or_default(),
        "name": pod.name_any(),
        "uid": pod.uid().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: &str, ready: bool) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "uid": name, "labels": {"app": "web"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i",
                    "ports": [{"name": "http", "containerPort": 8080}]}]},
                "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
            }))
            .unwrap(),
        )
    }

    fn service(extra: Value) -> Service {
        let mut v = json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"app": "web"}, "ipFamilies": ["IPv4"],
                "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]},
        });
        for (k, val) in extra.as_object().unwrap() {
            v["spec"][k] = val.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    /// `staging/src/k8s.io/endpointslice/utils.go podToEndpoint` and `reconciler.go`: a named
    /// target port resolves to the container port, readiness gives the conditions, and at
    /// most 100 endpoints go in one slice.
    fn cached(name: &str, rv: u64) -> Arc<EndpointSlice> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default", "resourceVersion": rv.to_string()},
                "addressType": "IPv4", "endpoints": [],
            }))
            .unwrap(),
        )
    }

    /// `endpointslice_tracker.go` `StaleSlices`: a Service is stale while the cache lacks a
    /// slice the controller created, shows an older resourceVersion than it wrote, or still
    /// holds one it deleted; fresh once the cache shows every write.
    #[tokio::test(start_paused = true)]
    async fn the_cache_is_stale_until_it_shows_the_controllers_own_writes() {
        let mut tracker = SliceTracker::default();
        assert!(!tracker.stale("default/web", &[]));
        tracker.wrote(
            "default/web",
            vec![("web-a".into(), Some(7)), ("web-old".into(), None)],
        );
        assert!(
            tracker.stale("default/web", &[cached("web-old", 3)]),
            "web-a not seen yet"
        );
        assert!(tracker.stale("default/web", &[cached("web-a", 6), cached("web-old", 3)]));
        assert!(tracker.stale("default/web", &[cached("web-a", 7), cached("web-old", 3)]));
        assert!(!tracker.stale("default/web", &[cached("web-a", 7)]));
        assert!(!tracker.stale("default/web", &[]), "forgotten once seen");
        // A write the cache never shows (the slice was deleted by someone else) is waited
        // for a while only.
        tracker.wrote("default/web", vec![("web-b".into(), Some(9))]);
        assert!(tracker.stale("default/web", &[]));
        tokio::time::advance(STALE_CACHE_TIMEOUT).await;
        assert!(!tracker.stale("default/web", &[]));
    }

    #[test]
    fn pods_become_endpoints_of_at_most_100_per_slice_with_named_ports_resolved() {
        let (store, _) = kube::runtime::reflector::store::<Node>();
        let pods: Vec<Arc<Pod>> = (0..250)
            .map(|i| {
                pod(
                    &format!("p{i:03}"),
                    &format!("10.0.{}.{}", i / 200, i % 200 + 1),
                    i != 0,
                )
            })
            .collect();
        let slices = desired_slices(&service(json!({})), &pods, &store);
        let sizes: Vec<usize> = slices.iter().map(|s| s.endpoints.len()).collect();
        assert_eq!(sizes, [100, 100, 50]);
        assert_eq!(
            slices[0].ports,
            [json!({"name": "http", "port": 8080, "protocol": "TCP"})]
        );
        let first = &slices[0].endpoints[0];
        assert_eq!(
            first["conditions"],
            json!({"ready": false, "serving": false, "terminating": false})
        );
        assert_eq!(slices[0].endpoints[1]["conditions"]["ready"], true);
        assert_eq!(first["targetRef"]["name"], "p000");
        // publishNotReadyAddresses: every endpoint is ready and serving.
        let slices = desired_slices(
            &service(json!({"publishNotReadyAddresses": true})),
            &pods[..1],
            &store,
        );
        assert_eq!(slices[0].endpoints[0]["conditions"]["ready"], true);
    }
}
