//! `…/pods/{name}/portforward`, as kube-apiserver serves it (`pkg/registry/core/pod/rest/
//! subresources.go PortForwardREST`, `pkg/registry/core/pod/strategy.go
//! PortForwardLocation`): the upgrade is handed to the kubelet the Node advertises, on
//! `/portForward/{namespace}/{pod}` with the `ports` of `PodPortForwardOptions` as kubelet's
//! `port` parameters, and the two upgraded connections are spliced.
//!
//! Three kinds of client:
//! - a WebSocket offering `SPDY/3.1+portforward.k8s.io` (kubectl v1.32, client-go's
//!   `tools/portforward/tunneling_dialer.go`): SPDY tunnelled in binary WebSocket messages.
//!   As upstream's `PortForwardWebsockets` translation (`staging/src/k8s.io/apiserver/pkg/
//!   util/proxy/streamtunnel.go TunnelingHandler`), the kubelet is asked for a plain SPDY/3.1
//!   upgrade, and once it accepts, the client's WebSocket is accepted with the kubelet's
//!   protocol under the same prefix; the SPDY bytes then travel unchanged, each chunk from
//!   the kubelet one binary message, each message from the client written through;
//! - a plain SPDY/3.1 upgrade (kubectl's fallback, older clients): handed on as is;
//! - a WebSocket with the channel protocols (kube-rs's `Api::portforward`): handed on as is.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::{Buf, Bytes, BytesMut};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::mpsc,
};

use super::{
    ServerState, Target,
    node_proxy::backend_error,
    status::ApiError,
    websocket::{accept_key, server_frame},
};
use crate::{registry::resources, storage::get_list::get_object};

/// The WebSocket subprotocol prefix of SPDY tunnelled over WebSocket
/// (`k8s.io/apimachinery/pkg/util/portforward WebsocketsSPDYTunnelingPrefix`).
pub(crate) const TUNNELING_PREFIX: &str = "SPDY/3.1+";
/// `X-Stream-Protocol-Version`, naming the SPDY subprotocol.
const STREAM_PROTOCOL: &str = "x-stream-protocol-version";
/// The largest WebSocket message accepted from a tunnelling client (bounded memory).
const MAX_MESSAGE: usize = 1 << 20;
/// How much is read from the kubelet at once (one WebSocket message).
const READ_CHUNK: usize = 32 << 10;
/// How long one direction of a tunnel may linger once the other has ended.
const LINGER: Duration = Duration::from_secs(5);

/// `…/pods/{name}/portforward`.
pub(crate) async fn pod_port_forward(
    state: &Arc<ServerState>,
    target: &Target,
    request: Request<Body>,
) -> Response {
    match port_forward(state, target, request).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// `PodPortForwardOptions.ports` from the query (`?ports=80,8080&ports=9`), each a port
/// number from 1 to 65535.
fn ports(query: Option<&str>) -> Result<Vec<u16>, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?;
    let mut ports = Vec::new();
    for (_, value) in pairs.iter().filter(|(k, _)| k == "ports") {
        for p in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match p.parse::<u16>() {
                Ok(port) if port > 0 => ports.push(port),
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "invalid port {p:?}: must be a number from 1 to 65535"
                    )));
                }
            }
        }
    }
    Ok(ports)
}

/// How the client asked to upgrade.
#[derive(Debug, PartialEq, Eq)]
enum Upgrade {
    /// SPDY tunnelled over WebSocket, with the SPDY protocols offered.
    Tunnel(Vec<String>),
    /// A WebSocket with the channel protocols.
    WebSocket,
    /// A SPDY/3.1 upgrade.
    Spdy,
}

fn upgrade_kind(request: &Request<Body>) -> Option<Upgrade> {
    let headers = request.headers();
    let joined = |name: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(",")
    };
    let upgrade = joined("upgrade").to_ascii_lowercase();
    if upgrade == "websocket" {
        // `spdyProtocolsFromWebsocketProtocols`.
        let tunnelled: Vec<String> = joined("sec-websocket-protocol")
            .split(',')
            .map(str::trim)
            .filter_map(|p| p.strip_prefix(TUNNELING_PREFIX))
            .filter(|p| p.ends_with(".k8s.io"))
            .map(str::to_owned)
            .collect();
        return Some(if tunnelled.is_empty() {
            Upgrade::WebSocket
        } else {
            Upgrade::Tunnel(tunnelled)
        });
    }
    upgrade.contains("spdy/3.1").then_some(Upgrade::Spdy)
}

async fn port_forward(
    state: &Arc<ServerState>,
    target: &Target,
    mut request: Request<Body>,
) -> Result<Response, ApiError> {
    if !matches!(*request.method(), Method::GET | Method::POST) {
        return Err(ApiError::method_not_served());
    }
    let (Some(ns), Some(name)) = (target.namespace.as_deref(), target.name.as_deref()) else {
        return Err(ApiError::no_route(request.uri().path()));
    };
    let ports = ports(request.uri().query())?;
    let pod = get_object(&*state.store, &resources::PODS, Some(ns), name)
        .await?
        .1;
    let node_name = pod["spec"]["nodeName"].as_str().unwrap_or("");
    if node_name.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    }
    let Some(kind) = upgrade_kind(&request) else {
        return Err(ApiError::bad_request("Upgrade request required"));
    };
    let node = get_object(&*state.store, &resources::NODES, None, node_name)
        .await?
        .1;
    let query: Vec<(&str, String)> = ports.iter().map(|p| ("port", p.to_string())).collect();
    let mut path = format!("/portForward/{ns}/{name}");
    if !query.is_empty() {
        path = format!(
            "{path}?{}",
            serde_urlencoded::to_string(&query).unwrap_or_default()
        );
    }
    let mut headers = vec![(header::CONNECTION, HeaderValue::from_static("Upgrade"))];
    let client_key = request
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let method = match &kind {
        Upgrade::Tunnel(protocols) => {
            // `createSPDYRequest`.
            if client_key.is_none() {
                return Err(ApiError::bad_request("missing Sec-WebSocket-Key"));
            }
            headers.push((header::UPGRADE, HeaderValue::from_static("SPDY/3.1")));
            for p in protocols {
                if let Ok(v) = HeaderValue::from_str(p) {
                    headers.push((header::HeaderName::from_static(STREAM_PROTOCOL), v));
                }
            }
            Method::POST
        }
        Upgrade::WebSocket => {
            headers.push((header::UPGRADE, HeaderValue::from_static("websocket")));
            for h in [
                header::SEC_WEBSOCKET_KEY,
                header::SEC_WEBSOCKET_VERSION,
                header::SEC_WEBSOCKET_PROTOCOL,
            ] {
                for v in request.headers().get_all(&h) {
                    headers.push((h.clone(), v.clone()));
                }
            }
            Method::GET
        }
        Upgrade::Spdy => {
            headers.push((header::UPGRADE, HeaderValue::from_static("SPDY/3.1")));
            for v in request.headers().get_all(STREAM_PROTOCOL) {
                headers.push((header::HeaderName::from_static(STREAM_PROTOCOL), v.clone()));
            }
            request.method().clone()
        }
    };
    let client_upgrade = hyper::upgrade::on(&mut request);
    let mut response = state
        .kubelet
        .send(&node, method, &path, &headers, Body::empty())
        .await
        .map_err(ApiError::internal)?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(backend_error(response).await);
    }
    let mut out = Response::new(Body::empty());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let tunnel = if let Upgrade::Tunnel(_) = kind {
        // `tunnelingWebsocketUpgraderConn.InitializeWrite`.
        let upgraded = response
            .headers()
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains("spdy/3.1"));
        if !upgraded {
            return Err(ApiError::internal(
                "unable to upgrade: missing upgrade headers in response",
            ));
        }
        let h = out.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        if let Ok(v) = HeaderValue::from_str(&accept_key(client_key.as_deref().unwrap_or(""))) {
            h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
        }
        if let Some(p) = response
            .headers()
            .get(STREAM_PROTOCOL)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|p| !p.is_empty())
            && let Ok(v) = HeaderValue::from_str(&format!("{TUNNELING_PREFIX}{p}"))
        {
            h.insert(header::SEC_WEBSOCKET_PROTOCOL, v);
        }
        true
    } else {
        for (name, value) in response.headers() {
            let n = name.as_str();
            if matches!(
                n,
                "connection" | "upgrade" | "sec-websocket-accept" | "sec-websocket-protocol"
            ) || n == STREAM_PROTOCOL
            {
                out.headers_mut().append(name.clone(), value.clone());
            }
        }
        false
    };
    let kubelet_upgrade = hyper::upgrade::on(&mut response);
    tokio::spawn(async move {
        let (client, kubelet) = match (client_upgrade.await, kubelet_upgrade.await) {
            (Ok(c), Ok(k)) => (TokioIo::new(c), TokioIo::new(k)),
            (c, k) => {
                tracing::debug!(
                    client = c.is_ok(),
                    kubelet = k.is_ok(),
                    "port-forward upgrade failed"
                );
                return;
            }
        };
        if tunnel {
            splice_tunnel(client, kubelet).await;
        } else {
            let (mut client, mut kubelet) = (client, kubelet);
            if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut kubelet).await {
                tracing::debug!(%error, "port-forward stream ended");
            }
        }
    });
    Ok(out)
}

/// What the tunnel writes to the client.
enum ToClient {
    Binary(Bytes),
    Pong(Bytes),
    Close,
}

/// Carries SPDY between a tunnelling client's WebSocket and the kubelet's raw connection
/// (client-go's `TunnelingConnection` on both ends of upstream's translation), until either
/// side ends; the other then gets [`LINGER`] to finish.
async fn splice_tunnel<C, K>(client: C, kubelet: K)
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    K: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (client_read, mut client_write) = tokio::io::split(client);
    let (mut kubelet_read, mut kubelet_write) = tokio::io::split(kubelet);
    let (tx, mut rx) = mpsc::channel::<ToClient>(16);
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            let (opcode, payload) = match m {
                ToClient::Binary(b) => (0x2, b),
                ToClient::Pong(b) => (0xA, b),
                ToClient::Close => (0x8, Bytes::from_static(&[0x03, 0xe8])),
            };
            if client_write
                .write_all(&server_frame(opcode, &payload))
                .await
                .is_err()
            {
                return;
            }
            if opcode == 0x8 {
                break;
            }
        }
        let _ = client_write.shutdown().await;
    });
    let pongs = tx.clone();
    let up = async move {
        let mut reader = FrameReader {
            io: client_read,
            buf: BytesMut::new(),
        };
        loop {
            match reader.frame().await {
                // Binary and continuation frames carry the SPDY bytes.
                Some((0x0 | 0x2, payload)) => {
                    if kubelet_write.write_all(&payload).await.is_err() {
                        break;
                    }
                }
                Some((0x9, payload)) => {
                    let _ = pongs.send(ToClient::Pong(payload)).await;
                }
                Some((0xA, _)) => {}
                // Close, a text message (not a tunnel's), or the connection's end.
                _ => break,
            }
        }
        let _ = kubelet_write.shutdown().await;
    };
    let down = async move {
        let mut buf = vec![0u8; READ_CHUNK];
        loop {
            match kubelet_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send(ToClient::Binary(Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(ToClient::Close).await;
    };
    tokio::pin!(up, down);
    tokio::select! {
        () = &mut up => { let _ = tokio::time::timeout(LINGER, down).await; }
        () = &mut down => { let _ = tokio::time::timeout(LINGER, up).await; }
    }
    let _ = tokio::time::timeout(LINGER, writer).await;
}

/// Reads a client's frames (RFC 6455 section 5.2), unmasked.
struct FrameReader<R> {
    io: R,
    buf: BytesMut,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    async fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            match self.io.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
        true
    }

    /// The next frame (opcode, payload); `None` at the end or on a malformed frame.
    async fn frame(&mut self) -> Option<(u8, Bytes)> {
        if !self.fill(2).await {
            return None;
        }
        let (b0, b1) = (self.buf[0], self.buf[1]);
        let opcode = b0 & 0x0f;
        let masked = b1 & 0x80 != 0;
        let (header, len) = match b1 & 0x7f {
            126 => {
                if !self.fill(4).await {
                    return None;
                }
                (4, u64::from(u16::from_be_bytes([self.buf[2], self.buf[3]])))
            }
            127 => {
                if !self.fill(10).await {
                    return None;
                }
                let mut b = [0u8; 8];
                b.copy_from_slice(&self.buf[2..10]);
                (10, u64::from_be_bytes(b))
            }
            n => (2, u64::from(n)),
        };
        if len > MAX_MESSAGE as u64 {
            return None;
        }
        let len = len as usize;
        let mask_len = if masked { 4 } else { 0 };
        if !self.fill(header + mask_len + len).await {
            return None;
        }
        self.buf.advance(header);
        let mask = masked.then(|| {
            let m = [self.buf[0], self.buf[1], self.buf[2], self.buf[3]];
            self.buf.advance(4);
            m
        });
        let mut payload = self.buf.split_to(len);
        if let Some(m) = mask {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= m[i % 4];
            }
        }
        Some((opcode, payload.freeze()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `PodPortForwardOptions.ports`: comma lists and repeats; a port outside 1..65535 is
    /// a 400.
    #[test]
    fn ports_are_read_from_the_query() {
        assert_eq!(
            ports(Some("ports=80%2C8080&ports=9")).unwrap(),
            [80, 8080, 9]
        );
        assert_eq!(ports(None).unwrap(), Vec::<u16>::new());
        assert_eq!(ports(Some("ports=0")).unwrap_err().code, 400);
        assert_eq!(ports(Some("ports=65536")).unwrap_err().code, 400);
        assert_eq!(ports(Some("ports=x")).unwrap_err().code, 400);
    }

    /// `streamtunnel.go spdyProtocolsFromWebsocketProtocols`: only `SPDY/3.1+…k8s.io`
    /// protocols make a tunnel.
    #[test]
    fn tunnelling_clients_are_told_from_channel_clients_and_spdy() {
        let req = |pairs: &[(&str, &str)]| {
            let mut b = Request::builder().uri("/");
            for (k, v) in pairs {
                b = b.header(*k, *v);
            }
            b.body(Body::empty()).unwrap()
        };
        assert_eq!(
            upgrade_kind(&req(&[
                ("upgrade", "websocket"),
                ("sec-websocket-protocol", "SPDY/3.1+portforward.k8s.io")
            ])),
            Some(Upgrade::Tunnel(vec!["portforward.k8s.io".into()]))
        );
        assert_eq!(
            upgrade_kind(&req(&[
                ("upgrade", "websocket"),
                (
                    "sec-websocket-protocol",
                    "v4.channel.k8s.io, SPDY/3.1+evil.example"
                )
            ])),
            Some(Upgrade::WebSocket)
        );
        assert_eq!(
            upgrade_kind(&req(&[("upgrade", "SPDY/3.1")])),
            Some(Upgrade::Spdy)
        );
        assert_eq!(upgrade_kind(&req(&[])), None);
    }

    /// The tunnel carries binary messages both ways, answers pings, and ends both sides
    /// when the client closes.
    #[tokio::test]
    async fn the_tunnel_carries_binary_messages_both_ways() {
        let (client, client_end) = tokio::io::duplex(1 << 16);
        let (kubelet, mut kubelet_end) = tokio::io::duplex(1 << 16);
        let splice = tokio::spawn(splice_tunnel(client_end, kubelet));
        let (cr, mut cw) = tokio::io::split(client);
        let masked = |opcode: u8, data: &[u8]| {
            let mask = [9u8, 8, 7, 6];
            let mut f = vec![0x80 | opcode, 0x80 | data.len() as u8];
            f.extend_from_slice(&mask);
            f.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
            f
        };
        cw.write_all(&masked(0x2, b"spdy bytes")).await.unwrap();
        let mut got = [0u8; 10];
        kubelet_end.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"spdy bytes");
        kubelet_end.write_all(b"reply").await.unwrap();
        let mut reader = FrameReader {
            io: cr,
            buf: BytesMut::new(),
        };
        assert_eq!(
            reader.frame().await,
            Some((0x2, Bytes::from_static(b"reply")))
        );
        cw.write_all(&masked(0x9, b"p")).await.unwrap();
        assert_eq!(reader.frame().await, Some((0xA, Bytes::from_static(b"p"))));
        cw.write_all(&masked(0x8, &[0x03, 0xe8])).await.unwrap();
        // The kubelet's side sees the end, and its end closes the client's.
        let mut rest = Vec::new();
        kubelet_end.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
        drop(kubelet_end);
        assert_eq!(reader.frame().await.map(|f| f.0), Some(0x8));
        splice.await.unwrap();
    }
}
