//! `serverTLSBootstrap`: the kubelet's serving certificate from a CertificateSigningRequest,
//! as kubelet's serving certificate manager (`pkg/kubelet/certificate/kubelet.go
//! NewKubeletServerCertificateManager`, `client-go/util/certificate/certificate_manager.go`)
//! gets it: a new key, a request for `kubernetes.io/kubelet-serving` with the subject
//! `system:node:<name>` in `system:nodes` and the node's hostname and IP as SANs, created as
//! the node; then the kubelet waits for the signed certificate. Until it arrives the server
//! listens but every TLS handshake fails, as kubelet's `GetCertificate` answers "no serving
//! certificate available for the kubelet".
//!
//! A denied or failed request is logged and left there: kubelet's manager would try again
//! with a new request after a backoff.

use std::{net::IpAddr, sync::Arc};

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::{Api, Client, api::PostParams, runtime::wait::await_condition};
use parking_lot::RwLock;
use rustls::{
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// The signer kubelet asks.
pub(crate) const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// The serving certificate, once signed.
#[derive(Debug)]
pub(super) struct BootstrapCert {
    current: RwLock<Option<Arc<CertifiedKey>>>,
    provider: Arc<CryptoProvider>,
}

impl BootstrapCert {
    /// No certificate yet.
    pub(super) fn new(provider: Arc<CryptoProvider>) -> Self {
        Self {
            current: RwLock::new(None),
            provider,
        }
    }

    /// Serves `cert_pem` (the leaf, then any chain) with `key_pem`.
    fn install(&self, cert_pem: &[u8], key_pem: &str) -> Result<(), String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        if chain.is_empty() {
            return Err("the issued certificate holds no CERTIFICATE block".into());
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| e.to_string())?;
        let key = self
            .provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| e.to_string())?;
        *self.current.write() = Some(Arc::new(CertifiedKey::new(chain, key)));
        Ok(())
    }
}

impl ResolvesServerCert for BootstrapCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().clone()
    }
}

/// The request's state: issued (the certificate), refused (why), or pending.
fn answered(csr: &CertificateSigningRequest) -> Option<Result<Vec<u8>, String>> {
    let status = csr.status.as_ref()?;
    if let Some(cert) = status.certificate.as_ref().filter(|c| !c.0.is_empty()) {
        return Some(Ok(cert.0.clone()));
    }
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
        .map(|c| {
            Err(format!(
                "{} ({}): {}",
                c.type_,
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or("")
            ))
        })
}

/// Asks for the serving certificate of `node` (hostname `name`, address `ip`) through
/// `client` (the node's identity) and installs it in `cert` once signed.
pub(super) async fn bootstrap(
    client: Client,
    name: String,
    ip: IpAddr,
    cert: Arc<BootstrapCert>,
    shutdown: CancellationToken,
) {
    let result = tokio::select! {
        r = request_and_wait(client, &name, ip) => r,
        () = shutdown.cancelled() => return,
    };
    match result.and_then(|(pem, key)| cert.install(&pem, &key)) {
        Ok(()) => {
            tracing::info!(node = %name, "serving certificate issued; the kubelet API serves")
        }
        Err(error) => tracing::warn!(node = %name, %error, "no serving certificate"),
    }
}

/// Creates the request and waits for its answer: (certificate PEM, key PEM).
async fn request_and_wait(
    client: Client,
    name: &str,
    ip: IpAddr,
) -> Result<(Vec<u8>, String), String> {
    use rcgen::{CertificateParams, DnType, KeyPair, SanType};
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("system:node:{name}"));
    params
        .distinguished_name
        .push(DnType::OrganizationName, "system:nodes");
    let dns = name
        .to_owned()
        .try_into()
        .map_err(|e| format!("node name {name:?}: {e}"))?;
    params.subject_alt_names = vec![SanType::DnsName(dns), SanType::IpAddress(ip)];
    let request = params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| e.to_string())?;
    // An ECDSA key: no key encipherment (`certificate_manager.go`'s usages for non-RSA keys).
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "metadata": {"generateName": "csr-"},
        "spec": {
            "request": k8s_openapi::ByteString(request.into_bytes()),
            "signerName": KUBELET_SERVING_SIGNER,
            "usages": ["digital signature", "server auth"],
        },
    }))
    .map_err(|e| e.to_string())?;
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .map_err(|e| format!("creating the certificate signing request: {e}"))?;
    let csr_name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(node = %name, csr = %csr_name, "waiting for the serving certificate");
    let cond = |o: Option<&CertificateSigningRequest>| o.and_then(answered).is_some();
    let done = await_condition(api, &csr_name, cond)
        .await
        .map_err(|e| format!("watching {csr_name}: {e}"))?;
    match done.as_ref().and_then(answered) {
        Some(Ok(pem)) => Ok((pem, key.serialize_pem())),
        Some(Err(why)) => Err(format!("certificate signing request {csr_name}: {why}")),
        None => Err(format!(
            "certificate signing request {csr_name} was deleted"
        )),
    }
}
