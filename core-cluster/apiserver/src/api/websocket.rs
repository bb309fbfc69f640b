//! A one-way byte stream over a WebSocket, as kube-apiserver sends a streamed answer (a
//! pod's log) to a client that asked for a WebSocket upgrade: `k8s.io/apiserver/pkg/
//! endpoints/handlers/responsewriters/writers.go StreamObject` with
//! `k8s.io/apimachinery/pkg/util/httpstream/wsstream/stream.go` (`NewReader` with
//! `NewDefaultReaderProtocols`).
//!
//! The subprotocols are `binary.k8s.io` (each piece of the stream one binary message),
//! `base64.binary.k8s.io` (each piece one text message, in standard base64) and none (as
//! binary); the first the client offers that is one of these is spoken, else the handshake
//! is refused with 403, as `golang.org/x/net/websocket` refuses it. An empty message comes
//! first (the reader's `ping`), then the stream in messages of at most [`MESSAGE_BYTES`],
//! then a normal close. What the client sends is read and dropped (it should send nothing):
//! pings are answered, and its close or its going away ends the stream.

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use base64::Engine as _;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::StreamExt as _;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// `binary.k8s.io`: the stream's bytes as binary messages.
pub(crate) const BINARY_PROTOCOL: &str = "binary.k8s.io";
/// `base64.binary.k8s.io`: the stream's bytes base64-encoded, as text messages.
pub(crate) const BASE64_PROTOCOL: &str = "base64.binary.k8s.io";
/// The most bytes of the stream one message carries (`messageCopy`'s read buffer).
pub(crate) const MESSAGE_BYTES: usize = 2048;

/// The longest payload of a control frame (RFC 6455 section 5.5).
const MAX_CONTROL_PAYLOAD: usize = 125;
/// A normal closure (RFC 6455 section 7.4.1).
const CLOSE_NORMAL: u16 = 1000;

/// How the stream's bytes are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// Binary messages.
    Binary,
    /// Text messages holding base64.
    Base64,
}

/// Whether the request asks for a WebSocket (`wsstream.IsWebSocketRequest`: `Upgrade:
/// websocket` and a `Connection` header naming `upgrade`).
pub(crate) fn requested(headers: &HeaderMap) -> bool {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"));
    let connection = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    upgrade && connection
}

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key` (RFC 6455 section 4.2.2).
pub(super) fn accept_key(key: &str) -> String {
    let mut digest = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    digest.update(key.trim().as_bytes());
    digest.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(digest.finish().as_ref())
}

/// A server frame (unmasked, final, RFC 6455 section 5.2) of `opcode` with `payload`.
pub(super) fn server_frame(opcode: u8, payload: &[u8]) -> BytesMut {
    let mut frame = BytesMut::with_capacity(payload.len() + 10);
    frame.put_u8(0x80 | opcode);
    match payload.len() {
        n if n < 126 => frame.put_u8(n as u8),
        n => match u16::try_from(n) {
            Ok(n) => {
                frame.put_u8(126);
                frame.put_u16(n);
            }
            Err(_) => {
                frame.put_u8(127);
                frame.put_u64(n as u64);
            }
        },
    }
    frame.put_slice(payload);
    frame
}

/// The subprotocol to speak: the first the client offers that is served (`wsstream`'s
/// `handshake`), none offered being the unnamed binary one; `None` when none is served.
fn choose_protocol(headers: &HeaderMap) -> Option<(&'static str, Encoding)> {
    let offered: Vec<&str> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if offered.is_empty() {
        return Some(("", Encoding::Binary));
    }
    offered.into_iter().find_map(|p| match p {
        BINARY_PROTOCOL => Some((BINARY_PROTOCOL, Encoding::Binary)),
        BASE64_PROTOCOL => Some((BASE64_PROTOCOL, Encoding::Base64)),
        _ => None,
    })
}

/// A refused handshake, answered as `golang.org/x/net/websocket`'s server answers it: the
/// status alone (with the reason as text here).
fn refused(code: StatusCode, reason: &str) -> Response {
    let mut response = (code, format!("{reason}\n")).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if code == StatusCode::BAD_REQUEST {
        response.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
    }
    response
}

/// Answers `request` (a WebSocket upgrade, see [`requested`]) with `101 Switching
/// Protocols` and sends `body` over the WebSocket once the connection is upgraded; a
/// handshake that cannot be accepted is refused instead (400 without a key or with a version
/// other than 13, 403 when no offered subprotocol is served).
pub(crate) fn stream(request: &mut Request<Body>, body: Body) -> Response {
    let headers = request.headers();
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty());
    let Some(key) = key else {
        return refused(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key");
    };
    let version = headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    // x/net/websocket also takes draft hybi-08's version.
    if !matches!(version, Some("13" | "8")) {
        return refused(StatusCode::BAD_REQUEST, "unsupported Sec-WebSocket-Version");
    }
    let Some((protocol, encoding)) = choose_protocol(headers) else {
        return refused(
            StatusCode::FORBIDDEN,
            &format!(
                "requested protocol(s) are not supported; supports \"\", {BINARY_PROTOCOL}, {BASE64_PROTOCOL}"
            ),
        );
    };
    let accept = accept_key(key);
    let upgrade = hyper::upgrade::on(request);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                let (read, write) = tokio::io::split(TokioIo::new(upgraded));
                if let Err(error) = copy(body, read, write, encoding).await {
                    tracing::debug!(%error, "streaming over a WebSocket ended");
                }
            }
            Err(error) => tracing::debug!(%error, "the WebSocket upgrade failed"),
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let out = response.headers_mut();
    out.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    out.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        out.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    if !protocol.is_empty() {
        out.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(protocol),
        );
    }
    response
}

/// `Reader.handle` with `messageCopy`: the empty first message, the body in messages, then
/// a normal close; ends early when the client closes or goes away.
async fn copy<R, W>(body: Body, mut read: R, write: W, encoding: Encoding) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut out = Writer {
        io: write,
        encoding,
    };
    out.message(&[]).await?;
    let mut data = body.into_data_stream();
    let mut inbound = Inbound::default();
    loop {
        tokio::select! {
            piece = data.next() => match piece {
                Some(Ok(bytes)) => {
                    for chunk in bytes.chunks(MESSAGE_BYTES) {
                        out.message(chunk).await?;
                    }
                }
                Some(Err(error)) => {
                    tracing::debug!(%error, "the streamed body failed");
                    break;
                }
                None => break,
            },
            read = read.read_buf(&mut inbound.buf) => {
                if read? == 0 {
                    // The client went away: nothing more can reach it.
                    return Ok(());
                }
                match inbound.events() {
                    Ok(events) => {
                        for event in events {
                            match event {
                                Event::Ping(payload) => out.frame(0xA, &payload).await?,
                                Event::Close => return out.close().await,
                            }
                        }
                    }
                    Err(reason) => {
                        tracing::debug!(reason, "a malformed frame from the client");
                        return out.close().await;
                    }
                }
            }
        }
    }
    out.close().await
}

/// Writes server frames (unmasked, RFC 6455 section 5.2).
struct Writer<W> {
    io: W,
    encoding: Encoding,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    async fn frame(&mut self, opcode: u8, payload: &[u8]) -> std::io::Result<()> {
        self.io.write_all(&server_frame(opcode, payload)).await?;
        self.io.flush().await
    }

    /// One message of the stream's bytes, in the protocol's encoding.
    async fn message(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self.encoding {
            Encoding::Binary => self.frame(0x2, bytes).await,
            Encoding::Base64 => {
                let text = base64::engine::general_purpose::STANDARD.encode(bytes);
                self.frame(0x1, text.as_bytes()).await
            }
        }
    }

    /// A normal close, then the end of the connection.
    async fn close(&mut self) -> std::io::Result<()> {
        self.frame(0x8, &CLOSE_NORMAL.to_be_bytes()).await?;
        self.io.shutdown().await
    }
}

/// What a client's frames ask of the server.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// A ping, to be answered with its payload.
    Ping(Bytes),
    /// A close.
    Close,
}

/// The client's frames as they arrive: data is dropped as it comes (never held), control
/// frames (at most 125 bytes each) are parsed whole.
#[derive(Default)]
struct Inbound {
    buf: BytesMut,
    /// Bytes of a data frame's payload still to drop.
    skip: u64,
}

impl Inbound {
    /// The events of the frames received so far; `Err` for a frame no client may send.
    fn events(&mut self) -> Result<Vec<Event>, &'static str> {
        let mut events = Vec::new();
        loop {
            if self.skip > 0 {
                let dropped = usize::try_from(self.skip)
                    .unwrap_or(usize::MAX)
                    .min(self.buf.len());
                self.buf.advance(dropped);
                self.skip -= dropped as u64;
                if self.skip > 0 {
                    return Ok(events);
                }
            }
            let Some((opcode, header, len)) = frame_header(&self.buf) else {
                return Ok(events);
            };
            match opcode {
                0x0..=0x2 => {
                    self.buf.advance(header);
                    self.skip = len;
                }
                0x8..=0xA => {
                    let len = usize::try_from(len)
                        .ok()
                        .filter(|n| *n <= MAX_CONTROL_PAYLOAD)
                        .ok_or("a control frame longer than 125 bytes")?;
                    if self.buf.len() < header + len {
                        return Ok(events);
                    }
                    let mask = (self.buf[1] & 0x80 != 0).then(|| {
                        let at = header - 4;
                        [
                            self.buf[at],
                            self.buf[at + 1],
                            self.buf[at + 2],
                            self.buf[at + 3],
                        ]
                    });
                    self.buf.advance(header);
                    let mut payload = self.buf.split_to(len);
                    if let Some(mask) = mask {
                        for (i, b) in payload.iter_mut().enumerate() {
                            *b ^= mask[i % 4];
                        }
                    }
                    match opcode {
                        0x8 => {
                            events.push(Event::Close);
                            return Ok(events);
                        }
                        0x9 => events.push(Event::Ping(payload.freeze())),
                        _ => {}
                    }
                }
                _ => return Err("an unknown opcode"),
            }
        }
    }
}

/// The opcode, header length (mask included) and payload length of the frame at the start
/// of `buf`, once its header has arrived.
fn frame_header(buf: &[u8]) -> Option<(u8, usize, u64)> {
    let (&b0, &b1) = (buf.first()?, buf.get(1)?);
    let mask = if b1 & 0x80 != 0 { 4 } else { 0 };
    let (extended, len) = match b1 & 0x7f {
        126 => (
            2,
            u64::from(u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?])),
        ),
        127 => {
            let bytes: [u8; 8] = buf.get(2..10)?.try_into().ok()?;
            (8, u64::from_be_bytes(bytes))
        }
        n => (0, u64::from(n)),
    };
    let header = 2 + extended + mask;
    (buf.len() >= header).then_some((b0 & 0x0f, header, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    /// `wsstream.IsWebSocketRequest` and the `handshake` of `wsstream/conn.go` with
    /// `NewDefaultReaderProtocols`: the first offered protocol that is served; none offered
    /// is the unnamed binary one.
    #[test]
    fn the_first_offered_stream_protocol_is_spoken() {
        assert!(requested(&headers(&[
            ("upgrade", "WebSocket"),
            ("connection", "keep-alive, Upgrade")
        ])));
        assert!(!requested(&headers(&[("upgrade", "websocket")])));
        let chosen = |offer: &str| choose_protocol(&headers(&[("sec-websocket-protocol", offer)]));
        assert_eq!(
            chosen("v4.channel.k8s.io, base64.binary.k8s.io, binary.k8s.io"),
            Some((BASE64_PROTOCOL, Encoding::Base64))
        );
        assert_eq!(
            chosen("binary.k8s.io"),
            Some((BINARY_PROTOCOL, Encoding::Binary))
        );
        assert_eq!(chosen("channel.k8s.io"), None);
        assert_eq!(
            choose_protocol(&HeaderMap::new()),
            Some(("", Encoding::Binary))
        );
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    fn masked(opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [9u8, 8, 7, 6];
        let mut frame = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        frame
    }

    /// The client's frames, however they are cut: data dropped unread, pings answered
    /// with their payload, a close ending the stream; an oversized control frame refused.
    #[test]
    fn client_frames_are_dropped_except_pings_and_close() {
        let mut wire = masked(0x2, &[1u8; 300]);
        wire.extend(masked(0x9, b"hi"));
        wire.extend(masked(0x8, &1000u16.to_be_bytes()));
        let mut inbound = Inbound::default();
        let mut events = Vec::new();
        for byte in wire {
            inbound.buf.put_u8(byte);
            events.extend(inbound.events().unwrap());
        }
        assert_eq!(
            events,
            [Event::Ping(Bytes::from_static(b"hi")), Event::Close]
        );
        let mut bad = Inbound::default();
        bad.buf.extend_from_slice(&masked(0x9, &[0u8; 200]));
        assert!(bad.events().is_err());
        let mut unknown = Inbound::default();
        unknown.buf.extend_from_slice(&masked(0x3, b""));
        assert!(unknown.events().is_err());
    }

    /// `messageCopy`: an empty message first, then the stream in messages of at most 2048
    /// bytes (base64 text for `base64.binary.k8s.io`), then a normal close.
    #[tokio::test]
    async fn the_stream_is_sent_in_messages_then_closed() {
        let (server, mut client) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(server);
        let body = Body::from(vec![b'x'; MESSAGE_BYTES + 5]);
        let task = tokio::spawn(copy(body, read, write, Encoding::Base64));
        let mut wire = Vec::new();
        client.read_to_end(&mut wire).await.unwrap();
        task.await.unwrap().unwrap();
        let mut frames = Vec::new();
        let mut rest = &wire[..];
        while let Some((opcode, header, len)) = frame_header(rest) {
            let len = len as usize;
            frames.push((opcode, rest[header..header + len].to_vec()));
            rest = &rest[header + len..];
        }
        let b64 = |n: usize| {
            base64::engine::general_purpose::STANDARD
                .encode(vec![b'x'; n])
                .into_bytes()
        };
        assert_eq!(
            frames,
            [
                (0x1, Vec::new()),
                (0x1, b64(MESSAGE_BYTES)),
                (0x1, b64(5)),
                (0x8, 1000u16.to_be_bytes().to_vec()),
            ]
        );
    }
}
