//! The EndpointSlice mirroring controller: the Endpoints of a Service without a selector
//! (written by their user) mirrored as EndpointSlices, so slice readers see them too.
//!
//! # What upstream does (`pkg/controller/endpointslicemirroring`)
//!
//! - An Endpoints is mirrored when its Service exists and has no selector, and it does not
//!   carry `endpointslice.kubernetes.io/skip-mirror: "true"`.
//! - Each subset's `addresses` become ready endpoints and its `notReadyAddresses`
//!   unready ones (`ready` and `serving` false), with their `nodeName`, `hostname` and
//!   `targetRef`; the subset's ports are the slice's; addresses are split by address type,
//!   at most 1000 per subset and 100 per slice.
//! - Slices are labelled `kubernetes.io/service-name` and
//!   `endpointslice.kubernetes.io/managed-by: endpointslicemirroring-controller.k8s.io`
//!   (plus the Endpoints' labels) and owned by the Endpoints.
//!
//! # Where we differ
//!
//! - Slices are refilled in order, as in [`crate::endpointslice`].

use std::{net::IpAddr, time::Duration};

use async_trait::async_trait;
use k8s_openapi::{
    api::{
        core::v1::{Endpoints, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{
    endpoints::SKIP_MIRROR_LABEL,
    endpointslice::{
        DesiredSlice, MAX_ENDPOINTS_PER_SLICE, SliceOwner, SliceTracker, selector_of, slice_key,
        slices_of, write_slices,
    },
    workload::{drive, key_of, watch},
};

/// This controller's value of `endpointslice.kubernetes.io/managed-by`.
pub const MANAGED_BY: &str = "endpointslicemirroring-controller.k8s.io";
/// Upstream's `--mirroring-max-endpoints-per-subset`.
pub const MAX_ENDPOINTS_PER_SUBSET: usize = 1000;

/// The EndpointSlice mirroring controller.
pub struct EndpointSliceMirroringController {
    client: Client,
}

impl std::fmt::Debug for EndpointSliceMirroringController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointSliceMirroringController")
            .finish_non_exhaustive()
    }
}

impl EndpointSliceMirroringController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (services, service_events) = watch(Api::<Service>::all(self.client.clone()), |s| {
            vec![key_of(s)]
        });
        let (endpoints, endpoints_events) =
            watch(Api::<Endpoints>::all(self.client.clone()), |e| {
                vec![key_of(e)]
            });
        let (slices, slice_events) = watch(Api::<EndpointSlice>::all(self.client.clone()), |s| {
            slice_key(s, MANAGED_BY)
        });
        let sync = Sync {
            client: self.client,
            services,
            endpoints,
            slices,
            tracker: SliceTracker::default(),
        };
        drive(
            sync,
            vec![service_events, endpoints_events, slice_events],
            shutdown,
        )
        .await;
    }
}

struct Sync {
    client: Client,
    services: Store<Service>,
    endpoints: Store<Endpoints>,
    slices: Store<EndpointSlice>,
    tracker: SliceTracker,
}

/// The slices mirroring `endpoints`.
fn mirrored(endpoints: &Endpoints) -> Vec<DesiredSlice> {
    let mut out = Vec::new();
    for subset in endpoints.subsets.as_deref().unwrap_or_default() {
        let ports: Vec<Value> = subset
            .ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|p| {
                let mut v = json!({
                    "name": p.name.clone().unwrap_or_default(),
                    "port": p.port,
                    "protocol": p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                });
                if let Some(a) = &p.app_protocol {
                    v["appProtocol"] = json!(a);
                }
                v
            })
            .collect();
        let mut by_family: [(String, Vec<Value>); 2] =
            [("IPv4".into(), Vec::new()), ("IPv6".into(), Vec::new())];
        let addresses = subset
            .addresses
            .iter()
            .flatten()
            .map(|a| (a, true))
            .chain(
                subset
                    .not_ready_addresses
                    .iter()
                    .flatten()
                    .map(|a| (a, false)),
            )
            .take(MAX_ENDPOINTS_PER_SUBSET);
        for (a, ready) in addresses {
            let Ok(ip) = a.ip.parse::<IpAddr>() else {
                continue;
            };
            let mut e = json!({
                "addresses": [ip.to_string()],
                "conditions": {"ready": ready, "serving": ready, "terminating": false},
            });
            if let Some(n) = &a.node_name {
                e["nodeName"] = json!(n);
            }
            if let Some(h) = &a.hostname {
                e["hostname"] = json!(h);
            }
            if let Some(r) = &a.target_ref {
                e["targetRef"] = serde_json::to_value(r).unwrap_or_default();
            }
            by_family[usize::from(ip.is_ipv6())].1.push(e);
        }
        for (family, endpoints) in by_family {
            for chunk in endpoints.chunks(MAX_ENDPOINTS_PER_SLICE) {
                out.push(DesiredSlice {
                    address_type: family.clone(),
                    ports: ports.clone(),
                    endpoints: chunk.to_vec(),
                });
            }
        }
    }
    out
}

#[async_trait]
impl super::workload::Reconcile for Sync {
    fn name(&self) -> &'static str {
        "endpointslice-mirroring"
    }

    async fn reconcile(&mut self, key: &str) -> Result<Option<Duration>, kube::Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let existing = slices_of(&self.slices, ns, name, MANAGED_BY);
        let endpoints = self.endpoints.get(&ObjectRef::new(name).within(ns));
        let service = self.services.get(&ObjectRef::new(name).within(ns));
        let mirror = match (&endpoints, &service) {
            (Some(e), Some(s)) => {
                selector_of(s).is_none()
                    && e.labels().get(SKIP_MIRROR_LABEL).map(String::as_str) != Some("true")
            }
            _ => false,
        };
        let desired = match (&endpoints, mirror) {
            (Some(e), true) => mirrored(e),
            _ => Vec::new(),
        };
        if desired.is_empty() && existing.is_empty() {
            self.tracker.forget(key);
            return Ok(None);
        }
        if self.tracker.stale(key, &existing) {
            return Ok(Some(Duration::from_millis(100)));
        }
        let (owner, labels) = match &endpoints {
            Some(e) => (
                OwnerReference {
                    api_version: "v1".into(),
                    kind: "Endpoints".into(),
                    name: e.name_any(),
                    uid: e.uid().unwrap_or_default(),
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                },
                e.labels().clone(),
            ),
            None => (OwnerReference::default(), Default::default()),
        };
        let owner = SliceOwner {
            namespace: ns,
            service: name,
            owner,
            managed_by: MANAGED_BY,
            labels,
        };
        let mut written = Vec::new();
        let result = write_slices(&self.client, &owner, desired, existing, &mut written).await;
        self.tracker.wrote(key, written);
        match result {
            Ok(()) => Ok(None),
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                Ok(Some(Duration::from_millis(200)))
            }
            Err(e) => Err(e),
        }
    }
}
