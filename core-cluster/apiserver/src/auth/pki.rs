//! The cluster's PKI: a CA generated in the data directory on first start, the API server's
//! serving certificate, client certificates (CN = user, O = groups) and the service-account
//! signing key, all ECDSA P-256 (ring cannot make RSA keys; Kubernetes accepts ECDSA
//! everywhere).
//!
//! Files, under `<data dir>/pki/`: `ca.crt`/`ca.key`, `server.crt`/`server.key`,
//! `admin.crt`/`admin.key` (`system:masters`) and `sa.key`. As k3s does, every certificate
//! with 90 days or less left is renewed on start ([`RENEW_WITHIN`]); a renewed CA re-issues
//! every leaf certificate, so kubeconfigs must be rewritten (the callers do so on every start).

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use time::OffsetDateTime;

use super::GROUP_MASTERS;

/// A certificate with 90 days or less left is renewed on start (k3s' rule).
pub const RENEW_WITHIN: Duration = Duration::from_secs(90 * 24 * 3600);
/// How long the CA is valid (kubeadm and k3s: 10 years).
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long serving and client certificates are valid (kubeadm and k3s: 1 year).
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// The user name of the admin client certificate written into kubeconfigs.
pub const ADMIN_USER: &str = "ccm-admin";
/// The DNS names every serving certificate carries (kube-apiserver's defaults).
pub const DEFAULT_SERVING_NAMES: [&str; 5] = [
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// Why the PKI could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A certificate or key could not be made or parsed.
    #[error("{what}: {message}")]
    Crypto {
        /// Which certificate or key.
        what: String,
        /// Why.
        message: String,
    },
}

impl PkiError {
    fn crypto(what: impl Into<String>, message: impl std::fmt::Display) -> Self {
        PkiError::Crypto {
            what: what.into(),
            message: message.to_string(),
        }
    }
}

/// A PEM certificate and its PEM private key.
#[derive(Clone, PartialEq, Eq)]
pub struct CertAndKey {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The PKCS#8 private key, PEM.
    pub key_pem: String,
}

impl std::fmt::Debug for CertAndKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAndKey")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl CertAndKey {
    /// The certificate chain (leaf only) as DER.
    pub fn cert_der(&self) -> Result<Vec<CertificateDer<'static>>, PkiError> {
        CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| PkiError::crypto("certificate", e))
    }

    /// The private key as DER.
    pub fn key_der(&self) -> Result<PrivateKeyDer<'static>, PkiError> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| PkiError::crypto("private key", e))
    }
}

/// What [`Pki::load_or_create`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PkiReport {
    /// The CA was created (first start).
    pub ca_created: bool,
    /// The CA was renewed (≤ 90 days left).
    pub ca_renewed: bool,
    /// The leaf certificates that were (re)issued: `server`, `admin`.
    pub issued: Vec<&'static str>,
}

/// The cluster CA and the certificates the API server needs.
pub struct Pki {
    dir: PathBuf,
    ca: CertAndKey,
    issuer: Issuer<'static, KeyPair>,
    serving: CertAndKey,
    admin: CertAndKey,
    service_account_key: String,
    report: PkiReport,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.dir)
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

impl Pki {
    /// Loads the PKI from `<data_dir>/pki`, creating what is missing and renewing what has
    /// [`RENEW_WITHIN`] or less left. `serving_names` (DNS names or IP addresses) are added
    /// to [`DEFAULT_SERVING_NAMES`] and `127.0.0.1`; a serving certificate missing one of
    /// them is re-issued.
    pub fn load_or_create(data_dir: &Path, serving_names: &[String]) -> Result<Pki, PkiError> {
        Self::load_or_create_at(data_dir, serving_names, OffsetDateTime::now_utc())
    }

    /// [`Pki::load_or_create`] as if the time were `now` (tests of renewal).
    pub fn load_or_create_at(
        data_dir: &Path,
        serving_names: &[String],
        now: OffsetDateTime,
    ) -> Result<Pki, PkiError> {
        let dir = data_dir.join("pki");
        std::fs::create_dir_all(&dir).map_err(|source| PkiError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let mut report = PkiReport::default();
        let existing_ca = read_pair(&dir, "ca")?;
        let ca = match existing_ca {
            Some(ca) if !expiring(&ca.cert_pem, now)? => ca,
            previous => {
                if previous.is_some() {
                    report.ca_renewed = true;
                    tracing::info!(dir = %dir.display(), "renewing the cluster CA (90 days or less left)");
                } else {
                    report.ca_created = true;
                    tracing::info!(dir = %dir.display(), "creating the cluster CA");
                }
                let ca = new_ca(now)?;
                write_pair(&dir, "ca", &ca)?;
                ca
            }
        };
        let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|e| PkiError::crypto("ca.key", e))?;
        let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)
            .map_err(|e| PkiError::crypto("ca.crt", e))?;
        let ca_changed = report.ca_created || report.ca_renewed;

        let mut names: Vec<String> = DEFAULT_SERVING_NAMES.map(str::to_owned).to_vec();
        names.push("127.0.0.1".to_owned());
        for name in serving_names {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        // A leaf the CA did not sign (the CA files were replaced, say by another API
        // server's of the same cluster) is issued again.
        let serving = match read_pair(&dir, "server")? {
            Some(s)
                if !ca_changed
                    && !expiring(&s.cert_pem, now)?
                    && covers(&s, &names)?
                    && issued_by(&s, &ca)? =>
            {
                s
            }
            _ => {
                report.issued.push("server");
                let s = issue(&issuer, Leaf::Serving(&names), now)?;
                write_pair(&dir, "server", &s)?;
                s
            }
        };
        let admin = match read_pair(&dir, "admin")? {
            Some(a) if !ca_changed && !expiring(&a.cert_pem, now)? && issued_by(&a, &ca)? => a,
            _ => {
                report.issued.push("admin");
                let a = issue(&issuer, Leaf::Client(ADMIN_USER, &[GROUP_MASTERS]), now)?;
                write_pair(&dir, "admin", &a)?;
                a
            }
        };
        let sa_path = dir.join("sa.key");
        let service_account_key = match read_optional(&sa_path)? {
            Some(pem) => pem,
            None => {
                let key = KeyPair::generate().map_err(|e| PkiError::crypto("sa.key", e))?;
                let pem = key.serialize_pem();
                write_private(&sa_path, &pem)?;
                pem
            }
        };
        Ok(Pki {
            dir,
            ca,
            issuer,
            serving,
            admin,
            service_account_key,
            report,
        })
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// The serving certificate and key.
    pub fn serving(&self) -> &CertAndKey {
        &self.serving
    }

    /// The admin client certificate (`ccm-admin` in `system:masters`).
    pub fn admin(&self) -> &CertAndKey {
        &self.admin
    }

    /// The service-account token signing key (PKCS#8 PEM, ECDSA P-256).
    pub fn service_account_key_pem(&self) -> &str {
        &self.service_account_key
    }

    /// What loading did (created, renewed, issued).
    pub fn report(&self) -> &PkiReport {
        &self.report
    }

    /// The public fingerprints of what every API server of one cluster must share: the CA
    /// certificate and the service-account signing key (never the keys themselves).
    pub fn identity(&self) -> Result<ClusterIdentity, PkiError> {
        let ca = first_der(&self.ca.cert_pem)?;
        let sa = KeyPair::from_pem(&self.service_account_key)
            .map_err(|e| PkiError::crypto("sa.key", e))?;
        Ok(ClusterIdentity {
            ca_certificate_sha256: fingerprint(&ca),
            service_account_key_sha256: fingerprint(sa.public_key_raw()),
        })
    }

    /// Issues a client certificate for `user` in `groups` (CN = user, O = each group), valid
    /// for [`LEAF_VALIDITY`]: `system:node:<name>` in `system:nodes` for a kubelet, the
    /// cloud-controller-manager's own identity, a test user.
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<CertAndKey, PkiError> {
        issue(
            &self.issuer,
            Leaf::Client(user, groups),
            OffsetDateTime::now_utc(),
        )
    }

    /// The root store trusting this CA only.
    pub fn root_store(&self) -> Result<rustls::RootCertStore, PkiError> {
        let mut roots = rustls::RootCertStore::empty();
        for der in self.ca.cert_der()? {
            roots.add(der).map_err(|e| PkiError::crypto("ca.crt", e))?;
        }
        Ok(roots)
    }

    /// The rustls server configuration: the serving certificate, client certificates
    /// verified against the CA but optional (a request without one is anonymous, or
    /// authenticates with a bearer token), HTTP/2 and HTTP/1.1 by ALPN. The crypto provider
    /// is ring, passed explicitly.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, PkiError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(self.root_store()?),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| PkiError::crypto("client verifier", e))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| PkiError::crypto("TLS versions", e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.serving.cert_der()?, self.serving.key_der()?)
            .map_err(|e| PkiError::crypto("server.crt", e))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// A kubeconfig for `server` (an `https://` URL) with the CA embedded and `client` as
    /// the user's certificate and key, as YAML text.
    pub fn kubeconfig(&self, server: &str, client: &CertAndKey) -> String {
        kubeconfig_yaml(server, &self.ca.cert_pem, Credentials::Certificate(client))
    }
}

/// The public fingerprints of a cluster's PKI ([`Pki::identity`]): API servers that share
/// a store must share the CA (their clients' certificates and their serving certificates
/// are issued by it) and the service-account key (tokens one issues, another verifies).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterIdentity {
    /// SHA-256 of the CA certificate (DER), as `openssl x509 -noout -fingerprint -sha256
    /// -in ca.crt` prints it: upper-case hex pairs joined by colons.
    pub ca_certificate_sha256: String,
    /// SHA-256 of the service-account signing key's public key (the uncompressed EC point),
    /// in the same form.
    pub service_account_key_sha256: String,
}

/// SHA-256 of `bytes` as colon-separated upper-case hex pairs.
fn fingerprint(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// How a kubeconfig's user authenticates.
#[derive(Debug, Clone, Copy)]
pub enum Credentials<'a> {
    /// A client certificate and key.
    Certificate(&'a CertAndKey),
    /// A bearer token.
    Token(&'a str),
    /// Nothing: anonymous.
    Anonymous,
}

/// A kubeconfig for `server` trusting `ca_pem`, with `credentials`, as YAML text.
pub fn kubeconfig_yaml(server: &str, ca_pem: &str, credentials: Credentials<'_>) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let user = match credentials {
        Credentials::Certificate(c) => format!(
            "\n    client-certificate-data: {}\n    client-key-data: {}",
            b64(&c.cert_pem),
            b64(&c.key_pem)
        ),
        Credentials::Token(token) => format!("\n    token: {token}"),
        Credentials::Anonymous => " {}".to_owned(),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ccm\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\ncontexts:\n- name: ccm\n  context:\n    cluster: ccm\n    user: ccm\n    namespace: default\ncurrent-context: ccm\nusers:\n- name: ccm\n  user:{user}\npreferences: {{}}\n",
        b64(ca_pem),
    )
}

enum Leaf<'a> {
    Serving(&'a [String]),
    Client(&'a str, &'a [&'a str]),
}

fn validity(now: OffsetDateTime, length: Duration) -> (OffsetDateTime, OffsetDateTime) {
    // A little backdating tolerates clock skew between the server and its clients.
    let before = now - time::Duration::hours(1);
    let after = now + time::Duration::seconds(i64::try_from(length.as_secs()).unwrap_or(i64::MAX));
    (before, after)
}

fn new_ca(now: OffsetDateTime) -> Result<CertAndKey, PkiError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        format!("ccm-rs-ca@{}", now.unix_timestamp()),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (params.not_before, params.not_after) = validity(now, CA_VALIDITY);
    let key = KeyPair::generate().map_err(|e| PkiError::crypto("ca.key", e))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| PkiError::crypto("ca.crt", e))?;
    Ok(CertAndKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn issue(
    issuer: &Issuer<'_, KeyPair>,
    leaf: Leaf<'_>,
    now: OffsetDateTime,
) -> Result<CertAndKey, PkiError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    match leaf {
        Leaf::Serving(names) => {
            dn.push(DnType::CommonName, "kube-apiserver");
            params.subject_alt_names = names
                .iter()
                .map(|n| match n.parse::<IpAddr>() {
                    Ok(ip) => Ok(SanType::IpAddress(ip)),
                    Err(_) => n
                        .clone()
                        .try_into()
                        .map(SanType::DnsName)
                        .map_err(|e| PkiError::crypto(format!("serving name {n:?}"), e)),
                })
                .collect::<Result<_, _>>()?;
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        }
        Leaf::Client(user, groups) => {
            if user.is_empty() {
                return Err(PkiError::crypto("client certificate", "empty user name"));
            }
            dn.push(DnType::CommonName, user);
            for group in groups {
                dn.push(DnType::OrganizationName, *group);
            }
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
    }
    params.distinguished_name = dn;
    (params.not_before, params.not_after) = validity(now, LEAF_VALIDITY);
    let key = KeyPair::generate().map_err(|e| PkiError::crypto("key", e))?;
    let cert = params
        .signed_by(&key, issuer)
        .map_err(|e| PkiError::crypto("certificate", e))?;
    let cert_pem = match leaf {
        // rcgen keeps one value per attribute type: a subject with several O (groups) is
        // written here and the certificate signed again.
        Leaf::Client(user, groups) if groups.len() > 1 => {
            let der = with_subject(cert.der(), &client_subject(user, groups), issuer.key())?;
            pem_certificate(&der)
        }
        _ => cert.pem(),
    };
    Ok(CertAndKey {
        cert_pem,
        key_pem: key.serialize_pem(),
    })
}

/// A DER type-length-value.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// The subject `CN=<user>, O=<group>…` as a DER `Name`.
fn client_subject(user: &str, groups: &[&str]) -> Vec<u8> {
    const CN: [u8; 5] = [0x06, 0x03, 0x55, 0x04, 0x03];
    const O: [u8; 5] = [0x06, 0x03, 0x55, 0x04, 0x0a];
    let rdn = |oid: &[u8], value: &str| {
        let atv = der(0x30, &[oid, &der(0x0c, value.as_bytes())].concat());
        der(0x31, &atv)
    };
    let mut name = rdn(&CN, user);
    for group in groups {
        name.extend(rdn(&O, group));
    }
    der(0x30, &name)
}

/// `cert` with its subject replaced by `subject`, signed again by `key` (ECDSA P-256).
fn with_subject(cert: &[u8], subject: &[u8], key: &KeyPair) -> Result<Vec<u8>, PkiError> {
    use ring::signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair};
    let bad = |m: &str| PkiError::crypto("client certificate", m);
    let (_, parsed) = x509_parser::parse_x509_certificate(cert).map_err(|e| bad(&e.to_string()))?;
    let tbs = parsed.tbs_certificate.as_ref();
    let old_subject = parsed.tbs_certificate.subject.as_raw();
    let offset_of =
        |inner: &[u8], outer: &[u8]| (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize);
    let start = offset_of(old_subject, tbs).ok_or_else(|| bad("subject outside the TBS"))?;
    // The TBS content starts after its own tag and length.
    let header = match tbs.get(1) {
        Some(len) if *len < 0x80 => 2,
        Some(len) => 2 + usize::from(len & 0x7f),
        None => return Err(bad("empty TBS")),
    };
    let content = [
        &tbs[header..start],
        subject,
        &tbs[start + old_subject.len()..],
    ]
    .concat();
    let new_tbs = der(0x30, &content);
    let rng = ring::rand::SystemRandom::new();
    let signer =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, key.serialized_der(), &rng)
            .map_err(|e| bad(&e.to_string()))?;
    let signature = signer
        .sign(&rng, &new_tbs)
        .map_err(|e| bad(&e.to_string()))?;
    // ecdsa-with-SHA256, no parameters.
    let algorithm = der(
        0x30,
        &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x02],
    );
    let bits = [&[0u8][..], signature.as_ref()].concat();
    Ok(der(0x30, &[new_tbs, algorithm, der(0x03, &bits)].concat()))
}

fn pem_certificate(der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

fn first_der(cert_pem: &str) -> Result<CertificateDer<'static>, PkiError> {
    CertificateDer::from_pem_slice(cert_pem.as_bytes())
        .map_err(|e| PkiError::crypto("certificate", e))
}

/// Whether the certificate has [`RENEW_WITHIN`] or less left at `now`.
fn expiring(cert_pem: &str, now: OffsetDateTime) -> Result<bool, PkiError> {
    let der = first_der(cert_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| PkiError::crypto("certificate", e))?;
    let not_after = cert.validity().not_after.timestamp();
    let left = not_after - now.unix_timestamp();
    Ok(left <= i64::try_from(RENEW_WITHIN.as_secs()).unwrap_or(i64::MAX))
}

/// Whether `ca` issued `leaf`: the leaf's issuer is the CA's subject and its signature
/// verifies with the CA's public key.
fn issued_by(leaf: &CertAndKey, ca: &CertAndKey) -> Result<bool, PkiError> {
    let (leaf_der, ca_der) = (first_der(&leaf.cert_pem)?, first_der(&ca.cert_pem)?);
    let (_, leaf) = x509_parser::parse_x509_certificate(&leaf_der)
        .map_err(|e| PkiError::crypto("certificate", e))?;
    let (_, ca) =
        x509_parser::parse_x509_certificate(&ca_der).map_err(|e| PkiError::crypto("ca.crt", e))?;
    Ok(leaf.issuer().as_raw() == ca.subject().as_raw()
        && leaf.verify_signature(Some(ca.public_key())).is_ok())
}

/// Whether the serving certificate names every one of `names`.
fn covers(serving: &CertAndKey, names: &[String]) -> Result<bool, PkiError> {
    use x509_parser::extensions::GeneralName;
    let der = first_der(&serving.cert_pem)?;
    let (_, cert) =
        x509_parser::parse_x509_certificate(&der).map_err(|e| PkiError::crypto("server.crt", e))?;
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Ok(false);
    };
    let present: Vec<String> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some((*d).to_owned()),
            GeneralName::IPAddress(b) => match b.len() {
                4 => <[u8; 4]>::try_from(*b)
                    .ok()
                    .map(|a| IpAddr::from(a).to_string()),
                16 => <[u8; 16]>::try_from(*b)
                    .ok()
                    .map(|a| IpAddr::from(a).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    Ok(names.iter().all(|n| {
        let normal = n
            .parse::<IpAddr>()
            .map_or_else(|_| n.clone(), |ip| ip.to_string());
        present.contains(&normal)
    }))
}

fn read_optional(path: &Path) -> Result<Option<String>, PkiError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PkiError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

fn read_pair(dir: &Path, name: &str) -> Result<Option<CertAndKey>, PkiError> {
    let cert = read_optional(&dir.join(format!("{name}.crt")))?;
    let key = read_optional(&dir.join(format!("{name}.key")))?;
    Ok(match (cert, key) {
        (Some(cert_pem), Some(key_pem)) => Some(CertAndKey { cert_pem, key_pem }),
        _ => None,
    })
}

fn write_file(path: &Path, contents: &str, private: bool) -> Result<(), PkiError> {
    let err = |source| PkiError::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        if private {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        #[cfg(not(unix))]
        let _ = private;
        let mut file = options.open(&tmp).map_err(err)?;
        file.write_all(contents.as_bytes()).map_err(err)?;
        file.sync_all().map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(err)
}

fn write_private(path: &Path, contents: &str) -> Result<(), PkiError> {
    write_file(path, contents, true)
}

fn write_pair(dir: &Path, name: &str, pair: &CertAndKey) -> Result<(), PkiError> {
    // The key first: a crash between the two leaves a certificate that no longer matches
    // its key only if the certificate was written, which is then re-issued on next start.
    write_private(&dir.join(format!("{name}.key")), &pair.key_pem)?;
    write_file(&dir.join(format!("{name}.crt")), &pair.cert_pem, false)
}

/// The user and groups of a client certificate: CN is the user, each O a group
/// (kube-apiserver's x509 authenticator, `CommonNameUserConversion`).
pub fn client_identity(der: &[u8]) -> Option<(String, Vec<String>)> {
    ccm_serving::CertificateIdentity::from_der(der).map(|id| (id.user, id.groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_certificates_carry_user_and_groups() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::load_or_create(dir.path(), &[]).unwrap();
        let node = pki
            .issue_client("system:node:n1", &["system:nodes"])
            .unwrap();
        let der = node.cert_der().unwrap();
        assert_eq!(
            client_identity(&der[0]),
            Some(("system:node:n1".to_owned(), vec!["system:nodes".to_owned()]))
        );
        let admin = pki.admin().cert_der().unwrap();
        assert_eq!(
            client_identity(&admin[0]),
            Some((ADMIN_USER.to_owned(), vec![GROUP_MASTERS.to_owned()]))
        );
        assert!(
            pki.issue_client("", &[]).is_err(),
            "an empty user is refused"
        );
        // Several groups: one O attribute each, still signed by the CA.
        let dev = pki.issue_client("alice", &["dev", "ops", "qa"]).unwrap();
        let der = dev.cert_der().unwrap();
        assert_eq!(
            client_identity(&der[0]),
            Some((
                "alice".to_owned(),
                vec!["dev".to_owned(), "ops".to_owned(), "qa".to_owned()]
            ))
        );
        let ca = pki.ca.cert_der().unwrap();
        let (_, ca) = x509_parser::parse_x509_certificate(&ca[0]).unwrap();
        let (_, leaf) = x509_parser::parse_x509_certificate(&der[0]).unwrap();
        leaf.verify_signature(Some(ca.public_key())).unwrap();
    }

    #[test]
    fn second_start_reuses_and_new_names_reissue_the_serving_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let first = Pki::load_or_create(dir.path(), &[]).unwrap();
        assert!(first.report().ca_created);
        let second = Pki::load_or_create(dir.path(), &[]).unwrap();
        assert_eq!(second.report(), &PkiReport::default());
        assert_eq!(first.ca_pem(), second.ca_pem());
        assert_eq!(first.serving(), second.serving());
        let third = Pki::load_or_create(dir.path(), &["10.1.2.3".to_owned()]).unwrap();
        assert_eq!(third.report().issued, ["server"]);
        assert_eq!(first.ca_pem(), third.ca_pem());
        assert!(covers(third.serving(), &["10.1.2.3".to_owned()]).unwrap());
    }

    /// The files every API server of one cluster shares (kubeadm's "copy the certificates
    /// to the other control-plane nodes": `ca.crt`, `ca.key`, `sa.key`): copied into a data
    /// directory that has leaves of its own, they give the same identity, and the leaves
    /// the copied CA did not sign are issued again by it.
    #[test]
    fn copied_ca_and_service_account_key_give_the_same_identity_and_reissue_leaves() {
        let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = Pki::load_or_create(first.path(), &[]).unwrap();
        let b = Pki::load_or_create(second.path(), &[]).unwrap();
        assert_ne!(a.identity().unwrap(), b.identity().unwrap());
        for file in ["ca.crt", "ca.key", "sa.key"] {
            std::fs::copy(
                first.path().join("pki").join(file),
                second.path().join("pki").join(file),
            )
            .unwrap();
        }
        let b = Pki::load_or_create(second.path(), &[]).unwrap();
        assert_eq!(a.identity().unwrap(), b.identity().unwrap());
        assert_eq!(b.report().issued, ["server", "admin"]);
        assert!(issued_by(b.serving(), &a.ca).unwrap());
        assert!(issued_by(b.admin(), &a.ca).unwrap());
        let fingerprint = &a.identity().unwrap().ca_certificate_sha256;
        assert_eq!(fingerprint.len(), 32 * 3 - 1, "{fingerprint}");
    }

    /// k3s renews every certificate with 90 days or less left on start; a renewed CA
    /// re-issues the leaf certificates it signed.
    #[test]
    fn k3s_renews_certificates_with_90_days_or_less_left() {
        let dir = tempfile::tempdir().unwrap();
        let now = OffsetDateTime::now_utc();
        let first = Pki::load_or_create_at(dir.path(), &[], now).unwrap();
        // 91 days before the leaf certificates expire: nothing to do.
        let early = now + time::Duration::days(365 - 91);
        let same = Pki::load_or_create_at(dir.path(), &[], early).unwrap();
        assert_eq!(same.report(), &PkiReport::default());
        // 89 days before: the leaves are re-issued by the same CA.
        let late = now + time::Duration::days(365 - 89);
        let leaves = Pki::load_or_create_at(dir.path(), &[], late).unwrap();
        assert!(!leaves.report().ca_renewed);
        assert_eq!(leaves.report().issued, ["server", "admin"]);
        assert_eq!(leaves.ca_pem(), first.ca_pem());
        assert_ne!(leaves.admin(), first.admin());
        // 89 days before the CA expires: a new CA and new leaves.
        let ca_late = now + time::Duration::days(10 * 365 - 89);
        let renewed = Pki::load_or_create_at(dir.path(), &[], ca_late).unwrap();
        assert!(renewed.report().ca_renewed);
        assert_eq!(renewed.report().issued, ["server", "admin"]);
        assert_ne!(renewed.ca_pem(), first.ca_pem());
        assert!(!expiring(&renewed.ca.cert_pem, ca_late).unwrap());
    }
}
