//! `ccm apiserver`: core-cluster's API server as a process, on a durable data directory.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context, bail};
use core_cluster::{
    ApiServer, ApiServerConfig, DEFAULT_PREFERRED_ADDRESS_TYPES, KubeletClientConfig, NodeEgress,
    serve,
    store::{MemoryStore, Store},
};
use ipnet::IpNet;
use tokio_util::sync::CancellationToken;

/// Flags of `ccm apiserver`.
#[derive(Debug, clap::Args)]
pub(crate) struct ApiServerArgs {
    /// Address to listen on (loopback by default; port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: String,
    /// Directory of the durable store (SQLite, WAL) and the PKI (`pki/`); with
    /// `--etcd-servers`, of the PKI only. Every API server of one etcd needs the same CA and
    /// service-account key (`pki/ca.crt`, `ca.key`, `sa.key`, copied from the first server's
    /// data directory): a server whose PKI differs from the one recorded in etcd by the first
    /// refuses to start, naming the files. Created if missing.
    #[arg(long, required_unless_present = "in_memory")]
    data_dir: Option<PathBuf>,
    /// Keep everything in memory instead (lost on exit; for experiments).
    #[arg(long, conflicts_with_all = ["data_dir", "etcd_servers"])]
    in_memory: bool,
    /// Write a kubeconfig for this server to FILE (https, the cluster CA embedded, the
    /// admin's client certificate and key).
    #[arg(long, value_name = "FILE")]
    write_kubeconfig: Option<PathBuf>,
    /// Extra DNS names or IP addresses for the serving certificate (k3s' `--tls-san`).
    #[arg(long = "tls-san", value_name = "NAME", value_delimiter = ',')]
    tls_san: Vec<String>,
    /// CIDRs for Service ClusterIPs (one, or one per family, comma-separated).
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
    /// Port range for NodePorts, `LOW-HIGH`.
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: String,
    #[command(flatten)]
    store: crate::flags::StoreArgs,
    #[command(flatten)]
    kubelet: KubeletClientArgs,
    #[command(flatten)]
    tolerations: TolerationArgs,
}

/// kube-apiserver's DefaultTolerationSeconds admission flags.
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct TolerationArgs {
    /// Seconds of the `node.kubernetes.io/not-ready:NoExecute` toleration added to every
    /// pod that has none: how long its pods stay on a node that is not ready.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(i64).range(0..))]
    default_not_ready_toleration_seconds: i64,
    /// Seconds of the `node.kubernetes.io/unreachable:NoExecute` toleration added to every
    /// pod that has none: how long its pods stay on an unreachable node.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(i64).range(0..))]
    default_unreachable_toleration_seconds: i64,
}

impl TolerationArgs {
    /// Sets the two toleration seconds of `config`.
    pub(crate) fn apply(&self, config: &mut ApiServerConfig) {
        config.default_not_ready_toleration_seconds = self.default_not_ready_toleration_seconds;
        config.default_unreachable_toleration_seconds = self.default_unreachable_toleration_seconds;
    }
}

/// How the API server reaches kubelets for logs and the node proxy: kube-apiserver's
/// `--kubelet-*` flags.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct KubeletClientArgs {
    /// Node address types tried in order when dialling a kubelet, comma-separated. Default:
    /// upstream's Hostname,InternalDNS,InternalIP,ExternalDNS,ExternalIP (the embedded
    /// cluster: kubeadm's InternalIP,ExternalIP,Hostname, since simulated hostnames do not
    /// resolve).
    #[arg(long, value_name = "TYPES", value_delimiter = ',')]
    kubelet_preferred_address_types: Vec<String>,
    /// PEM CA bundle the kubelets' serving certificates are verified against; a kubelet
    /// presenting another certificate is refused. Without it they are not verified, as
    /// upstream (the embedded cluster gives its own kubelet-serving CA unless this is set).
    #[arg(long, value_name = "FILE")]
    kubelet_certificate_authority: Option<PathBuf>,
    /// PEM client certificate the API server presents to kubelets.
    #[arg(long, value_name = "FILE", requires = "kubelet_client_key")]
    kubelet_client_certificate: Option<PathBuf>,
    /// The private key of `--kubelet-client-certificate`.
    #[arg(long, value_name = "FILE", requires = "kubelet_client_certificate")]
    kubelet_client_key: Option<PathBuf>,
    /// How long dialling a kubelet, its TLS handshake and its answer's headers may take
    /// (log streams are not bounded).
    #[arg(long, default_value = "5s", value_parser = crate::flags::parse_duration)]
    kubelet_timeout: std::time::Duration,
    /// How kubelets are reached (the `cluster` egress of upstream's
    /// EgressSelectorConfiguration): `direct`, a connection to the address each Node
    /// advertises (upstream's default); or `agent-tunnel`, only over the connection each
    /// node's agent opened to this server (Konnectivity's model, built in: a node behind
    /// NAT is reached, a node whose agent is not connected is not).
    #[arg(long, default_value = "direct", value_parser = ["direct", "agent-tunnel"])]
    node_egress: String,
}

impl KubeletClientArgs {
    /// The settings, with `default_types` when `--kubelet-preferred-address-types` is not
    /// given and `default_ca` (PEM) when `--kubelet-certificate-authority` is not.
    pub(crate) fn config(
        &self,
        default_types: &[&str],
        default_ca: Option<String>,
    ) -> anyhow::Result<KubeletClientConfig> {
        let read = |flag: &str, path: &Option<PathBuf>| -> anyhow::Result<Option<String>> {
            path.as_ref()
                .map(|p| {
                    std::fs::read_to_string(p)
                        .with_context(|| format!("--{flag}: reading {}", p.display()))
                })
                .transpose()
        };
        const KNOWN: [&str; 5] = DEFAULT_PREFERRED_ADDRESS_TYPES;
        if let Some(bad) = self
            .kubelet_preferred_address_types
            .iter()
            .find(|t| !KNOWN.contains(&t.as_str()))
        {
            bail!(
                "--kubelet-preferred-address-types: {bad:?} is not one of {}",
                KNOWN.join(", ")
            );
        }
        let types = if self.kubelet_preferred_address_types.is_empty() {
            default_types.iter().map(|t| (*t).to_owned()).collect()
        } else {
            self.kubelet_preferred_address_types.clone()
        };
        Ok(KubeletClientConfig {
            preferred_address_types: types,
            certificate_authority: read(
                "kubelet-certificate-authority",
                &self.kubelet_certificate_authority,
            )?
            .or(default_ca),
            client_certificate: read(
                "kubelet-client-certificate",
                &self.kubelet_client_certificate,
            )?,
            client_key: read("kubelet-client-key", &self.kubelet_client_key)?,
            timeout: self.kubelet_timeout,
            egress: if self.node_egress == "agent-tunnel" {
                NodeEgress::AgentTunnel
            } else {
                NodeEgress::Direct
            },
            ..KubeletClientConfig::default()
        })
    }
}

pub(crate) fn parse_config(args: &ApiServerArgs) -> anyhow::Result<ApiServerConfig> {
    let mut config = parse_config_from(
        &args.service_cluster_ip_range,
        &args.service_node_port_range,
    )?;
    config.kubelet = args
        .kubelet
        .config(&DEFAULT_PREFERRED_ADDRESS_TYPES, None)?;
    args.tolerations.apply(&mut config);
    Ok(config)
}

/// The API server settings from `--service-cluster-ip-range` and `--service-node-port-range`.
pub(crate) fn parse_config_from(
    ip_range: &str,
    port_range: &str,
) -> anyhow::Result<ApiServerConfig> {
    let ranges: Vec<IpNet> = ip_range
        .split(',')
        .map(|r| {
            r.trim()
                .parse::<IpNet>()
                .map(|n| n.trunc())
                .with_context(|| format!("--service-cluster-ip-range: {r:?} is not a CIDR"))
        })
        .collect::<Result<_, _>>()?;
    if ranges.is_empty()
        || ranges.len() > 2
        || (ranges.len() == 2 && ranges[0].addr().is_ipv6() == ranges[1].addr().is_ipv6())
    {
        bail!("--service-cluster-ip-range takes one CIDR, or one IPv4 and one IPv6 CIDR");
    }
    let (low, high) = port_range
        .split_once('-')
        .context("--service-node-port-range must be LOW-HIGH, e.g. 30000-32767")?;
    let low: u16 = low
        .trim()
        .parse()
        .context("--service-node-port-range: LOW is not a port")?;
    let high: u16 = high
        .trim()
        .parse()
        .context("--service-node-port-range: HIGH is not a port")?;
    if low == 0 || low > high {
        bail!("--service-node-port-range: {low}-{high} is empty or starts at 0");
    }
    Ok(ApiServerConfig {
        service_cluster_ip_ranges: ranges,
        service_node_port_range: low..=high,
        ..ApiServerConfig::default()
    })
}

/// Runs the API server until SIGTERM or Ctrl-C.
/// How often the Service IP and port ranges are repaired: kube-apiserver's 3 minutes.
pub(crate) const SERVICE_REPAIR_INTERVAL: std::time::Duration = std::time::Duration::from_secs(180);

pub(crate) async fn run(args: ApiServerArgs) -> anyhow::Result<()> {
    let config = parse_config(&args)?;
    let store: Arc<dyn Store> = match &args.data_dir {
        Some(dir) => args.store.open(dir).await?,
        None => Arc::new(MemoryStore::new()),
    };
    let server = ApiServer::new(store, config).await?;
    let shutdown = CancellationToken::new();
    let compaction = args.store.etcd_compaction_interval;
    if !compaction.is_zero() {
        server.spawn_compactor(compaction, shutdown.clone());
    }
    server.spawn_service_repair(SERVICE_REPAIR_INTERVAL, shutdown.clone());
    if !args.store.etcd_servers.is_empty() {
        // Other API servers write to the same etcd: RBAC, the Node graph, custom resource
        // definitions and namespace deletions follow their writes too.
        server.spawn_store_follower(shutdown.clone());
    }
    // The PKI lives beside the store; an in-memory server gets a throwaway one.
    let temp;
    let pki_dir = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary PKI directory")?;
            temp.path().to_owned()
        }
    };
    let secure = SecureServing::start(
        &server,
        &pki_dir,
        &args.listen,
        &args.tls_san,
        args.write_kubeconfig.as_deref(),
        !args.store.etcd_servers.is_empty(),
        shutdown.clone(),
    )
    .await?;
    println!("serving the Kubernetes API on {}", secure.url);
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            crate::signals::terminated().await;
            shutdown.cancel();
        }
    });
    secure.task.await.context("the server task")??;
    eprintln!("shut down");
    Ok(())
}

/// The API server served over TLS with authentication (the PKI under the data directory).
pub(crate) struct SecureServing {
    /// `https://<address>`.
    pub(crate) url: String,
    /// The address clients on this machine dial (loopback for an unspecified listen address).
    pub(crate) addr: SocketAddr,
    /// The server, until shutdown.
    pub(crate) task: tokio::task::JoinHandle<Result<(), core_cluster::serve::ServeError>>,
    /// The service-account token authenticator, for in-process routers that serve
    /// TokenRequest and TokenReview (the network router has it already).
    pub(crate) tokens: Option<std::sync::Arc<core_cluster::auth::token::TokenAuthenticator>>,
}

impl SecureServing {
    /// Loads or creates the PKI in `data_dir` (the listen address and `tls_san` in the
    /// serving certificate), binds `listen`, writes the admin kubeconfig to `kubeconfig` and
    /// serves until `shutdown`. On a store `shared` with other API servers (etcd), it first
    /// records this PKI's identity there or refuses to start when it differs from the one
    /// the first server recorded ([`serve::Security::check_cluster_identity`]: the error
    /// names the files to copy), before the CA is published or anything served.
    pub(crate) async fn start(
        server: &ApiServer,
        data_dir: &Path,
        listen: &str,
        tls_san: &[String],
        kubeconfig: Option<&Path>,
        shared: bool,
        shutdown: CancellationToken,
    ) -> anyhow::Result<SecureServing> {
        let (listener, addr): (_, SocketAddr) = serve::bind(listen).await?;
        let mut names: Vec<String> = tls_san.to_vec();
        if !addr.ip().is_unspecified() {
            names.push(addr.ip().to_string());
        }
        let security = serve::Security::load(server, data_dir, &names)
            .with_context(|| format!("setting up TLS in {}", data_dir.display()))?;
        if shared {
            security.check_cluster_identity(server).await?;
        }
        security.publish_client_ca(server).await?;
        if let Some(path) = kubeconfig {
            serve::write_kubeconfig(path, &security.admin_kubeconfig(addr))?;
        }
        let tokens = security.authenticator.tokens().cloned();
        // The `default/kubernetes` Service's endpoints name this server (kube-apiserver's
        // endpoint reconciler); an unspecified listen address is reached on loopback.
        let advertised = if addr.ip().is_unspecified() {
            IpAddr::from([127, 0, 0, 1])
        } else {
            addr.ip()
        };
        server.spawn_endpoint_reconciler(advertised, addr.port(), shutdown.clone());
        let task = tokio::spawn({
            let server = server.clone();
            async move {
                serve::serve(
                    server,
                    &security,
                    listener,
                    serve::ServeOptions::default(),
                    shutdown,
                )
                .await
            }
        });
        Ok(SecureServing {
            url: serve::https_url(addr),
            addr: SocketAddr::new(advertised, addr.port()),
            task,
            tokens,
        })
    }
}
