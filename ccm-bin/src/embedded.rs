//! The embedded default: with no cluster to manage, `ccm` starts one: core-cluster's API
//! server on a durable store, the node-side controllers (node lifecycle, taint eviction,
//! node IPAM, garbage collection, pod GC), simulated nodes that register as kubelets of a
//! cluster with an external cloud provider, and the fake cloud with one instance per
//! simulated node. The cloud-controller-manager then runs exactly as against a real cluster
//! (`cloud_provider_app::run_with`, the four shared controllers, leader election), through
//! the API server's REST API. It prints progress (nodes registered, initialized, Ready;
//! load balancers ensured) and a summary; `kubectl` works through the kubeconfig it writes.
//!
//! The controllers and the scheduler are assembled by [`crate::control_plane::spawn`], the
//! simulator by [`crate::simulation::spawn`], exactly as `ccm controller-manager` and
//! `ccm node-simulator` assemble them against another API server; this module gives them
//! in-process clients and what only its own API server makes possible.

use std::{net::Ipv4Addr, path::PathBuf, sync::Arc, time::Duration};

use crate::{
    control_plane::ControlPlane,
    nodeipam::NodeIpamArgs,
    simulation::{Fleet, InProcess, fake_cloud_builder},
};
use anyhow::Context;
use cloud_provider::CloudProvider;
use cloud_provider_app::{CloudControllerManagerOptions, HealthChecks};
use cloud_provider_fake::{LoadBalancerLimits, LoadBalancerLimitsError};
use core_cluster::{
    ApiServer,
    auth::{node::node_user, rbac::service_account_user},
    controllers::{
        csr_signing::SigningCa,
        supervisor::{PANICS_HELP, PANICS_METRIC, Supervisor},
    },
    sim::{
        KubeletApiConfig, KubeletAuthConfig, NodeClientFactory, ServiceProxyLimits, ServingCa,
        SimNode, UNINITIALIZED_TAINT_KEY,
    },
    store::Store,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::{
    Api,
    runtime::{WatchStreamExt, reflector, watcher},
};
use tokio_util::sync::CancellationToken;

use crate::flags::parse_duration;

/// Flags of the embedded default. The node-lifecycle and IPAM flags keep
/// kube-controller-manager's names and defaults.
#[derive(Debug, clap::Args)]
pub(crate) struct EmbeddedArgs {
    /// Address of the API server (loopback; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: String,
    /// Directory of the durable store. Default: a fresh temporary directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    store: crate::flags::StoreArgs,
    /// Where to write the kubeconfig for kubectl.
    #[arg(long, value_name = "FILE", default_value = "ccm.kubeconfig")]
    write_kubeconfig: PathBuf,
    #[command(flatten)]
    pub(crate) sim: crate::simulation::SimArgs,
    #[command(flatten)]
    pub(crate) controllers: crate::control_plane::ControllerArgs,
    /// Whether the simulated nodes serve kubelet's HTTPS API (`kubectl logs`, `get --raw
    /// /api/v1/nodes/N/proxy/healthz`), each on a loopback address of its own, with a
    /// serving certificate from the cluster's kubelet-serving CA.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    sim_kubelet_api: bool,
    /// Whether Service traffic flows, in kube-proxy's place (with `--sim-kubelet-api`, whose
    /// nodes have loopback addresses): each simulated node listens on the NodePort and
    /// LoadBalancer Services' node ports and forwards to a ready endpoint's pod, which
    /// answers with its name; the fake cloud's load balancers get loopback addresses
    /// (127.2.0.1 onwards) that forward to the nodes, so `curl http://<EXTERNAL-IP>:<port>/`
    /// reaches a pod.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    sim_data_path: bool,
    /// The data path's idle timeout: a connection to a load balancer or a node port with no
    /// byte either way for this long is closed, both sides, as an AWS Classic or Application
    /// Load Balancer closes one after its idle timeout (60 s by default).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    sim_data_path_idle_timeout: Duration,
    /// The data path's cap on connections per listener (each load balancer port, each node's
    /// node port): a new connection beyond it is reset, as a load balancer at its limit
    /// resets it. Whatever the cap, the data path as a whole holds at most a quarter of the
    /// process's open-files limit (`ulimit -n`), so the API server keeps the rest.
    #[arg(long, default_value_t = 1024)]
    sim_data_path_max_connections: usize,
    /// Whether each simulated node (with `--sim-kubelet-api`) runs an agent that dials out
    /// to the API server, and the API server reaches kubelets only through those agents
    /// (`--node-egress=agent-tunnel`, Konnectivity's model) instead of dialling them.
    #[arg(long)]
    sim_agent_tunnel: bool,
    #[command(flatten)]
    kubelet: crate::apiserver::KubeletClientArgs,
    #[command(flatten)]
    tolerations: crate::apiserver::TolerationArgs,
}

/// kubeadm's `--kubelet-preferred-address-types`: the embedded default's, since simulated
/// hostnames do not resolve.
const EMBEDDED_ADDRESS_TYPES: [&str; 3] = ["InternalIP", "ExternalIP", "Hostname"];

/// The CA issuing the simulated kubelets' serving certificates, kept beside the cluster's
/// PKI (`pki/kubelet-serving-ca.{crt,key}`) so a restarted cluster trusts the same CA.
fn kubelet_serving_ca(data_dir: &std::path::Path) -> anyhow::Result<ServingCa> {
    let dir = data_dir.join("pki");
    let (cert, key) = (
        dir.join("kubelet-serving-ca.crt"),
        dir.join("kubelet-serving-ca.key"),
    );
    if let (Ok(cert_pem), Ok(key_pem)) = (
        std::fs::read_to_string(&cert),
        std::fs::read_to_string(&key),
    ) {
        return Ok(ServingCa { cert_pem, key_pem });
    }
    let ca = ServingCa::generate("kubelet-serving-ca").map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(&cert, &ca.cert_pem).with_context(|| format!("writing {}", cert.display()))?;
    write_private(&key, &ca.key_pem)?;
    Ok(ca)
}

/// The API server's identity towards the simulated kubelets, as kubeadm sets it up: a
/// client certificate from the cluster CA for `kube-apiserver-kubelet-client` (re-issued at
/// each start), and the cluster CA the kubelets verify client certificates against (their
/// `clientCAFile`). Returns (certificate, key, CA), in PEM.
fn kubelet_client_identity(data_dir: &std::path::Path) -> anyhow::Result<(String, String, String)> {
    let pki = core_cluster::auth::pki::Pki::load_or_create(data_dir, &[])
        .with_context(|| format!("setting up the PKI in {}", data_dir.display()))?;
    let cert = pki
        .issue_client(core_cluster::KUBELET_CLIENT_USER, &[])
        .context("issuing the API server's kubelet client certificate")?;
    Ok((
        cert.cert_pem.clone(),
        cert.key_pem.clone(),
        pki.ca_pem().to_owned(),
    ))
}

/// The nodes' agents dial `server` as their nodes, with client certificates from the
/// cluster CA in `data_dir` (as kubelet's client certificate is).
fn agent_tunnel_config(
    data_dir: &std::path::Path,
    server: std::net::SocketAddr,
) -> anyhow::Result<core_cluster::sim::AgentTunnelConfig> {
    let pki = Arc::new(
        core_cluster::auth::pki::Pki::load_or_create(data_dir, &[])
            .with_context(|| format!("setting up the PKI in {}", data_dir.display()))?,
    );
    Ok(core_cluster::sim::AgentTunnelConfig {
        server,
        server_name: server.ip().to_string(),
        server_ca: pki.ca_pem().to_owned(),
        credentials: Arc::new(move |node: &str| {
            pki.issue_client(&format!("system:node:{node}"), &["system:nodes"])
                .map(|c| (c.cert_pem, c.key_pem))
                .map_err(|e| e.to_string())
        }),
    })
}

/// Writes a private key readable by its owner only.
fn write_private(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// The embedded API server's Service cluster IP range unless `--service-cluster-ip-range`
/// is given (kube-apiserver's default).
const DEFAULT_SERVICE_CLUSTER_IP_RANGE: &str = "10.96.0.0/12";

/// The deploy manifests whose RBAC the embedded ccm runs under: its ServiceAccount, the
/// shared RBAC (leader election, delegated authn/authz) and the least-privilege role.
const CCM_MANIFESTS: [(&str, &str); 3] = [
    (
        "deploy/ccm-daemonset.yaml",
        include_str!("../../deploy/ccm-daemonset.yaml"),
    ),
    (
        "deploy/rbac-common.yaml",
        include_str!("../../deploy/rbac-common.yaml"),
    ),
    (
        "deploy/rbac/least-privilege.yaml",
        include_str!("../../deploy/rbac/least-privilege.yaml"),
    ),
];
/// The kinds of [`CCM_MANIFESTS`] that make the ccm's RBAC.
const CCM_RBAC_KINDS: [&str; 5] = [
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ClusterRole",
    "ClusterRoleBinding",
];
/// The ccm's service account, as in the manifest.
const CCM_NAMESPACE: &str = "kube-system";
/// The ccm's service account name, as in the manifest.
const CCM_SERVICE_ACCOUNT: &str = "cloud-controller-manager";

/// The flags of [`EmbeddedArgs`], by clap id: refused when `ccm` manages another cluster.
pub(crate) fn embedded_only_flags() -> Vec<String> {
    use clap::Args;
    EmbeddedArgs::augment_args(clap::Command::new("ccm"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect()
}

/// This control plane's identity in its Leases: `hostname_<random>`, made once and kept in
/// the data directory, so that a restarted process takes its own Lease back at once
/// (client-go lets the holder renew) instead of waiting out the lease duration, while
/// control planes with their own data directories stay distinct.
fn leader_identity(data_dir: &std::path::Path) -> anyhow::Result<String> {
    let path = data_dir.join("leader-identity");
    if let Ok(saved) = std::fs::read_to_string(&path)
        && !saved.trim().is_empty()
    {
        return Ok(saved.trim().to_owned());
    }
    let identity = crate::control_plane::new_leader_identity();
    std::fs::write(&path, &identity)
        .with_context(|| format!("writing the leader identity to {}", path.display()))?;
    Ok(identity)
}

/// The fake cloud's load balancers' addresses with `--sim-data-path`: 127.2.0.1 onwards.
const LOAD_BALANCER_BASE: Ipv4Addr = Ipv4Addr::new(127, 2, 0, 0);

/// Prints a progress line. A closed stdout (a pipe whose reader went away) must not stop
/// the cluster, so write errors are ignored instead of panicking as `println!` would.
fn say(line: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// What the progress line reports.
#[derive(Debug, Default, PartialEq, Eq, Clone)]
struct Progress {
    registered: usize,
    initialized: usize,
    ready: usize,
    with_pod_cidr: usize,
    not_ready_or_unknown: usize,
    tainted_no_execute: usize,
    load_balancer_services: usize,
    load_balancers_ensured: usize,
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "nodes: {} registered, {} initialized by the cloud, {} Ready, {} with a pod CIDR, {} NotReady/Unknown, {} tainted NoExecute; load balancers: {} of {} ensured",
            self.registered,
            self.initialized,
            self.ready,
            self.with_pod_cidr,
            self.not_ready_or_unknown,
            self.tainted_no_execute,
            self.load_balancers_ensured,
            self.load_balancer_services,
        )
    }
}

/// A Node is initialized once the cloud set its providerID and removed the uninitialized
/// taint.
fn is_initialized(node: &Node) -> bool {
    let Some(spec) = node.spec.as_ref() else {
        return false;
    };
    spec.provider_id.as_deref().is_some_and(|p| !p.is_empty())
        && !spec
            .taints
            .iter()
            .flatten()
            .any(|t| t.key == UNINITIALIZED_TAINT_KEY)
}

/// A reflector store of every `K`, fed by a watch task that ends with `shutdown`.
fn watched_store<K>(
    client: &kube::Client,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> reflector::Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(Api::<K>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff();
    let shutdown = shutdown.clone();
    tasks.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                event = stream.next() => if event.is_none() { return },
            }
        }
    });
    store
}

fn progress_of(nodes: &[Arc<Node>], services: &[Arc<Service>]) -> Progress {
    let mut p = Progress {
        registered: nodes.len(),
        ..Progress::default()
    };
    for node in nodes {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.as_str());
        if ready == Some("True") {
            p.ready += 1;
        } else {
            p.not_ready_or_unknown += 1;
        }
        if is_initialized(node) {
            p.initialized += 1;
        }
        let spec = node.spec.as_ref();
        if spec
            .and_then(|s| s.pod_cidrs.as_ref())
            .is_some_and(|c| !c.is_empty())
        {
            p.with_pod_cidr += 1;
        }
        if spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.effect == "NoExecute"))
        {
            p.tainted_no_execute += 1;
        }
    }
    for svc in services {
        let spec = svc.spec.as_ref();
        let wants = spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
            && spec.and_then(|s| s.load_balancer_class.as_ref()).is_none();
        if !wants {
            continue;
        }
        p.load_balancer_services += 1;
        let ensured = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .is_some_and(|i| !i.is_empty());
        if ensured {
            p.load_balancers_ensured += 1;
        }
    }
    p
}

/// The cloud the embedded cluster's ccm runs with: the fake built for the simulated nodes,
/// the fake from `--cloud-config`, or any linked provider through the registry.
fn embedded_cloud(
    ccm: &CloudControllerManagerOptions,
    nodes: &[SimNode],
    data_path: Option<LoadBalancerLimits>,
) -> anyhow::Result<Arc<dyn CloudProvider>> {
    if ccm.cloud_provider == cloud_provider_fake::PROVIDER_NAME && ccm.cloud_config.is_none() {
        let cloud = match data_path {
            Some(limits) => fake_cloud_builder(nodes)
                .serve_load_balancers(LOAD_BALANCER_BASE)
                .load_balancer_limits(limits)
                .build(),
            None => fake_cloud_builder(nodes).build(),
        };
        return Ok(Arc::new(cloud));
    }
    cloud_provider::init_cloud_provider(&ccm.cloud_provider, ccm.cloud_config.as_deref())?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "--cloud-provider {:?} means no provider in this process",
                ccm.cloud_provider
            )
        })
}

/// The data path's bounds (`--sim-data-path-idle-timeout`, `--sim-data-path-max-connections`):
/// the load balancers' and the node ports', drawing on one budget of descriptors, a quarter
/// of the process's open-files limit.
fn data_path_limits(
    args: &EmbeddedArgs,
) -> anyhow::Result<(LoadBalancerLimits, ServiceProxyLimits)> {
    let (idle, max) = (
        args.sim_data_path_idle_timeout,
        args.sim_data_path_max_connections,
    );
    // One type (ccm-serving's `ConnectionLimits`): the clone shares the budget. Its refusal
    // names the flag that caused it.
    let load_balancers = LoadBalancerLimits::new(idle, max).map_err(|e| {
        let flag = match e {
            LoadBalancerLimitsError::ZeroIdleTimeout => "--sim-data-path-idle-timeout",
            LoadBalancerLimitsError::MaxConnections { .. } => "--sim-data-path-max-connections",
        };
        anyhow::anyhow!("{flag}: {e}")
    })?;
    Ok((load_balancers.clone(), load_balancers))
}

/// Runs the embedded cluster until SIGTERM or Ctrl-C, or until the cloud-controller-manager
/// stops with an error (then the error is returned, for a non-zero exit).
pub(crate) async fn run(
    args: EmbeddedArgs,
    mut ipam_args: NodeIpamArgs,
    mut ccm: CloudControllerManagerOptions,
) -> anyhow::Result<()> {
    // kube-controller-manager's `--node-monitor-period` is the ccm's flag of that name here.
    let node_monitor_period = if ccm.node_monitor_period.is_non_positive() {
        Duration::ZERO
    } else {
        ccm.node_monitor_period.value
    };
    let lifecycle = args.controllers.lifecycle_config(node_monitor_period)?;
    let service_range = ipam_args
        .service_cluster_ip_range
        .get_or_insert_with(|| DEFAULT_SERVICE_CLUSTER_IP_RANGE.to_owned())
        .clone();
    // The embedded cluster's own node IPAM (kube-controller-manager's, here), with the
    // ccm's node IPAM flags and upstream's checks of them.
    let ipam = crate::nodeipam::setup(&ipam_args, &ccm).map_err(anyhow::Error::msg)?;
    // Taken by the IPAM above, so the ccm does not warn that it has no effect.
    ccm.accepted.cidr_allocator_type = None;
    ccm.validate_with(&cloud_provider_app::default_registry().names())
        .map_err(anyhow::Error::msg)?;
    let mut apiserver_args = crate::apiserver::parse_config_from(&service_range, "30000-32767")?;
    args.tolerations.apply(&mut apiserver_args);
    let fleet = Fleet::from_args(&args.sim, args.sim_kubelet_api)?;
    let data_path = args.sim_data_path && args.sim_kubelet_api;
    let (load_balancer_limits, node_port_limits) = data_path_limits(&args)?;
    let cloud = embedded_cloud(
        &ccm,
        &fleet.nodes,
        data_path.then_some(load_balancer_limits),
    )?;

    let temp;
    let data_dir = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary data directory")?;
            temp.path().to_owned()
        }
    };
    let store: Arc<dyn Store> = args.store.open(&data_dir).await?;
    let serving_ca = if args.sim_kubelet_api {
        Some(kubelet_serving_ca(&data_dir)?)
    } else {
        None
    };
    apiserver_args.kubelet = args.kubelet.config(
        &EMBEDDED_ADDRESS_TYPES,
        serving_ca.as_ref().map(|ca| ca.cert_pem.clone()),
    )?;
    let agent_tunnel = args.sim_agent_tunnel && args.sim_kubelet_api;
    if agent_tunnel {
        apiserver_args.kubelet.egress = core_cluster::NodeEgress::AgentTunnel;
    }
    // Pods get their service account's identity (the serviceaccounts controller below
    // makes the `default` accounts the plugin needs).
    apiserver_args.service_account_admission = true;

    // The kubelets authenticate every request (client certificates from the cluster CA,
    // tokens by TokenReview) and authorize it by SubjectAccessReview: the API server
    // presents kubeadm's kubelet client certificate unless given its own.
    let kubelet_client_ca = if args.sim_kubelet_api {
        let (cert, key, ca) = kubelet_client_identity(&data_dir)?;
        if apiserver_args.kubelet.client_certificate.is_none() {
            apiserver_args.kubelet.client_certificate = Some(cert);
            apiserver_args.kubelet.client_key = Some(key);
        }
        Some(ca)
    } else {
        None
    };
    let server = ApiServer::new(store, apiserver_args).await?;
    if args.sim_kubelet_api {
        server
            .apply_manifest(
                &core_cluster::kubelet_api_admin_binding(core_cluster::KUBELET_CLIENT_USER),
                &["ClusterRoleBinding"],
            )
            .await
            .context("binding system:kubelet-api-admin to the API server's kubelet client")?;
    }
    // The ccm's RBAC, exactly as deployed: the cluster enforces Node,RBAC and the ccm runs
    // under its service account with the least-privilege role and nothing more.
    for (path, manifest) in CCM_MANIFESTS {
        server
            .apply_manifest(manifest, &CCM_RBAC_KINDS)
            .await
            .with_context(|| format!("installing the ccm's RBAC from {path}"))?;
    }
    let shutdown = CancellationToken::new();
    if !args.store.etcd_compaction_interval.is_zero() {
        server.spawn_compactor(args.store.etcd_compaction_interval, shutdown.clone());
    }
    server.spawn_service_repair(crate::apiserver::SERVICE_REPAIR_INTERVAL, shutdown.clone());
    if !args.store.etcd_servers.is_empty() {
        // Other API servers write to the same etcd: RBAC, the Node graph, custom resource
        // definitions and namespace deletions follow their writes too.
        server.spawn_store_follower(shutdown.clone());
    }
    // On etcd shared with other control planes, this one's PKI must be theirs (the same CA
    // and service-account key, as kubeadm copies them to each control-plane node): checked
    // before anything is served, as `ccm apiserver --etcd-servers` does.
    let secure = crate::apiserver::SecureServing::start(
        &server,
        &data_dir,
        &args.listen,
        &[],
        Some(&args.write_kubeconfig),
        !args.store.etcd_servers.is_empty(),
        shutdown.clone(),
    )
    .await?;
    // The ccm's secure port trusts the cluster's client certificates (the kubeconfig's
    // admin reads /metrics), as upstream's would through extension-apiserver-authentication.
    if ccm.client_ca_file.is_none() {
        ccm.client_ca_file = Some(data_dir.join("pki").join("ca.crt"));
    }
    say(format_args!(
        "embedded cluster: API server on {}, store in {}",
        secure.url,
        data_dir.display()
    ));
    say(format_args!(
        "  kubectl --kubeconfig {} get nodes",
        args.write_kubeconfig.display()
    ));

    // The controllers are API clients like any other; in-process they skip TCP. Each runs
    // under the supervisor: a panic restarts it after a backoff and is counted in
    // `controller_panics_total`; one that keeps panicking fails `/livez` (a check named
    // after it, as kube-controller-manager names its controllers' checks).
    //
    // They act only while this process leads, as kube-controller-manager and kube-scheduler
    // do, so that several control planes on one etcd never both act: the controllers under
    // the Lease `kube-system/kube-controller-manager`, the scheduler under
    // `kube-system/kube-scheduler`.
    let client = kube::Client::new(server.router(), "default");
    let mut tasks = tokio::task::JoinSet::new();
    let supervisor = Supervisor::default();
    server.register_metric(PANICS_METRIC, PANICS_HELP, supervisor.panics_metric());
    let ca_path = data_dir.join("pki").join("ca.crt");
    let root_ca = std::fs::read_to_string(&ca_path)
        .with_context(|| format!("reading the cluster CA {}", ca_path.display()))?;
    let plan = ControlPlane {
        client: client.clone(),
        lifecycle,
        args: args.controllers.clone(),
        root_ca: Some(root_ca),
        // The kubelet-serving signer issues from the CA the simulated kubelets' serving
        // certificates come from.
        signing_ca: serving_ca.as_ref().map(|ca| SigningCa {
            cert_pem: ca.cert_pem.clone(),
            key_pem: ca.key_pem.clone(),
        }),
        ipam: ipam.config.allocate_node_cidrs.then_some(ipam),
        leader_identity: Some(leader_identity(&data_dir)?),
        // The API server deletes a namespace's contents and finalizes it itself.
        namespace_controller: false,
    };
    crate::control_plane::spawn(plan, &supervisor, &mut tasks, &shutdown)?;
    server.add_livez_checks(supervisor.health_checks());

    // The cloud-controller-manager, exactly as against any cluster.
    say(format_args!(
        "  cloud-controller-manager: --cloud-provider {}, controllers {}",
        cloud.provider_name(),
        ccm.controllers.join(",")
    ));
    // With the token authenticator, so the ccm's secure port can ask for TokenReviews.
    let mut ccm_router = server.router_as(service_account_user(CCM_NAMESPACE, CCM_SERVICE_ACCOUNT));
    if let Some(tokens) = secure.tokens.clone() {
        ccm_router = ccm_router.layer(axum::Extension(tokens));
    }
    let ccm_client = kube::Client::new(ccm_router, "default");
    let mut manager = tokio::spawn(cloud_provider_app::run_with(
        ccm,
        cloud_provider_app::default_registry(),
        cloud,
        ccm_client,
        shutdown.child_token(),
        HealthChecks::new(),
    ));

    if fleet.config.lease_renew_interval() >= args.controllers.node_monitor_grace_period {
        eprintln!(
            "warning: simulated nodes renew every {:?}, longer than --node-monitor-grace-period {:?}: healthy nodes will flap to Unknown",
            fleet.config.lease_renew_interval(),
            args.controllers.node_monitor_grace_period
        );
    }
    // Each kubelet acts as its own node (`system:node:<name>`), under the Node authorizer
    // and NodeRestriction; the simulator's fleet-wide watches use the loopback client.
    // They mint their pods' projected tokens through TokenRequest, which needs the token
    // authenticator in process as on the network.
    let per_node = server.clone();
    let node_tokens = secure.tokens.clone();
    let node_clients: NodeClientFactory = Arc::new(move |name: &str| {
        let mut router = per_node.router_as(node_user(name));
        if let Some(tokens) = node_tokens.clone() {
            router = router.layer(axum::Extension(tokens));
        }
        kube::Client::new(router, "default")
    });
    let extras = InProcess {
        node_clients: Some(node_clients),
        kubelet_api: serving_ca.map(|ca| KubeletApiConfig {
            serving_ca: Some(ca),
            auth: KubeletAuthConfig {
                client_ca: kubelet_client_ca,
                ..KubeletAuthConfig::default()
            },
            ..KubeletApiConfig::default()
        }),
        service_proxy: data_path.then_some(node_port_limits),
        agent_tunnel: if agent_tunnel {
            Some(agent_tunnel_config(&data_dir, secure.addr)?)
        } else {
            None
        },
    };
    let zones = fleet.zones.join(", ");
    let node_count = crate::simulation::spawn(client.clone(), fleet, extras, &mut tasks, &shutdown);
    say(format_args!(
        "  {node_count} simulated nodes across {zones}"
    ));

    // Progress comes from two watches kept in reflector stores: one list at the start, then
    // only changes, so counting 10,000 nodes every second costs the API server nothing.
    let nodes = watched_store::<Node>(&client, &mut tasks, &shutdown);
    let services = watched_store::<Service>(&client, &mut tasks, &shutdown);
    let mut last = Progress::default();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let terminated = crate::signals::terminated();
    tokio::pin!(terminated);
    let mut failure = None;
    loop {
        tokio::select! {
            _ = &mut terminated => break,
            ended = &mut manager => {
                failure = Some(match ended {
                    Ok(Ok(())) => anyhow::anyhow!("the cloud-controller-manager stopped"),
                    Ok(Err(error)) => anyhow::Error::new(error).context("cloud-controller-manager"),
                    Err(join) => anyhow::anyhow!("the cloud-controller-manager task failed: {join}"),
                });
                break;
            }
            _ = ticker.tick() => {
                let now = progress_of(&nodes.state(), &services.state());
                if now != last {
                    say(&now);
                    last = now;
                }
            }
        }
    }
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        if failure.is_none() {
            let _ = (&mut manager).await;
        }
        while tasks.join_next().await.is_some() {}
    })
    .await;
    say(format_args!("summary: {last}"));
    match failure {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulation::{sim_config, sim_fleet, sim_nodes};

    fn node(provider_id: Option<&str>, tainted: bool) -> Node {
        let mut node = Node::default();
        let spec = node.spec.get_or_insert_default();
        spec.provider_id = provider_id.map(str::to_owned);
        if tainted {
            spec.taints = Some(vec![core_cluster::sim::uninitialized_taint()]);
        }
        node
    }

    #[test]
    fn initialized_means_provider_id_and_no_uninitialized_taint() {
        assert!(is_initialized(&node(Some("fake://i-1"), false)));
        assert!(!is_initialized(&node(Some("fake://i-1"), true)));
        assert!(!is_initialized(&node(None, false)));
        assert!(!is_initialized(&node(Some(""), false)));
    }

    #[test]
    fn every_simulated_node_has_a_running_instance_with_its_ip() {
        let zones = vec!["a".to_owned(), "b".to_owned()];
        let args = <EmbeddedArgsParser as clap::Parser>::parse_from(["ccm", "--sim-nodes", "3"]);
        let nodes = sim_nodes(&args.args.sim, &zones, args.args.sim_kubelet_api);
        let cloud = fake_cloud_builder(&nodes).build();
        let instances = cloud.instances();
        assert_eq!(instances.len(), 3);
        for (node, instance) in nodes.iter().zip(&instances) {
            assert_eq!(instance.name, node.name);
            assert_eq!(Some(instance.zone.clone()), node.zone);
            assert!(
                instance
                    .addresses
                    .iter()
                    .any(|a| Some(a.address.clone()) == node.ip.map(|ip| ip.to_string()))
            );
        }
        assert_eq!(nodes[2].zone.as_deref(), Some("a"));
        let named = <EmbeddedArgsParser as clap::Parser>::parse_from([
            "ccm",
            "--sim-node-names",
            "i-1,i-2",
        ]);
        let nodes = sim_nodes(&named.args.sim, &zones, true);
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1].name, "i-2");
        assert!(
            nodes[1].ip.is_none(),
            "the cloud's addresses are taken as they are"
        );
    }

    /// kubelet's `ValidateKubeletConfiguration`: `shutdownGracePeriodCriticalPods` must not
    /// exceed `shutdownGracePeriod`; the error names the field, and the flags reach the
    /// simulator's configuration.
    #[test]
    fn simulator_shutdown_flags_are_checked_as_kubelet_checks_them() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["ccm"];
            argv.extend_from_slice(extra);
            <EmbeddedArgsParser as clap::Parser>::parse_from(argv)
                .args
                .sim
        };
        let ok = sim_config(&parse(&[
            "--sim-shutdown-grace-period",
            "30s",
            "--sim-shutdown-grace-period-critical-pods",
            "10s",
        ]))
        .unwrap();
        assert_eq!(ok.shutdown_grace_period, Duration::from_secs(30));
        assert_eq!(
            ok.shutdown_grace_period_critical_pods,
            Duration::from_secs(10)
        );
        let bad = sim_config(&parse(&[
            "--sim-shutdown-grace-period-critical-pods",
            "10s",
        ]))
        .unwrap_err();
        let text = format!("{bad:#}");
        assert!(
            text.contains("shutdownGracePeriodCriticalPods") && text.contains("--sim-"),
            "{text}"
        );
    }

    /// kubelet's registration flags reach the simulator as kubelet parses them
    /// (`ParseTaints`, `ValidateKubeletFlags`, `GetNodeAllocatableReservation`), and a
    /// malformed one stops `ccm` at start naming the flag.
    #[test]
    fn simulator_registration_flags_are_parsed_as_kubelet_parses_them() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["ccm"];
            argv.extend_from_slice(extra);
            <EmbeddedArgsParser as clap::Parser>::parse_from(argv)
                .args
                .sim
        };
        let ok = sim_config(&parse(&[
            "--sim-register-with-taints",
            "dedicated=gpu:NoSchedule",
            "--sim-node-labels",
            "node.kubernetes.io/instance-type=sim,team=a",
            "--sim-kube-reserved",
            "cpu=500m,memory=1Gi",
            "--sim-register-node=false",
        ]))
        .unwrap();
        let keys: Vec<&str> = ok
            .register_with_taints
            .iter()
            .map(|t| t.key.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "dedicated",
                "node.cloudprovider.kubernetes.io/uninitialized"
            ]
        );
        assert_eq!(ok.node_labels.len(), 2);
        assert!(!ok.register_node);
        assert_eq!(ok.allocatable.cpu, "3500m");
        // 16Gi - 1Gi - memory.available's 100Mi.
        assert_eq!(ok.allocatable.memory, "15260Mi");
        // 100Gi - nodefs.available's 10 %.
        assert_eq!(ok.allocatable.ephemeral_storage, "90Gi");
        for (flag, value, needle) in [
            (
                "--sim-register-with-taints",
                "a=b:Sometimes",
                "invalid taint effect",
            ),
            ("--sim-node-labels", "kubernetes.io/role=x", "unknown"),
            ("--sim-kube-reserved", "gpu=1", "cannot reserve"),
            (
                "--sim-eviction-hard",
                "disk.available<1Gi",
                "unsupported eviction signal",
            ),
        ] {
            let text = format!("{:#}", sim_config(&parse(&[flag, value])).unwrap_err());
            assert!(
                text.contains(&flag[2..]) && text.contains(needle),
                "{flag}: {text}"
            );
        }
    }

    /// The simulator config file reaches each node over the flags, adds the nodes it names,
    /// and a malformed one stops `ccm` at start naming the file, the node and the field
    /// (kubelet's `ValidateKubeletConfiguration` and `--node-ip` checks).
    #[test]
    fn a_simulator_config_file_configures_each_node_and_a_bad_one_stops_ccm() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.yaml");
        let parse = |extra: &[&str]| {
            let mut argv = vec!["ccm", "--sim-nodes", "2", "--sim-config"];
            argv.push(path.to_str().unwrap());
            argv.extend_from_slice(extra);
            <EmbeddedArgsParser as clap::Parser>::parse_from(argv).args
        };
        std::fs::write(
            &path,
            "apiVersion: sim.ccm-rs.io/v1alpha1\nkind: NodeSimulatorConfiguration\nnodes:\n  - name: sim-node-1\n    machine: {swap: 2Gi}\n    kubelet: {failSwapOn: false, memorySwap: {swapBehavior: LimitedSwap}}\n  - name: extra\n    kubelet: {topologyManagerPolicy: single-numa-node}\n",
        )
        .unwrap();
        let zones = ["zone-a".to_owned(), "zone-b".to_owned()];
        let (config, nodes) =
            sim_fleet(&parse(&["--sim-kube-reserved", "cpu=1"]).sim, &zones, true).unwrap();
        assert_eq!(config.allocatable.cpu, "3");
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["sim-node-0", "sim-node-1", "extra"]);
        assert!(nodes[0].config.is_none());
        let own = nodes[1].config.as_ref().unwrap();
        assert_eq!(own.swap.capacity, 2 << 30);
        assert_eq!(own.allocatable.cpu, "3", "the flags' reservation stays");
        assert_eq!(nodes[2].zone.as_deref(), Some("zone-a"));
        assert_eq!(nodes[2].ip, Some("127.1.0.3".parse().unwrap()));
        assert!(
            own.register_with_taints
                .iter()
                .any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized")
        );

        std::fs::write(
            &path,
            "apiVersion: sim.ccm-rs.io/v1alpha1\nkind: NodeSimulatorConfiguration\nnodes:\n  - name: sim-node-1\n    kubelet: {evictionHard: {disk.available: 1Gi}}\n",
        )
        .unwrap();
        let text = format!(
            "{:#}",
            sim_fleet(&parse(&[]).sim, &zones, true).unwrap_err()
        );
        assert!(
            text.contains("--sim-config")
                && text.contains("node \"sim-node-1\": evictionHard: unsupported eviction signal"),
            "{text}"
        );
    }

    /// The data path's bounds: an AWS Classic or Application Load Balancer's idle timeout
    /// (60 s) and 1,024 connections per listener by default, one descriptor budget for the
    /// load balancers and the node ports, and a bound of 0 stops `ccm` naming its flag.
    #[test]
    fn data_path_flags_bound_both_halves_of_the_data_path_with_one_budget() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["ccm"];
            argv.extend_from_slice(extra);
            <EmbeddedArgsParser as clap::Parser>::parse_from(argv).args
        };
        let (load_balancers, node_ports) = data_path_limits(&parse(&[])).unwrap();
        assert_eq!(load_balancers.idle_timeout(), Duration::from_secs(60));
        assert_eq!(node_ports.idle_timeout(), Duration::from_secs(60));
        assert_eq!(load_balancers.max_connections(), 1024);
        assert_eq!(node_ports.max_connections(), 1024);
        assert!(Arc::ptr_eq(
            load_balancers.descriptors(),
            node_ports.descriptors()
        ));
        let (load_balancers, _) = data_path_limits(&parse(&[
            "--sim-data-path-idle-timeout",
            "350s",
            "--sim-data-path-max-connections",
            "10",
        ]))
        .unwrap();
        assert_eq!(load_balancers.idle_timeout(), Duration::from_secs(350));
        assert_eq!(load_balancers.max_connections(), 10);
        for (flag, value) in [
            ("--sim-data-path-idle-timeout", "0s"),
            ("--sim-data-path-max-connections", "0"),
        ] {
            let e = data_path_limits(&parse(&[flag, value])).unwrap_err();
            assert!(e.to_string().starts_with(flag), "{e}");
        }
    }

    #[derive(clap::Parser)]
    struct EmbeddedArgsParser {
        #[command(flatten)]
        args: EmbeddedArgs,
    }
}
