//! The cloud-controller-manager under its RBAC, as deployed: the identity
//! `system:serviceaccount:kube-system:cloud-controller-manager`, bound by the roles and
//! bindings of `deploy/rbac-common.yaml` and `deploy/rbac/least-privilege.yaml` (embedded
//! here, not rewritten) and nothing more, against an API server enforcing Node,RBAC; each
//! simulated kubelet acts as its own node (`system:node:<name>`). `ccm-bin/tests/it/deploy.rs`
//! checks the roles statically and applies deploy/ to a `ccm apiserver`; this proves the
//! least-privilege role at run time in process.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use cloud_provider::well_known::TAINT_UNINITIALIZED;
use cloud_provider_app::HealthChecks;
use cloud_provider_fake::{FakeCloud, FakeInstance};
use core_cluster::auth::{node::node_user, rbac::service_account_user};
use core_cluster::controllers::node_ipam::{NodeIpamConfig, NodeIpamController};
use core_cluster::sim::{NodeSimulator, SimConfig, SimNode};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use kube::api::{ListParams, PostParams};
use parking_lot::Mutex;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use crate::ccm::ccm_options;

/// The ServiceAccount, the shared RBAC and the least-privilege role, as deployed.
const MANIFESTS: [&str; 3] = [
    include_str!("../../deploy/ccm-daemonset.yaml"),
    include_str!("../../deploy/rbac-common.yaml"),
    include_str!("../../deploy/rbac/least-privilege.yaml"),
];
/// The kinds of the manifests that make the ccm's RBAC.
const RBAC_KINDS: [&str; 5] = [
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
];
const ROLE: &str = "cloud-controller-manager:least-privilege";
const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// The 403 messages the ccm got.
type Denials = Arc<Mutex<Vec<String>>>;

async fn record_denials(State(denials): State<Denials>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if response.status() != axum::http::StatusCode::FORBIDDEN {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let status: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    denials
        .lock()
        .push(status["message"].as_str().unwrap_or("").to_owned());
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

struct Secured {
    admin: kube::Client,
    denials: Denials,
    stop: CancellationToken,
}

impl Drop for Secured {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A secured cluster with three kubelets under their node identities, the manifest's RBAC
/// installed (then `edit_role` applied to the ClusterRole), and the ccm running as its
/// service account.
async fn start(edit_role: impl FnOnce(&mut serde_json::Value)) -> Secured {
    let server = ccm_testkit::memory_server().await;
    let mut installed = 0;
    for manifest in MANIFESTS {
        installed += server
            .apply_manifest(manifest, &RBAC_KINDS)
            .await
            .expect("the manifest's RBAC installs");
    }
    // The ServiceAccount, four roles with their bindings, the ClusterRole and its binding.
    assert_eq!(installed, 11);
    let admin = kube::Client::new(server.router(), "default");
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let mut role = serde_json::to_value(roles.get(ROLE).await.unwrap()).unwrap();
    edit_role(&mut role);
    roles
        .replace(
            ROLE,
            &PostParams::default(),
            &serde_json::from_value(role).unwrap(),
        )
        .await
        .unwrap();

    let stop = CancellationToken::new();
    let ipam = NodeIpamController::new(
        admin.clone(),
        NodeIpamConfig {
            allocate_node_cidrs: true,
            cluster_cidrs: vec![CLUSTER_CIDR.parse().unwrap()],
            ..NodeIpamConfig::default()
        },
    )
    .expect("valid IPAM config");
    tokio::spawn(ipam.run(stop.clone()));

    let instances: Vec<FakeInstance> = (0..3)
        .map(|i| {
            FakeInstance::new(format!("i-{i}"), format!("node-{i}"))
                .in_zone("zone-a", "region-1")
                .with_internal_ip([10, 0, 0, 10 + i as u8].into())
        })
        .collect();
    let cloud = FakeCloud::builder().instances(instances.clone()).build();
    let per_node = server.clone();
    let sim = NodeSimulator::new(
        admin.clone(),
        SimConfig::default().external_cloud_provider(),
    )
    .with_node_clients(Arc::new(move |name: &str| {
        kube::Client::new(per_node.router_as(node_user(name)), "default")
    }));
    sim.add_nodes(instances.iter().enumerate().map(|(i, instance)| {
        SimNode::new(instance.name.clone())
            .zone("zone-a")
            .ip([10, 0, 0, 10 + i as u8].into())
    }));
    tokio::spawn({
        let stop = stop.clone();
        async move { sim.run(stop).await.expect("simulator runs") }
    });

    let denials = Denials::default();
    let ccm_router = server
        .router_as(service_account_user(
            "kube-system",
            "cloud-controller-manager",
        ))
        .layer(axum::middleware::from_fn_with_state(
            denials.clone(),
            record_denials,
        ));
    tokio::spawn(cloud_provider_app::run_with(
        ccm_options(),
        cloud_provider_app::default_registry(),
        Arc::new(cloud),
        kube::Client::new(ccm_router, "default"),
        stop.child_token(),
        HealthChecks::new(),
    ));
    Secured {
        admin,
        denials,
        stop,
    }
}

async fn create_lb(admin: &kube::Client) {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
}

async fn nodes_initialized(admin: &kube::Client) -> bool {
    let nodes = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    nodes.len() == 3
        && nodes.iter().all(|n| {
            let spec = n.spec.clone().unwrap_or_default();
            spec.provider_id.is_some_and(|p| !p.is_empty())
                && !spec
                    .taints
                    .unwrap_or_default()
                    .iter()
                    .any(|t| t.key == TAINT_UNINITIALIZED)
        })
}

async fn lb_ingress(admin: &kube::Client) -> bool {
    let svc = Api::<Service>::namespaced(admin.clone(), "default")
        .get("web")
        .await
        .unwrap();
    svc.status
        .and_then(|s| s.load_balancer)
        .and_then(|lb| lb.ingress)
        .is_some_and(|i| !i.is_empty())
}

/// The least-privilege role is sufficient: under it, and nothing more, the ccm initializes
/// every node and ensures the load balancer, and is never refused.
#[tokio::test(start_paused = true)]
async fn ccm_under_its_cluster_role_initializes_nodes_and_load_balancers() {
    let cluster = start(|_| {}).await;
    create_lb(&cluster.admin).await;
    let mut done = false;
    for _ in 0..120 {
        if nodes_initialized(&cluster.admin).await && lb_ingress(&cluster.admin).await {
            done = true;
            break;
        }
        sleep(Duration::from_secs(1)).await;
    }
    assert!(done, "not converged; 403s: {:?}", cluster.denials.lock());
    assert_eq!(*cluster.denials.lock(), Vec::<String>::new());
}

/// Without `patch`/`update` on `services/status` the ccm cannot publish the load balancer:
/// it gets upstream's 403 naming the verb and the subresource, and the Service stays
/// without ingress.
#[tokio::test(start_paused = true)]
async fn ccm_without_a_verb_gets_a_clear_403() {
    let cluster = start(|role| {
        let rules = role["rules"].as_array_mut().unwrap();
        let before = rules.len();
        rules.retain(|r| r["resources"] != serde_json::json!(["services/status"]));
        assert_eq!(
            rules.len(),
            before - 1,
            "the manifest has a services/status rule"
        );
    })
    .await;
    create_lb(&cluster.admin).await;
    let mut seen = None;
    for _ in 0..120 {
        seen = cluster
            .denials
            .lock()
            .iter()
            .find(|m| m.contains("services/status"))
            .cloned();
        if seen.is_some() {
            break;
        }
        sleep(Duration::from_secs(1)).await;
    }
    let message = seen.expect("a 403 on services/status");
    let prefix = r#"services "web" is forbidden: User "system:serviceaccount:kube-system:cloud-controller-manager" cannot "#;
    assert!(message.starts_with(prefix), "{message}");
    assert!(
        message
            .ends_with(r#" resource "services/status" in API group "" in the namespace "default""#),
        "{message}"
    );
    assert!(nodes_initialized(&cluster.admin).await);
    assert!(!lb_ingress(&cluster.admin).await);
}
