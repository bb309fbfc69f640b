//! The Endpoints controller: the legacy `core/v1` Endpoints of every Service with a
//! selector.
//!
//! # What upstream does (`pkg/controller/endpoint/endpoints_controller.go`)
//!
//! - The pods its selector selects with an IP, not terminal, and not terminating unless
//!   the Service says `publishNotReadyAddresses`, become addresses: Ready ones (or all,
//!   with `publishNotReadyAddresses`) in `addresses`, the others in `notReadyAddresses`,
//!   each with its `nodeName`, `targetRef` and, when the pod's `subdomain` is the Service,
//!   its `hostname`; the ports are the resolved target ports, and subsets group the
//!   addresses whose ports resolve alike (`RepackSubsets`).
//! - The Endpoints carry the Service's labels plus `endpointslice.kubernetes.io/skip-mirror:
//!   "true"` (the EndpointSlice controller covers the Service already) and, for a headless
//!   Service, `service.kubernetes.io/headless`.
//! - At most 1000 addresses: the rest are dropped and the Endpoints annotated
//!   `endpoints.kubernetes.io/over-capacity: truncated`.
//! - The Endpoints of a Service that is gone are deleted; an unchanged one is not written.
//!
//! # Where we differ
//!
//! - No `endpoints.kubernetes.io/last-change-trigger-time` annotation.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{EndpointSubset, Endpoints, Pod, Service};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, PostParams},
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{
    endpointslice::{
        find_port, pod_ips, selector_of, selects, services_of, should_be_in_endpoints,
    },
    workload::{drive, is_ready, key_of, select, watch},
};

/// Upstream `maxCapacity`: addresses an Endpoints object holds at most.
pub const MAX_ENDPOINTS_CAPACITY: usize = 1000;
/// The label that tells the mirroring controller to leave an Endpoints alone.
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";

/// The Endpoints controller.
pub struct EndpointsController {
    client: Client,
}

impl std::fmt::Debug for EndpointsController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointsController")
            .finish_non_exhaustive()
    }
}

impl EndpointsController {
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
        // Only the Endpoints this controller writes (marked skip-mirror) are put right when
        // changed by others; a selectorless Service's Endpoints are its user's.
        let (endpoints, endpoints_events) =
            watch(Api::<Endpoints>::all(self.client.clone()), |e| {
                if e.labels().contains_key(SKIP_MIRROR_LABEL) {
                    vec![key_of(e)]
                } else {
                    Vec::new()
                }
            });
        let sync = Sync {
            client: self.client,
            services,
            pods,
            endpoints,
        };
        drive(
            sync,
            vec![service_events, pod_events, endpoints_events],
            shutdown,
        )
        .await;
    }
}

struct Sync {
    client: Client,
    services: Store<Service>,
    pods: Store<Pod>,
    endpoints: Store<Endpoints>,
}

/// One subset being built: its ports, ready and not-ready addresses.
type Subset = (Vec<Value>, Vec<Value>, Vec<Value>);

/// The subsets of the Service's Endpoints and whether addresses were truncated.
fn subsets(svc: &Service, pods: &[Arc<Pod>]) -> (Vec<Value>, bool) {
    let spec = svc.spec.clone().unwrap_or_default();
    let publish_not_ready = spec.publish_not_ready_addresses.unwrap_or(false);
    let svc_name = svc.name_any();
    let mut pods: Vec<&Arc<Pod>> = pods.iter().collect();
    pods.sort_by_key(|p| p.name_any());
    // ports (as JSON) → the subset of the addresses with those ports
    let mut groups: BTreeMap<String, Subset> = BTreeMap::new();
    let mut count = 0;
    let mut truncated = false;
    for pod in pods {
        if !should_be_in_endpoints(pod, publish_not_ready) {
            continue;
        }
        let ports: Vec<Value> = spec
            .ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter_map(|p| {
                let port = find_port(pod, p)?;
                let mut v = json!({"port": port, "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into())});
                if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
                    v["name"] = json!(n);
                }
                if let Some(a) = &p.app_protocol {
                    v["appProtocol"] = json!(a);
                }
                Some(v)
            })
            .collect();
        let ready = publish_not_ready || is_ready(pod);
        for ip in pod_ips(pod).into_iter().take(1) {
            if count >= MAX_ENDPOINTS_CAPACITY {
                truncated = true;
                break;
            }
            count += 1;
            let mut address = json!({
                "ip": ip.to_string(),
                "targetRef": super::endpointslice::pod_kind_ref(pod),
            });
            if let Some(n) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
                address["nodeName"] = json!(n);
            }
            if let Some(spec) = pod.spec.as_ref()
                && spec.subdomain.as_deref() == Some(svc_name.as_str())
                && let Some(h) = &spec.hostname
            {
                address["hostname"] = json!(h);
            }
            let key = serde_json::to_string(&ports).unwrap_or_default();
            let group = groups
                .entry(key)
                .or_insert_with(|| (ports.clone(), Vec::new(), Vec::new()));
            if ready {
                group.1.push(address);
            } else {
                group.2.push(address);
            }
        }
    }
    let subsets = groups
        .into_values()
        .map(|(ports, ready, not_ready)| {
            let mut subset = json!({});
            if !ready.is_empty() {
                subset["addresses"] = json!(ready);
            }
            if !not_ready.is_empty() {
                subset["notReadyAddresses"] = json!(not_ready);
            }
            if !ports.is_empty() {
                subset["ports"] = json!(ports);
            }
            subset
        })
        .collect();
    (subsets, truncated)
}

#[async_trait]
impl super::workload::Reconcile for Sync {
    fn name(&self) -> &'static str {
        "endpoints"
    }

    async fn reconcile(&mut self, key: &str) -> Result<Option<Duration>, kube::Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), ns);
        let current = self.endpoints.get(&ObjectRef::new(name).within(ns));
        let Some(svc) = self.services.get(&ObjectRef::new(name).within(ns)) else {
            // The Service is gone: so are its Endpoints.
            if current.is_some() {
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            return Ok(None);
        };
        let Some(selector) = selector_of(&svc) else {
            // Selectorless: the Endpoints are the user's.
            return Ok(None);
        };
        let pods = select(&self.pods, |p| {
            p.namespace().as_deref() == Some(ns) && selects(selector, p.labels())
        });
        let (subsets, truncated) = subsets(&svc, &pods);
        let mut labels = svc.labels().clone();
        labels.insert(SKIP_MIRROR_LABEL.into(), "true".into());
        if svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None") {
            labels.insert("service.kubernetes.io/headless".into(), String::new());
        }
        let mut annotations = current
            .as_ref()
            .map(|c| c.annotations().clone())
            .unwrap_or_default();
        if truncated {
            annotations.insert(
                "endpoints.kubernetes.io/over-capacity".into(),
                "truncated".into(),
            );
        } else {
            annotations.remove("endpoints.kubernetes.io/over-capacity");
        }
        if let Some(c) = &current {
            let want: Vec<EndpointSubset> =
                serde_json::from_value(json!(subsets)).map_err(kube::Error::SerdeError)?;
            let same = c.subsets.clone().unwrap_or_default() == want
                && c.labels() == &labels
                && c.annotations() == &annotations;
            if same {
                return Ok(None);
            }
        }
        let mut body = json!({
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
            "subsets": subsets,
        });
        let result = match &current {
            Some(c) => {
                body["metadata"]["resourceVersion"] = json!(c.resource_version());
                let e: Endpoints = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
                api.replace(name, &PostParams::default(), &e).await
            }
            None => {
                let e: Endpoints = serde_json::from_value(body).map_err(kube::Error::SerdeError)?;
                api.create(&PostParams::default(), &e).await
            }
        };
        match result {
            Ok(_) => Ok(None),
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                Ok(Some(Duration::from_millis(200)))
            }
            Err(e) => Err(e),
        }
    }
}
