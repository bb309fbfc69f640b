//! The whole cloud-controller-manager (`run_with` + `default_registry`) end to end: one
//! in-process API server, simulated kubelets registering with the uninitialized taint, node
//! IPAM handing out pod CIDRs, FakeCloud, and paused time. These tests check what an operator
//! sees: Nodes initialized, load balancers and routes matching the cluster, nothing leaked and
//! nothing duplicated, across a leader crash and across a cloud that fails often.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ccm_testkit::eventually;
use cloud_provider::well_known::{FINALIZER_LOAD_BALANCER_CLEANUP, TAINT_UNINITIALIZED};
use cloud_provider_app::{AppError, CloudControllerManagerOptions, HealthChecks};
use cloud_provider_fake::{Call, FakeCloud, FakeInstance, Fault, FaultRule, Method};
use core_cluster::ApiServer;
use core_cluster::controllers::node_ipam::{NodeIpamConfig, NodeIpamController};
use core_cluster::sim::{NodeSimulator, SimConfig, SimNode};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use crate::tap::Tap;

const CLUSTER: &str = "kubernetes";
const CLUSTER_CIDR: &str = "10.244.0.0/16";
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

/// The cluster side: API server, simulated kubelets, node IPAM. The ccm instances come and go.
struct Cluster {
    server: ApiServer,
    client: kube::Client,
    cloud: FakeCloud,
    nodes: Vec<String>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

fn node_ip(i: usize) -> IpAddr {
    IpAddr::from([10, 0, (i / 200) as u8, (i % 200 + 10) as u8])
}

/// `count` instances spread over three zones, as the fake cloud knows them; the simulated
/// kubelets use the same names and IPs (`--node-ip`).
fn instances(count: usize) -> Vec<FakeInstance> {
    (0..count)
        .map(|i| {
            FakeInstance::new(format!("i-{i}"), format!("node-{i}"))
                .in_zone(ZONES[i % ZONES.len()], "region-1")
                .with_internal_ip(node_ip(i))
        })
        .collect()
}

impl Cluster {
    async fn start(cloud: FakeCloud) -> Cluster {
        let server = ccm_testkit::memory_server().await;
        let client = kube::Client::new(server.router(), "default");
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        let ipam = NodeIpamController::new(
            client.clone(),
            NodeIpamConfig {
                allocate_node_cidrs: true,
                cluster_cidrs: vec![CLUSTER_CIDR.parse().unwrap()],
                ..NodeIpamConfig::default()
            },
        )
        .expect("valid IPAM config");
        tasks.push(tokio::spawn(ipam.run(stop.clone())));
        let sim = NodeSimulator::new(
            client.clone(),
            SimConfig::default().external_cloud_provider(),
        );
        let instances = cloud.instances();
        let nodes: Vec<String> = instances.iter().map(|i| i.name.clone()).collect();
        // The kubelet of instance `i-<n>` runs with the instance's zone and IP.
        sim.add_nodes(instances.iter().map(|instance| {
            let n: usize = instance.id.trim_start_matches("i-").parse().unwrap();
            SimNode::new(instance.name.clone())
                .zone(instance.zone.clone())
                .ip(node_ip(n))
        }));
        tasks.push(tokio::spawn({
            let stop = stop.clone();
            async move {
                sim.run(stop).await.expect("simulator runs");
            }
        }));
        Cluster {
            server,
            client,
            cloud,
            nodes,
            stop,
            tasks,
        }
    }

    async fn shutdown(self) {
        self.stop.cancel();
        for task in self.tasks {
            task.await.unwrap();
        }
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create_lb_service(&self, name: &str) -> Service {
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "protocol": "TCP" }] },
        }))
        .unwrap();
        self.services()
            .create(&PostParams::default(), &svc)
            .await
            .unwrap()
    }

    async fn lease(&self) -> Option<Lease> {
        Api::<Lease>::namespaced(self.client.clone(), "kube-system")
            .get_opt("cloud-controller-manager")
            .await
            .unwrap()
    }

    async fn warnings(&self) -> Vec<String> {
        Api::<Event>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .filter_map(|e| e.reason)
            .collect()
    }

    /// Why the cluster and the cloud do not agree yet (`Ok` once they do), with `lb_services`
    /// the Services that should have a load balancer and no other load balancer allowed.
    async fn converged(&self, lb_services: &[&str]) -> Result<(), String> {
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items;
        if nodes.len() != self.nodes.len() {
            return Err(format!("{} of {} nodes", nodes.len(), self.nodes.len()));
        }
        let mut pod_cidrs = BTreeSet::new();
        for node in &nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let spec = node.spec.clone().unwrap_or_default();
            if spec.provider_id.as_deref().unwrap_or("").is_empty() {
                return Err(format!("{name} has no providerID"));
            }
            if spec
                .taints
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == TAINT_UNINITIALIZED)
            {
                return Err(format!("{name} is still uninitialized"));
            }
            let cidrs = spec.pod_cidrs.unwrap_or_default();
            if cidrs.is_empty() {
                return Err(format!("{name} has no pod CIDR"));
            }
            for cidr in cidrs {
                pod_cidrs.insert((name.clone(), cidr));
            }
        }
        let routes: BTreeSet<(String, String)> = self
            .cloud
            .routes(CLUSTER)
            .into_iter()
            .map(|r| (r.target_node, r.cidr.to_string()))
            .collect();
        if routes != pod_cidrs {
            return Err(format!("routes {routes:?} != pod CIDRs {pod_cidrs:?}"));
        }
        let lbs = self.cloud.load_balancers();
        if lbs.len() != lb_services.len() {
            return Err(format!(
                "{} load balancers for {} LoadBalancer services",
                lbs.len(),
                lb_services.len()
            ));
        }
        for name in lb_services {
            let svc = self.services().get(name).await.map_err(|e| e.to_string())?;
            let lb = self
                .cloud
                .load_balancer_of(&svc)
                .ok_or_else(|| format!("no load balancer for {name}"))?;
            let ingress = ingress_ips(&svc);
            if ingress != vec![lb.ip.to_string()] {
                return Err(format!(
                    "{name} has ingress {ingress:?}, its LB is {}",
                    lb.ip
                ));
            }
        }
        Ok(())
    }

    /// Polls [`Self::converged`] every second for up to `secs` (paused) seconds.
    async fn wait_converged(&self, secs: u64, lb_services: &[&str]) {
        let mut last = String::new();
        for _ in 0..secs {
            match self.converged(lb_services).await {
                Ok(()) => return,
                Err(why) => last = why,
            }
            sleep(Duration::from_secs(1)).await;
        }
        panic!("not converged after {secs} s: {last}");
    }
}

fn ingress_ips(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|i| i.ip.clone()).collect())
        .unwrap_or_default()
}

fn finalized(svc: &Service) -> bool {
    svc.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP))
}

/// One ccm process: its own API connection (a tap, so it can be cut), its health checks.
struct Ccm {
    shutdown: CancellationToken,
    checks: HealthChecks,
    tap: Arc<Tap>,
    task: JoinHandle<Result<(), AppError>>,
}

/// The ccm's flags in these tests: the fake cloud, routes and pod CIDRs on.
pub(crate) fn ccm_options() -> CloudControllerManagerOptions {
    CloudControllerManagerOptions::try_parse_from([
        "ccm",
        "--cloud-provider",
        "fake",
        "--secure-port",
        "0",
        "--cluster-cidr",
        CLUSTER_CIDR,
        "--allocate-node-cidrs",
        "--configure-cloud-routes",
    ])
    .expect("valid flags")
}

impl Ccm {
    fn start(cluster: &Cluster) -> Ccm {
        let (client, tap) = Tap::client(&cluster.server);
        let shutdown = CancellationToken::new();
        let checks = HealthChecks::new();
        let task = tokio::spawn(cloud_provider_app::run_with(
            ccm_options(),
            cloud_provider_app::default_registry(),
            Arc::new(cluster.cloud.clone()),
            client,
            shutdown.clone(),
            checks.clone(),
        ));
        Ccm {
            shutdown,
            checks,
            tap,
            task,
        }
    }

    /// The controllers this instance runs (its health checks other than `leaderElection`).
    fn controllers(&self) -> Vec<String> {
        self.checks
            .names()
            .into_iter()
            .filter(|n| n != "leaderElection")
            .collect()
    }

    /// The process dies: its connections fail from now on, its tasks stop where they are,
    /// and nothing runs on the way out, so the Lease is left to expire (nothing would release
    /// it anyway: as upstream, the Lease is never released).
    fn crash(self) {
        self.tap.cut();
        self.shutdown.cancel();
        self.task.abort();
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().expect("graceful shutdown is Ok");
    }
}

/// When (paused clock) each Lease write was seen, and the holder it named.
type LeaseChanges = Arc<Mutex<Vec<(Instant, String)>>>;

/// Records every change of the Lease, polled every 100 ms.
fn watch_lease(cluster: &Cluster) -> (LeaseChanges, JoinHandle<()>) {
    let changes = Arc::new(Mutex::new(Vec::new()));
    let api = Api::<Lease>::namespaced(cluster.client.clone(), "kube-system");
    let task = tokio::spawn({
        let changes = changes.clone();
        async move {
            let mut last_version = None;
            loop {
                if let Ok(Some(lease)) = api.get_opt("cloud-controller-manager").await
                    && lease.metadata.resource_version != last_version
                {
                    last_version = lease.metadata.resource_version.clone();
                    let holder = lease
                        .spec
                        .and_then(|s| s.holder_identity)
                        .unwrap_or_default();
                    changes.lock().push((Instant::now(), holder));
                }
                sleep(Duration::from_millis(100)).await;
            }
        }
    });
    (changes, task)
}

/// Counts, per Service, the `EnsureLoadBalancer` calls made when the Service had no load
/// balancer yet (creates) and when it had one (updates), decided at the moment of the call.
type Ensures = Arc<Mutex<BTreeMap<String, (usize, usize)>>>;

fn count_ensures(cloud: &FakeCloud) -> Ensures {
    let ensures: Ensures = Arc::default();
    let (seen, probe) = (ensures.clone(), cloud.clone());
    cloud.set_call_hook(Some(Arc::new(move |call: Call| {
        if let Call::EnsureLoadBalancer { service, .. } = &call {
            let existed = probe
                .load_balancers()
                .iter()
                .any(|lb| lb.service == *service);
            let mut seen = seen.lock();
            let entry = seen.entry(service.clone()).or_default();
            if existed {
                entry.1 += 1;
            } else {
                entry.0 += 1;
            }
        }
        Box::pin(async {})
    })));
    ensures
}

/// The standby takes over within the lease duration, with no duplicate cloud resources
/// (client-go leader election; node initialization, routes and load balancers across a
/// failover). Two ccm instances share one cluster and one cloud; the leader
/// crashes without releasing the Lease. The standby leads once the Lease has expired (not
/// before) and soon after; it re-ensures the existing load balancers in place (same name
/// and IP, no create, no delete), leaves the routes alone, and serves a new Service.
#[tokio::test(start_paused = true)]
async fn the_standby_takes_over_a_crashed_leader_without_duplicates() {
    let cluster = Cluster::start(FakeCloud::builder().instances(instances(6)).build()).await;
    let ensures = count_ensures(&cluster.cloud);
    let (lease_changes, lease_watch) = watch_lease(&cluster);

    let leader = Ccm::start(&cluster);
    let first_holder = eventually(10, "the first instance leads", || async {
        cluster.lease().await.and_then(|l| l.spec?.holder_identity)
    })
    .await;
    let standby = Ccm::start(&cluster);

    let names: Vec<String> = (0..4).map(|i| format!("svc-{i}")).collect();
    let mut services = Vec::new();
    for name in &names {
        services.push(cluster.create_lb_service(name).await);
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    cluster.wait_converged(120, &refs).await;
    // Let the periodic loops run a while in the converged state.
    sleep(Duration::from_secs(30)).await;
    cluster.converged(&refs).await.unwrap();
    assert_eq!(
        leader.controllers().len(),
        4,
        "the leader runs the four controllers: {:?}",
        leader.checks.names()
    );
    assert!(
        standby.controllers().is_empty(),
        "the standby runs nothing while the leader renews: {:?}",
        standby.checks.names()
    );
    let before: BTreeMap<String, (String, IpAddr)> = services
        .iter()
        .map(|svc| {
            let lb = cluster.cloud.load_balancer_of(svc).unwrap();
            (svc.metadata.name.clone().unwrap(), (lb.name, lb.ip))
        })
        .collect();
    let routes_before = cluster.cloud.routes(CLUSTER);
    let calls_before = cluster.cloud.calls().len();

    leader.crash();
    let crashed = Instant::now();
    let took_over = eventually(30, "the standby takes the Lease", || async {
        lease_changes
            .lock()
            .iter()
            .find(|(at, holder)| *at >= crashed && *holder != first_holder)
            .map(|(at, _)| *at)
    })
    .await;
    // The watch sees each write within 100 ms; the crashed leader wrote nothing after the
    // crash, and had renewed every retry period (2 s) until then.
    let last_renewal = lease_changes
        .lock()
        .iter()
        .rev()
        .find(|(_, holder)| *holder == first_holder)
        .map(|(at, _)| *at)
        .expect("the leader renewed");
    assert!(last_renewal <= crashed + Duration::from_millis(100));
    assert!(crashed.saturating_duration_since(last_renewal) <= Duration::from_secs(2));
    let after = took_over - last_renewal;
    // Not before the lease duration (15 s) has passed since the last renewal, and at most two
    // retry periods (2 s each) later: one for the standby to see that renewal (it reads the
    // Lease every retry period and times the lease from when it saw the change, on its own
    // clock, as client-go does) and one until its next attempt.
    assert!(
        after >= Duration::from_secs(15),
        "took over {after:?} after the last renewal: before the lease expired"
    );
    assert!(
        after <= Duration::from_secs(19),
        "took over {after:?} after the last renewal"
    );
    let lease = cluster.lease().await.unwrap().spec.unwrap();
    assert_eq!(lease.lease_transitions, Some(1));
    eventually(5, "the standby starts the controllers", || async {
        (standby.controllers().len() == 4).then_some(())
    })
    .await;

    // The new leader re-syncs everything it finds; nothing changes in the cloud.
    sleep(Duration::from_secs(30)).await;
    cluster.converged(&refs).await.unwrap();
    for svc in &services {
        let name = svc.metadata.name.clone().unwrap();
        let lb = cluster.cloud.load_balancer_of(svc).unwrap();
        assert_eq!(
            (lb.name, lb.ip),
            before[&name].clone(),
            "{name}: the same load balancer"
        );
    }
    assert_eq!(cluster.cloud.routes(CLUSTER), routes_before);
    let since: Vec<Method> = cluster.cloud.calls()[calls_before..]
        .iter()
        .map(Call::method)
        .collect();
    assert!(
        since.contains(&Method::EnsureLoadBalancer),
        "the new leader re-ensured the load balancers: {since:?}"
    );
    for method in [
        Method::CreateRoute,
        Method::DeleteRoute,
        Method::EnsureLoadBalancerDeleted,
    ] {
        assert!(
            !since.contains(&method),
            "no {method} after the failover: {since:?}"
        );
    }

    // A Service created after the failover gets its load balancer from the new leader.
    let late = cluster.create_lb_service("svc-late").await;
    let mut all = refs.clone();
    all.push("svc-late");
    cluster.wait_converged(60, &all).await;
    assert!(cluster.cloud.load_balancer_of(&late).is_some());

    let ensures = ensures.lock().clone();
    assert_eq!(ensures.len(), 5, "{ensures:?}");
    for (service, (creates, updates)) in &ensures {
        assert_eq!(*creates, 1, "{service}: created once: {ensures:?}");
        if service != "default/svc-late" {
            assert!(*updates >= 1, "{service}: re-ensured in place: {ensures:?}");
        }
    }

    cluster.cloud.set_call_hook(None);
    lease_watch.abort();
    standby.stop().await;
    cluster.shutdown().await;
}

/// All four controllers against a cloud that fails 30% of all calls, seeded, with 50 ms
/// latency on each: initialization (retried), routes, load balancers and their errors,
/// together. 21 simulated nodes over 3 zones and 10 LoadBalancer Services, of which 3 are
/// deleted and 2 changed to ClusterIP while the controllers are still fighting the faults;
/// then 3 more deleted, deleted without the finalizer, or changed to ClusterIP while their
/// load balancer is being created.
/// Everything converges: every Node initialized, one route per pod CIDR, one load balancer
/// per remaining LoadBalancer Service with its ingress in the status, none left for the
/// others, and the failures reported as Warning events.
#[tokio::test(start_paused = true)]
async fn a_faulty_cloud_converges_with_nothing_leaked() {
    let cloud = FakeCloud::builder()
        .instances(instances(21))
        .seed(20_261_122)
        .latency(Duration::from_millis(50))
        .fault(FaultRule::always(Fault::Error("chaos".into())).with_probability(0.3))
        .build();
    let cluster = Cluster::start(cloud).await;
    let ccm = Ccm::start(&cluster);

    let mut services = BTreeMap::new();
    for i in 0..10 {
        let name = format!("svc-{i}");
        services.insert(name.clone(), cluster.create_lb_service(&name).await);
    }
    // While the controllers are at it: delete three, turn two into ClusterIP.
    sleep(Duration::from_secs(10)).await;
    for name in ["svc-7", "svc-8", "svc-9"] {
        cluster
            .services()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    let cluster_ip = serde_json::json!({"spec": {"type": "ClusterIP",
        "ports": [{"port": 80, "protocol": "TCP", "nodePort": null}]}});
    for name in ["svc-5", "svc-6"] {
        cluster
            .services()
            .patch(name, &PatchParams::default(), &Patch::Merge(&cluster_ip))
            .await
            .unwrap();
    }

    let remaining = ["svc-0", "svc-1", "svc-2", "svc-3", "svc-4"];
    cluster.wait_converged(1800, &remaining).await;
    for name in ["svc-5", "svc-6", "svc-7", "svc-8", "svc-9"] {
        assert!(
            cluster.cloud.load_balancer_of(&services[name]).is_none(),
            "{name}: no load balancer left"
        );
    }
    let gone = eventually(60, "deleted Services are garbage-collected", || async {
        let mut left = Vec::new();
        for name in ["svc-7", "svc-8", "svc-9"] {
            if cluster.services().get_opt(name).await.unwrap().is_some() {
                left.push(name);
            }
        }
        left.is_empty().then_some(left)
    })
    .await;
    assert!(gone.is_empty());
    for name in ["svc-5", "svc-6"] {
        let svc = cluster.services().get(name).await.unwrap();
        assert!(!finalized(&svc), "{name}: finalizer removed");
        assert!(ingress_ips(&svc).is_empty(), "{name}: status cleared");
    }
    for name in remaining {
        assert!(finalized(&cluster.services().get(name).await.unwrap()));
    }
    // The faults really happened, and the controllers said so.
    let warnings = cluster.warnings().await;
    assert!(
        warnings.iter().any(|r| r == "SyncLoadBalancerFailed"),
        "{warnings:?}"
    );
    assert!(
        warnings.iter().any(|r| r == "FailedToCreateRoute"),
        "{warnings:?}"
    );

    // Converged means stable: a while later nothing has changed.
    sleep(Duration::from_secs(120)).await;
    cluster.converged(&remaining).await.unwrap();

    // Services that change while their load balancer is being created: the test acts from
    // inside the cloud call (a call hook), so the change lands while EnsureLoadBalancer is in
    // flight. Deleted (finalizer on), deleted without the finalizer (the Service is gone
    // before its LB exists), turned ClusterIP. Faults stay on.
    let acted: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let (seen, client) = (acted.clone(), cluster.client.clone());
    cluster
        .cloud
        .set_call_hook(Some(Arc::new(move |call: Call| {
            let target = match &call {
                Call::EnsureLoadBalancer { service, .. }
                    if service.starts_with("default/race-")
                        && seen.lock().insert(service.clone()) =>
                {
                    Some(service.trim_start_matches("default/").to_owned())
                }
                _ => None,
            };
            let api: Api<Service> = Api::namespaced(client.clone(), "default");
            Box::pin(async move {
                let Some(name) = target else { return };
                let to_cluster_ip = serde_json::json!({"spec": {"type": "ClusterIP",
                "ports": [{"port": 80, "protocol": "TCP", "nodePort": null}]}});
                let no_finalizer = serde_json::json!({"metadata": {"finalizers": null}});
                let params = PatchParams::default();
                match name.as_str() {
                    "race-delete" => {
                        api.delete(&name, &DeleteParams::default()).await.unwrap();
                    }
                    "race-gone" => {
                        api.patch(&name, &params, &Patch::Merge(&no_finalizer))
                            .await
                            .unwrap();
                        api.delete(&name, &DeleteParams::default()).await.unwrap();
                    }
                    _ => {
                        api.patch(&name, &params, &Patch::Merge(&to_cluster_ip))
                            .await
                            .unwrap();
                    }
                }
            })
        })));
    let mut racing = Vec::new();
    for name in ["race-delete", "race-gone", "race-type"] {
        racing.push((name, cluster.create_lb_service(name).await));
    }
    eventually(600, "each change lands during an ensure", || async {
        (acted.lock().len() == 3).then_some(())
    })
    .await;
    eventually(
        600,
        "race-delete and race-gone go, race-type loses its finalizer",
        || async {
            let a = cluster.services().get_opt("race-delete").await.unwrap();
            let b = cluster.services().get_opt("race-gone").await.unwrap();
            let c = cluster.services().get("race-type").await.unwrap();
            (a.is_none() && b.is_none() && !finalized(&c)).then_some(())
        },
    )
    .await;
    // Whatever was still in flight has landed and been cleaned up by now; nothing leaked.
    sleep(Duration::from_secs(300)).await;
    cluster.converged(&remaining).await.unwrap();
    for (name, svc) in &racing {
        assert!(
            cluster.cloud.load_balancer_of(svc).is_none(),
            "{name}: no load balancer left"
        );
    }
    // race-gone went through the deleted-without-finalizer path: the cached copy.
    assert!(cluster.cloud.calls().iter().any(|c| matches!(c,
        Call::EnsureLoadBalancerDeleted { service, .. } if service == "default/race-gone")));
    let race_type = cluster.services().get("race-type").await.unwrap();
    assert!(
        ingress_ips(&race_type).is_empty(),
        "race-type: status cleared"
    );
    cluster.cloud.set_call_hook(None);

    ccm.stop().await;
    cluster.shutdown().await;
}

/// A running manager's `/metrics` shows upstream's controller
/// metrics (controllers/{node,service,route}/metrics.go and client-go's workqueue metrics,
/// labelled with upstream's queue names) with values that follow what the controllers did:
/// every Node initialized once, a load balancer ensured and its hosts updated once a Node was
/// excluded, routes synced.
#[tokio::test(start_paused = true)]
async fn metrics_show_upstream_names_with_the_controllers_work() {
    use crate::metrics::sample;
    let cluster = Cluster::start(FakeCloud::builder().instances(instances(3)).build()).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let cert_dir = tempfile::tempdir().expect("cert dir");
    let mut options = ccm_options();
    options.secure_port = port;
    options.bind_address = IpAddr::from([127, 0, 0, 1]);
    options.cert_dir = Some(cert_dir.path().to_owned());
    // Authorization of /metrics is tested in secure_port.rs; here a scraper is let in.
    options
        .authorization_always_allow_paths
        .push("/metrics".to_owned());
    let shutdown = CancellationToken::new();
    let app = tokio::spawn(cloud_provider_app::run_with(
        options,
        cloud_provider_app::default_registry(),
        Arc::new(cluster.cloud.clone()),
        cluster.client.clone(),
        shutdown.clone(),
        HealthChecks::new(),
    ));
    cluster.create_lb_service("web").await;
    cluster.wait_converged(120, &["web"]).await;
    // A Node leaves the load balancers: the hosts are updated.
    let exclude = serde_json::json!({"metadata": {"labels": {
        "node.kubernetes.io/exclude-from-external-load-balancers": "true"}}});
    Api::<Node>::all(cluster.client.clone())
        .patch(
            &cluster.nodes[0],
            &PatchParams::default(),
            &Patch::Merge(&exclude),
        )
        .await
        .unwrap();
    let text = eventually(60, "the hosts update on /metrics", || async {
        let text = scrape(port, cert_dir.path()).await?;
        (sample(&text, "service_controller_loadbalancer_sync_total") >= 1.0).then_some(text)
    })
    .await;

    let nodes = cluster.nodes.len() as f64;
    for histogram in [
        "node_controller_cloud_provider_taint_removal_delay_seconds",
        "node_controller_initial_node_sync_delay_seconds",
    ] {
        assert_eq!(
            sample(&text, &format!("{histogram}_count")),
            nodes,
            "{histogram}"
        );
    }
    let host = "service_controller_update_loadbalancer_host_latency_seconds_count";
    assert_eq!(
        sample(&text, host),
        sample(&text, "service_controller_loadbalancer_sync_total")
    );
    assert!(sample(&text, "service_controller_nodesync_latency_seconds_count") >= 1.0);
    assert_eq!(
        sample(&text, "service_controller_nodesync_error_total"),
        0.0
    );
    assert!(sample(&text, "route_controller_route_sync_total") >= 1.0);
    for queue in ["Nodes", "service", "node"] {
        let adds = sample(&text, &format!("workqueue_adds_total{{name=\"{queue}\"}}"));
        assert!(adds >= 1.0, "{queue}: {adds}");
        assert!(
            sample(
                &text,
                &format!("workqueue_work_duration_seconds_count{{name=\"{queue}\"}}")
            ) >= 1.0,
            "{queue}"
        );
        for gauge in [
            "workqueue_depth",
            "workqueue_unfinished_work_seconds",
            "workqueue_longest_running_processor_seconds",
        ] {
            sample(&text, &format!("{gauge}{{name=\"{queue}\"}}"));
        }
        sample(
            &text,
            &format!("workqueue_retries_total{{name=\"{queue}\"}}"),
        );
        sample(
            &text,
            &format!("workqueue_queue_duration_seconds_count{{name=\"{queue}\"}}"),
        );
    }
    assert!(
        text.contains("running_managed_controllers{"),
        "the manager's own metrics stay:\n{text}"
    );
    // No series per Node: the cost does not grow with the cluster.
    for name in &cluster.nodes {
        assert!(!text.contains(&format!("\"{name}\"")), "{name} in\n{text}");
    }
    shutdown.cancel();
    app.await.unwrap().expect("graceful shutdown is Ok");
    cluster.shutdown().await;
}

/// `GET /metrics` on the manager's port: the body of a 200, else `None`.
async fn scrape(port: u16, cert_dir: &std::path::Path) -> Option<String> {
    use crate::secure_port::{generated_ca_pem, get, secure_port_client};
    if !cert_dir.join("cloud-controller-manager.crt").is_file() {
        return None;
    }
    let client = secure_port_client(
        port,
        &generated_ca_pem(cert_dir),
        core_cluster::auth::pki::Credentials::Anonymous,
    )
    .await;
    match get(&client, "/metrics").await {
        Ok((200, body)) => Some(body),
        _ => None,
    }
}
