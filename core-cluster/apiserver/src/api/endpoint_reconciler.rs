//! kube-apiserver's endpoint reconciler (`pkg/controlplane/reconcilers`, the `lease`
//! reconciler with one server): the `default/kubernetes` Service's Endpoints and
//! EndpointSlice name the API server's address and secure port, checked every 10 s
//! (`--endpoint-reconciler-type`'s interval) and rewritten only when they differ.
//!
//! Upstream's Endpoints carry `endpointslice.kubernetes.io/skip-mirror: "true"` (the
//! server writes the slice itself) and its port is named `https`; the slice is named
//! `kubernetes` and labelled `kubernetes.io/service-name: kubernetes`.
//!
//! Where we differ: one server, so no master leases are kept (several servers over one
//! store would each write their own address).

use std::{net::IpAddr, time::Duration};

use serde_json::{Value, json};

use super::{ApiServer, handlers, status::ApiError};
use crate::storage::{ObjectKey, WriteContext};

/// How often the endpoints are checked (upstream `EndpointInterval`).
pub const ENDPOINT_INTERVAL: Duration = Duration::from_secs(10);

/// The `default/kubernetes` Endpoints for the server at `ip:port`.
fn endpoints(ip: IpAddr, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": [{"addresses": [{"ip": ip.to_string()}],
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    })
}

/// The `default/kubernetes` EndpointSlice for the server at `ip:port`.
fn slice(ip: IpAddr, port: u16) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": if ip.is_ipv4() { "IPv4" } else { "IPv6" },
        "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    })
}

impl ApiServer {
    /// Writes the `default/kubernetes` Endpoints and EndpointSlice for a server reached at
    /// `ip:port` where they differ (see the [module docs](self)).
    pub async fn reconcile_kubernetes_endpoints(
        &self,
        ip: IpAddr,
        port: u16,
    ) -> Result<(), ApiError> {
        let reader = self.state.storage.reader();
        for (group, plural, want, fields) in [
            ("", "endpoints", endpoints(ip, port), &["subsets"][..]),
            (
                "discovery.k8s.io",
                "endpointslices",
                slice(ip, port),
                &["addressType", "endpoints", "ports"][..],
            ),
        ] {
            let def = self.def(group, plural);
            let ctx = WriteContext::server();
            match reader.get(def, Some("default"), "kubernetes").await {
                Ok(current) => {
                    let labels_ok = want["metadata"]["labels"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .all(|(k, v)| current["metadata"]["labels"][k] == *v);
                    if labels_ok && fields.iter().all(|f| current[*f] == want[*f]) {
                        continue;
                    }
                    let mut updated = current.clone();
                    for f in fields {
                        updated[*f] = want[*f].clone();
                    }
                    updated["metadata"]["labels"] = want["metadata"]["labels"].clone();
                    let key = ObjectKey::new(def, Some("default"), "kubernetes");
                    handlers::update_object(&self.state, &ctx, key, None, updated).await?;
                }
                Err(e) if e.code == 404 => {
                    match handlers::create_object(&self.state, &ctx, def, Some("default"), want)
                        .await
                    {
                        Ok(_) => {}
                        Err(e) if e.reason == "AlreadyExists" => {}
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Keeps the `default/kubernetes` endpoints naming `ip:port` every
    /// [`ENDPOINT_INTERVAL`] until `shutdown`.
    pub fn spawn_endpoint_reconciler(
        &self,
        ip: IpAddr,
        port: u16,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let server = self.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(ENDPOINT_INTERVAL);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = ticker.tick() => {}
                }
                if let Err(e) = server.reconcile_kubernetes_endpoints(ip, port).await {
                    tracing::warn!(error = %e, "reconciling the kubernetes Service's endpoints failed");
                }
            }
        })
    }
}
