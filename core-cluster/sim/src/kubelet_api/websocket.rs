//! The server side of RFC 6455 WebSocket as the kubelet's streaming server speaks it with
//! Kubernetes' channel protocols (`staging/src/k8s.io/apimachinery/pkg/util/httpstream/
//! wsstream/conn.go`): every binary message starts with its channel byte (0 stdin, 1 stdout,
//! 2 stderr, 3 error, 4 resize; `v5.channel.k8s.io` adds 255, "close this channel").

use base64::Engine as _;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The channel protocols served, in order of preference.
pub(crate) const PROTOCOLS: [&str; 4] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "channel.k8s.io",
];
/// The largest message accepted from a client (stdin, resize): bounded memory.
const MAX_MESSAGE: usize = 1 << 20;

/// `Sec-WebSocket-Accept` for a client's `Sec-WebSocket-Key`.
pub(crate) fn accept_key(key: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key.trim().as_bytes());
    ctx.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(ctx.finish().as_ref())
}

/// The protocol to speak: the first of ours the client offers.
pub(crate) fn choose_protocol(offered: &str) -> Option<&'static str> {
    let offered: Vec<&str> = offered.split(',').map(str::trim).collect();
    PROTOCOLS.iter().copied().find(|p| offered.contains(p))
}

/// One message read from the client.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// A data message (binary or text).
    Data(Bytes),
    /// The client closed, or the connection ended.
    Closed,
}

/// Reads messages (reassembling fragments, answering pings through `pongs`).
pub(crate) struct Reader<R> {
    io: R,
    buf: BytesMut,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    pub(crate) fn new(io: R) -> Self {
        Reader {
            io,
            buf: BytesMut::new(),
        }
    }

    async fn fill(&mut self, n: usize) -> std::io::Result<bool> {
        while self.buf.len() < n {
            if self.io.read_buf(&mut self.buf).await? == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The next frame: (fin, opcode, payload).
    async fn frame(&mut self) -> std::io::Result<Option<(bool, u8, Bytes)>> {
        if !self.fill(2).await? {
            return Ok(None);
        }
        let (b0, b1) = (self.buf[0], self.buf[1]);
        let fin = b0 & 0x80 != 0;
        let opcode = b0 & 0x0f;
        let masked = b1 & 0x80 != 0;
        let mut header = 2;
        let len = match b1 & 0x7f {
            126 => {
                if !self.fill(4).await? {
                    return Ok(None);
                }
                header = 4;
                u64::from(u16::from_be_bytes([self.buf[2], self.buf[3]]))
            }
            127 => {
                if !self.fill(10).await? {
                    return Ok(None);
                }
                header = 10;
                let mut b = [0u8; 8];
                b.copy_from_slice(&self.buf[2..10]);
                u64::from_be_bytes(b)
            }
            n => u64::from(n),
        };
        if len > MAX_MESSAGE as u64 {
            return Err(std::io::Error::other("message too large"));
        }
        let len = len as usize;
        let mask_len = if masked { 4 } else { 0 };
        if !self.fill(header + mask_len + len).await? {
            return Ok(None);
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
        Ok(Some((fin, opcode, payload.freeze())))
    }

    /// The next data message; pings are answered with `on_ping`'s pong by the caller's
    /// writer (returned as `Ok(Err(payload))`).
    pub(crate) async fn next(&mut self) -> Result<Incoming, Bytes> {
        let mut message = BytesMut::new();
        loop {
            let frame = match self.frame().await {
                Ok(Some(f)) => f,
                Ok(None) | Err(_) => return Ok(Incoming::Closed),
            };
            match frame {
                (_, 0x8, _) => return Ok(Incoming::Closed),
                (_, 0x9, payload) => return Err(payload),
                (_, 0xA, _) => continue,
                (fin, 0x0..=0x2, payload) => {
                    if message.len() + payload.len() > MAX_MESSAGE {
                        return Ok(Incoming::Closed);
                    }
                    message.put(payload);
                    if fin {
                        return Ok(Incoming::Data(message.freeze()));
                    }
                }
                _ => return Ok(Incoming::Closed),
            }
        }
    }
}

/// Writes server frames (unmasked).
pub(crate) struct Writer<W> {
    io: W,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    pub(crate) fn new(io: W) -> Self {
        Writer { io }
    }

    async fn frame(&mut self, opcode: u8, payload: &[u8]) -> std::io::Result<()> {
        let mut out = BytesMut::with_capacity(payload.len() + 10);
        out.put_u8(0x80 | opcode);
        match payload.len() {
            n if n < 126 => out.put_u8(n as u8),
            n if n <= 0xffff => {
                out.put_u8(126);
                out.put_u16(n as u16);
            }
            n => {
                out.put_u8(127);
                out.put_u64(n as u64);
            }
        }
        out.put_slice(payload);
        self.io.write_all(&out).await?;
        self.io.flush().await
    }

    /// A binary message on `channel`.
    pub(crate) async fn channel(&mut self, channel: u8, data: &[u8]) -> std::io::Result<()> {
        let mut message = Vec::with_capacity(data.len() + 1);
        message.push(channel);
        message.extend_from_slice(data);
        self.frame(0x2, &message).await
    }

    pub(crate) async fn pong(&mut self, payload: &[u8]) -> std::io::Result<()> {
        self.frame(0xA, payload).await
    }

    /// A normal close.
    pub(crate) async fn close(&mut self) -> std::io::Result<()> {
        self.frame(0x8, &1000u16.to_be_bytes()).await?;
        self.io.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6455 section 1.3's example.
    #[test]
    fn the_accept_key_is_rfc_6455s() {
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn the_newest_channel_protocol_the_client_offers_is_chosen() {
        assert_eq!(
            choose_protocol("v4.channel.k8s.io, v5.channel.k8s.io"),
            Some("v5.channel.k8s.io")
        );
        assert_eq!(choose_protocol("channel.k8s.io"), Some("channel.k8s.io"));
        assert_eq!(choose_protocol("base64.channel.k8s.io"), None);
    }

    #[tokio::test]
    async fn masked_fragmented_client_messages_are_reassembled() {
        let mask = [1u8, 2, 3, 4];
        let frame = |fin: bool, op: u8, data: &[u8]| {
            let mut f = vec![if fin { 0x80 | op } else { op }, 0x80 | data.len() as u8];
            f.extend_from_slice(&mask);
            f.extend(data.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
            f
        };
        let mut wire = frame(false, 0x2, b"\x00hel");
        wire.extend(frame(true, 0x0, b"lo"));
        wire.extend(frame(true, 0x8, b""));
        let mut reader = Reader::new(&wire[..]);
        assert_eq!(
            reader.next().await,
            Ok(Incoming::Data(Bytes::from_static(b"\x00hello")))
        );
        assert_eq!(reader.next().await, Ok(Incoming::Closed));
    }
}
