//! Flag value parsers shared by the subcommands, in upstream's formats.

use std::time::Duration;

/// Parses a non-negative Go-style duration as Kubernetes flags take them (`5s`, `1m30s`,
/// `500ms`), with the SDK's parser so `ccm` and the app entry read durations alike.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let parsed = cloud_provider_app::parse_go_duration(text).map_err(|e| e.to_string())?;
    if parsed.negative {
        return Err(format!("{text:?}: must not be negative"));
    }
    Ok(parsed.value)
}

/// The durable store's flags, shared by `ccm apiserver` and the embedded default.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StoreArgs {
    /// The largest the store's database may grow to, in bytes (etcd's flag; 0 = no limit but
    /// the disk's). Past it writes fail, and /livez, /readyz and /healthz report the store
    /// failed, as a full disk does.
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    quota_backend_bytes: u64,
    /// How long one attempt to commit a batch waits for a write lock another process holds.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    store_busy_timeout: Duration,
    /// How many such attempts a batch gets before its writes fail (the store carries on).
    #[arg(long, value_name = "N", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..))]
    store_busy_attempts: u32,
    /// Store in etcd instead of SQLite: the members' client URLs, comma-separated
    /// (kube-apiserver's flag). API servers given the same etcd and prefix serve one cluster.
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    pub(crate) etcd_servers: Vec<String>,
    /// Where the cluster's keys live in etcd (kube-apiserver's flag): `/registry/…` by
    /// default; another prefix P roots them at `P/registry/…` (a trailing `/registry` of P is
    /// not repeated), so several clusters can share one etcd.
    #[arg(long, value_name = "PREFIX", default_value = "/registry")]
    etcd_prefix: String,
    /// The CA bundle (PEM) that signed etcd's serving certificates (https etcd URLs).
    #[arg(long, value_name = "FILE")]
    etcd_cafile: Option<std::path::PathBuf>,
    /// The client certificate (PEM) presented to etcd.
    #[arg(long, value_name = "FILE", requires = "etcd_keyfile")]
    etcd_certfile: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_certfile")]
    etcd_keyfile: Option<std::path::PathBuf>,
    /// How often the store's history is compacted (kube-apiserver's flag; 0 = never): watches
    /// and continue tokens older than about one interval get 410 Gone and relist. Among API
    /// servers sharing an etcd, one compacts per interval.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub(crate) etcd_compaction_interval: Duration,
}

impl StoreArgs {
    /// The SQLite store's options with these flags applied.
    pub(crate) fn options(&self) -> core_cluster::store::SqliteOptions {
        core_cluster::store::SqliteOptions {
            max_db_bytes: (self.quota_backend_bytes > 0).then_some(self.quota_backend_bytes),
            busy_timeout: self.store_busy_timeout,
            busy_attempts: self.store_busy_attempts,
            ..core_cluster::store::SqliteOptions::default()
        }
    }

    /// The etcd store's options, when `--etcd-servers` is given.
    pub(crate) fn etcd_options(&self) -> Option<core_cluster::store::EtcdOptions> {
        if self.etcd_servers.is_empty() {
            return None;
        }
        let prefix = self.etcd_prefix.trim_end_matches('/');
        // The API server's keys begin with `/registry`: the namespace is what comes before.
        let namespace = prefix.strip_suffix("/registry").unwrap_or(prefix);
        Some(core_cluster::store::EtcdOptions {
            endpoints: self.etcd_servers.clone(),
            namespace: namespace.to_owned(),
            tls: core_cluster::store::EtcdTls {
                ca_file: self.etcd_cafile.clone(),
                cert_file: self.etcd_certfile.clone(),
                key_file: self.etcd_keyfile.clone(),
            },
            ..core_cluster::store::EtcdOptions::default()
        })
    }

    /// Opens the store these flags name: etcd with `--etcd-servers`, else SQLite in
    /// `data_dir`.
    pub(crate) async fn open(
        &self,
        data_dir: &std::path::Path,
    ) -> anyhow::Result<std::sync::Arc<dyn core_cluster::store::Store>> {
        use anyhow::Context;
        Ok(match self.etcd_options() {
            Some(options) => {
                let servers = options.endpoints.join(",");
                core_cluster::store::connect_etcd(options)
                    .await
                    .with_context(|| format!("connecting to etcd at {servers}"))?
            }
            None => std::sync::Arc::new(
                core_cluster::store::SqliteStore::open(data_dir, self.options())
                    .await
                    .with_context(|| format!("opening the store in {}", data_dir.display()))?,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        for bad in ["", "5", "s", "5x", "-5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn store_flags_fill_the_sqlite_options() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            store: StoreArgs,
        }
        let defaults = Cli::parse_from(["ccm"]).store.options();
        assert_eq!(defaults, core_cluster::store::SqliteOptions::default());
        let set = Cli::parse_from([
            "ccm",
            "--quota-backend-bytes=2147483648",
            "--store-busy-timeout=250ms",
            "--store-busy-attempts=4",
        ])
        .store
        .options();
        assert_eq!(set.max_db_bytes, Some(2 << 30));
        assert_eq!(set.busy_timeout, Duration::from_millis(250));
        assert_eq!(set.busy_attempts, 4);
        assert!(
            Cli::parse_from(["ccm"]).store.etcd_options().is_none(),
            "SQLite unless --etcd-servers is given"
        );
        for (prefix, namespace) in [
            ("/registry", ""),
            ("/registry/", ""),
            ("/cluster-a", "/cluster-a"),
            ("/cluster-a/registry", "/cluster-a"),
        ] {
            let etcd = Cli::parse_from([
                "ccm",
                "--etcd-servers=http://127.0.0.1:2379,http://127.0.0.1:22379",
                &format!("--etcd-prefix={prefix}"),
            ])
            .store
            .etcd_options()
            .expect("etcd options");
            assert_eq!(
                etcd.endpoints,
                ["http://127.0.0.1:2379", "http://127.0.0.1:22379"]
            );
            assert_eq!(etcd.namespace, namespace, "{prefix}");
        }
        let cli = Cli::parse_from(["ccm"]);
        assert_eq!(
            cli.store.etcd_compaction_interval,
            Duration::from_secs(300),
            "kube-apiserver's default"
        );
        for bad in [
            "--etcd-certfile=client.crt",
            "--etcd-compaction-interval=5",
            "--store-busy-attempts=0",
            "--quota-backend-bytes=-1",
            "--store-busy-timeout=5",
        ] {
            assert!(Cli::try_parse_from(["ccm", bad]).is_err(), "{bad}");
        }
    }
}
