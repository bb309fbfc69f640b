//! `/portForward/{namespace}/{pod}[/{uid}]`: kubelet's port forwarding
//! (`pkg/kubelet/cri/streaming/portforward`), to the simulated pod network of
//! [`responder`](super::responder): a declared TCP `containerPort` of a running container
//! answers HTTP with the pod's name, any other port refuses as a closed port inside the
//! pod's network namespace does.
//!
//! Two protocols, as kubelet's `ServePortForward` serves them:
//! - SPDY/3.1 (`httpstream.go`): the client opens a pair of streams per forwarded connection,
//!   `streamtype` `error` then `data`, with the same `port` and `requestid` headers; bytes
//!   on the data stream reach the pod's port, a failure is written on the error stream and
//!   both are closed. kubectl v1.32 reaches this through the API server, which translates
//!   its SPDY-over-WebSocket tunnel (`SPDY/3.1+portforward.k8s.io`) to a SPDY upgrade.
//! - WebSocket (`websocket.go`, kube-rs's `Api::portforward`): the ports are in the query
//!   (`?port=80&port=8080`), channel `2i` carries port `i`'s data and `2i+1` its error,
//!   and the first message on every channel is the port, 2 bytes little-endian.

use std::{collections::HashMap, sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::{Path, Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::Bytes;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use parking_lot::Mutex;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream},
    sync::mpsc,
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;

use super::{
    NodeCtx, pod_here, responder,
    spdy::{self, Frame, FrameReader, HeaderDeflater},
    text_error,
    websocket::{self, Incoming, Reader, Writer},
};

/// The SPDY subprotocol kubelet serves (`portforward.k8s.io`, `X-Stream-Protocol-Version`).
pub(crate) const PROTOCOL_V1: &str = "portforward.k8s.io";
/// The WebSocket subprotocols served, as `websocket.go` (the binary one; none offered is the
/// same protocol).
const WEBSOCKET_PROTOCOLS: [&str; 1] = ["v4.channel.k8s.io"];
/// kubelet's `streamCreationTimeout`: how long the second stream of a pair may take.
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);
/// A data stream's frames waiting to reach the pod (bounded memory per stream).
const INBOUND_FRAMES: usize = 16;
/// How much is read from the pod's port at once (one DATA frame or message).
const READ_CHUNK: usize = 32 << 10;

/// Opens a connection to a port of the pod: the stream, or the message written on the
/// error stream.
pub(crate) type Dialer =
    Arc<dyn Fn(u16) -> BoxFuture<'static, Result<DuplexStream, String>> + Send + Sync>;

/// `/portForward/{namespace}/{pod}[/{uid}]` (kubelet's `getPortForward`).
pub(super) async fn port_forward(
    State(ctx): State<NodeCtx>,
    Path(params): Path<Vec<(String, String)>>,
    Query(query): Query<Vec<(String, String)>>,
    mut request: axum::extract::Request,
) -> Response {
    let get = |k: &str| {
        params
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    let (namespace, name) = (
        get("namespace").unwrap_or_default(),
        get("pod").unwrap_or_default(),
    );
    let pod = match pod_here(&ctx, &namespace, &name).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    if let Some(uid) = get("uid")
        && pod.uid().as_deref() != Some(uid.as_str())
    {
        return text_error(StatusCode::NOT_FOUND, "pod not found");
    }
    let dial = dialer(ctx, namespace, name);
    let headers = request.headers();
    let value = |name: header::HeaderName| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(",")
    };
    if value(header::UPGRADE).eq_ignore_ascii_case("websocket") {
        let ports = match parse_ports(&query) {
            Ok(p) => p,
            Err(e) => return text_error(StatusCode::BAD_REQUEST, e),
        };
        let Some(key) = headers
            .get(header::SEC_WEBSOCKET_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
        else {
            return text_error(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
        };
        let offered = value(header::SEC_WEBSOCKET_PROTOCOL);
        let offered: Vec<&str> = offered
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        let protocol = WEBSOCKET_PROTOCOLS
            .iter()
            .find(|p| offered.contains(p))
            .copied();
        if protocol.is_none() && !offered.is_empty() {
            return text_error(
                StatusCode::BAD_REQUEST,
                format!(
                    "unable to upgrade websocket connection: requested protocol(s) are not supported: {offered:?}; supports {WEBSOCKET_PROTOCOLS:?}"
                ),
            );
        }
        let on_upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            match on_upgrade.await {
                Ok(io) => websocket_session(TokioIo::new(io), ports, dial).await,
                Err(error) => tracing::debug!(%error, "port-forward upgrade failed"),
            }
        });
        let mut response = Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_ACCEPT, websocket::accept_key(&key));
        if let Some(p) = protocol {
            response = response.header(header::SEC_WEBSOCKET_PROTOCOL, p);
        }
        return response
            .body(Body::empty())
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    // `httpstream.Handshake`, then `spdy.NewResponseUpgrader().UpgradeResponse`.
    let offered = value(header::HeaderName::from_static("x-stream-protocol-version"));
    let offered: Vec<&str> = offered
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if offered.is_empty() {
        return text_error(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: X-Stream-Protocol-Version is required",
        );
    }
    if !offered.contains(&PROTOCOL_V1) {
        let mut r = text_error(
            StatusCode::FORBIDDEN,
            format!(
                "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts [\"{PROTOCOL_V1}\"]"
            ),
        );
        r.headers_mut().insert(
            "x-accepted-stream-protocol-versions",
            header::HeaderValue::from_static(PROTOCOL_V1),
        );
        return r;
    }
    let connection = value(header::CONNECTION).to_ascii_lowercase();
    let upgrade = value(header::UPGRADE).to_ascii_lowercase();
    if !connection.contains("upgrade") || !upgrade.contains("spdy/3.1") {
        return text_error(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: missing upgrade headers in request",
        );
    }
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(io) => spdy_session(TokioIo::new(io), dial, STREAM_CREATION_TIMEOUT).await,
            Err(error) => tracing::debug!(%error, "port-forward upgrade failed"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("x-stream-protocol-version", PROTOCOL_V1)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The `port` query parameters of a WebSocket request (`websocket.go NewV4Options`).
fn parse_ports(query: &[(String, String)]) -> Result<Vec<u16>, String> {
    let values: Vec<&str> = query
        .iter()
        .filter(|(k, _)| k == "port")
        .map(|(_, v)| v.as_str())
        .collect();
    if values.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    let mut ports = Vec::new();
    for value in values {
        if value.is_empty() {
            return Err("query parameter \"port\" cannot be empty".into());
        }
        for p in value.split(',') {
            let port: u16 = p
                .parse()
                .map_err(|e| format!("unable to parse {value:?} as a port: {e}"))?;
            if port < 1 {
                return Err(format!("port {value:?} must be > 0"));
            }
            ports.push(port);
        }
    }
    // One channel byte numbers two channels per port.
    if ports.len() > 127 {
        return Err(format!("{} ports is more than 127", ports.len()));
    }
    Ok(ports)
}

/// Connections to the pod `namespace/name` as it is when each is opened.
fn dialer(ctx: NodeCtx, namespace: String, name: String) -> Dialer {
    Arc::new(move |port| {
        let (ctx, namespace, name) = (ctx.clone(), namespace.clone(), name.clone());
        Box::pin(async move {
            let pod = pod_here(&ctx, &namespace, &name).await.map_err(|_| {
                format!("error forwarding port {port} to pod {name}, uid : pod not found")
            })?;
            connect(pod, port)
        })
    })
}

/// A connection to `port` of `pod`: its responder when the port listens, else the error
/// a CRI runtime reports for a closed port (containerd's `portForward`).
pub(crate) fn connect(pod: Pod, port: u16) -> Result<DuplexStream, String> {
    let sandbox = pod.uid().unwrap_or_default();
    if !responder::listens(&pod, port) {
        return Err(format!(
            "error forwarding port {port} to pod {sandbox}, uid : failed to execute portforward in network namespace \"/var/run/netns/cni-{sandbox}\": failed to connect to localhost:{port} inside namespace \"{sandbox}\", IPv4: dial tcp4 127.0.0.1:{port}: connect: connection refused IPv6 dial tcp6 [::1]:{port}: connect: connection refused "
        ));
    }
    let (client, server) = tokio::io::duplex(64 << 10);
    tokio::spawn(async move {
        let pod = Arc::new(pod);
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let response = responder::answer(&pod, req.uri().path());
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
        if let Err(error) = hyper::server::conn::http1::Builder::new()
            .half_close(true)
            .serve_connection(TokioIo::new(server), service)
            .await
        {
            tracing::debug!(%error, "forwarded connection ended");
        }
    });
    Ok(client)
}

/// Copies between one forwarded connection and its streams until the pod's side ends (as
/// a runtime's port forward returns once the pod → client copy is done): what the client
/// sends arrives on `inbound` (its end closes the pod's read side), what the pod answers
/// goes out as DATA on `data_id`, a failure as DATA on `error_id`; both are then closed
/// with FIN (kubelet's `portForward` closing both streams).
async fn forward_pair(
    out: mpsc::Sender<Frame>,
    error_id: u32,
    data_id: u32,
    port: u16,
    mut inbound: mpsc::Receiver<Bytes>,
    dial: Dialer,
) {
    match dial(port).await {
        Err(message) => {
            let _ = out
                .send(Frame::Data {
                    stream_id: error_id,
                    fin: false,
                    data: Bytes::from(message),
                })
                .await;
        }
        Ok(conn) => {
            let (mut rd, mut wr) = tokio::io::split(conn);
            let up = async move {
                while let Some(data) = inbound.recv().await {
                    if wr.write_all(&data).await.is_err() {
                        return;
                    }
                }
                let _ = wr.shutdown().await;
            };
            let down = async {
                let mut buf = vec![0u8; READ_CHUNK];
                loop {
                    match rd.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            let frame = Frame::Data {
                                stream_id: data_id,
                                fin: false,
                                data: Bytes::copy_from_slice(&buf[..n]),
                            };
                            if out.send(frame).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            };
            tokio::pin!(up, down);
            let mut up_done = false;
            loop {
                tokio::select! {
                    () = &mut up, if !up_done => up_done = true,
                    () = &mut down => break,
                }
            }
        }
    }
    for stream_id in [data_id, error_id] {
        let _ = out
            .send(Frame::Data {
                stream_id,
                fin: true,
                data: Bytes::new(),
            })
            .await;
    }
}

/// One forwarded connection's streams while the second is awaited (kubelet's
/// `httpStreamPair`).
#[derive(Default)]
struct Pending {
    error: Option<u32>,
    data: Option<u32>,
    port: u16,
    inbound: Option<mpsc::Receiver<Bytes>>,
    /// Ends the pair's creation timer once complete.
    complete: CancellationToken,
}

/// A SPDY connection's streams.
#[derive(Default)]
struct Streams {
    /// Where each data stream's bytes go; `true` once its pair forwards.
    inbound: HashMap<u32, (mpsc::Sender<Bytes>, bool)>,
    /// Pairs waiting for their second stream, by request id.
    pending: HashMap<String, Pending>,
}

/// Serves a SPDY/3.1 port-forward connection until the client closes it or goes away; its
/// forwarded connections end with it.
pub(crate) async fn spdy_session<IO>(io: IO, dial: Dialer, stream_timeout: Duration)
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (read, write) = tokio::io::split(io);
    let (out, out_rx) = mpsc::channel::<Frame>(32);
    let closed = CancellationToken::new();
    let writer = tokio::spawn(write_spdy(write, out_rx, closed.clone()));
    let streams = Arc::new(Mutex::new(Streams::default()));
    let mut tasks = JoinSet::new();
    let mut reader = FrameReader::new(read);
    loop {
        while tasks.try_join_next().is_some() {}
        let frame = tokio::select! {
            f = reader.next() => f,
            () = closed.cancelled() => break,
        };
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(error) => {
                tracing::debug!(%error, "port-forward connection: bad frame");
                let _ = out.try_send(Frame::GoAway {
                    last_good_stream_id: 0,
                    status: 1,
                });
                break;
            }
        };
        match frame {
            Frame::SynStream {
                stream_id, headers, ..
            } => {
                let opened = Opened {
                    out: &out,
                    streams: &streams,
                    tasks: &mut tasks,
                    dial: &dial,
                    stream_timeout,
                };
                if let Err(reply) = opened.stream(stream_id, &headers)
                    && out.send(reply).await.is_err()
                {
                    break;
                }
            }
            Frame::Data {
                stream_id,
                fin,
                data,
            } => {
                let entry = streams.lock().inbound.get(&stream_id).cloned();
                let Some((tx, forwarding)) = entry else {
                    continue;
                };
                let mut gone = false;
                if !data.is_empty() {
                    if forwarding {
                        tokio::select! {
                            r = tx.send(data) => gone = r.is_err(),
                            () = closed.cancelled() => break,
                        }
                    } else if tx.try_send(data).is_err() {
                        // Data piling up before the pair is complete: refused.
                        gone = true;
                        let _ = out
                            .send(Frame::RstStream {
                                stream_id,
                                status: spdy::RST_FLOW_CONTROL_ERROR,
                            })
                            .await;
                    }
                }
                if fin || gone {
                    streams.lock().inbound.remove(&stream_id);
                }
            }
            Frame::RstStream { stream_id, .. } => {
                streams.lock().inbound.remove(&stream_id);
            }
            // A client's ping (odd id) is echoed; an answer to ours would be even.
            Frame::Ping(id) if id % 2 == 1 && out.send(Frame::Ping(id)).await.is_err() => break,
            Frame::GoAway { .. } => break,
            _ => {}
        }
    }
    // The forwarded connections end with the client's connection.
    tasks.abort_all();
    drop(tasks);
    drop(out);
    if tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .is_err()
    {
        tracing::debug!("port-forward writer did not finish");
    }
}

/// What a SYN_STREAM needs from its session.
struct Opened<'a> {
    out: &'a mpsc::Sender<Frame>,
    streams: &'a Arc<Mutex<Streams>>,
    tasks: &'a mut JoinSet<()>,
    dial: &'a Dialer,
    stream_timeout: Duration,
}

impl Opened<'_> {
    /// Accepts a stream (its SYN_REPLY queued) or rejects it (the frame to send).
    fn stream(self, stream_id: u32, headers: &[(String, String)]) -> Result<(), Frame> {
        let reset = |status| Frame::RstStream { stream_id, status };
        // `httpStreamReceived`: a port and a stream type, or the stream is reset.
        let port = spdy::header(headers, "port")
            .and_then(|p| p.parse::<u16>().ok())
            .filter(|p| *p > 0);
        let kind = spdy::header(headers, "streamtype");
        let (Some(port), Some(kind @ ("error" | "data"))) = (port, kind) else {
            tracing::debug!(stream_id, ?headers, "port-forward stream rejected");
            return Err(reset(spdy::RST_CANCEL));
        };
        let mut guard = self.streams.lock();
        let streams = &mut *guard;
        if stream_id.is_multiple_of(2) {
            return Err(reset(spdy::RST_PROTOCOL_ERROR));
        }
        if streams.inbound.contains_key(&stream_id) {
            return Err(reset(spdy::RST_STREAM_IN_USE));
        }
        // `httpStreamHandler.requestID`: old clients send none; their streams are paired by
        // id (error n, data n + 2).
        let request_id = match spdy::header(headers, "requestid") {
            Some(id) => id.to_owned(),
            None if kind == "error" => stream_id.to_string(),
            None => stream_id.saturating_sub(2).to_string(),
        };
        if self
            .out
            .try_send(Frame::SynReply {
                stream_id,
                fin: false,
                headers: Vec::new(),
            })
            .is_err()
        {
            return Err(reset(spdy::RST_CANCEL));
        }
        let created = !streams.pending.contains_key(&request_id);
        let pending = streams.pending.entry(request_id.clone()).or_default();
        if created {
            pending.port = port;
            let (out, shared, token, id) = (
                self.out.clone(),
                self.streams.clone(),
                pending.complete.clone(),
                request_id.clone(),
            );
            let timeout = self.stream_timeout;
            self.tasks.spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(timeout) => {}
                    () = token.cancelled() => return,
                }
                let Some(p) = shared.lock().pending.remove(&id) else {
                    return;
                };
                if let Some(error_id) = p.error {
                    let message =
                        format!("(conn=spdy, request={id}) timed out waiting for streams");
                    for (fin, data) in [(false, Bytes::from(message)), (true, Bytes::new())] {
                        let _ = out
                            .send(Frame::Data {
                                stream_id: error_id,
                                fin,
                                data,
                            })
                            .await;
                    }
                }
            });
        }
        // `httpStreamPair.add`.
        let duplicate = match kind {
            "error" if pending.error.is_some() => Some("error stream already assigned"),
            "data" if pending.data.is_some() => Some("data stream already assigned"),
            _ => None,
        };
        if let Some(problem) = duplicate {
            if let Some(error_id) = pending.error {
                let _ = self.out.try_send(Frame::Data {
                    stream_id: error_id,
                    fin: false,
                    data: Bytes::from(format!(
                        "error processing stream for request {request_id}: {problem}"
                    )),
                });
            }
            // Accepted (already answered) and left unused, as kubelet leaves it.
            return Ok(());
        }
        if kind == "error" {
            pending.error = Some(stream_id);
        } else {
            let (tx, rx) = mpsc::channel(INBOUND_FRAMES);
            streams.inbound.insert(stream_id, (tx, false));
            pending.data = Some(stream_id);
            pending.inbound = Some(rx);
        }
        let (Some(error_id), Some(data_id)) = (pending.error, pending.data) else {
            return Ok(());
        };
        let Some(p) = streams.pending.remove(&request_id) else {
            return Ok(());
        };
        p.complete.cancel();
        if let Some(entry) = streams.inbound.get_mut(&data_id) {
            entry.1 = true;
        }
        let inbound = p.inbound.unwrap_or_else(|| mpsc::channel(1).1);
        self.tasks.spawn(forward_pair(
            self.out.clone(),
            error_id,
            data_id,
            p.port,
            inbound,
            self.dial.clone(),
        ));
        Ok(())
    }
}

/// Writes a SPDY connection's frames in order (one header compression stream), flushing
/// when none waits; a failed write ends the session.
async fn write_spdy<W: AsyncWrite + Unpin>(
    mut w: W,
    mut frames: mpsc::Receiver<Frame>,
    closed: CancellationToken,
) {
    let mut deflater = HeaderDeflater::default();
    while let Some(frame) = frames.recv().await {
        let bytes = spdy::encode(&frame, &mut deflater);
        if w.write_all(&bytes).await.is_err() || (frames.is_empty() && w.flush().await.is_err()) {
            break;
        }
    }
    closed.cancel();
    let _ = w.shutdown().await;
}

/// Serves a WebSocket port-forward connection (`websocket.go handleWebSocketStreams`): every
/// port forwarded once, the connection closed when all are done or the client goes away.
pub(crate) async fn websocket_session<IO>(io: IO, ports: Vec<u16>, dial: Dialer)
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (read, write) = tokio::io::split(io);
    let (out, mut out_rx) = mpsc::channel::<Frame>(32);
    let (pongs, mut pong_rx) = mpsc::channel::<Bytes>(4);
    let closed = CancellationToken::new();
    let writer = tokio::spawn({
        let closed = closed.clone();
        async move {
            let mut w = Writer::new(write);
            loop {
                let result = tokio::select! {
                    frame = out_rx.recv() => match frame {
                        // A closed stream has no signal in the v4 protocol.
                        Some(Frame::Data { stream_id, data, .. }) if !data.is_empty() => {
                            w.channel(stream_id as u8, &data).await
                        }
                        Some(_) => Ok(()),
                        None => break,
                    },
                    Some(payload) = pong_rx.recv() => w.pong(&payload).await,
                };
                if result.is_err() {
                    closed.cancel();
                    return;
                }
            }
            let _ = w.close().await;
        }
    });
    let mut inbound = Vec::with_capacity(ports.len());
    let mut tasks = JoinSet::new();
    for (i, port) in ports.iter().enumerate() {
        let (data_id, error_id) = (2 * i as u32, 2 * i as u32 + 1);
        for stream_id in [data_id, error_id] {
            let prefix = Frame::Data {
                stream_id,
                fin: false,
                data: Bytes::copy_from_slice(&port.to_le_bytes()),
            };
            if out.send(prefix).await.is_err() {
                return;
            }
        }
        let (tx, rx) = mpsc::channel(INBOUND_FRAMES);
        inbound.push(Some(tx));
        tasks.spawn(forward_pair(
            out.clone(),
            error_id,
            data_id,
            *port,
            rx,
            dial.clone(),
        ));
    }
    let mut reader = Reader::new(read);
    loop {
        let message = tokio::select! {
            m = reader.next() => m,
            () = closed.cancelled() => break,
            done = tasks.join_next() => match done {
                Some(_) => continue,
                // Every port is done: the connection closes.
                None => break,
            },
        };
        match message {
            Ok(Incoming::Closed) => {
                // The client is gone: its forwarded connections end.
                tasks.abort_all();
                break;
            }
            Err(ping) => {
                let _ = pongs.try_send(ping);
            }
            Ok(Incoming::Data(m)) => {
                let (Some(&channel), Some(data)) = (m.first(), m.get(1..)) else {
                    continue;
                };
                let index = usize::from(channel / 2);
                if channel % 2 != 0 || data.is_empty() {
                    continue;
                }
                let Some(Some(tx)) = inbound.get(index) else {
                    continue;
                };
                let gone = tokio::select! {
                    r = tx.send(m.slice(1..)) => r.is_err(),
                    () = closed.cancelled() => break,
                };
                if gone {
                    inbound[index] = None;
                }
            }
        }
    }
    tasks.abort_all();
    drop(tasks);
    drop(inbound);
    drop(out);
    drop(pongs);
    if tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .is_err()
    {
        tracing::debug!("port-forward writer did not finish");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dialer whose port 80 answers every request with `hello`, and whose other ports
    /// refuse.
    fn test_dialer() -> Dialer {
        Arc::new(|port| {
            Box::pin(async move {
                if port != 80 {
                    return Err(format!("connection refused on {port}"));
                }
                let pod: Pod = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "hello"}}))
                .unwrap();
                let (client, server) = tokio::io::duplex(1024);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let r = responder::answer(&pod, req.uri().path());
                            async move { Ok::<_, std::convert::Infallible>(r) }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .half_close(true)
                        .serve_connection(TokioIo::new(server), service)
                        .await;
                });
                Ok(client)
            })
        })
    }

    struct Client {
        reader: FrameReader<tokio::io::ReadHalf<DuplexStream>>,
        writer: tokio::io::WriteHalf<DuplexStream>,
        deflater: HeaderDeflater,
    }

    impl Client {
        fn new(io: DuplexStream) -> Self {
            let (r, w) = tokio::io::split(io);
            Client {
                reader: FrameReader::new(r),
                writer: w,
                deflater: HeaderDeflater::default(),
            }
        }

        async fn send(&mut self, frame: Frame) {
            let bytes = spdy::encode(&frame, &mut self.deflater);
            self.writer.write_all(&bytes).await.unwrap();
        }

        async fn open(&mut self, stream_id: u32, kind: &str, port: &str, request: &str) {
            let headers = [("streamtype", kind), ("port", port), ("requestid", request)]
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            self.send(Frame::SynStream {
                stream_id,
                fin: false,
                headers,
            })
            .await;
        }

        async fn next(&mut self) -> Option<Frame> {
            self.reader.next().await.unwrap()
        }

        /// Frames until both streams are closed: (data bytes, error bytes).
        async fn collect(&mut self, error_id: u32, data_id: u32) -> (Vec<u8>, Vec<u8>) {
            let (mut data, mut error) = (Vec::new(), Vec::new());
            let mut open = 2;
            while open > 0 {
                match self.next().await.expect("connection open") {
                    Frame::Data {
                        stream_id,
                        fin,
                        data: d,
                    } => {
                        if stream_id == data_id {
                            data.extend_from_slice(&d);
                        } else if stream_id == error_id {
                            error.extend_from_slice(&d);
                        }
                        if fin {
                            open -= 1;
                        }
                    }
                    Frame::SynReply { .. } | Frame::Ping(_) => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            (data, error)
        }
    }

    /// `httpstream.go`: an error and a data stream per forwarded connection, each answered
    /// with SYN_REPLY; the pod's answer on the data stream; pings echoed; a closed port's
    /// refusal on the error stream.
    #[tokio::test]
    async fn a_stream_pair_reaches_the_pods_port_and_a_closed_port_errors() {
        let (ours, theirs) = tokio::io::duplex(64 << 10);
        let session = tokio::spawn(spdy_session(theirs, test_dialer(), Duration::from_secs(30)));
        let mut c = Client::new(ours);
        c.send(Frame::Ping(1)).await;
        assert_eq!(c.next().await, Some(Frame::Ping(1)));
        c.open(1, "error", "80", "0").await;
        c.send(Frame::Data {
            stream_id: 1,
            fin: true,
            data: Bytes::new(),
        })
        .await;
        c.open(3, "data", "80", "0").await;
        c.send(Frame::Data {
            stream_id: 3,
            fin: true,
            data: Bytes::from_static(b"GET /x HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n"),
        })
        .await;
        let (data, error) = c.collect(1, 3).await;
        let text = String::from_utf8(data).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        assert!(text.ends_with("\r\n\r\nhello\n"), "{text}");
        assert!(text.contains("x-sim-path: /x"), "{text}");
        assert!(error.is_empty());

        c.open(5, "error", "81", "1").await;
        c.open(7, "data", "81", "1").await;
        let (data, error) = c.collect(5, 7).await;
        assert!(data.is_empty());
        assert_eq!(
            String::from_utf8(error).unwrap(),
            "connection refused on 81"
        );
        c.send(Frame::GoAway {
            last_good_stream_id: 0,
            status: 0,
        })
        .await;
        session.await.unwrap();
    }

    /// `httpStreamReceived`: a stream without a valid port or type is reset; a second data
    /// error stream for a request is refused with `httpStreamPair.add`'s message on its error
    /// stream; a pair left incomplete times out with `monitorStreamPair`'s message.
    #[tokio::test(start_paused = true)]
    async fn invalid_streams_are_reset_and_incomplete_pairs_time_out() {
        let (ours, theirs) = tokio::io::duplex(64 << 10);
        tokio::spawn(spdy_session(theirs, test_dialer(), Duration::from_secs(30)));
        let mut c = Client::new(ours);
        c.open(1, "error", "0", "0").await;
        assert_eq!(
            c.next().await,
            Some(Frame::RstStream {
                stream_id: 1,
                status: spdy::RST_CANCEL
            })
        );
        c.open(3, "other", "80", "0").await;
        assert!(matches!(
            c.next().await,
            Some(Frame::RstStream { stream_id: 3, .. })
        ));
        c.open(5, "error", "80", "9").await;
        assert!(matches!(
            c.next().await,
            Some(Frame::SynReply { stream_id: 5, .. })
        ));
        c.open(7, "error", "80", "9").await;
        assert!(matches!(
            c.next().await,
            Some(Frame::SynReply { stream_id: 7, .. })
        ));
        let Some(Frame::Data {
            stream_id: 5, data, ..
        }) = c.next().await
        else {
            panic!("expected the error stream's message");
        };
        assert_eq!(
            &data[..],
            b"error processing stream for request 9: error stream already assigned"
        );
        // No data stream comes: after kubelet's stream creation timeout, the error.
        let Some(Frame::Data {
            stream_id: 5, data, ..
        }) = c.next().await
        else {
            panic!("expected the timeout");
        };
        assert_eq!(
            &data[..],
            b"(conn=spdy, request=9) timed out waiting for streams"
        );
    }

    /// A client that goes away ends the session and the forwarded connections with it.
    #[tokio::test]
    async fn a_client_that_goes_away_frees_its_streams() {
        let (ours, theirs) = tokio::io::duplex(64 << 10);
        let session = tokio::spawn(spdy_session(theirs, test_dialer(), Duration::from_secs(30)));
        let mut c = Client::new(ours);
        c.open(1, "error", "80", "0").await;
        c.open(3, "data", "80", "0").await;
        // A request left half-sent: the pod's side waits for the rest.
        c.send(Frame::Data {
            stream_id: 3,
            fin: false,
            data: Bytes::from_static(b"GET / HTTP/1.1\r\n"),
        })
        .await;
        assert!(matches!(c.next().await, Some(Frame::SynReply { .. })));
        drop(c);
        tokio::time::timeout(Duration::from_secs(60), session)
            .await
            .expect("the session ends")
            .unwrap();
    }

    /// Garbage instead of frames ends the session with GOAWAY, never a panic.
    #[tokio::test]
    async fn garbage_ends_the_session_with_goaway() {
        let (mut ours, theirs) = tokio::io::duplex(1024);
        let session = tokio::spawn(spdy_session(theirs, test_dialer(), Duration::from_secs(30)));
        ours.write_all(&[0x80, 2, 0, 1, 0, 0, 0, 0]).await.unwrap();
        let mut reader = FrameReader::new(ours);
        assert!(matches!(
            reader.next().await.unwrap(),
            Some(Frame::GoAway { status: 1, .. })
        ));
        session.await.unwrap();
    }

    /// `websocket.go`: the port, 2 bytes little-endian, first on both channels of each
    /// port; the pod's answer on the data channel; a closed port's refusal on the error
    /// channel; the connection closed once every port is done.
    #[tokio::test]
    async fn websocket_channels_carry_each_ports_data_and_error() {
        let (ours, theirs) = tokio::io::duplex(64 << 10);
        let session = tokio::spawn(websocket_session(theirs, vec![80, 81], test_dialer()));
        let (r, mut w) = tokio::io::split(ours);
        let mut reader = Reader::new(r);
        // A masked client message on channel 0.
        let mask = [7u8, 1, 2, 3];
        let mut payload = vec![0u8];
        payload.extend_from_slice(b"GET / HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n");
        let mut frame = vec![0x82, 0x80 | payload.len() as u8];
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        w.write_all(&frame).await.unwrap();
        let mut channels: HashMap<u8, Vec<Vec<u8>>> = HashMap::new();
        while let Ok(Incoming::Data(m)) = reader.next().await {
            channels.entry(m[0]).or_default().push(m[1..].to_vec());
        }
        for (ch, port) in [(0u8, 80u16), (1, 80), (2, 81), (3, 81)] {
            assert_eq!(channels[&ch][0], port.to_le_bytes(), "channel {ch}");
        }
        let answer: Vec<u8> = channels[&0][1..].concat();
        assert!(String::from_utf8(answer).unwrap().ends_with("hello\n"));
        assert_eq!(channels[&1].len(), 1, "no error for port 80");
        assert!(channels.get(&2).is_some_and(|m| m.len() == 1));
        assert_eq!(channels[&3][1], b"connection refused on 81");
        session.await.unwrap();
    }

    #[test]
    fn websocket_ports_are_parsed_as_kubelets_v4_options() {
        let q = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        assert_eq!(
            parse_ports(&q(&[("port", "80,8080"), ("port", "9")])).unwrap(),
            [80, 8080, 9]
        );
        assert_eq!(
            parse_ports(&q(&[])).unwrap_err(),
            "query parameter \"port\" is required"
        );
        assert!(
            parse_ports(&q(&[("port", "0")]))
                .unwrap_err()
                .contains("must be > 0")
        );
        assert!(
            parse_ports(&q(&[("port", "70000")]))
                .unwrap_err()
                .contains("unable to parse")
        );
        assert!(
            parse_ports(&q(&[("port", "")]))
                .unwrap_err()
                .contains("cannot be empty")
        );
    }
}
