//! HTTPS on `--bind-address:--secure-port`, as upstream's `SecureServingOptions`:
//!
//! - `--tls-cert-file`/`--tls-private-key-file` when given (both, PEM; the certificate file
//!   may hold the chain);
//! - else, with `--cert-dir`, `<cert-dir>/cloud-controller-manager.crt|.key`: read when both
//!   exist, otherwise generated (self-signed) and written there, as upstream's
//!   `MaybeDefaultWithSelfSignedCerts` with the pair name `cloud-controller-manager`;
//! - else a self-signed certificate generated in memory for `localhost` and `127.0.0.1`
//!   (plus the bind address when it is a specific one).
//!
//! Generated certificates follow client-go's `GenerateSelfSignedCertKey`
//! ([`ccm_serving::self_signed`]): a CA (`localhost-ca@<unix time>`) and a serving
//! certificate (`localhost@<unix time>`) signed by it, one year each, the file holding the
//! serving certificate then the CA. Keys are ECDSA P-256 (ring makes no RSA keys).
//!
//! `--tls-min-version` and `--tls-cipher-suites` take Go's names. rustls speaks TLS 1.2 and
//! 1.3 only, with AEAD suites only: `VersionTLS10`/`VersionTLS11` serve from TLS 1.2 with a
//! warning, and Go suites rustls lacks (CBC, RC4, 3DES, static RSA) are dropped with a
//! warning; an unknown name is an error, as upstream. As in Go, the list restricts TLS 1.2
//! suites only (TLS 1.3 suites are not configurable).
//!
//! Client certificates are requested but optional; with a client CA (`--client-ca-file`, or
//! the cluster's `extension-apiserver-authentication` ConfigMap) they are verified against
//! it during the handshake, and a certificate from another CA fails the handshake (Go's
//! `VerifyClientCertIfGiven`). A verified certificate's identity (CN user, O groups) travels
//! with every request of its connection as [`Peer`]. Connections are served by
//! [`ccm_serving::serve`] ([`crate::serve::serve_tls`]).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(test)]
pub(crate) use ccm_serving::CertificateIdentity;
pub(crate) use ccm_serving::{CertKey, Peer};
use ccm_serving::{CertificateError, self_signed};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio::net::TcpListener;

/// The pair name of generated certificates in `--cert-dir` (upstream's
/// `ServerCert.PairName` for the cloud-controller-manager).
pub(crate) const PAIR_NAME: &str = "cloud-controller-manager";

/// The most TLS handshakes in progress at once; beyond that new connections are closed, so
/// clients that never finish a handshake cannot pile up tasks.
pub(crate) const MAX_HANDSHAKES: usize = 1024;

/// Why secure serving could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    /// A certificate, key or CA file could not be read or written.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A certificate or key is not usable.
    #[error("{what}: {message}")]
    Certificate {
        /// Which one.
        what: String,
        /// Why.
        message: String,
    },
    /// A TLS flag is invalid.
    #[error("{0}")]
    Flag(String),
    /// The address could not be bound.
    #[error("could not listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl From<CertificateError> for ServingError {
    fn from(error: CertificateError) -> Self {
        ServingError::Certificate {
            what: error.what,
            message: error.message,
        }
    }
}

fn certificate_error(what: impl Into<String>, message: impl std::fmt::Display) -> ServingError {
    ServingError::Certificate {
        what: what.into(),
        message: message.to_string(),
    }
}

/// Where the serving certificate comes from, by upstream's precedence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CertSource {
    /// `--tls-cert-file`.
    pub cert_file: Option<PathBuf>,
    /// `--tls-private-key-file`.
    pub key_file: Option<PathBuf>,
    /// `--cert-dir`.
    pub cert_dir: Option<PathBuf>,
}

/// Loads or generates the serving certificate for a server bound to `bind` (see the module
/// documentation for the precedence).
pub(crate) fn serving_cert(source: &CertSource, bind: IpAddr) -> Result<CertKey, ServingError> {
    match (&source.cert_file, &source.key_file) {
        (Some(cert), Some(key)) => {
            return Ok(CertKey {
                cert_pem: read(cert)?,
                key_pem: read(key)?,
            });
        }
        (None, None) => {}
        _ => {
            return Err(ServingError::Flag(
                "--tls-cert-file and --tls-private-key-file must be given together".into(),
            ));
        }
    }
    let files = source
        .cert_dir
        .as_ref()
        .filter(|d| !d.as_os_str().is_empty())
        .map(|dir| {
            (
                dir.join(format!("{PAIR_NAME}.crt")),
                dir.join(format!("{PAIR_NAME}.key")),
            )
        });
    if let Some((cert, key)) = &files
        && cert.is_file()
        && key.is_file()
    {
        return Ok(CertKey {
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        });
    }
    // Upstream adds `localhost` when bound to every address, else the bind address.
    let mut ips = vec![IpAddr::from([127, 0, 0, 1])];
    if !bind.is_unspecified() && !ips.contains(&bind) {
        ips.push(bind);
    }
    let generated = self_signed("localhost", &ips, &["localhost"])?;
    match files {
        Some((cert, key)) => {
            if let Some(dir) = cert.parent() {
                std::fs::create_dir_all(dir).map_err(|source| ServingError::File {
                    path: dir.to_owned(),
                    source,
                })?;
            }
            write(&key, &generated.key_pem, true)?;
            write(&cert, &generated.cert_pem, false)?;
            tracing::info!(cert = %cert.display(), key = %key.display(), "Generated self-signed cert");
        }
        None => tracing::info!("serving with a self-signed certificate generated in memory"),
    }
    Ok(generated)
}

/// Reads a text file, naming it on error.
pub(crate) fn read(path: &Path) -> Result<String, ServingError> {
    std::fs::read_to_string(path).map_err(|source| ServingError::File {
        path: path.to_owned(),
        source,
    })
}

fn write(path: &Path, contents: &str, private: bool) -> Result<(), ServingError> {
    use std::io::Write;
    let err = |source| ServingError::File {
        path: path.to_owned(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if private { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options.open(path).map_err(err)?;
    file.write_all(contents.as_bytes()).map_err(err)
}

/// The certificates of a PEM text (a CA bundle, a chain).
pub(crate) fn certificates(
    what: &str,
    pem: &str,
) -> Result<Vec<CertificateDer<'static>>, ServingError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| certificate_error(what, e))?;
    if certs.is_empty() {
        return Err(certificate_error(what, "no PEM certificate found"));
    }
    Ok(certs)
}

/// Go's cipher suite names that rustls (ring) implements, with the rustls suite each means.
fn rustls_suite_name(go_name: &str) -> &str {
    match go_name {
        // Go's legacy aliases.
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" => "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305" => "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        other => other,
    }
}

/// Go's cipher suite names (`tls.CipherSuites()` and `tls.InsecureCipherSuites()`): a name
/// outside this list is an error, as upstream.
const GO_CIPHER_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

/// The TLS settings of the secure port.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsSettings {
    /// `--tls-min-version` (Go's `VersionTLS10` … `VersionTLS13`).
    pub min_version: Option<String>,
    /// `--tls-cipher-suites` (Go's names).
    pub cipher_suites: Vec<String>,
}

impl TlsSettings {
    /// What these settings cannot honour exactly (logged as warnings), or an error for a name
    /// Go does not know.
    pub(crate) fn check(&self) -> Result<Vec<String>, ServingError> {
        self.build_provider().map(|(_, _, warnings)| warnings)
    }

    #[allow(clippy::type_complexity)]
    fn build_provider(
        &self,
    ) -> Result<
        (
            rustls::crypto::CryptoProvider,
            Vec<&'static rustls::SupportedProtocolVersion>,
            Vec<String>,
        ),
        ServingError,
    > {
        let mut warnings = Vec::new();
        let versions: Vec<&'static rustls::SupportedProtocolVersion> = match self
            .min_version
            .as_deref()
            .filter(|v| !v.is_empty())
        {
            None | Some("VersionTLS12") => vec![&rustls::version::TLS13, &rustls::version::TLS12],
            Some(v @ ("VersionTLS10" | "VersionTLS11")) => {
                warnings.push(format!(
                        "--tls-min-version={v}: TLS 1.0 and 1.1 are not supported, serving TLS 1.2 and 1.3"
                    ));
                vec![&rustls::version::TLS13, &rustls::version::TLS12]
            }
            Some("VersionTLS13") => vec![&rustls::version::TLS13],
            Some(other) => {
                return Err(ServingError::Flag(format!(
                    "--tls-min-version: unknown TLS version {other:?} (VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13)"
                )));
            }
        };
        let mut provider = rustls::crypto::ring::default_provider();
        let names: Vec<&str> = self
            .cipher_suites
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .collect();
        if !names.is_empty() {
            let mut wanted = Vec::new();
            for name in names {
                if !GO_CIPHER_SUITES.contains(&name) {
                    return Err(ServingError::Flag(format!(
                        "--tls-cipher-suites: cipher suite {name} not supported or doesn't exist"
                    )));
                }
                let rustls_name = rustls_suite_name(name);
                let found = provider
                    .cipher_suites
                    .iter()
                    .any(|s| format!("{:?}", s.suite()) == rustls_name);
                if !found {
                    warnings.push(format!(
                        "--tls-cipher-suites: {name} is not available (rustls serves AEAD suites only); ignored"
                    ));
                }
                wanted.push(rustls_name);
            }
            // As in Go, the list restricts TLS 1.2 suites; TLS 1.3 keeps its own.
            provider.cipher_suites.retain(|s| {
                s.version() == &rustls::version::TLS13
                    || wanted.contains(&format!("{:?}", s.suite()).as_str())
            });
            if versions.contains(&&rustls::version::TLS12)
                && !provider
                    .cipher_suites
                    .iter()
                    .any(|s| s.version() == &rustls::version::TLS12)
            {
                warnings.push(
                    "--tls-cipher-suites: no TLS 1.2 suite left, only TLS 1.3 clients can connect"
                        .into(),
                );
            }
        }
        Ok((provider, versions, warnings))
    }

    /// The rustls server configuration: `cert`, client certificates verified against
    /// `client_ca` when there is one (optional for the client), HTTP/2 and HTTP/1.1 by ALPN,
    /// the ring provider given explicitly.
    pub(crate) fn server_config(
        &self,
        cert: &CertKey,
        client_ca: Option<&str>,
    ) -> Result<Arc<rustls::ServerConfig>, ServingError> {
        let (provider, versions, _) = self.build_provider()?;
        let provider = Arc::new(provider);
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| certificate_error("TLS versions", e))?;
        let builder = match client_ca {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for der in certificates("client CA", pem)? {
                    roots
                        .add(der)
                        .map_err(|e| certificate_error("client CA", e))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .allow_unauthenticated()
                .build()
                .map_err(|e| certificate_error("client CA", e))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let chain = certificates("serving certificate", &cert.cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes())
            .map_err(|e| certificate_error("serving key", e))?;
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| certificate_error("serving certificate", e))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Binds `addr` for [`crate::serve::serve_tls`]: the listener and the address bound (port 0
/// picks a free one).
pub(crate) async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServingError> {
    let tcp = TcpListener::bind(addr)
        .await
        .map_err(|source| ServingError::Bind { addr, source })?;
    let local = tcp
        .local_addr()
        .map_err(|source| ServingError::Bind { addr, source })?;
    Ok((tcp, local))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_rustls::TlsAcceptor;

    /// Upstream's `MaybeDefaultWithSelfSignedCerts`: with `--cert-dir` the pair
    /// `cloud-controller-manager.crt|.key` is generated once, then reused.
    #[test]
    fn cert_dir_pair_is_generated_once_then_reused() {
        let dir = tempfile_dir();
        let source = CertSource {
            cert_dir: Some(dir.clone()),
            ..CertSource::default()
        };
        let first = serving_cert(&source, IpAddr::from([0, 0, 0, 0])).unwrap();
        let crt = dir.join("cloud-controller-manager.crt");
        let key = dir.join("cloud-controller-manager.key");
        assert_eq!(std::fs::read_to_string(&crt).unwrap(), first.cert_pem);
        assert_eq!(std::fs::read_to_string(&key).unwrap(), first.key_pem);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&key).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // Leaf then CA.
        assert_eq!(certificates("c", &first.cert_pem).unwrap().len(), 2);
        let second = serving_cert(&source, IpAddr::from([0, 0, 0, 0])).unwrap();
        assert_eq!(second.cert_pem, first.cert_pem);
        TlsSettings::default()
            .server_config(&second, None)
            .expect("usable");
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ccm-serving-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A TLS handshake over an in-memory pipe between `server` and a TLS 1.2 client limited
    /// to `suite` (any when `None`): whether it completes.
    async fn tls12_handshake(
        server: Arc<rustls::ServerConfig>,
        ca_pem: &str,
        suite: Option<&str>,
    ) -> bool {
        let mut provider = rustls::crypto::ring::default_provider();
        if let Some(suite) = suite {
            provider
                .cipher_suites
                .retain(|s| format!("{:?}", s.suite()) == suite);
        }
        let mut roots = rustls::RootCertStore::empty();
        for der in certificates("ca", ca_pem).unwrap() {
            roots.add(der).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let acceptor = TlsAcceptor::from(server);
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let (server_side, client_side) = tokio::join!(
            acceptor.accept(server_io),
            connector.connect(name, client_io)
        );
        server_side.is_ok() && client_side.is_ok()
    }

    /// `--tls-min-version=VersionTLS13` refuses TLS 1.2 clients; `--tls-cipher-suites`
    /// restricts the TLS 1.2 suites actually negotiated.
    #[tokio::test]
    async fn tls_flags_are_honoured_in_the_handshake() {
        let cert =
            self_signed("localhost", &[IpAddr::from([127, 0, 0, 1])], &["localhost"]).unwrap();
        let ca = certificates("c", &cert.cert_pem).unwrap();
        assert_eq!(ca.len(), 2);
        let ca_pem = {
            let start = cert.cert_pem[1..].find("-----BEGIN").unwrap() + 1;
            cert.cert_pem[start..].to_owned()
        };
        let config = |min: Option<&str>, suites: &[&str]| {
            TlsSettings {
                min_version: min.map(str::to_owned),
                cipher_suites: suites.iter().map(|s| s.to_string()).collect(),
            }
            .server_config(&cert, None)
            .unwrap()
        };
        assert!(tls12_handshake(config(None, &[]), &ca_pem, None).await);
        assert!(!tls12_handshake(config(Some("VersionTLS13"), &[]), &ca_pem, None).await);
        let only_128 = config(None, &["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]);
        assert!(
            tls12_handshake(
                only_128.clone(),
                &ca_pem,
                Some("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")
            )
            .await
        );
        assert!(
            !tls12_handshake(
                only_128,
                &ca_pem,
                Some("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384")
            )
            .await
        );
    }

    #[test]
    fn explicit_files_must_come_in_pairs() {
        let source = CertSource {
            cert_file: Some("/x.crt".into()),
            ..CertSource::default()
        };
        let err = serving_cert(&source, IpAddr::from([127, 0, 0, 1])).unwrap_err();
        assert!(err.to_string().contains("--tls-private-key-file"), "{err}");
        let source = CertSource {
            cert_file: Some("/nonexistent/x.crt".into()),
            key_file: Some("/nonexistent/x.key".into()),
            ..CertSource::default()
        };
        let err = serving_cert(&source, IpAddr::from([127, 0, 0, 1])).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/x.crt"), "{err}");
    }

    /// `--tls-min-version` / `--tls-cipher-suites` take Go's names: unknown ones are errors,
    /// known ones rustls cannot serve are warnings.
    #[test]
    fn tls_flags_take_go_names() {
        let settings = |min: Option<&str>, suites: &[&str]| TlsSettings {
            min_version: min.map(str::to_owned),
            cipher_suites: suites.iter().map(|s| s.to_string()).collect(),
        };
        assert!(settings(None, &[]).check().unwrap().is_empty());
        assert!(
            settings(Some("VersionTLS13"), &[])
                .check()
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            settings(Some("VersionTLS10"), &[]).check().unwrap().len(),
            1
        );
        assert!(settings(Some("TLS1.2"), &[]).check().is_err());
        assert!(
            settings(
                None,
                &[
                    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
                    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305"
                ]
            )
            .check()
            .unwrap()
            .is_empty()
        );
        let warnings = settings(None, &["TLS_RSA_WITH_AES_128_CBC_SHA"])
            .check()
            .unwrap();
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("TLS_RSA_WITH_AES_128_CBC_SHA")),
            "{warnings:?}"
        );
        assert!(
            warnings.iter().any(|w| w.contains("only TLS 1.3")),
            "{warnings:?}"
        );
        let err = settings(None, &["TLS_NOPE"]).check().unwrap_err();
        assert!(err.to_string().contains("TLS_NOPE"), "{err}");
        let (provider, _, _) = settings(None, &["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"])
            .build_provider()
            .unwrap();
        let tls12: Vec<_> = provider
            .cipher_suites
            .iter()
            .filter(|s| s.version() == &rustls::version::TLS12)
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert_eq!(tls12, vec!["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]);
    }
}
