//! The etcd backend's options, and the one entry that opens it: compiled whether or not the
//! backend itself is (the `etcd` feature, which needs `protoc` to build the etcd client), so
//! a binary takes `--etcd-*` flags either way and says clearly when it was built without it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{Store, StoreError, WatchConfig};

/// The key, under the namespace, through which API servers sharing an etcd take turns at
/// compaction (upstream: `compactRevKey` in `etcd3/compact.go`). Its value is the last
/// compacted revision and its version counts compactions.
pub const COMPACT_KEY: &str = "compact_rev_key";

/// Client certificates and CA for an etcd reached over TLS (kube-apiserver's
/// `--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA bundle (PEM) that signed etcd's serving certificates.
    pub ca_file: Option<PathBuf>,
    /// The client certificate (PEM) presented to etcd.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key_file: Option<PathBuf>,
}

/// How to reach etcd and how to lay the store out in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// The etcd members' client URLs (`http://127.0.0.1:2379`, or `https://…` with [`tls`](Self::tls)).
    pub endpoints: Vec<String>,
    /// Prepended to every key, so several clusters can share one etcd (empty: keys as given,
    /// so the API server's `/registry/…` keys land where kube-apiserver's default
    /// `--etcd-prefix=/registry` puts them).
    pub namespace: String,
    /// TLS towards etcd, when any of its files is given.
    pub tls: EtcdTls,
    /// The watch window's sizes.
    pub watch: WatchConfig,
    /// The deadline of each request to etcd; an unreachable etcd fails requests after it.
    pub request_timeout: Duration,
    /// How many recently written keys the store keeps the last value of, from its watch of
    /// etcd, for an update's first read ([`Store::recent`](crate::Store::recent), as
    /// kube-apiserver's watch cache suggests the current object to `GuaranteedUpdate`), so
    /// an update is one transaction instead of a read and a transaction. 0 turns it off.
    pub recent_writes: usize,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            namespace: String::new(),
            tls: EtcdTls::default(),
            watch: WatchConfig::default(),
            request_timeout: Duration::from_secs(5),
            recent_writes: 10_000,
        }
    }
}

/// Whether this build has the etcd backend (the crate's `etcd` feature).
pub const ETCD_SUPPORTED: bool = cfg!(feature = "etcd");

/// Connects to etcd with `options` (see [`EtcdStore`](crate::EtcdStore) with the `etcd`
/// feature). Built without that feature, it fails with a [`StoreError::Backend`] that says
/// how to build with it.
pub async fn connect_etcd(options: EtcdOptions) -> Result<Arc<dyn Store>, StoreError> {
    #[cfg(feature = "etcd")]
    {
        Ok(Arc::new(crate::etcd::EtcdStore::connect(options).await?))
    }
    #[cfg(not(feature = "etcd"))]
    {
        let _ = options;
        Err(StoreError::Backend {
            context: "connecting to etcd".into(),
            source: Arc::new(std::io::Error::other(
                "this binary was built without the etcd backend: rebuild with the `etcd` \
                 feature (`cargo build --features etcd`; building it needs protoc, Debian's \
                 protobuf-compiler)",
            )),
        })
    }
}
