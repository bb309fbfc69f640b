//! The CSR signing controller for `kubernetes.io/kubelet-serving`: approved
//! CertificateSigningRequests of that signer get a certificate of the kubelet-serving CA.
//!
//! # What upstream does (`pkg/controller/certificates/signer/signer.go`)
//!
//! `handle` skips a request that is not approved, already failed or already issued, or for
//! another signer. It parses the request (a PEM `CERTIFICATE REQUEST` whose signature
//! checks); `isKubeletServing` then applies `ValidateKubeletServingCSR`
//! (`pkg/apis/certificates/helpers.go`): the subject's organization exactly
//! `[system:nodes]`, at least one DNS or IP subjectAltName, no email or URI ones, the
//! usages `digital signature, key encipherment, server auth` (or without key encipherment),
//! and a common name starting `system:node:`. A request failing that gets a `Failed`
//! condition (reason `SignerValidationFailure`) through `/status` and is never signed.
//! Otherwise `authority.go Sign` issues a certificate for the request's public key, subject
//! and SANs, backdated five minutes, valid for `--cluster-signing-duration` (one year) or
//! the request's `spec.expirationSeconds` if shorter (and never past the CA's own end), with
//! the requested usages, and writes it into `status.certificate`.
//!
//! # Where we differ
//!
//! When the requester is itself a node (`spec.username` `system:node:<name>`), the subject
//! must name that node: a node asking for another node's serving certificate is refused
//! with `Failed`. Upstream leaves that check to the approver.

use std::{net::IpAddr, time::Duration};

use async_trait::async_trait;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, Client,
    api::PostParams,
    runtime::reflector::{ObjectRef, Store},
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::workload::{Reconcile, drive, watch};

/// The signer this controller serves.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// `--cluster-signing-duration`'s default: one year.
pub const DEFAULT_SIGNING_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far back a certificate's validity starts (`authority.go`'s backdate).
const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// The shortest validity `spec.expirationSeconds` can ask for.
const MIN_DURATION: Duration = Duration::from_secs(600);

/// Why a request is not for this signer's policy (`ValidateKubeletServingCSR`'s errors).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// The request does not parse, or its signature does not check.
    #[error("unable to parse csr: {0}")]
    Parse(String),
    /// `errOrganizationNotSystemNodesErr`.
    #[error("subject organization is not system:nodes")]
    Organization,
    /// `errDNSOrIPSANRequiredErr`.
    #[error("DNS or IP subjectAltName is required")]
    NoSan,
    /// `errEmailSANNotAllowedErr`.
    #[error("Email subjectAltNames are not allowed")]
    EmailSan,
    /// `errURISANNotAllowedErr`.
    #[error("URI subjectAltNames are not allowed")]
    UriSan,
    /// The usages are not a kubelet serving certificate's.
    #[error("usages did not match [digital signature key encipherment server auth]")]
    Usages,
    /// `errCommonNameNotSystemNode`.
    #[error("subject common name does not begin with system:node:")]
    CommonName,
    /// A node asked for another node's certificate.
    #[error("subject common name {subject:?} does not name the requesting node {requester:?}")]
    OtherNode {
        /// The subject's common name.
        subject: String,
        /// The requester.
        requester: String,
    },
}

/// What a parsed request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRequest {
    /// The subject's common name.
    pub common_name: String,
    /// The subject's organizations.
    pub organizations: Vec<String>,
    /// DNS subjectAltNames.
    pub dns_names: Vec<String>,
    /// IP subjectAltNames.
    pub ip_addresses: Vec<IpAddr>,
    /// Whether it names emails.
    pub emails: bool,
    /// Whether it names URIs.
    pub uris: bool,
    /// The DER SubjectPublicKeyInfo.
    pub public_key: Vec<u8>,
}

/// The DER of the one `CERTIFICATE REQUEST` PEM block of `request`.
fn request_der(request: &[u8]) -> Result<Vec<u8>, PolicyError> {
    let text = std::str::from_utf8(request).map_err(|e| PolicyError::Parse(e.to_string()))?;
    let blocks = crate::registry::certificates::pem_blocks(text).map_err(PolicyError::Parse)?;
    match blocks.into_iter().next() {
        Some((label, der)) if label == "CERTIFICATE REQUEST" => Ok(der),
        _ => Err(PolicyError::Parse(
            "PEM block type must be CERTIFICATE REQUEST".into(),
        )),
    }
}

/// `ParseCSR`: the PKCS#10 request in `request` (PEM), its signature checked.
pub fn parse_request(request: &[u8]) -> Result<ParsedRequest, PolicyError> {
    use x509_parser::{
        certification_request::X509CertificationRequest,
        extensions::{GeneralName, ParsedExtension},
        prelude::FromDer,
    };
    let der = request_der(request)?;
    let (_, csr) =
        X509CertificationRequest::from_der(&der).map_err(|e| PolicyError::Parse(e.to_string()))?;
    csr.verify_signature()
        .map_err(|e| PolicyError::Parse(format!("signature: {e}")))?;
    let info = &csr.certification_request_info;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        a.as_str().map(str::to_owned).unwrap_or_default()
    };
    let mut parsed = ParsedRequest {
        common_name: info
            .subject
            .iter_common_name()
            .next()
            .map(text)
            .unwrap_or_default(),
        organizations: info.subject.iter_organization().map(text).collect(),
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        emails: false,
        uris: false,
        public_key: info.subject_pki.raw.to_vec(),
    };
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(d) => parsed.dns_names.push((*d).to_owned()),
                    GeneralName::IPAddress(b) => match b.len() {
                        4 => parsed
                            .ip_addresses
                            .push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())),
                        16 => parsed
                            .ip_addresses
                            .push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())),
                        _ => return Err(PolicyError::Parse("bad IP subjectAltName".into())),
                    },
                    GeneralName::RFC822Name(_) => parsed.emails = true,
                    GeneralName::URI(_) => parsed.uris = true,
                    _ => {}
                }
            }
        }
    }
    Ok(parsed)
}

/// `ValidateKubeletServingCSR`, and that a node asks only for its own name.
pub fn validate_kubelet_serving(
    req: &ParsedRequest,
    usages: &[String],
    requester: &str,
) -> Result<(), PolicyError> {
    if req.organizations != ["system:nodes"] {
        return Err(PolicyError::Organization);
    }
    if req.dns_names.is_empty() && req.ip_addresses.is_empty() {
        return Err(PolicyError::NoSan);
    }
    if req.emails {
        return Err(PolicyError::EmailSan);
    }
    if req.uris {
        return Err(PolicyError::UriSan);
    }
    let mut set: Vec<&str> = usages.iter().map(String::as_str).collect();
    set.sort_unstable();
    set.dedup();
    let required = ["digital signature", "key encipherment", "server auth"];
    let no_rsa = ["digital signature", "server auth"];
    if set != required && set != no_rsa {
        return Err(PolicyError::Usages);
    }
    if !req.common_name.starts_with("system:node:") {
        return Err(PolicyError::CommonName);
    }
    if requester.starts_with("system:node:") && requester != req.common_name {
        return Err(PolicyError::OtherNode {
            subject: req.common_name.clone(),
            requester: requester.to_owned(),
        });
    }
    Ok(())
}

/// The kubelet-serving CA: certificate and key, PEM.
#[derive(Clone)]
pub struct SigningCa {
    /// The CA certificate.
    pub cert_pem: String,
    /// Its key.
    pub key_pem: String,
}

impl std::fmt::Debug for SigningCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningCa").finish_non_exhaustive()
    }
}

/// Why a certificate could not be issued.
#[derive(Debug, thiserror::Error)]
#[error("signing: {0}")]
pub struct SignError(String);

/// The DER of the first `CERTIFICATE` block of `pem`.
pub fn first_certificate(pem: &str) -> Result<Vec<u8>, String> {
    crate::registry::certificates::pem_blocks(pem)?
        .into_iter()
        .find(|(label, _)| label == "CERTIFICATE")
        .map(|(_, der)| der)
        .ok_or_else(|| "no CERTIFICATE PEM block".to_owned())
}

/// `authority.go Sign`: a certificate for `req` valid for `duration` from now (backdated),
/// never past the CA's own end, with `usages`. PEM.
pub fn sign(
    ca: &SigningCa,
    req: &ParsedRequest,
    usages: &[String],
    duration: Duration,
) -> Result<String, SignError> {
    use rcgen::{
        CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
        KeyUsagePurpose, SanType, SerialNumber, SubjectPublicKeyInfo,
    };
    let err = |e: &dyn std::fmt::Display| SignError(e.to_string());
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|e| err(&e))?;
    let ca_not_after = {
        let der = first_certificate(&ca.cert_pem).map_err(|e| err(&e))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).map_err(|e| err(&e))?;
        parsed.validity().not_after.to_datetime()
    };
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).map_err(|e| err(&e))?;
    let public_key = SubjectPublicKeyInfo::from_der(&req.public_key).map_err(|e| err(&e))?;
    let now = time::OffsetDateTime::now_utc();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, req.common_name.clone());
    for o in &req.organizations {
        dn.push(DnType::OrganizationName, o.clone());
    }
    params.distinguished_name = dn;
    for d in &req.dns_names {
        params
            .subject_alt_names
            .push(SanType::DnsName(d.clone().try_into().map_err(|e| err(&e))?));
    }
    params
        .subject_alt_names
        .extend(req.ip_addresses.iter().map(|ip| SanType::IpAddress(*ip)));
    for u in usages {
        match u.as_str() {
            "digital signature" => params.key_usages.push(KeyUsagePurpose::DigitalSignature),
            "key encipherment" => params.key_usages.push(KeyUsagePurpose::KeyEncipherment),
            "server auth" => params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth),
            "client auth" => params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth),
            _ => {}
        }
    }
    params.use_authority_key_identifier_extension = true;
    let mut serial = [0u8; 16];
    for b in &mut serial {
        *b = fastrand::u8(..);
    }
    serial[0] &= 0x7f;
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    let span = time::Duration::try_from(duration).map_err(|e| err(&e))?;
    let backdate = time::Duration::try_from(BACKDATE).map_err(|e| err(&e))?;
    params.not_before = now - backdate;
    params.not_after = (now + span).min(ca_not_after);
    let cert = params
        .signed_by(&public_key, &issuer)
        .map_err(|e| err(&e))?;
    Ok(cert.pem())
}

/// The signing controller (see the module's documentation).
pub struct CsrSigner {
    client: Client,
    ca: SigningCa,
    duration: Duration,
}

impl std::fmt::Debug for CsrSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsrSigner")
            .field("duration", &self.duration)
            .finish_non_exhaustive()
    }
}

impl CsrSigner {
    /// A signer issuing from `ca` for at most `duration` (`--cluster-signing-duration`).
    pub fn new(client: Client, ca: SigningCa, duration: Duration) -> Self {
        Self {
            client,
            ca,
            duration,
        }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (requests, events) = watch(
            Api::<CertificateSigningRequest>::all(self.client.clone()),
            |c| c.metadata.name.clone().into_iter().collect(),
        );
        let sync = Sync {
            api: Api::all(self.client),
            ca: self.ca,
            duration: self.duration,
            requests,
        };
        drive(sync, vec![events], shutdown).await;
    }
}

struct Sync {
    api: Api<CertificateSigningRequest>,
    ca: SigningCa,
    duration: Duration,
    requests: Store<CertificateSigningRequest>,
}

/// Whether `csr` has a condition of `type_` with status True.
pub fn has_true_condition(csr: &CertificateSigningRequest, type_: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// The validity a request gets: `--cluster-signing-duration`, or its `expirationSeconds`
/// if shorter (at least ten minutes), as `duration.go` computes it.
pub fn validity(duration: Duration, expiration_seconds: Option<i32>) -> Duration {
    match expiration_seconds {
        Some(s) => duration
            .min(Duration::from_secs(u64::try_from(s).unwrap_or(0)))
            .max(MIN_DURATION),
        None => duration,
    }
}

#[async_trait]
impl Reconcile for Sync {
    fn name(&self) -> &'static str {
        "csrsigning"
    }

    async fn reconcile(&mut self, name: &str) -> Result<Option<Duration>, kube::Error> {
        let Some(csr) = self.requests.get(&ObjectRef::new(name)) else {
            return Ok(None);
        };
        let issued = csr
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .is_some_and(|c| !c.0.is_empty());
        if !has_true_condition(&csr, "Approved")
            || has_true_condition(&csr, "Denied")
            || has_true_condition(&csr, "Failed")
            || issued
            || csr.spec.signer_name != KUBELET_SERVING_SIGNER
        {
            return Ok(None);
        }
        let usages = csr.spec.usages.clone().unwrap_or_default();
        let requester = csr.spec.username.clone().unwrap_or_default();
        let mut updated = (*csr).clone();
        let status = updated.status.get_or_insert_with(Default::default);
        let checked = parse_request(&csr.spec.request.0)
            .and_then(|req| validate_kubelet_serving(&req, &usages, &requester).map(|()| req));
        match checked {
            Err(e) => {
                warn!(csr = name, error = %e, "refusing to sign");
                status.conditions.get_or_insert_with(Vec::new).push(
                    CertificateSigningRequestCondition {
                        type_: "Failed".into(),
                        status: "True".into(),
                        reason: Some("SignerValidationFailure".into()),
                        message: Some(e.to_string()),
                        last_update_time: Some(Time(jiff::Timestamp::now())),
                        last_transition_time: Some(Time(jiff::Timestamp::now())),
                    },
                );
            }
            Ok(req) => {
                let duration = validity(self.duration, csr.spec.expiration_seconds);
                match sign(&self.ca, &req, &usages, duration) {
                    Ok(pem) => {
                        status.certificate = Some(k8s_openapi::ByteString(pem.into_bytes()));
                    }
                    Err(e) => {
                        warn!(csr = name, error = %e, "signing failed");
                        return Ok(Some(Duration::from_secs(5)));
                    }
                }
            }
        }
        match self
            .api
            .replace_status(name, &PostParams::default(), &updated)
            .await
        {
            Ok(_) => {
                info!(csr = name, "kubelet-serving request answered");
                Ok(None)
            }
            // A newer version is on its way to the cache: that event queues again.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(cn: &str, o: &str, sans: &[&str]) -> Vec<u8> {
        use rcgen::{CertificateParams, DnType, KeyPair};
        let mut params =
            CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.distinguished_name.push(DnType::OrganizationName, o);
        let key = KeyPair::generate().unwrap();
        params
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap()
            .into_bytes()
    }

    fn usages(u: &[&str]) -> Vec<String> {
        u.iter().map(|s| (*s).to_owned()).collect()
    }

    const SERVING: &[&str] = &["digital signature", "key encipherment", "server auth"];

    /// `ValidateKubeletServingCSR` (`pkg/apis/certificates/helpers.go`): organization,
    /// SANs, usages and the `system:node:` common name.
    #[test]
    fn kubelet_serving_requests_are_held_to_upstreams_policy() {
        let ok = parse_request(&request(
            "system:node:a",
            "system:nodes",
            &["a", "127.0.0.1"],
        ))
        .unwrap();
        assert_eq!(ok.dns_names, ["a"]);
        assert_eq!(ok.ip_addresses, ["127.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(
            validate_kubelet_serving(&ok, &usages(SERVING), "system:node:a"),
            Ok(())
        );
        assert_eq!(
            validate_kubelet_serving(&ok, &usages(&["digital signature", "server auth"]), "admin"),
            Ok(())
        );
        assert_eq!(
            validate_kubelet_serving(&ok, &usages(&["client auth"]), "admin"),
            Err(PolicyError::Usages)
        );
        assert!(matches!(
            validate_kubelet_serving(&ok, &usages(SERVING), "system:node:b"),
            Err(PolicyError::OtherNode { .. })
        ));
        let org = parse_request(&request("system:node:a", "admins", &["a"])).unwrap();
        assert_eq!(
            validate_kubelet_serving(&org, &usages(SERVING), "x"),
            Err(PolicyError::Organization)
        );
        let cn = parse_request(&request("a", "system:nodes", &["a"])).unwrap();
        assert_eq!(
            validate_kubelet_serving(&cn, &usages(SERVING), "x"),
            Err(PolicyError::CommonName)
        );
        let none = parse_request(&request("system:node:a", "system:nodes", &[])).unwrap();
        assert_eq!(
            validate_kubelet_serving(&none, &usages(SERVING), "x"),
            Err(PolicyError::NoSan)
        );
        assert!(matches!(
            parse_request(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"),
            Err(PolicyError::Parse(_))
        ));
    }

    /// `authority.go Sign`: the certificate carries the request's subject and SANs, is
    /// issued by the CA, and lasts the shorter of the flag and `expirationSeconds`.
    #[test]
    fn a_signed_certificate_names_the_request_and_lasts_the_asked_duration() {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kubelet-serving-ca");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let ca = SigningCa {
            cert_pem: ca_cert.pem(),
            key_pem: ca_key.serialize_pem(),
        };
        let req = parse_request(&request(
            "system:node:a",
            "system:nodes",
            &["a", "10.0.0.1"],
        ))
        .unwrap();
        let duration = validity(DEFAULT_SIGNING_DURATION, Some(3600));
        assert_eq!(duration, Duration::from_secs(3600));
        assert_eq!(validity(DEFAULT_SIGNING_DURATION, Some(60)), MIN_DURATION);
        let pem = sign(&ca, &req, &usages(SERVING), duration).unwrap();
        let der = first_certificate(&pem).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        assert_eq!(
            cert.subject()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            "system:node:a"
        );
        assert_eq!(
            cert.issuer()
                .iter_common_name()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            "kubelet-serving-ca"
        );
        let validity = cert.validity();
        let seconds = (validity.not_after.timestamp() - validity.not_before.timestamp()) as u64;
        assert_eq!(seconds, 3600 + BACKDATE.as_secs());
        let ca_der = first_certificate(&ca.cert_pem).unwrap();
        let (_, ca_parsed) = x509_parser::parse_x509_certificate(&ca_der).unwrap();
        cert.verify_signature(Some(ca_parsed.public_key())).unwrap();
    }
}
