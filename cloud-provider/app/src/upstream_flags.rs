//! Upstream flags that mean nothing here (or not yet), accepted so that an upstream manifest
//! runs unchanged: an operator swaps the image, not the arguments. Each one given is logged as
//! a warning at start ([`AcceptedFlags::given`]); none is ever a reason to refuse to start.
//!
//! Flags that do have a meaning here are real fields of
//! [`CloudControllerManagerOptions`](crate::options::CloudControllerManagerOptions).

use std::collections::BTreeMap;

/// Defines [`AcceptedFlags`]: one `Option<String>` per upstream flag, value optional (a bare
/// `--authentication-skip-lookup` reads as `true`, as a Go bool flag does).
macro_rules! accepted_flags {
    ($( $(#[doc = $doc:literal])* $field:ident = $flag:literal, )*) => {
        /// Upstream flags accepted without effect (see the module documentation).
        #[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
        #[command(next_help_heading = "Upstream flags accepted for compatibility (no effect)")]
        pub struct AcceptedFlags {
            $(
                $(#[doc = $doc])*
                #[arg(long = $flag, value_name = "VALUE", num_args = 0..=1, default_missing_value = "true")]
                pub $field: Option<String>,
            )*
        }

        impl AcceptedFlags {
            /// Every flag given, as `(flag, value)`, in declaration order.
            pub fn given(&self) -> Vec<(&'static str, &str)> {
                let mut given = Vec::new();
                $(
                    if let Some(value) = &self.$field {
                        given.push(($flag, value.as_str()));
                    }
                )*
                given
            }
        }
    };
}

accepted_flags! {
    /// SNI certificate and key pairs.
    tls_sni_cert_key = "tls-sni-cert-key",
    /// HTTP/2 streams per connection.
    http2_max_streams_per_connection = "http2-max-streams-per-connection",
    /// SO_REUSEPORT on the secure port.
    permit_port_sharing = "permit-port-sharing",
    /// SO_REUSEADDR on the secure port.
    permit_address_sharing = "permit-address-sharing",
    /// Front-proxy client CA.
    requestheader_client_ca_file = "requestheader-client-ca-file",
    /// Front-proxy client common names.
    requestheader_allowed_names = "requestheader-allowed-names",
    /// Front-proxy user name headers.
    requestheader_username_headers = "requestheader-username-headers",
    /// Front-proxy group headers.
    requestheader_group_headers = "requestheader-group-headers",
    /// Front-proxy extra header prefixes.
    requestheader_extra_headers_prefix = "requestheader-extra-headers-prefix",
    /// Front-proxy UID headers.
    requestheader_uid_headers = "requestheader-uid-headers",
    /// Webhooks to run (no webhook is implemented).
    webhooks = "webhooks",
    /// Webhook server address.
    webhook_bind_address = "webhook-bind-address",
    /// Webhook certificates directory.
    webhook_cert_dir = "webhook-cert-dir",
    /// Webhook serving certificate.
    webhook_tls_cert_file = "webhook-tls-cert-file",
    /// Webhook serving key.
    webhook_tls_private_key_file = "webhook-tls-private-key-file",
    /// Webhook TLS cipher suites.
    webhook_tls_cipher_suites = "webhook-tls-cipher-suites",
    /// Webhook minimum TLS version.
    webhook_tls_min_version = "webhook-tls-min-version",
    /// Webhook SNI certificate and key pairs.
    webhook_tls_sni_cert_key = "webhook-tls-sni-cert-key",
    /// Disable HTTP/2 on the webhook server.
    webhook_disable_http2_serving = "webhook-disable-http2-serving",
    /// KCM-to-CCM leader migration.
    enable_leader_migration = "enable-leader-migration",
    /// Leader migration configuration.
    leader_migration_config = "leader-migration-config",
    /// Pod CIDR allocator type (vendor node-IPAM only).
    cidr_allocator_type = "cidr-allocator-type",
    /// Legacy volume plugin.
    external_cloud_volume_plugin = "external-cloud-volume-plugin",
    /// Deprecated no-op upstream too.
    node_sync_period = "node-sync-period",
    /// `/debug/pprof` and `/debug/flags/v` (Go only: there is no pprof here).
    profiling = "profiling",
    /// Go lock contention profiling.
    contention_profiling = "contention-profiling",
    /// klog per-file verbosity (use `RUST_LOG` for per-module levels).
    vmodule = "vmodule",
    /// klog flush period (tracing writes at once).
    log_flush_frequency = "log-flush-frequency",
}

/// Feature gates we know. Upstream's others (logging, metrics gates) are accepted and ignored.
pub(crate) const FEATURE_GATE_WATCH_BASED_ROUTES: &str =
    "CloudControllerManagerWatchBasedRoutesReconciliation";

/// Parses `--feature-gates` (`A=true,B=false`, Go bool values) into a map. A malformed entry
/// is an error, as upstream.
pub(crate) fn parse_feature_gates(entries: &[String]) -> Result<BTreeMap<String, bool>, String> {
    let mut gates = BTreeMap::new();
    for entry in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let (name, value) = entry
            .split_once('=')
            .ok_or_else(|| format!("--feature-gates: missing bool value for {entry:?}"))?;
        let value = match value.trim() {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => true,
            "0" | "f" | "F" | "false" | "FALSE" | "False" => false,
            other => {
                return Err(format!(
                    "--feature-gates: invalid value of {name}: {other:?}, err: not a bool"
                ));
            }
        };
        gates.insert(name.trim().to_owned(), value);
    }
    Ok(gates)
}

/// The `tracing` filter for klog's `-v` when `RUST_LOG` is not set: 0–2 `info` (production
/// manifests run `--v=2`), 3–4 `debug`, 5 and more `trace`.
pub(crate) fn level_for_verbosity(verbosity: u8) -> &'static str {
    match verbosity {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_gates_parse_as_upstream() {
        let gates = parse_feature_gates(&[
            "CloudControllerManagerWatchBasedRoutesReconciliation=true".into(),
            "LoggingBetaOptions=False".into(),
        ])
        .unwrap();
        assert!(gates[FEATURE_GATE_WATCH_BASED_ROUTES]);
        assert!(!gates["LoggingBetaOptions"]);
        assert!(parse_feature_gates(&["NoValue".into()]).is_err());
        assert!(parse_feature_gates(&["A=maybe".into()]).is_err());
    }

    #[test]
    fn verbosity_maps_to_tracing_levels() {
        assert_eq!(level_for_verbosity(0), "info");
        assert_eq!(level_for_verbosity(2), "info");
        assert_eq!(level_for_verbosity(4), "debug");
        assert_eq!(level_for_verbosity(9), "trace");
    }
}
