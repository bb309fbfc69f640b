//! The provider conformance kit: the providers we ship pass it, and a provider that breaks the
//! contract fails it with a report that says which check and why.

use std::{collections::BTreeSet, sync::Arc};

use async_trait::async_trait;
use cloud_provider::{
    CloudConfig, CloudError, CloudProvider, CloudResult, InstanceMetadata, InstancesV2,
    LoadBalancer, Registry, Route, Routes,
    conformance::{ConformanceKit, Fixture, Outcome},
    node_address,
};
use cloud_provider_fake::{FakeCloud, FakeInstance, Fault, FaultRule, InstanceState, Method};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use parking_lot::Mutex;

fn failed_with(outcome: Option<&Outcome>, needle: &str) -> bool {
    matches!(outcome, Some(Outcome::Failed(why)) if why.contains(needle))
}

#[tokio::test]
async fn the_fake_passes_every_check_with_backends_observed() {
    let cloud = FakeCloud::builder()
        .instance(FakeInstance::new("i-1", "node-1").with_internal_ip("10.0.0.1".parse().unwrap()))
        .instance(FakeInstance::new("i-2", "node-2").with_internal_ip("fd00::2".parse().unwrap()))
        .instance(
            FakeInstance::new("i-3", "node-3")
                .with_internal_ip("10.0.0.3".parse().unwrap())
                .with_state(InstanceState::Stopped),
        )
        .build();
    let fixture = cloud.conformance_fixture("kubernetes");
    let report = ConformanceKit::new(Arc::new(cloud.clone()), fixture)
        .run()
        .await;
    assert!(report.is_success(), "{report}");
    assert!(
        report
            .checks
            .iter()
            .all(|c| c.outcome == Outcome::Passed(None)),
        "every check ran and observed everything:\n{report}"
    );
    assert!(
        report
            .to_string()
            .ends_with("12 passed, 0 failed, 0 skipped"),
        "{report}"
    );
}

#[tokio::test]
async fn the_fake_found_by_name_passes_from_a_config_file() {
    let config = CloudConfig::new(
        "cloud.toml",
        r#"
[[instances]]
id = "i-a"
name = "a"
internal_ips = ["10.1.0.1", "fd00:1::1"]

[[instances]]
id = "i-b"
name = "b"
internal_ips = ["10.1.0.2"]

[[instances]]
id = "i-c"
name = "c"
internal_ips = ["10.1.0.3"]
state = "stopped"
"#,
    );
    let cloud = Registry::global()
        .unwrap()
        .create("fake", Some(&config))
        .unwrap();
    let fixture = Fixture::new("kubernetes")
        .with_running_node(Fixture::node("a", None))
        .with_running_node(Fixture::node("b", Some("fake://i-b")))
        .with_stopped_node(Fixture::node("c", None));
    let report = ConformanceKit::new(cloud, fixture).run().await;
    assert!(report.is_success(), "{report}");
}

#[tokio::test]
async fn the_out_of_tree_hello_provider_passes_what_it_implements() {
    let config = CloudConfig::new("hello.conf", "n1 zone-1 10.0.0.1\nn2 zone-2 10.0.0.2\n");
    let cloud = Registry::global()
        .unwrap()
        .create("hello", Some(&config))
        .unwrap();
    let fixture = Fixture::new("c")
        .with_running_node(Fixture::node("n1", None))
        .with_running_node(Fixture::node("n2", None));
    let report = ConformanceKit::new(cloud, fixture).run().await;
    assert!(report.is_success(), "{report}");
    assert!(
        matches!(report.outcome("routes/round-trip"), Some(Outcome::Skipped(why)) if why == "provider has no Routes"),
        "{report}"
    );
}

#[tokio::test]
async fn cloud_errors_fail_the_checks_that_hit_them_and_nothing_leaks() {
    let cloud = FakeCloud::new();
    let fixture = cloud.conformance_fixture("k");
    cloud.inject(
        FaultRule::always(Fault::Error("no capacity".into())).on(Method::UpdateLoadBalancer),
    );
    cloud.inject(FaultRule::always(Fault::Error("table full".into())).on(Method::ListRoutes));
    let report = ConformanceKit::new(Arc::new(cloud.clone()), fixture)
        .run()
        .await;
    assert!(!report.is_success());
    assert!(
        failed_with(
            report.outcome("load-balancer/update-backends"),
            "no capacity"
        ),
        "{report}"
    );
    assert!(
        failed_with(report.outcome("routes/round-trip"), "table full"),
        "{report}"
    );
    assert_eq!(report.failures().count(), 2, "{report}");
    // The kit cleaned up what it created despite the failures.
    assert!(cloud.load_balancers().is_empty());
    assert!(cloud.routes("k").is_empty(), "{:?}", cloud.routes("k"));
}

/// A provider that breaks one rule of each part of the contract.
#[derive(Default)]
struct Contrarian {
    lbs: Mutex<BTreeSet<String>>,
    routes: Mutex<Vec<Route>>,
}

#[async_trait]
impl InstancesV2 for Contrarian {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        // Breaks the contract: a stopped instance is reported as gone (the Node would be deleted).
        Ok(node.metadata.name.as_deref() == Some("running"))
    }
    async fn instance_shutdown(&self, _node: &Node) -> CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        match node.metadata.name.as_deref() {
            // Breaks the contract: an InternalIP that is not an IP.
            Some("running") => Ok(Some(
                InstanceMetadata::new("contrarian://1")
                    .with_zone("z", "r")
                    .with_addresses(vec![node_address("InternalIP", "10.0.0.300")]),
            )),
            // Wrapped deep inside context: still recognised as InstanceNotFound.
            _ => Err(CloudError::context(
                "describe",
                CloudError::context("lookup", CloudError::InstanceNotFound),
            )),
        }
    }
}

#[async_trait]
impl LoadBalancer for Contrarian {
    async fn get_load_balancer(
        &self,
        _c: &str,
        svc: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let uid = svc.metadata.uid.clone().unwrap_or_default();
        Ok(self
            .lbs
            .lock()
            .contains(&uid)
            .then(|| status("198.51.100.1")))
    }
    async fn ensure_load_balancer(
        &self,
        _c: &str,
        svc: &Service,
        _n: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.lbs
            .lock()
            .insert(svc.metadata.uid.clone().unwrap_or_default());
        // Breaks the contract: the ingress IP is not an IP.
        Ok(status("lb.example.com:80x"))
    }
    async fn update_load_balancer(
        &self,
        _c: &str,
        _s: &Service,
        _n: &[Arc<Node>],
    ) -> CloudResult<()> {
        Ok(())
    }
    async fn ensure_load_balancer_deleted(&self, _c: &str, svc: &Service) -> CloudResult<()> {
        self.lbs
            .lock()
            .remove(svc.metadata.uid.as_deref().unwrap_or_default());
        Ok(())
    }
}

fn status(ip: &str) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            ip: Some(ip.into()),
            ..Default::default()
        }]),
    }
}

#[async_trait]
impl Routes for Contrarian {
    async fn list_routes(&self, _c: &str) -> CloudResult<Vec<Route>> {
        Ok(self.routes.lock().clone())
    }
    async fn create_route(&self, _c: &str, _hint: &str, route: &Route) -> CloudResult<()> {
        // Breaks the contract: the route is recorded with another target.
        self.routes
            .lock()
            .push(Route::new("somewhere-else", route.destination_cidr));
        Ok(())
    }
    async fn delete_route(&self, _c: &str, route: &Route) -> CloudResult<()> {
        self.routes
            .lock()
            .retain(|r| r.destination_cidr != route.destination_cidr);
        Ok(())
    }
}

impl CloudProvider for Contrarian {
    fn provider_name(&self) -> &str {
        "contrarian"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }
    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }
}

#[tokio::test]
async fn a_provider_that_breaks_the_contract_fails_with_reasons() {
    let cloud = Arc::new(Contrarian::default());
    let fixture = Fixture::new("k")
        .with_running_node(Fixture::node("running", None))
        .with_stopped_node(Fixture::node("stopped", None));
    let report = ConformanceKit::new(cloud.clone(), fixture).run().await;
    let text = report.to_string();
    assert!(
        failed_with(
            report.outcome("instances-v2/metadata"),
            "InternalIP address \"10.0.0.300\" is not an IP"
        ),
        "{text}"
    );
    assert!(
        failed_with(
            report.outcome("instances-v2/stopped"),
            "stopped instance reported as absent"
        ),
        "{text}"
    );
    // The wrapped InstanceNotFound is recognised: the unknown-instance check passes.
    assert_eq!(
        report.outcome("instances-v2/unknown"),
        Some(&Outcome::Passed(None)),
        "{text}"
    );
    assert!(
        failed_with(
            report.outcome("load-balancer/ensure"),
            "ingress IP \"lb.example.com:80x\" is not an IP"
        ),
        "{text}"
    );
    assert!(
        matches!(
            report.outcome("load-balancer/get"),
            Some(Outcome::Skipped(_))
        ),
        "{text}"
    );
    assert!(
        failed_with(
            report.outcome("routes/round-trip"),
            "listed with target \"somewhere-else\""
        ),
        "{text}"
    );
    assert!(text.contains("  FAIL  routes/round-trip"), "{text}");
    // Cleanup ran anyway: no load balancer and no route left.
    assert!(cloud.lbs.lock().is_empty());
    assert!(cloud.routes.lock().is_empty());
}
