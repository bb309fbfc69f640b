//! The provider conformance kit: checks that a provider keeps the contract the controllers rely
//! on. Any provider runs it against itself, ours and vendors' alike, and gets a readable
//! per-check report.
//!
//! ```no_run
//! # async fn demo(cloud: std::sync::Arc<dyn cloud_provider::CloudProvider>) {
//! use cloud_provider::conformance::{ConformanceKit, Fixture};
//!
//! let fixture = Fixture::new("my-cluster")
//!     .with_running_node(Fixture::node("node-a", None))
//!     .with_running_node(Fixture::node("node-b", None));
//! let report = ConformanceKit::new(cloud, fixture).run().await;
//! println!("{report}");
//! assert!(report.is_success(), "{report}");
//! # }
//! ```
//!
//! What it checks (each check is skipped when the provider lacks the part it needs):
//!
//! | check | contract |
//! |---|---|
//! | `provider/name` | a non-empty lowercase name |
//! | `instances-v2/metadata` | provider ID `<name>://…` (or the Node's own), valid IPs, zone and region, no duplicate address |
//! | `instances-v2/metadata-batch` | one result per Node in order, equal to the single calls; an unknown Node fails alone with InstanceNotFound |
//! | `instances-v2/running` | a running instance exists and is not shut down |
//! | `instances-v2/stopped` | a stopped instance exists and is shut down |
//! | `instances-v2/unknown` | an unknown instance does not exist, and its metadata is InstanceNotFound |
//! | `load-balancer/ensure` | ensure returns an ingress with a valid IP or a hostname |
//! | `load-balancer/ensure-idempotent` | a second ensure returns the same status |
//! | `load-balancer/get` | get finds it, with the same status, and the name is stable |
//! | `load-balancer/update-backends` | update changes the backends (observed through a [`BackendProbe`] if given) |
//! | `load-balancer/delete` | ensure-deleted removes it, and succeeds again when it is absent |
//! | `routes/round-trip` | routes for every CIDR (both families when given) are created, listed and deleted |

use std::{collections::BTreeSet, fmt, future::Future, sync::Arc, time::Duration};

use async_trait::async_trait;
use ipnet::IpNet;
use k8s_openapi::{
    api::core::v1::{LoadBalancerStatus, Node, NodeSpec, Service, ServicePort, ServiceSpec},
    apimachinery::pkg::util::intstr::IntOrString,
};

use crate::{
    CloudError, CloudProvider, CloudResult, ErrorKind, InstanceMetadata, Route,
    helpers::{parse_ip_sloppy, service::load_balancer_status_equal},
};

/// Reads which Nodes a load balancer sends traffic to, so the kit can check that an update
/// really changed the backends. Providers implement it on top of their own cloud API.
#[async_trait]
pub trait BackendProbe: Send + Sync {
    /// The names of the Nodes the Service's load balancer targets.
    async fn backends(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<BTreeSet<String>>;
}

/// What the kit runs against: Nodes backed by real instances of the provider's cloud, and the
/// objects to create. Build it with [`Fixture::new`] and the `with_*` methods.
#[derive(Clone)]
#[non_exhaustive]
pub struct Fixture {
    /// The cluster name passed to load-balancer and route calls.
    pub cluster_name: String,
    /// Nodes whose instances are running. At least one; two for the backend-update check.
    pub running_nodes: Vec<Node>,
    /// A Node whose instance is stopped, if the cloud has one.
    pub stopped_node: Option<Node>,
    /// A Node with no instance behind it.
    pub unknown_node: Node,
    /// A LoadBalancer Service to create a load balancer for.
    pub service: Service,
    /// Pod CIDRs to create routes for (one IPv4 and one IPv6 by default).
    pub route_cidrs: Vec<IpNet>,
    /// How to observe load-balancer backends, if the provider offers a way.
    pub backend_probe: Option<Arc<dyn BackendProbe>>,
    /// How long one check may take.
    pub check_timeout: Duration,
}

impl Fixture {
    /// A fixture with default Service, unknown Node and route CIDRs, and no running Nodes yet.
    pub fn new(cluster_name: impl Into<String>) -> Self {
        Fixture {
            cluster_name: cluster_name.into(),
            running_nodes: Vec::new(),
            stopped_node: None,
            unknown_node: Fixture::node("conformance-no-such-node", None),
            service: Fixture::load_balancer_service(),
            route_cidrs: vec![
                "10.250.7.0/24".parse().expect("valid CIDR"),
                "fd00:250:7::/64".parse().expect("valid CIDR"),
            ],
            backend_probe: None,
            check_timeout: Duration::from_secs(120),
        }
    }

    /// A Node with a name and, optionally, a provider ID.
    pub fn node(name: &str, provider_id: Option<&str>) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_owned());
        node.metadata.uid = Some(format!("uid-{name}"));
        node.spec = Some(NodeSpec {
            provider_id: provider_id.map(str::to_owned),
            ..Default::default()
        });
        node
    }

    /// The default Service: `default/conformance`, TCP 80 on node port 30080.
    pub fn load_balancer_service() -> Service {
        let mut svc = Service::default();
        svc.metadata.name = Some("conformance".to_owned());
        svc.metadata.namespace = Some("default".to_owned());
        svc.metadata.uid = Some("c0f0c0f0-0000-4000-8000-00000000c0f0".to_owned());
        svc.spec = Some(ServiceSpec {
            type_: Some("LoadBalancer".to_owned()),
            ports: Some(vec![ServicePort {
                name: Some("http".to_owned()),
                protocol: Some("TCP".to_owned()),
                port: 80,
                node_port: Some(30080),
                target_port: Some(IntOrString::Int(8080)),
                ..Default::default()
            }]),
            external_traffic_policy: Some("Cluster".to_owned()),
            ..Default::default()
        });
        svc
    }

    /// Adds a Node whose instance is running.
    pub fn with_running_node(mut self, node: Node) -> Self {
        self.running_nodes.push(node);
        self
    }

    /// Sets the Node whose instance is stopped.
    pub fn with_stopped_node(mut self, node: Node) -> Self {
        self.stopped_node = Some(node);
        self
    }

    /// Replaces the Node with no instance behind it.
    pub fn with_unknown_node(mut self, node: Node) -> Self {
        self.unknown_node = node;
        self
    }

    /// Replaces the Service.
    pub fn with_service(mut self, service: Service) -> Self {
        self.service = service;
        self
    }

    /// Replaces the route CIDRs.
    pub fn with_route_cidrs(mut self, cidrs: Vec<IpNet>) -> Self {
        self.route_cidrs = cidrs;
        self
    }

    /// Sets the backend probe.
    pub fn with_backend_probe(mut self, probe: Arc<dyn BackendProbe>) -> Self {
        self.backend_probe = Some(probe);
        self
    }

    /// Sets the per-check timeout.
    pub fn with_check_timeout(mut self, timeout: Duration) -> Self {
        self.check_timeout = timeout;
        self
    }
}

/// How one check ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The contract holds. The note says what was not observable, if anything.
    Passed(Option<String>),
    /// The contract is broken: why.
    Failed(String),
    /// Not run: why (the provider lacks the part, or the fixture lacks the input).
    Skipped(String),
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// The check's name, e.g. `load-balancer/ensure`.
    pub name: &'static str,
    /// How it ended.
    pub outcome: Outcome,
}

/// The kit's report: one line per check. `Display` prints it as a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The provider's name.
    pub provider: String,
    /// Every check, in the order run.
    pub checks: Vec<CheckResult>,
}

impl Report {
    /// Whether no check failed.
    pub fn is_success(&self) -> bool {
        self.failures().next().is_none()
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &CheckResult> {
        self.checks
            .iter()
            .filter(|c| matches!(c.outcome, Outcome::Failed(_)))
    }

    /// The outcome of the check called `name`.
    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.checks
            .iter()
            .find(|c| c.name == name)
            .map(|c| &c.outcome)
    }

    fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.checks.iter().filter(|c| f(&c.outcome)).count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "conformance report for cloud provider {:?}",
            self.provider
        )?;
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        for check in &self.checks {
            let (status, detail) = match &check.outcome {
                Outcome::Passed(None) => ("PASS", String::new()),
                Outcome::Passed(Some(note)) => ("PASS", format!("  ({note})")),
                Outcome::Failed(why) => ("FAIL", format!("  {why}")),
                Outcome::Skipped(why) => ("SKIP", format!("  {why}")),
            };
            if detail.is_empty() {
                writeln!(f, "  {status}  {}", check.name)?;
            } else {
                writeln!(f, "  {status}  {:width$}{detail}", check.name)?;
            }
        }
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            self.count(|o| matches!(o, Outcome::Passed(_))),
            self.count(|o| matches!(o, Outcome::Failed(_))),
            self.count(|o| matches!(o, Outcome::Skipped(_))),
        )
    }
}

/// What a check body returns: a pass note, or why it failed.
type CheckOutput = Result<Option<String>, String>;

/// Runs the conformance checks against one provider.
pub struct ConformanceKit {
    cloud: Arc<dyn CloudProvider>,
    fixture: Fixture,
}

impl ConformanceKit {
    /// A kit for `cloud` with `fixture`.
    pub fn new(cloud: Arc<dyn CloudProvider>, fixture: Fixture) -> Self {
        ConformanceKit { cloud, fixture }
    }

    /// Runs every check and returns the report. Never panics on a provider's misbehaviour:
    /// errors and timeouts become failed checks. Load balancers and routes it created are
    /// deleted even when a check fails.
    pub async fn run(&self) -> Report {
        let mut checks = Vec::new();
        checks.push(self.check("provider/name", self.provider_name()).await);
        self.instances_v2_checks(&mut checks).await;
        self.load_balancer_checks(&mut checks).await;
        self.route_checks(&mut checks).await;
        Report {
            provider: self.cloud.provider_name().to_owned(),
            checks,
        }
    }

    async fn check(
        &self,
        name: &'static str,
        body: impl Future<Output = CheckOutput>,
    ) -> CheckResult {
        let outcome = match tokio::time::timeout(self.fixture.check_timeout, body).await {
            Ok(Ok(note)) => Outcome::Passed(note),
            Ok(Err(why)) => Outcome::Failed(why),
            Err(_) => Outcome::Failed(format!("timed out after {:?}", self.fixture.check_timeout)),
        };
        CheckResult { name, outcome }
    }

    fn skip(name: &'static str, why: impl Into<String>) -> CheckResult {
        CheckResult {
            name,
            outcome: Outcome::Skipped(why.into()),
        }
    }

    async fn provider_name(&self) -> CheckOutput {
        let name = self.cloud.provider_name();
        let valid = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if valid {
            Ok(None)
        } else {
            Err(format!(
                "provider name {name:?} must be non-empty lowercase letters, digits and '-'"
            ))
        }
    }

    async fn instances_v2_checks(&self, checks: &mut Vec<CheckResult>) {
        const NAMES: [&str; 5] = [
            "instances-v2/metadata",
            "instances-v2/metadata-batch",
            "instances-v2/running",
            "instances-v2/stopped",
            "instances-v2/unknown",
        ];
        if self.cloud.instances_v2().is_none() {
            checks.extend(NAMES.map(|n| Self::skip(n, "provider has no InstancesV2")));
            return;
        }
        if self.fixture.running_nodes.is_empty() {
            checks.extend(NAMES.map(|n| Self::skip(n, "fixture has no running node")));
            return;
        }
        checks.push(self.check(NAMES[0], self.metadata()).await);
        checks.push(self.check(NAMES[1], self.metadata_batch()).await);
        checks.push(self.check(NAMES[2], self.running()).await);
        checks.push(match &self.fixture.stopped_node {
            Some(node) => self.check(NAMES[3], self.stopped(node)).await,
            None => Self::skip(NAMES[3], "fixture has no stopped node"),
        });
        checks.push(self.check(NAMES[4], self.unknown()).await);
    }

    fn instances_v2(&self) -> Result<&dyn crate::InstancesV2, String> {
        self.cloud
            .instances_v2()
            .ok_or_else(|| "provider has no InstancesV2".to_owned())
    }

    async fn metadata(&self) -> CheckOutput {
        let instances = self.instances_v2()?;
        for node in &self.fixture.running_nodes {
            let meta = instances
                .instance_metadata(node)
                .await
                .map_err(|e| format!("{}: instance_metadata failed: {e}", node_name(node)))?
                .ok_or_else(|| format!("{}: instance_metadata returned None", node_name(node)))?;
            self.validate_metadata(node, &meta)
                .map_err(|why| format!("{}: {why}", node_name(node)))?;
        }
        Ok(None)
    }

    fn validate_metadata(&self, node: &Node, meta: &InstanceMetadata) -> Result<(), String> {
        let prefix = format!("{}://", self.cloud.provider_name());
        let node_provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .filter(|p| !p.is_empty());
        match node_provider_id {
            Some(pid) if !meta.provider_id.is_empty() && meta.provider_id != pid => {
                return Err(format!(
                    "provider ID {:?} differs from the Node's {pid:?}",
                    meta.provider_id
                ));
            }
            _ if !meta.provider_id.starts_with(&prefix)
                || meta.provider_id.len() == prefix.len() =>
            {
                return Err(format!(
                    "provider ID {:?} does not start with {prefix:?} followed by an ID",
                    meta.provider_id
                ));
            }
            _ => {}
        }
        if meta.node_addresses.is_empty() {
            return Err("no addresses".to_owned());
        }
        let mut seen = BTreeSet::new();
        for address in &meta.node_addresses {
            match address.type_.as_str() {
                "InternalIP" | "ExternalIP" => {
                    if parse_ip_sloppy(&address.address).is_none() {
                        return Err(format!(
                            "{} address {:?} is not an IP",
                            address.type_, address.address
                        ));
                    }
                }
                "InternalDNS" | "ExternalDNS" | "Hostname" => {
                    if address.address.is_empty() {
                        return Err(format!("empty {} address", address.type_));
                    }
                }
                other => return Err(format!("unknown address type {other:?}")),
            }
            if !seen.insert((&address.type_, &address.address)) {
                return Err(format!(
                    "duplicate address {} {}",
                    address.type_, address.address
                ));
            }
        }
        if meta.zone.is_empty() || meta.region.is_empty() {
            return Err(format!(
                "zone {:?} and region {:?} must both be set",
                meta.zone, meta.region
            ));
        }
        Ok(())
    }

    async fn metadata_batch(&self) -> CheckOutput {
        let instances = self.instances_v2()?;
        let mut nodes: Vec<&Node> = self.fixture.running_nodes.iter().collect();
        nodes.push(&self.fixture.unknown_node);
        let batch = instances.instance_metadata_batch(&nodes).await;
        if batch.len() != nodes.len() {
            return Err(format!("{} results for {} nodes", batch.len(), nodes.len()));
        }
        let (unknown_result, running_results) = batch.split_last().expect("non-empty");
        for (node, result) in self.fixture.running_nodes.iter().zip(running_results) {
            let single = instances
                .instance_metadata(node)
                .await
                .map_err(|e| format!("{}: instance_metadata failed: {e}", node_name(node)))?;
            match result {
                Ok(batched) if *batched == single => {}
                Ok(batched) => {
                    return Err(format!(
                        "{}: batched metadata {batched:?} differs from single {single:?}",
                        node_name(node)
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "{}: batched lookup failed while the single one succeeded: {e}",
                        node_name(node)
                    ));
                }
            }
        }
        match unknown_result {
            Err(e) if e.kind() == ErrorKind::InstanceNotFound => Ok(None),
            other => Err(format!(
                "unknown node {}: expected InstanceNotFound in the batch, got {other:?}",
                node_name(&self.fixture.unknown_node)
            )),
        }
    }

    async fn running(&self) -> CheckOutput {
        let instances = self.instances_v2()?;
        for node in &self.fixture.running_nodes {
            let name = node_name(node);
            match instances.instance_exists(node).await {
                Ok(true) => {}
                Ok(false) => return Err(format!("{name}: running instance reported as absent")),
                Err(e) => return Err(format!("{name}: instance_exists failed: {e}")),
            }
            match instances.instance_shutdown(node).await {
                Ok(false) => {}
                Ok(true) => return Err(format!("{name}: running instance reported as shut down")),
                Err(e) => return Err(format!("{name}: instance_shutdown failed: {e}")),
            }
        }
        Ok(None)
    }

    async fn stopped(&self, node: &Node) -> CheckOutput {
        let instances = self.instances_v2()?;
        let name = node_name(node);
        match instances.instance_exists(node).await {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "{name}: stopped instance reported as absent (the Node would be deleted)"
                ));
            }
            Err(e) => return Err(format!("{name}: instance_exists failed: {e}")),
        }
        match instances.instance_shutdown(node).await {
            Ok(true) => Ok(None),
            Ok(false) => Err(format!(
                "{name}: stopped instance not reported as shut down"
            )),
            Err(e) => Err(format!("{name}: instance_shutdown failed: {e}")),
        }
    }

    async fn unknown(&self) -> CheckOutput {
        let instances = self.instances_v2()?;
        let node = &self.fixture.unknown_node;
        let name = node_name(node);
        match instances.instance_exists(node).await {
            Ok(false) => {}
            Ok(true) => return Err(format!("{name}: unknown instance reported as existing")),
            Err(e) => {
                return Err(format!(
                    "{name}: instance_exists must answer Ok(false) for an unknown instance, got error: {e}"
                ));
            }
        }
        match instances.instance_metadata(node).await {
            Err(e) if e.is_instance_not_found() => Ok(None),
            other => Err(format!(
                "{name}: instance_metadata must fail with InstanceNotFound, got {other:?}"
            )),
        }
    }

    async fn load_balancer_checks(&self, checks: &mut Vec<CheckResult>) {
        const NAMES: [&str; 5] = [
            "load-balancer/ensure",
            "load-balancer/ensure-idempotent",
            "load-balancer/get",
            "load-balancer/update-backends",
            "load-balancer/delete",
        ];
        let Some(lb) = self.cloud.load_balancer() else {
            checks.extend(NAMES.map(|n| Self::skip(n, "provider has no LoadBalancer")));
            return;
        };
        if self.fixture.running_nodes.is_empty() {
            checks.extend(NAMES.map(|n| Self::skip(n, "fixture has no running node")));
            return;
        }
        let cluster = &self.fixture.cluster_name;
        let svc = &self.fixture.service;
        // The running Nodes as the service controller passes them to a load balancer.
        let shared: Vec<Arc<Node>> = self
            .fixture
            .running_nodes
            .iter()
            .cloned()
            .map(Arc::new)
            .collect();
        let nodes = &shared[..];

        let mut status: Option<LoadBalancerStatus> = None;
        let ensure = self
            .check(NAMES[0], async {
                let s = lb
                    .ensure_load_balancer(cluster, svc, nodes)
                    .await
                    .map_err(|e| format!("ensure_load_balancer failed: {e}"))?;
                validate_ingress(&s)?;
                status = Some(s);
                Ok(None)
            })
            .await;
        checks.push(ensure);
        if let Some(first) = status.clone() {
            checks.push(
                self.check(NAMES[1], async {
                    let second = lb
                        .ensure_load_balancer(cluster, svc, nodes)
                        .await
                        .map_err(|e| format!("second ensure_load_balancer failed: {e}"))?;
                    if load_balancer_status_equal(&first, &second) {
                        Ok(None)
                    } else {
                        Err(format!("status changed: {first:?} then {second:?}"))
                    }
                })
                .await,
            );
            checks.push(
                self.check(NAMES[2], async {
                    let name = lb.get_load_balancer_name(cluster, svc);
                    if name.is_empty() || name != lb.get_load_balancer_name(cluster, svc) {
                        return Err(format!("load balancer name {name:?} is empty or unstable"));
                    }
                    match lb.get_load_balancer(cluster, svc).await {
                        Ok(Some(got)) if load_balancer_status_equal(&got, &first) => Ok(None),
                        Ok(Some(got)) => {
                            Err(format!("get returned {got:?}, ensure returned {first:?}"))
                        }
                        Ok(None) => Err("get says the ensured load balancer does not exist".into()),
                        Err(e) => Err(format!("get_load_balancer failed: {e}")),
                    }
                })
                .await,
            );
            checks.push(self.check(NAMES[3], self.update_backends(lb, nodes)).await);
        } else {
            for name in &NAMES[1..4] {
                checks.push(Self::skip(name, "load-balancer/ensure failed"));
            }
        }
        // Always clean up, even when the checks above failed.
        checks.push(
            self.check(NAMES[4], async {
                lb.ensure_load_balancer_deleted(cluster, svc)
                    .await
                    .map_err(|e| format!("ensure_load_balancer_deleted failed: {e}"))?;
                match lb.get_load_balancer(cluster, svc).await {
                    Ok(None) => {}
                    Ok(Some(s)) => return Err(format!("still exists after delete: {s:?}")),
                    Err(e) => return Err(format!("get_load_balancer after delete failed: {e}")),
                }
                lb.ensure_load_balancer_deleted(cluster, svc)
                    .await
                    .map_err(|e| {
                        format!(
                            "ensure_load_balancer_deleted on an absent load balancer failed: {e}"
                        )
                    })?;
                Ok(None)
            })
            .await,
        );
    }

    async fn update_backends(
        &self,
        lb: &dyn crate::LoadBalancer,
        all: &[Arc<Node>],
    ) -> CheckOutput {
        let cluster = &self.fixture.cluster_name;
        let svc = &self.fixture.service;
        if all.len() < 2 {
            return Err("fixture needs two running nodes to change backends".to_owned());
        }
        let subsets: [&[Arc<Node>]; 2] = [&all[..1], all];
        for subset in subsets {
            lb.update_load_balancer(cluster, svc, subset)
                .await
                .map_err(|e| {
                    format!(
                        "update_load_balancer with {} nodes failed: {e}",
                        subset.len()
                    )
                })?;
            if let Some(probe) = &self.fixture.backend_probe {
                let want: BTreeSet<String> =
                    subset.iter().map(|n| node_name(n).to_owned()).collect();
                let got = probe
                    .backends(cluster, svc)
                    .await
                    .map_err(|e| format!("backend probe failed: {e}"))?;
                if got != want {
                    return Err(format!("backends are {got:?} after update to {want:?}"));
                }
            }
        }
        Ok(self
            .fixture
            .backend_probe
            .is_none()
            .then(|| "backends not observed: fixture has no backend probe".to_owned()))
    }

    async fn route_checks(&self, checks: &mut Vec<CheckResult>) {
        const NAME: &str = "routes/round-trip";
        if self.cloud.routes().is_none() {
            checks.push(Self::skip(NAME, "provider has no Routes"));
        } else if self.fixture.running_nodes.is_empty() || self.fixture.route_cidrs.is_empty() {
            checks.push(Self::skip(
                NAME,
                "fixture has no running node or no route CIDR",
            ));
        } else {
            checks.push(self.check(NAME, self.routes_round_trip()).await);
        }
    }

    async fn routes_round_trip(&self) -> CheckOutput {
        let routes = self.cloud.routes().ok_or("provider has no Routes")?;
        let cluster = &self.fixture.cluster_name;
        let target = &self.fixture.running_nodes[0];
        let target_name = node_name(target);
        let hint = target
            .metadata
            .uid
            .clone()
            .unwrap_or_else(|| target_name.to_owned());
        let wanted: Vec<Route> = self
            .fixture
            .route_cidrs
            .iter()
            .map(|cidr| Route::new(target_name, *cidr))
            .collect();

        let created = async {
            for route in &wanted {
                routes
                    .create_route(cluster, &hint, route)
                    .await
                    .map_err(|e| format!("create_route {} failed: {e}", route.destination_cidr))?;
            }
            let listed = routes
                .list_routes(cluster)
                .await
                .map_err(|e| format!("list_routes failed: {e}"))?;
            for route in &wanted {
                let found = listed
                    .iter()
                    .find(|r| r.destination_cidr == route.destination_cidr)
                    .ok_or_else(|| {
                        format!("route {} not listed after create", route.destination_cidr)
                    })?;
                if found.target_node != target_name || found.blackhole {
                    return Err(format!(
                        "route {} listed with target {:?} (blackhole: {}), want {target_name:?}",
                        route.destination_cidr, found.target_node, found.blackhole
                    ));
                }
            }
            Ok::<_, String>(listed)
        }
        .await;

        // Delete what exists, whatever happened above, so the kit leaks nothing.
        let listed = match created {
            Ok(listed) => listed,
            Err(why) => {
                let _ = self.delete_routes(routes, &wanted).await;
                return Err(why);
            }
        };
        let to_delete: Vec<Route> = listed
            .into_iter()
            .filter(|r| {
                wanted
                    .iter()
                    .any(|w| w.destination_cidr == r.destination_cidr)
            })
            .collect();
        self.delete_routes(routes, &to_delete).await?;
        let after = routes
            .list_routes(cluster)
            .await
            .map_err(|e| format!("list_routes after delete failed: {e}"))?;
        if let Some(left) = after.iter().find(|r| {
            wanted
                .iter()
                .any(|w| w.destination_cidr == r.destination_cidr)
        }) {
            return Err(format!(
                "route {} still listed after delete",
                left.destination_cidr
            ));
        }
        let families: BTreeSet<bool> = wanted
            .iter()
            .map(|r| r.destination_cidr.addr().is_ipv6())
            .collect();
        Ok((families.len() < 2)
            .then(|| "single-stack only: fixture has one address family".to_owned()))
    }

    async fn delete_routes(
        &self,
        routes: &dyn crate::Routes,
        list: &[Route],
    ) -> Result<(), String> {
        for route in list {
            routes
                .delete_route(&self.fixture.cluster_name, route)
                .await
                .map_err(|e| format!("delete_route {} failed: {e}", route.destination_cidr))?;
        }
        Ok(())
    }
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("<unnamed>")
}

fn validate_ingress(status: &LoadBalancerStatus) -> Result<(), String> {
    let ingress = status.ingress.as_deref().unwrap_or_default();
    if ingress.is_empty() {
        return Err("status has no ingress".to_owned());
    }
    for entry in ingress {
        match (&entry.ip, &entry.hostname) {
            (Some(ip), _) if parse_ip_sloppy(ip).is_some() => {}
            (Some(ip), _) => return Err(format!("ingress IP {ip:?} is not an IP")),
            (None, Some(host)) if !host.is_empty() => {}
            _ => return Err("ingress entry has neither IP nor hostname".to_owned()),
        }
    }
    Ok(())
}

/// Convenience for providers' own tests: the error a provider call must return for an unknown
/// instance, for use in assertions.
pub fn is_instance_not_found<T>(result: &CloudResult<T>) -> bool {
    matches!(result, Err(e) if e.kind() == ErrorKind::InstanceNotFound)
}

impl From<&str> for CloudError {
    fn from(message: &str) -> Self {
        CloudError::message(message)
    }
}
