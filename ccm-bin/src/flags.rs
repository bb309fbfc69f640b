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
        for bad in [
            "--store-busy-attempts=0",
            "--quota-backend-bytes=-1",
            "--store-busy-timeout=5",
        ] {
            assert!(Cli::try_parse_from(["ccm", bad]).is_err(), "{bad}");
        }
    }
}
