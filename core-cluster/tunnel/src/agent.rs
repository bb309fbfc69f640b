//! The node's side: the agent that dials out to the API server and splices each stream the
//! API server opens to its kubelet's port.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use h2::{RecvStream, server::SendResponse};
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject},
};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::{CONNECTION_WINDOW, PATH, PROTOCOL, STREAM_WINDOW, TunnelError, TunnelStream};

/// The first wait before dialling again after a failure; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two dials.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long connecting to the kubelet may take before the stream is refused.
const KUBELET_DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Failures in a row after which each further one is a warning (the first are expected
/// while the API server starts).
const QUIET_FAILURES: u32 = 3;

/// Where and as whom an agent dials.
#[derive(Clone)]
pub struct AgentConfig {
    /// The API server's secure address.
    pub server: SocketAddr,
    /// The name the API server's certificate is verified for: an IP address or a DNS name.
    pub server_name: String,
    /// TLS settings: the API server's CA and the node's client certificate
    /// (see [`client_tls`]).
    pub tls: Arc<ClientConfig>,
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("server", &self.server)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// TLS settings for an agent: the API server's certificate verified against
/// `server_ca_pem`, and the node's client certificate chain and key presented.
pub fn client_tls(
    server_ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<Arc<ClientConfig>, TunnelError> {
    let bad =
        |what: &str, e: &dyn std::fmt::Display| TunnelError::Credentials(format!("{what}: {e}"));
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(server_ca_pem.as_bytes()) {
        let cert = cert.map_err(|e| bad("the API server's CA", &e))?;
        roots
            .add(cert)
            .map_err(|e| bad("the API server's CA", &e))?;
    }
    if roots.is_empty() {
        return Err(TunnelError::Credentials(
            "the API server's CA holds no certificate".to_owned(),
        ));
    }
    let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("the client certificate", &e))?;
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| bad("the client key", &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("TLS versions", &e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| bad("the client certificate", &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Runs `node`'s agent until `shutdown`: dials the API server, opens the tunnel, and
/// splices each stream the API server opens to `kubelet`. A lost or refused connection is
/// dialled again after a backoff of one second doubling to thirty, back to one second once
/// a tunnel was open.
pub async fn run_agent(
    config: AgentConfig,
    node: String,
    kubelet: SocketAddr,
    shutdown: CancellationToken,
) {
    let mut backoff = FIRST_BACKOFF;
    let mut failures = 0u32;
    loop {
        let mut opened = false;
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            result = connect_once(&config, &node, kubelet, &mut opened, &shutdown) => result,
        };
        if opened {
            backoff = FIRST_BACKOFF;
            failures = 0;
        }
        match result {
            Ok(()) => tracing::debug!(node, "agent tunnel closed; dialling again"),
            Err(error) => {
                failures += 1;
                if failures > QUIET_FAILURES {
                    tracing::warn!(node, %error, retry_in = ?backoff, "agent tunnel failed");
                } else {
                    tracing::debug!(node, %error, retry_in = ?backoff, "agent tunnel failed");
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        if !opened {
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// One tunnel connection, from the dial to its end. `opened` is set once the API server
/// accepted the upgrade.
async fn connect_once(
    config: &AgentConfig,
    node: &str,
    kubelet: SocketAddr,
    opened: &mut bool,
    shutdown: &CancellationToken,
) -> Result<(), TunnelError> {
    let connect =
        |what: &str, e: &dyn std::fmt::Display| TunnelError::Connect(format!("{what}: {e}"));
    let server = config.server;
    let tcp = TcpStream::connect(server)
        .await
        .map_err(|e| connect(&format!("dial tcp {server}"), &e))?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(config.server_name.clone())
        .map_err(|e| connect("the API server's name", &e))?;
    let tls = tokio_rustls::TlsConnector::from(config.tls.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| connect("tls", &e))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, String>(TokioIo::new(tls))
            .await
            .map_err(|e| connect("http", &e))?;
    tokio::spawn(async move {
        // Hands the connection over once the upgrade is answered.
        let _ = connection.with_upgrades().await;
    });
    let request = Request::builder()
        .method(Method::GET)
        .uri(PATH)
        .header(header::HOST, config.server_name.as_str())
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, PROTOCOL)
        .body(String::new())
        .map_err(|e| connect("the upgrade request", &e))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| connect("the upgrade request", &e))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(TunnelError::Connect(format!(
            "the API server refused the tunnel: HTTP {}",
            response.status().as_u16()
        )));
    }
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|e| connect("the upgrade", &e))?;
    *opened = true;
    tracing::debug!(node, %server, "agent tunnel open");
    serve_streams(TokioIo::new(upgraded), kubelet, shutdown).await
}

/// The agent's half of an open tunnel over `io`: HTTP/2 as the server, each stream spliced
/// to `kubelet`, until the connection ends or `shutdown`.
pub(crate) async fn serve_streams<I>(
    io: I,
    kubelet: SocketAddr,
    shutdown: &CancellationToken,
) -> Result<(), TunnelError>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut connection = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake::<_, Bytes>(io)
        .await?;
    loop {
        // Accepting also drives the connection: every stream's frames move only while it
        // is polled.
        let next = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            next = connection.accept() => next,
        };
        match next {
            None => return Ok(()),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok((request, respond))) => {
                tokio::spawn(splice(request.into_body(), respond, kubelet));
            }
        }
    }
}

/// Connects one stream to the kubelet's port and copies both ways until either side ends;
/// a kubelet that does not accept is answered 502.
async fn splice(body: RecvStream, mut respond: SendResponse<Bytes>, kubelet: SocketAddr) {
    let tcp = match tokio::time::timeout(KUBELET_DIAL_TIMEOUT, TcpStream::connect(kubelet)).await {
        Ok(Ok(tcp)) => tcp,
        failed => {
            tracing::debug!(%kubelet, ?failed, "the kubelet did not accept a tunnelled stream");
            let mut refused = Response::new(());
            *refused.status_mut() = StatusCode::BAD_GATEWAY;
            let _ = respond.send_response(refused, true);
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    let Ok(send) = respond.send_response(Response::new(()), false) else {
        return;
    };
    let mut stream = TunnelStream::new(send, body);
    let mut tcp = tcp;
    if let Err(error) = tokio::io::copy_bidirectional(&mut stream, &mut tcp).await {
        tracing::debug!(%kubelet, %error, "tunnelled stream ended");
    }
}
