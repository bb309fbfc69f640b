//! The command-line flags of the cloud-controller-manager, with upstream's names and defaults
//! (`k8s.io/cloud-provider/options`), and a [`CloudControllerManagerOptions::validate`] that
//! also rejects what upstream accepts and then misbehaves on.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

/// Canonical controller names, and the aliases upstream accepts for them
/// (`names.CCMControllerAliases()`).
pub(crate) const CONTROLLER_ALIASES: &[(&str, &str)] = &[
    ("cloud-node", "cloud-node-controller"),
    ("cloud-node-lifecycle", "cloud-node-lifecycle-controller"),
    ("service", "service-lb-controller"),
    ("route", "node-route-controller"),
];

/// The canonical names of the four shared cloud controllers.
pub(crate) const DEFAULT_CONTROLLERS: &[&str] = &[
    "cloud-node-controller",
    "cloud-node-lifecycle-controller",
    "service-lb-controller",
    "node-route-controller",
];

/// Resolves an alias (`service`) to its canonical name (`service-lb-controller`); canonical
/// and unknown names are returned unchanged.
pub(crate) fn canonical_controller_name(name: &str) -> &str {
    CONTROLLER_ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map_or(name, |(_, canonical)| canonical)
}

/// Log output format (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// An invalid flag combination, with a message naming the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid options: {}", .0.join("; "))]
pub struct OptionsError(pub Vec<String>);

/// A flag value that is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GoDurationError {
    /// Not a number followed by a unit, or out of range.
    #[error("invalid duration {0:?}")]
    Invalid(String),
    /// A number without a unit (Go accepts a bare `0` only).
    #[error("missing unit in duration {0:?}")]
    MissingUnit(String),
    /// A unit Go does not know.
    #[error("unknown unit {unit:?} in duration {text:?}")]
    UnknownUnit {
        /// The unit as written.
        unit: String,
        /// The whole flag value.
        text: String,
    },
}

/// Parses a Go duration (`5s`, `1m30s`, `300ms`, `1h`, `0`); a leading `-` is allowed and
/// parses to a negative value, so [`CloudControllerManagerOptions::validate`] can name it.
pub fn parse_go_duration(text: &str) -> Result<GoDuration, GoDurationError> {
    let invalid = || GoDurationError::Invalid(text.to_owned());
    let (negative, mut rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if rest == "0" {
        return Ok(GoDuration {
            negative,
            value: Duration::ZERO,
        });
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| GoDurationError::MissingUnit(text.to_owned()))?;
        if number_len == 0 {
            return Err(invalid());
        }
        let number: f64 = rest[..number_len].parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            unit => {
                return Err(GoDurationError::UnknownUnit {
                    unit: unit.to_owned(),
                    text: text.to_owned(),
                });
            }
        };
        rest = &rest[unit_len..];
        total += number * seconds;
    }
    Duration::try_from_secs_f64(total)
        .map(|value| GoDuration { negative, value })
        .map_err(|_| invalid())
}

/// An invalid `--cluster-cidr`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterCidrError {
    /// An entry that is not a CIDR.
    #[error("--cluster-cidr: {0:?} is not a CIDR")]
    NotACidr(String),
    /// More than one CIDR per IP family.
    #[error("--cluster-cidr: at most two CIDRs (one per IP family), got {0}")]
    TooMany(usize),
    /// Two CIDRs of one family.
    #[error("--cluster-cidr: two CIDRs must be one IPv4 and one IPv6, got {0} and {1}")]
    SameFamily(IpNet, IpNet),
}

/// A duration flag value: Go syntax, possibly negative (which validation rejects).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration {
    /// Whether the flag had a leading `-`.
    pub negative: bool,
    /// The magnitude.
    pub value: Duration,
}

impl GoDuration {
    /// A non-negative duration.
    pub const fn new(value: Duration) -> Self {
        GoDuration {
            negative: false,
            value,
        }
    }

    /// Whether this is zero or negative.
    pub fn is_non_positive(&self) -> bool {
        self.negative || self.value.is_zero()
    }
}

impl std::str::FromStr for GoDuration {
    type Err = GoDurationError;
    fn from_str(text: &str) -> Result<Self, GoDurationError> {
        parse_go_duration(text)
    }
}

/// Every flag of the cloud-controller-manager. `clap::Args`, so a vendor binary can
/// `#[command(flatten)]` it next to its own flags.
#[derive(Debug, Clone, clap::Args)]
pub struct CloudControllerManagerOptions {
    /// The provider to run, by its registered name. Required.
    #[arg(long, default_value = "")]
    pub cloud_provider: String,
    /// Path to the provider's configuration file, handed to its factory.
    #[arg(long)]
    pub cloud_config: Option<PathBuf>,
    /// Beyond upstream (the shape of the provisional KEP-5778, several cloud controller
    /// managers in one cluster): the platforms whose Nodes this ccm owns, overriding the
    /// provider's own list. A Node's platform is its `cloudprovider.kubernetes.io/platform`
    /// annotation, else its provider ID's scheme; every controller acts only on owned Nodes
    /// and never deletes another's. Default empty: the provider's list, and with none every
    /// Node, as upstream.
    #[arg(long, value_delimiter = ',')]
    pub cloud_provider_platforms: Vec<String>,
    /// Controllers to run: `*` (all on by default), `foo` (enable), `-foo` (disable); the
    /// first mention of a name wins.
    #[arg(long, value_delimiter = ',', default_value = "*")]
    pub controllers: Vec<String>,
    /// Cluster name passed to every load-balancer and route call.
    #[arg(long, default_value = "kubernetes")]
    pub cluster_name: String,
    /// Pod CIDRs of the cluster (comma list, one per IP family), needed by the route controller.
    #[arg(long, default_value = "")]
    pub cluster_cidr: String,
    /// Whether pod CIDRs are allocated (vendor node-IPAM controllers only).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allocate_node_cidrs: bool,
    /// Whether the route controller runs.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub configure_cloud_routes: bool,
    /// Period of the node-lifecycle loop.
    #[arg(long, default_value = "5s")]
    pub node_monitor_period: GoDuration,
    /// Period of the node address refresh.
    #[arg(long, default_value = "5m")]
    pub node_status_update_frequency: GoDuration,
    /// Period of the route reconciliation.
    #[arg(long, default_value = "10s")]
    pub route_reconciliation_period: GoDuration,
    /// Service controller workers.
    #[arg(long, default_value_t = 1)]
    pub concurrent_service_syncs: i32,
    /// Beyond upstream: `UpdateLoadBalancer` calls in flight while a node sync brings the
    /// load balancers' hosts up to date (the shared cloud limiter still paces them). Default
    /// 0 = `--concurrent-service-syncs`, as upstream's node sync, which uses that many workers.
    #[arg(long, default_value_t = 0)]
    pub concurrent_lb_host_updates: i32,
    /// Node initialisation workers (upstream accepts 0 and then never initialises a Node; we
    /// reject it).
    #[arg(long, default_value_t = 1)]
    pub concurrent_node_syncs: i32,
    /// Run leader election before starting the controllers.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    /// How long a non-leader waits after the last observed renewal before taking over.
    #[arg(long, default_value = "15s")]
    pub leader_elect_lease_duration: GoDuration,
    /// How long the leader retries renewing before giving up leadership.
    #[arg(long, default_value = "10s")]
    pub leader_elect_renew_deadline: GoDuration,
    /// Wait between attempts to acquire or renew.
    #[arg(long, default_value = "2s")]
    pub leader_elect_retry_period: GoDuration,
    /// Lock object type; only `leases` is supported.
    #[arg(long, default_value = "leases")]
    pub leader_elect_resource_lock: String,
    /// Name of the Lease.
    #[arg(long, default_value = "cloud-controller-manager")]
    pub leader_elect_resource_name: String,
    /// Namespace of the Lease.
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,
    /// Path to a kubeconfig; with `--master` empty too, the in-cluster config is used.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// API server address, overriding the kubeconfig's.
    #[arg(long)]
    pub master: Option<String>,
    /// HTTPS port of `/healthz`, `/readyz`, `/livez`, `/metrics` and `/configz`, with
    /// delegated authentication and authorization; 0 disables serving (and the auth setup).
    #[arg(long, default_value_t = 10258)]
    pub secure_port: u16,
    /// Address the secure port binds (upstream's default 0.0.0.0; the embedded mode binds
    /// 127.0.0.1).
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: IpAddr,
    /// Run even when the cloud reports no cluster ID (deprecated upstream).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_untagged_cloud: bool,
    /// Port of the admission webhook server; must differ from `--secure-port`; 0 disables.
    #[arg(long, default_value_t = 10260)]
    pub webhook_secure_port: u16,
    /// Beyond upstream: average cloud API calls per second shared by all controllers (one
    /// limiter, so controllers cannot exhaust the vendor's quota together). Default 0 =
    /// unlimited, as upstream, which has no such limiter.
    #[arg(long, default_value_t = 0.0)]
    pub cloud_api_qps: f64,
    /// Beyond upstream: burst of the shared cloud limiter (0 = unlimited, the default).
    #[arg(long, default_value_t = 0)]
    pub cloud_api_burst: u32,
    /// Beyond upstream: the shared cloud limiter halves its rate when the cloud answers
    /// "throttled" (and holds every caller for the cloud's retry-after), then climbs back to
    /// `--cloud-api-qps` by a twentieth of it per second. Needs `--cloud-api-qps`. Default
    /// false: a fixed rate. Callers always wait by priority (node initialization and
    /// deletion, load balancers, routes, status refreshes).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub cloud_api_adaptive: bool,
    /// Beyond upstream: fetch instance metadata for many Nodes in one cloud call when the
    /// provider supports it. Default true: one call per sync instead of one per Node.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub batch_instance_metadata: bool,
    /// Beyond upstream: how long (and at least two answers) an instance must be gone before
    /// its Node is deleted. Default 1m rides out an eventually-consistent cloud's "not found"
    /// about an instance that exists (kubernetes#127424); 0 = delete at once, as upstream.
    #[arg(long, default_value = "1m")]
    pub node_deletion_grace_period: GoDuration,
    /// Beyond upstream: put `node.kubernetes.io/out-of-service:NoExecute` (non-graceful
    /// node shutdown) on a Node whose instance the cloud reports shut down once it has been
    /// seen NotReady and shut down for this long, so pod GC force-deletes its terminating
    /// pods and their workloads start them elsewhere; removed when the Node is Ready again.
    /// Default 0 = off (upstream leaves the taint to an administrator).
    #[arg(long, default_value = "0")]
    pub node_out_of_service_after: GoDuration,
    /// Beyond upstream: reconcile routes on Node changes instead of only periodically.
    /// Default false = upstream (its gate is alpha and off).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub watch_based_routes: bool,
    /// Beyond upstream: re-ensure every load balancer this often to repair drift made outside
    /// Kubernetes. Default 0 = off, as upstream (which re-ensures only on changes).
    #[arg(long, default_value = "0")]
    pub lb_drift_reensure_period: GoDuration,
    /// Beyond upstream: look this often for load balancers the provider made for this
    /// cluster whose Service is gone or no longer wants one (leaked while the ccm was down,
    /// or by a finalizer removed by hand), and delete them. Needs a provider that lists its
    /// load balancers. Default 0 = off, as upstream.
    #[arg(long, default_value = "0")]
    pub orphaned_lb_gc_period: GoDuration,
    /// Beyond upstream: ask the cloud this often for the events it has scheduled for the
    /// instances (maintenance, reboot, retirement, spot interruption) and set the Nodes'
    /// `MaintenancePlanned` condition, cleared when the event passes. Needs a provider that
    /// reports them. Default 0 = off, as upstream.
    #[arg(long, default_value = "0")]
    pub node_maintenance_period: GoDuration,
    /// Beyond upstream: with `--node-maintenance-period`, also taint Nodes with planned
    /// maintenance `node.cloudprovider.kubernetes.io/maintenance-planned:PreferNoSchedule`.
    /// Default false.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub node_maintenance_taint: bool,
    /// Beyond upstream: how long a load balancer must stay orphaned before
    /// `--orphaned-lb-gc-period` deletes it. Default 10m.
    #[arg(long, default_value = "10m")]
    pub orphaned_lb_gc_grace_period: GoDuration,
    /// Beyond upstream: only log the orphaned load balancers `--orphaned-lb-gc-period` would
    /// delete. Default false.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub orphaned_lb_gc_dry_run: bool,
    /// Beyond upstream: log format. Default `text`.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Upstream's log format flag (`text` or `json`); overrides `--log-format`.
    #[arg(long, value_enum)]
    pub logging_format: Option<LogFormat>,
    /// klog verbosity (`-v=2`, `--v=2`), mapped to a tracing level when `RUST_LOG` is unset:
    /// 0–2 info, 3–4 debug, 5+ trace.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", default_value_t = 0)]
    pub verbosity: u8,
    /// Feature gates, `A=true,B=false`. `CloudControllerManagerWatchBasedRoutesReconciliation`
    /// turns on the watch-based routes; other gates are accepted and ignored.
    #[arg(long, value_delimiter = ',')]
    pub feature_gates: Vec<String>,
    /// Address refresh workers; 0 (the default) means `--concurrent-node-syncs`, as upstream.
    /// They run beside initialization, never blocking it.
    #[arg(long, default_value_t = 0)]
    pub concurrent_node_status_updates: i32,
    /// Pause between controller starts (jitter 1.0: a random wait in [d, 2d)).
    #[arg(long, default_value = "0s")]
    pub controller_start_interval: GoDuration,
    /// Queries per second to the API server (upstream's CCM default 20): a client-side token
    /// bucket per client, as client-go's (one per controller, one for the shared caches);
    /// as client-go, 0 means 5 and a negative value no limit.
    #[arg(long, default_value_t = 20.0)]
    pub kube_api_qps: f32,
    /// Burst to the API server (upstream's CCM default 30; 0 means client-go's 10).
    #[arg(long, default_value_t = 30)]
    pub kube_api_burst: i32,
    /// Content type of API requests. Requests are JSON: `application/json` is honoured,
    /// protobuf (upstream's default) is answered with JSON and logged.
    #[arg(long, default_value = "application/vnd.kubernetes.protobuf")]
    pub kube_api_content_type: String,
    /// One client per controller authenticating as its own service account in `kube-system`
    /// (`cloud-node-controller`, `node-controller`, `service-controller`, `route-controller`),
    /// with a TokenRequest token renewed before it expires (upstream's dynamic client
    /// builder).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub use_service_account_credentials: bool,
    /// Informer resync lower bound (upstream default 12h). The watch caches here resync by
    /// re-listing only after a watch error, so the value is validated and shown in
    /// `/configz`; a non-default value is warned about.
    #[arg(long, default_value = "12h")]
    pub min_resync_period: GoDuration,
    /// Directory of the self-signed serving pair `cloud-controller-manager.crt|.key`,
    /// generated there when missing; ignored with `--tls-cert-file`. Empty: generated in
    /// memory.
    #[arg(long)]
    pub cert_dir: Option<PathBuf>,
    /// Serving certificate (PEM, the chain after it) of the secure port.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// Key of `--tls-cert-file` (PEM).
    #[arg(long)]
    pub tls_private_key_file: Option<PathBuf>,
    /// Minimum TLS version, Go's names (`VersionTLS12`, `VersionTLS13`; 1.0 and 1.1 serve
    /// from 1.2 with a warning).
    #[arg(long)]
    pub tls_min_version: Option<String>,
    /// TLS 1.2 cipher suites, Go's names; those rustls lacks are dropped with a warning.
    #[arg(long, value_delimiter = ',')]
    pub tls_cipher_suites: Vec<String>,
    /// CA bundle verifying client certificates (CN user, O groups) on the secure port.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Kubeconfig of the cluster that reviews tokens (TokenReview); default: the manager's
    /// own connection.
    #[arg(long)]
    pub authentication_kubeconfig: Option<PathBuf>,
    /// Do not read the client CA from `kube-system/extension-apiserver-authentication`.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub authentication_skip_lookup: bool,
    /// Start even when that ConfigMap cannot be read (without client certificates then).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub authentication_tolerate_lookup_failure: bool,
    /// How long TokenReview answers are cached.
    #[arg(long, default_value = "10s")]
    pub authentication_token_webhook_cache_ttl: GoDuration,
    /// Kubeconfig of the cluster that reviews access (SubjectAccessReview); default: the
    /// manager's own connection.
    #[arg(long)]
    pub authorization_kubeconfig: Option<PathBuf>,
    /// Paths served without authorization (exact, or a prefix ending in `*`).
    #[arg(long, value_delimiter = ',', default_value = "/healthz,/readyz,/livez")]
    pub authorization_always_allow_paths: Vec<String>,
    /// How long allowed SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s")]
    pub authorization_webhook_cache_authorized_ttl: GoDuration,
    /// How long denied SubjectAccessReview answers are cached.
    #[arg(long, default_value = "10s")]
    pub authorization_webhook_cache_unauthorized_ttl: GoDuration,
    /// Upstream flags accepted for compatibility, with a warning.
    #[command(flatten)]
    pub accepted: crate::upstream_flags::AcceptedFlags,
}

impl Default for CloudControllerManagerOptions {
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            options: CloudControllerManagerOptions,
        }
        <Cli as clap::Parser>::try_parse_from(["cloud-controller-manager"])
            .map(|cli| cli.options)
            .unwrap_or_else(|error| unreachable!("the defaults parse: {error}"))
    }
}

impl CloudControllerManagerOptions {
    /// Parses options from command-line arguments (the first is the program name).
    pub fn try_parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            options: CloudControllerManagerOptions,
        }
        <Cli as clap::Parser>::try_parse_from(args).map(|cli| cli.options)
    }

    /// The log format: `--logging-format` if given, else `--log-format`.
    pub(crate) fn effective_log_format(&self) -> LogFormat {
        self.logging_format.unwrap_or(self.log_format)
    }

    /// Whether the route controller reconciles on Node changes: `--watch-based-routes` or
    /// upstream's feature gate.
    pub(crate) fn watch_based_routes_enabled(&self) -> bool {
        self.watch_based_routes
            || crate::upstream_flags::parse_feature_gates(&self.feature_gates)
                .ok()
                .and_then(|gates| {
                    gates
                        .get(crate::upstream_flags::FEATURE_GATE_WATCH_BASED_ROUTES)
                        .copied()
                })
                .unwrap_or(false)
    }

    /// What the manager warns about at start: upstream flags given that have no effect here.
    pub(crate) fn compatibility_warnings(&self) -> Vec<String> {
        let mut warnings: Vec<String> = self
            .accepted
            .given()
            .into_iter()
            .map(|(flag, value)| {
                format!("--{flag}={value} is accepted for compatibility and has no effect")
            })
            .collect();
        match self.kube_api_content_type.as_str() {
            "application/json" | "application/vnd.kubernetes.protobuf" => {}
            other => warnings.push(format!(
                "--kube-api-content-type={other}: requests are sent as application/json"
            )),
        }
        if self.min_resync_period.value != Duration::from_secs(12 * 3600) {
            warnings.push(format!(
                "--min-resync-period={:?}: the watch caches here do not resync periodically",
                self.min_resync_period.value
            ));
        }
        if let Ok(tls) = self.tls_settings().check() {
            warnings.extend(tls);
        }
        if let Ok(gates) = crate::upstream_flags::parse_feature_gates(&self.feature_gates) {
            for gate in gates.keys() {
                if gate != crate::upstream_flags::FEATURE_GATE_WATCH_BASED_ROUTES {
                    warnings.push(format!("feature gate {gate} has no effect here"));
                }
            }
        }
        warnings
    }

    /// The TLS settings of the secure port (`--tls-min-version`, `--tls-cipher-suites`).
    pub(crate) fn tls_settings(&self) -> crate::secure_serving::TlsSettings {
        crate::secure_serving::TlsSettings {
            min_version: self.tls_min_version.clone(),
            cipher_suites: self.tls_cipher_suites.clone(),
        }
    }

    /// Where the serving certificate comes from (empty paths count as not given).
    pub(crate) fn cert_source(&self) -> crate::secure_serving::CertSource {
        let given = |p: &Option<PathBuf>| p.clone().filter(|p| !p.as_os_str().is_empty());
        crate::secure_serving::CertSource {
            cert_file: given(&self.tls_cert_file),
            key_file: given(&self.tls_private_key_file),
            cert_dir: given(&self.cert_dir),
        }
    }

    /// Checks the flags; every problem is listed in the error.
    pub fn validate(&self) -> Result<(), OptionsError> {
        self.validate_with(DEFAULT_CONTROLLERS)
    }

    /// [`Self::validate`] against a custom list of known controller names (a vendor that
    /// registers its own controllers).
    pub fn validate_with(&self, known_controllers: &[&str]) -> Result<(), OptionsError> {
        let mut errors = Vec::new();
        if self.cloud_provider.is_empty() {
            errors.push("--cloud-provider cannot be empty".to_owned());
        }
        for entry in &self.controllers {
            let name = entry.strip_prefix('-').unwrap_or(entry);
            if name == "*" && !entry.starts_with('-') {
                continue;
            }
            if !known_controllers.contains(&canonical_controller_name(name)) {
                errors.push(format!("{name:?} is not in the list of known controllers"));
            }
        }
        if self.concurrent_node_syncs < 1 {
            errors.push(format!(
                "--concurrent-node-syncs must be at least 1, got {} (0 would never initialise a Node)",
                self.concurrent_node_syncs
            ));
        }
        if self.concurrent_service_syncs < 1 {
            errors.push(format!(
                "--concurrent-service-syncs must be at least 1, got {}",
                self.concurrent_service_syncs
            ));
        }
        for (flag, value) in [
            ("--node-monitor-period", self.node_monitor_period),
            (
                "--node-status-update-frequency",
                self.node_status_update_frequency,
            ),
            (
                "--route-reconciliation-period",
                self.route_reconciliation_period,
            ),
        ] {
            if value.is_non_positive() {
                errors.push(format!("{flag} must be positive"));
            }
        }
        for (flag, value) in [
            (
                "--node-deletion-grace-period",
                self.node_deletion_grace_period,
            ),
            ("--lb-drift-reensure-period", self.lb_drift_reensure_period),
            (
                "--node-out-of-service-after",
                self.node_out_of_service_after,
            ),
            ("--orphaned-lb-gc-period", self.orphaned_lb_gc_period),
            ("--node-maintenance-period", self.node_maintenance_period),
            (
                "--orphaned-lb-gc-grace-period",
                self.orphaned_lb_gc_grace_period,
            ),
        ] {
            if value.negative && !value.value.is_zero() {
                errors.push(format!("{flag} cannot be negative"));
            }
        }
        if let Err(error) = crate::upstream_flags::parse_feature_gates(&self.feature_gates) {
            errors.push(error);
        }
        if self.concurrent_lb_host_updates < 0 {
            errors.push("--concurrent-lb-host-updates cannot be negative".to_owned());
        }
        if self.concurrent_node_status_updates < 0 {
            errors.push("--concurrent-node-status-updates cannot be negative".to_owned());
        }
        if self.controller_start_interval.negative
            && !self.controller_start_interval.value.is_zero()
        {
            errors.push("--controller-start-interval cannot be negative".to_owned());
        }
        if self.cloud_api_qps < 0.0 || !self.cloud_api_qps.is_finite() {
            errors.push("--cloud-api-qps must be a non-negative number".to_owned());
        }
        if self.cloud_api_adaptive && self.cloud_api_qps <= 0.0 {
            errors.push(
                "--cloud-api-adaptive needs --cloud-api-qps: an unlimited limiter has no rate to adapt"
                    .to_owned(),
            );
        }
        if self.leader_elect {
            let lease = self.leader_elect_lease_duration;
            let renew = self.leader_elect_renew_deadline;
            let retry = self.leader_elect_retry_period;
            for (flag, value) in [
                ("--leader-elect-lease-duration", lease),
                ("--leader-elect-renew-deadline", renew),
                ("--leader-elect-retry-period", retry),
            ] {
                if value.is_non_positive() {
                    errors.push(format!("{flag} must be positive"));
                }
            }
            if renew.value >= lease.value {
                errors.push(format!(
                    "--leader-elect-renew-deadline ({:?}) must be less than --leader-elect-lease-duration ({:?})",
                    renew.value, lease.value
                ));
            }
            if retry.value >= renew.value {
                errors.push(format!(
                    "--leader-elect-retry-period ({:?}) must be less than --leader-elect-renew-deadline ({:?})",
                    retry.value, renew.value
                ));
            }
            if self.leader_elect_resource_lock != "leases" {
                errors.push(format!(
                    "--leader-elect-resource-lock must be \"leases\", got {:?}",
                    self.leader_elect_resource_lock
                ));
            }
            if self.leader_elect_resource_name.is_empty()
                || self.leader_elect_resource_namespace.is_empty()
            {
                errors.push(
                    "--leader-elect-resource-name and --leader-elect-resource-namespace cannot be empty"
                        .to_owned(),
                );
            }
        }
        if self.configure_cloud_routes
            && self.is_controller_enabled("node-route-controller")
            && let Err(error) = self.cluster_cidrs()
        {
            errors.push(error.to_string());
        }
        if let Err(error) = self.tls_settings().check() {
            errors.push(error.to_string());
        }
        if self.tls_cert_file.is_some() != self.tls_private_key_file.is_some() {
            errors.push(
                "--tls-cert-file and --tls-private-key-file must be given together".to_owned(),
            );
        }
        for (flag, value) in [
            ("--min-resync-period", self.min_resync_period),
            (
                "--authentication-token-webhook-cache-ttl",
                self.authentication_token_webhook_cache_ttl,
            ),
            (
                "--authorization-webhook-cache-authorized-ttl",
                self.authorization_webhook_cache_authorized_ttl,
            ),
            (
                "--authorization-webhook-cache-unauthorized-ttl",
                self.authorization_webhook_cache_unauthorized_ttl,
            ),
        ] {
            if value.negative && !value.value.is_zero() {
                errors.push(format!("{flag} cannot be negative"));
            }
        }
        if !self.kube_api_qps.is_finite() {
            errors.push("--kube-api-qps must be a number".to_owned());
        }
        if self.webhook_secure_port != 0 && self.webhook_secure_port == self.secure_port {
            errors.push(format!(
                "--webhook-secure-port and --secure-port must differ, both are {}",
                self.secure_port
            ));
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(OptionsError(errors))
        }
    }

    /// `--cluster-cidr` parsed: at most two CIDRs, one per IP family. An empty flag is an
    /// empty list.
    pub fn cluster_cidrs(&self) -> Result<Vec<IpNet>, ClusterCidrError> {
        if self.cluster_cidr.trim().is_empty() {
            return Ok(Vec::new());
        }
        let mut cidrs = Vec::new();
        for part in self.cluster_cidr.split(',') {
            let part = part.trim();
            let cidr: IpNet = part
                .parse()
                .map_err(|_| ClusterCidrError::NotACidr(part.to_owned()))?;
            cidrs.push(cidr);
        }
        if cidrs.len() > 2 {
            return Err(ClusterCidrError::TooMany(cidrs.len()));
        }
        if let [a, b] = cidrs.as_slice()
            && matches!(a, IpNet::V4(_)) == matches!(b, IpNet::V4(_))
        {
            return Err(ClusterCidrError::SameFamily(*a, *b));
        }
        Ok(cidrs)
    }

    /// Whether the controller `name` (canonical or alias) is on, by upstream's
    /// `IsControllerEnabled` over `--controllers` with default-on controllers.
    pub fn is_controller_enabled(&self, name: &str) -> bool {
        is_controller_enabled(&self.controllers, name, &[])
    }
}

/// Upstream's `IsControllerEnabled`: scan `controllers` in order; the first `name` enables,
/// the first `-name` disables (aliases resolved); with no mention, the controller is on iff
/// `*` is present and it is not in `disabled_by_default`. An empty list enables nothing.
pub(crate) fn is_controller_enabled(
    controllers: &[String],
    name: &str,
    disabled_by_default: &[&str],
) -> bool {
    let name = canonical_controller_name(name);
    let mut star = false;
    for entry in controllers {
        if entry == "*" {
            star = true;
            continue;
        }
        if let Some(disabled) = entry.strip_prefix('-') {
            if canonical_controller_name(disabled) == name {
                return false;
            }
        } else if canonical_controller_name(entry) == name {
            return true;
        }
    }
    star && !disabled_by_default.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> CloudControllerManagerOptions {
        let mut all = vec!["ccm", "--cloud-provider", "fake"];
        all.extend_from_slice(args);
        CloudControllerManagerOptions::try_parse_from(all).expect("flags parse")
    }

    fn errors(args: &[&str]) -> Vec<String> {
        parse(args)
            .validate()
            .err()
            .map(|e| e.0)
            .unwrap_or_default()
    }

    /// `--cloud-provider-platforms` is a comma-separated list, empty by default (the
    /// provider's own list, and with none every Node, as upstream).
    #[test]
    fn cloud_provider_platforms_is_a_list() {
        assert!(
            CloudControllerManagerOptions::default()
                .cloud_provider_platforms
                .is_empty()
        );
        let o = parse(&["--cloud-provider-platforms", "onprem,edge"]);
        assert_eq!(o.cloud_provider_platforms, ["onprem", "edge"]);
    }

    /// Upstream's defaults (`TestDefaultFlags`).
    #[test]
    fn defaults_match_upstream() {
        let o = CloudControllerManagerOptions::default();
        assert_eq!(o.cloud_provider, "");
        assert_eq!(o.controllers, vec!["*"]);
        assert_eq!(o.cluster_name, "kubernetes");
        assert!(!o.allocate_node_cidrs);
        assert!(o.configure_cloud_routes);
        assert_eq!(o.node_monitor_period.value, Duration::from_secs(5));
        assert_eq!(
            o.node_status_update_frequency.value,
            Duration::from_secs(300)
        );
        assert_eq!(o.route_reconciliation_period.value, Duration::from_secs(10));
        assert_eq!(
            (o.concurrent_service_syncs, o.concurrent_node_syncs),
            (1, 1)
        );
        assert!(o.leader_elect);
        assert_eq!(o.leader_elect_lease_duration.value, Duration::from_secs(15));
        assert_eq!(o.leader_elect_renew_deadline.value, Duration::from_secs(10));
        assert_eq!(o.leader_elect_retry_period.value, Duration::from_secs(2));
        assert_eq!(o.leader_elect_resource_lock, "leases");
        assert_eq!(o.leader_elect_resource_name, "cloud-controller-manager");
        assert_eq!(o.leader_elect_resource_namespace, "kube-system");
        assert_eq!((o.secure_port, o.webhook_secure_port), (10258, 10260));
        assert_eq!(o.bind_address.to_string(), "0.0.0.0");
        assert!(!o.allow_untagged_cloud);
        assert_eq!((o.cloud_api_qps, o.cloud_api_burst), (0.0, 0));
        assert!(o.batch_instance_metadata);
        assert_eq!(
            o.node_deletion_grace_period.value,
            crate::controllers::cloud_node_lifecycle::DEFAULT_DELETE_GRACE_PERIOD
        );
        assert!(!o.watch_based_routes);
        assert!(o.lb_drift_reensure_period.value.is_zero());
        assert_eq!(o.log_format, LogFormat::Text);
        // Upstream's `TestDefaultFlags` values of the client flags (`--kube-api-qps`, ...).
        assert_eq!((o.kube_api_qps, o.kube_api_burst), (20.0, 30));
        assert_eq!(
            o.kube_api_content_type,
            "application/vnd.kubernetes.protobuf"
        );
        assert!(!o.use_service_account_credentials);
        assert_eq!(o.concurrent_node_status_updates, 0);
        assert_eq!(
            o.concurrent_lb_host_updates, 0,
            "upstream's: the service workers"
        );
        // Secure serving and delegated auth (upstream's `TestDefaultFlags`).
        assert_eq!(o.cert_source(), Default::default());
        assert_eq!(
            o.authorization_always_allow_paths,
            vec!["/healthz", "/readyz", "/livez"]
        );
        for ttl in [
            o.authentication_token_webhook_cache_ttl,
            o.authorization_webhook_cache_authorized_ttl,
            o.authorization_webhook_cache_unauthorized_ttl,
        ] {
            assert_eq!(ttl.value, Duration::from_secs(10));
        }
        assert!(!o.authentication_skip_lookup && !o.authentication_tolerate_lookup_failure);
        assert_eq!(o.min_resync_period.value, Duration::from_secs(12 * 3600));
        assert!(o.controller_start_interval.value.is_zero());
        assert_eq!(o.verbosity, 0);
        assert!(o.compatibility_warnings().is_empty());
        // The defaults are valid once a provider is named.
        assert_eq!(errors(&[]), Vec::<String>::new());
    }

    /// Upstream's example DaemonSet (kubernetes.io "cloud-controller-manager
    /// DaemonSet example") and the AWS and GCP manifests start unchanged: every upstream flag is
    /// accepted, and those with no effect here are warned about, never refused.
    #[test]
    fn upstream_daemonset_flags_are_accepted() {
        let manifests: [&[&str]; 3] = [
            &[
                "--leader-elect=true",
                "--use-service-account-credentials",
                "--allocate-node-cidrs=true",
                "--configure-cloud-routes=true",
                "--cluster-cidr=172.17.0.0/16",
            ],
            &[
                "--v=2",
                "--use-service-account-credentials=true",
                "--configure-cloud-routes=false",
            ],
            &[
                "--use-service-account-credentials",
                "--secure-port=10258",
                "--cloud-config=/etc/kubernetes/cloud.config",
            ],
        ];
        for flags in manifests {
            let o = parse(flags);
            o.validate().unwrap();
            assert!(o.use_service_account_credentials, "{flags:?}");
        }
        let o = parse(&[
            "-v=4",
            "--vmodule=controller=5",
            "--kube-api-qps=50",
            "--kube-api-burst=100",
            "--kube-api-content-type=application/json",
            "--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=true,LoggingBetaOptions=true",
            "--authentication-skip-lookup",
            "--authentication-kubeconfig",
            "/etc/kubernetes/ccm.conf",
            "--authorization-always-allow-paths=/healthz,/metrics",
            "--tls-cert-file=/etc/tls/tls.crt",
            "--tls-private-key-file=/etc/tls/tls.key",
            "--cert-dir=/var/run/ccm",
            "--profiling=false",
            "--min-resync-period=12h",
            "--controller-start-interval=2s",
            "--concurrent-node-status-updates=4",
            "--logging-format=json",
            "--enable-leader-migration",
            "--webhooks=*",
        ]);
        o.validate().unwrap();
        assert_eq!(o.verbosity, 4);
        assert_eq!((o.kube_api_qps, o.kube_api_burst), (50.0, 100));
        assert!(
            o.watch_based_routes_enabled(),
            "the upstream gate turns it on"
        );
        assert_eq!(o.effective_log_format(), LogFormat::Json);
        assert_eq!(o.concurrent_node_status_updates, 4);
        assert_eq!(o.controller_start_interval.value, Duration::from_secs(2));
        // The secure-serving and delegated-auth flags now have their effect.
        assert_eq!(
            o.authentication_kubeconfig.as_deref(),
            Some(std::path::Path::new("/etc/kubernetes/ccm.conf"))
        );
        assert!(o.authentication_skip_lookup);
        assert_eq!(
            o.authorization_always_allow_paths,
            vec!["/healthz", "/metrics"]
        );
        let source = o.cert_source();
        assert_eq!(
            source.cert_file.as_deref(),
            Some(std::path::Path::new("/etc/tls/tls.crt"))
        );
        assert_eq!(
            source.key_file.as_deref(),
            Some(std::path::Path::new("/etc/tls/tls.key"))
        );
        assert_eq!(
            source.cert_dir.as_deref(),
            Some(std::path::Path::new("/var/run/ccm"))
        );
        assert_eq!(o.kube_api_content_type, "application/json");
        let warnings = o.compatibility_warnings().join("\n");
        for flag in ["--vmodule", "--profiling", "LoggingBetaOptions"] {
            assert!(
                warnings.contains(flag),
                "no warning about {flag}: {warnings}"
            );
        }
        assert!(!warnings.contains("WatchBasedRoutes"), "{warnings}");
        for honoured in [
            "--authentication",
            "--tls-cert-file",
            "--cert-dir",
            "--kube-api",
            "--min-resync-period",
            "--use-service-account-credentials",
        ] {
            assert!(
                !warnings.contains(honoured),
                "{honoured} is honoured: {warnings}"
            );
        }
        // A non-default resync period and TLS values rustls cannot honour are warned about.
        let o = parse(&[
            "--min-resync-period=1h",
            "--tls-min-version=VersionTLS11",
            "--kube-api-content-type=application/cbor",
        ]);
        o.validate().unwrap();
        let warnings = o.compatibility_warnings().join("\n");
        for flag in [
            "--min-resync-period",
            "--tls-min-version",
            "--kube-api-content-type",
        ] {
            assert!(
                warnings.contains(flag),
                "no warning about {flag}: {warnings}"
            );
        }
        // Malformed feature gates are an error, as upstream.
        assert!(
            errors(&["--feature-gates=Foo"])
                .iter()
                .any(|e| e.contains("--feature-gates"))
        );
    }

    #[test]
    fn go_durations_parse() {
        let d = |s: &str| parse_go_duration(s).map(|d| d.value);
        assert_eq!(d("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(d("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(d("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(d("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(d("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(d("0"), Ok(Duration::ZERO));
        assert!(parse_go_duration("-2s").unwrap().negative);
        for bad in ["", "5", "s", "5x", "1m5"] {
            assert!(parse_go_duration(bad).is_err(), "{bad:?} must not parse");
        }
        let o = parse(&["--node-monitor-period", "1m30s"]);
        assert_eq!(o.node_monitor_period.value, Duration::from_secs(90));
    }

    #[test]
    fn boolean_flags_take_optional_values() {
        let o = parse(&["--leader-elect=false", "--allocate-node-cidrs"]);
        assert!(!o.leader_elect);
        assert!(o.allocate_node_cidrs);
    }

    /// `*`, `foo`, `-foo`, first match wins, aliases.
    #[test]
    fn controllers_semantics() {
        let list = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let on = |l: &[&str], name| is_controller_enabled(&list(l), name, &[]);
        assert!(on(&["*"], "service-lb-controller"));
        assert!(
            !on(&[], "service-lb-controller"),
            "empty list enables nothing"
        );
        assert!(!on(&["*", "-service"], "service-lb-controller"));
        assert!(on(&["*", "-service"], "cloud-node-controller"));
        assert!(on(&["service"], "service-lb-controller"));
        assert!(!on(&["service"], "cloud-node-controller"));
        // First match wins, in either direction.
        assert!(on(&["service", "-service"], "service-lb-controller"));
        assert!(!on(
            &["-service-lb-controller", "service"],
            "service-lb-controller"
        ));
        // Aliases on the query side too.
        assert!(!on(&["-node-route-controller"], "route"));
        assert!(
            !is_controller_enabled(&list(&["*"]), "x", &["x"]),
            "disabled by default"
        );
        assert!(is_controller_enabled(&list(&["*", "x"]), "x", &["x"]));
        let o = parse(&["--controllers", "*,-route"]);
        assert!(!o.is_controller_enabled("node-route-controller"));
        assert!(o.is_controller_enabled("cloud-node"));
    }

    /// An unknown controller is a validation error.
    #[test]
    fn unknown_controllers_are_rejected() {
        assert_eq!(
            errors(&["--controllers", "*,-bogus"]),
            vec!["\"bogus\" is not in the list of known controllers"]
        );
        assert_eq!(
            errors(&["--controllers", "nope"]),
            vec!["\"nope\" is not in the list of known controllers"]
        );
        assert!(errors(&["--controllers", "cloud-node,-service,route"]).is_empty());
        let o = parse(&["--controllers", "mine"]);
        assert!(o.validate_with(&["mine"]).is_ok());
    }

    #[test]
    fn provider_is_required() {
        let o = CloudControllerManagerOptions::default();
        assert_eq!(
            o.validate().unwrap_err().0,
            vec!["--cloud-provider cannot be empty"]
        );
    }

    #[test]
    fn zero_node_syncs_is_rejected() {
        let e = errors(&["--concurrent-node-syncs", "0"]);
        assert_eq!(e.len(), 1);
        assert!(e[0].contains("--concurrent-node-syncs"), "{e:?}");
        assert_eq!(errors(&["--concurrent-service-syncs", "0"]).len(), 1);
    }

    #[test]
    fn negative_lb_host_updates_are_rejected() {
        assert_eq!(
            errors(&["--concurrent-lb-host-updates=-1"]),
            vec!["--concurrent-lb-host-updates cannot be negative"]
        );
        assert!(errors(&["--concurrent-lb-host-updates", "16"]).is_empty());
    }

    #[test]
    fn non_positive_periods_are_rejected() {
        for flag in [
            "--node-monitor-period",
            "--node-status-update-frequency",
            "--route-reconciliation-period",
        ] {
            for value in ["0", "-1s"] {
                let e = errors(&[&format!("{flag}={value}")]);
                assert!(e.len() == 1 && e[0].contains(flag), "{flag}={value}: {e:?}");
            }
        }
        assert!(
            errors(&["--leader-elect-retry-period=0"])
                .iter()
                .any(|e| e.contains("--leader-elect-retry-period must be positive"))
        );
        assert_eq!(errors(&["--node-deletion-grace-period=-1s"]).len(), 1);
        assert_eq!(errors(&["--lb-drift-reensure-period=10m"]).len(), 0);
    }

    /// Beyond upstream, plus upstream's rule that the lock must be `leases`.
    #[test]
    fn leader_election_timings_are_ordered() {
        let e = errors(&["--leader-elect-renew-deadline=15s"]);
        assert_eq!(e.len(), 1);
        assert!(
            e[0].contains("renew-deadline") && e[0].contains("lease-duration"),
            "{e:?}"
        );
        let e = errors(&["--leader-elect-retry-period=10s"]);
        assert_eq!(e.len(), 1);
        assert!(e[0].contains("retry-period"), "{e:?}");
        // Irrelevant without leader election.
        assert!(errors(&["--leader-elect=false", "--leader-elect-retry-period=10s"]).is_empty());
        assert_eq!(errors(&["--leader-elect-resource-lock=endpoints"]).len(), 1);
    }

    /// Invalid `--cluster-cidr` is fatal when routes are configured.
    #[test]
    fn cluster_cidr_is_checked_when_routes_are_configured() {
        assert!(errors(&["--cluster-cidr", "10.0.0.0/16,fd00::/48"]).is_empty());
        for bad in [
            "10.0.0.0/16,10.1.0.0/16",
            "10.0.0.0/16,fd00::/48,fd01::/48",
            "banana",
        ] {
            let e = errors(&["--cluster-cidr", bad]);
            assert!(
                e.len() == 1 && e[0].contains("--cluster-cidr"),
                "{bad}: {e:?}"
            );
        }
        // Not used, not checked (upstream only reads it in the route controller).
        assert!(errors(&["--cluster-cidr", "banana", "--configure-cloud-routes=false"]).is_empty());
        assert!(errors(&["--cluster-cidr", "banana", "--controllers", "*,-route"]).is_empty());
    }

    /// `--webhook-secure-port == --secure-port` is an error.
    #[test]
    fn ports_must_differ() {
        let e = errors(&["--secure-port", "10260"]);
        assert_eq!(e.len(), 1);
        assert!(e[0].contains("--webhook-secure-port"), "{e:?}");
        assert!(errors(&["--secure-port", "0", "--webhook-secure-port", "0"]).is_empty());
    }
}
