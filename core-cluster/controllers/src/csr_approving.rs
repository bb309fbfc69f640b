//! An opt-in approver of kubelet serving certificate requests whose names are the
//! requesting Node's own.
//!
//! # What upstream does
//!
//! Nothing: kube-controller-manager's `csrapproving` controller
//! (`pkg/controller/certificates/approver/sarapprove.go`) approves only kubelet *client*
//! certificates; `kubernetes.io/kubelet-serving` requests wait for an administrator
//! (`kubectl certificate approve`) or a third-party approver such as kubelet-csr-approver,
//! because the API server cannot know that a name in the request is really the node's.
//!
//! # What this does
//!
//! A pending request for `kubernetes.io/kubelet-serving` made by `system:node:<name>` (in
//! `system:nodes`) is approved (reason `AutoApproved`) when its subject is that node
//! (`system:node:<name>`, organization `system:nodes`), its usages those of
//! `ValidateKubeletServingCSR`, and every DNS name and IP it asks for is among the Node's
//! `status.addresses` (or the node's name). Anything else is left for the administrator.
//! The approver must hold `approve` on the signer (`certificates.k8s.io/signers`).

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::{
    certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition},
    core::v1::Node,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, Client,
    api::PostParams,
    runtime::reflector::{ObjectRef, Store},
};
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::{
    csr_signing::{
        KUBELET_SERVING_SIGNER, ParsedRequest, has_true_condition, parse_request,
        validate_kubelet_serving,
    },
    workload::{Reconcile, drive, watch},
};

/// How soon a request whose Node has not registered (or has no addresses yet) is looked
/// at again.
const NODE_WAIT: Duration = Duration::from_secs(2);

/// The approver (see the module's documentation).
pub struct KubeletServingApprover {
    client: Client,
}

impl std::fmt::Debug for KubeletServingApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletServingApprover")
            .finish_non_exhaustive()
    }
}

impl KubeletServingApprover {
    /// An approver acting through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (requests, events) = watch(
            Api::<CertificateSigningRequest>::all(self.client.clone()),
            |c| c.metadata.name.clone().into_iter().collect(),
        );
        let (nodes, node_events) = watch(Api::<Node>::all(self.client.clone()), |_| Vec::new());
        let sync = Sync {
            api: Api::all(self.client),
            requests,
            nodes,
        };
        drive(sync, vec![events, node_events], shutdown).await;
    }
}

struct Sync {
    api: Api<CertificateSigningRequest>,
    requests: Store<CertificateSigningRequest>,
    nodes: Store<Node>,
}

/// Whether every name `req` asks for is one of `node`'s addresses (or its name).
pub fn names_match_node(req: &ParsedRequest, node: &Node) -> bool {
    let name = node.metadata.name.as_deref().unwrap_or("");
    let addresses: Vec<(&str, &str)> = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .map(|a| (a.type_.as_str(), a.address.as_str()))
                .collect()
        })
        .unwrap_or_default();
    let dns_ok = req.dns_names.iter().all(|d| {
        d == name
            || addresses
                .iter()
                .any(|(t, a)| matches!(*t, "Hostname" | "InternalDNS" | "ExternalDNS") && a == d)
    });
    let ip_ok = req.ip_addresses.iter().all(|ip| {
        addresses
            .iter()
            .any(|(t, a)| matches!(*t, "InternalIP" | "ExternalIP") && a.parse().ok() == Some(*ip))
    });
    dns_ok && ip_ok
}

#[async_trait]
impl Reconcile for Sync {
    fn name(&self) -> &'static str {
        "csrapproving-kubelet-serving"
    }

    async fn reconcile(&mut self, name: &str) -> Result<Option<Duration>, kube::Error> {
        let Some(csr) = self.requests.get(&ObjectRef::new(name)) else {
            return Ok(None);
        };
        if csr.spec.signer_name != KUBELET_SERVING_SIGNER
            || has_true_condition(&csr, "Approved")
            || has_true_condition(&csr, "Denied")
        {
            return Ok(None);
        }
        let requester = csr.spec.username.clone().unwrap_or_default();
        let in_nodes = csr
            .spec
            .groups
            .as_ref()
            .is_some_and(|g| g.iter().any(|g| g == "system:nodes"));
        let Some(node_name) = requester.strip_prefix("system:node:").filter(|_| in_nodes) else {
            return Ok(None);
        };
        let usages = csr.spec.usages.clone().unwrap_or_default();
        let Ok(req) = parse_request(&csr.spec.request.0) else {
            return Ok(None);
        };
        if validate_kubelet_serving(&req, &usages, &requester).is_err() {
            return Ok(None);
        }
        let Some(node) = self.nodes.get(&ObjectRef::new(node_name)) else {
            return Ok(Some(NODE_WAIT));
        };
        if !names_match_node(&req, &node) {
            // The Node may not have posted its addresses yet.
            let posted = node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .is_some_and(|a| !a.is_empty());
            return Ok((!posted).then_some(NODE_WAIT));
        }
        let mut approved = (*csr).clone();
        let now = Time(jiff::Timestamp::now());
        approved
            .status
            .get_or_insert_with(Default::default)
            .conditions
            .get_or_insert_with(Vec::new)
            .push(CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                reason: Some("AutoApproved".into()),
                message: Some(
                    "Auto-approving kubelet serving certificate: its names are the Node's addresses"
                        .into(),
                ),
                last_update_time: Some(now.clone()),
                last_transition_time: Some(now),
            });
        match self
            .api
            .replace_subresource("approval", name, &PostParams::default(), &approved)
            .await
        {
            Ok(_) => {
                info!(
                    csr = name,
                    node = node_name,
                    "kubelet serving request approved"
                );
                Ok(None)
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Only names among the Node's addresses (of the matching kind) pass.
    #[test]
    fn a_request_matches_only_the_nodes_own_addresses() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "a"},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.1.0.1"},
                {"type": "Hostname", "address": "a.example"}]}}))
        .unwrap();
        let req = |dns: &[&str], ips: &[&str]| ParsedRequest {
            common_name: "system:node:a".into(),
            organizations: vec!["system:nodes".into()],
            dns_names: dns.iter().map(|s| (*s).to_owned()).collect(),
            ip_addresses: ips.iter().map(|s| s.parse().unwrap()).collect(),
            emails: false,
            uris: false,
            public_key: Vec::new(),
        };
        assert!(names_match_node(
            &req(&["a", "a.example"], &["127.1.0.1"]),
            &node
        ));
        assert!(!names_match_node(&req(&["b"], &[]), &node));
        assert!(!names_match_node(&req(&[], &["127.1.0.2"]), &node));
        // A DNS name is not an IP address's match.
        assert!(!names_match_node(&req(&["127.1.0.1"], &[]), &node));
    }
}
