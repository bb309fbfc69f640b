//! SPDY/3.1 framing as kubelet's streaming server speaks it through
//! `k8s.io/apimachinery/pkg/util/httpstream/spdy` over moby's `spdystream` (whose `spdy`
//! package is the SPDY/3 draft's framer): control frames (SYN_STREAM, SYN_REPLY,
//! RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE) and DATA frames, with
//! header blocks compressed by one zlib stream per direction using SPDY/3's dictionary.
//!
//! Reading: the client's header blocks are inflated by `miniz_oxide`'s raw inflater, which
//! has no preset-dictionary call; it is primed with the dictionary as a stored block whose
//! output is dropped (1,423 bytes copied once per connection), so back-references into the
//! dictionary resolve from its window. Writing: our header blocks go out as stored
//! (uncompressed) deflate blocks, each ended by a sync flush as zlib's, in a zlib stream that declares no dictionary, which any
//! zlib reader accepts (`spdystream` reads with `zlib.NewReaderDict`, which uses the
//! dictionary only when the stream's header asks for it); the few bytes a SYN_REPLY's
//! empty header block would save are not worth a compressor.
//!
//! `spdystream` does no flow control (it ignores SETTINGS and WINDOW_UPDATE), and neither
//! does this.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use miniz_oxide::{
    DataFormat, MZError, MZFlush, MZStatus,
    inflate::stream::{InflateState, inflate},
};
use tokio::io::{AsyncRead, AsyncReadExt};

/// SPDY/3's zlib dictionary for header blocks (the draft's section 2.6.10.1; 1,423 bytes,
/// no trailing NUL, as `spdystream`'s `headerDictionary`).
pub(crate) const DICTIONARY: &[u8] = b"\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put\x00\x00\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\x00\x00\x00\x0eaccept-charset\x00\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\x00\x00\x00\raccept-ranges\x00\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\rauthorization\x00\x00\x00\rcache-control\x00\x00\x00\nconnection\x00\x00\x00\x0ccontent-base\x00\x00\x00\x10content-encoding\x00\x00\x00\x10content-language\x00\x00\x00\x0econtent-length\x00\x00\x00\x10content-location\x00\x00\x00\x0bcontent-md5\x00\x00\x00\rcontent-range\x00\x00\x00\x0ccontent-type\x00\x00\x00\x04date\x00\x00\x00\x04etag\x00\x00\x00\x06expect\x00\x00\x00\x07expires\x00\x00\x00\x04from\x00\x00\x00\x04host\x00\x00\x00\x08if-match\x00\x00\x00\x11if-modified-since\x00\x00\x00\rif-none-match\x00\x00\x00\x08if-range\x00\x00\x00\x13if-unmodified-since\x00\x00\x00\rlast-modified\x00\x00\x00\x08location\x00\x00\x00\x0cmax-forwards\x00\x00\x00\x06pragma\x00\x00\x00\x12proxy-authenticate\x00\x00\x00\x13proxy-authorization\x00\x00\x00\x05range\x00\x00\x00\x07referer\x00\x00\x00\x0bretry-after\x00\x00\x00\x06server\x00\x00\x00\x02te\x00\x00\x00\x07trailer\x00\x00\x00\x11transfer-encoding\x00\x00\x00\x07upgrade\x00\x00\x00\nuser-agent\x00\x00\x00\x04vary\x00\x00\x00\x03via\x00\x00\x00\x07warning\x00\x00\x00\x10www-authenticate\x00\x00\x00\x06method\x00\x00\x00\x03get\x00\x00\x00\x06status\x00\x00\x00\x06200 OK\x00\x00\x00\x07version\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03url\x00\x00\x00\x06public\x00\x00\x00\nset-cookie\x00\x00\x00\nkeep-alive\x00\x00\x00\x06origin100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";

const VERSION: u16 = 3;
const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;
/// FLAG_FIN, on DATA and on SYN_STREAM/SYN_REPLY/HEADERS.
const FLAG_FIN: u8 = 0x01;
/// The largest frame accepted (bounded memory; `spdystream` writes what each `Write` is
/// given, 32 KiB from `io.Copy`).
pub(crate) const MAX_FRAME: usize = 1 << 20;
/// The largest inflated header block, and the most name/value pairs in one.
const MAX_HEADER_BLOCK: usize = 64 << 10;
const MAX_HEADERS: u32 = 128;

/// RST_STREAM status `CANCEL` (what `spdystream`'s `Stream.Reset` sends).
pub(crate) const RST_CANCEL: u32 = 5;
/// RST_STREAM status `PROTOCOL_ERROR`.
pub(crate) const RST_PROTOCOL_ERROR: u32 = 1;
/// RST_STREAM status `STREAM_IN_USE`.
pub(crate) const RST_STREAM_IN_USE: u32 = 8;
/// RST_STREAM status `FLOW_CONTROL_ERROR`.
pub(crate) const RST_FLOW_CONTROL_ERROR: u32 = 7;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// A stream opened by the peer, with its (lower-case) headers.
    SynStream {
        stream_id: u32,
        fin: bool,
        headers: Vec<(String, String)>,
    },
    /// The answer to a SYN_STREAM.
    SynReply {
        stream_id: u32,
        fin: bool,
        headers: Vec<(String, String)>,
    },
    /// A stream abandoned.
    RstStream { stream_id: u32, status: u32 },
    /// Settings (ignored).
    Settings,
    /// A ping, echoed by the side that did not send it.
    Ping(u32),
    /// The sender takes no more streams.
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    /// More headers for a stream (ignored beyond FIN).
    Headers { stream_id: u32, fin: bool },
    /// Flow-control credit (ignored).
    WindowUpdate,
    /// Stream data; `fin` ends the sender's half of the stream.
    Data {
        stream_id: u32,
        fin: bool,
        data: Bytes,
    },
    /// A control frame type this side does not know (skipped, as the draft says).
    Unknown(u16),
}

/// Why a connection's frames cannot be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpdyError {
    #[error("reading: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame of {0} bytes is larger than {MAX_FRAME}")]
    TooLarge(usize),
    #[error("unsupported SPDY version {0}")]
    Version(u16),
    #[error("invalid {0} frame")]
    Invalid(&'static str),
    #[error("header block: {0}")]
    HeaderBlock(String),
}

/// The inflater of the peer's header blocks: one zlib stream across all of them.
pub(crate) struct HeaderInflater {
    state: Box<InflateState>,
    /// The zlib header (2 bytes, and 4 of dictionary id when FDICT is set) still to skip.
    header: Option<Vec<u8>>,
}

impl Default for HeaderInflater {
    fn default() -> Self {
        Self::new()
    }
}

impl HeaderInflater {
    /// A raw inflater whose window already holds [`DICTIONARY`].
    pub(crate) fn new() -> Self {
        let mut state = InflateState::new_boxed(DataFormat::Raw);
        // A non-final stored block: BFINAL=0, BTYPE=00, byte-aligned LEN and NLEN.
        let len = DICTIONARY.len() as u16;
        let mut primer = Vec::with_capacity(DICTIONARY.len() + 5);
        primer.push(0);
        primer.extend_from_slice(&len.to_le_bytes());
        primer.extend_from_slice(&(!len).to_le_bytes());
        primer.extend_from_slice(DICTIONARY);
        let mut sink = vec![0u8; DICTIONARY.len() + 16];
        let r = inflate(&mut state, &primer, &mut sink, MZFlush::None);
        debug_assert_eq!(r.bytes_written, DICTIONARY.len());
        HeaderInflater {
            state,
            header: Some(Vec::new()),
        }
    }

    /// The bytes one header block inflates to.
    pub(crate) fn block(&mut self, mut input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        if let Some(header) = &mut self.header {
            while header.len() < 2 && !input.is_empty() {
                header.push(input[0]);
                input = &input[1..];
            }
            if header.len() >= 2 {
                let (cmf, flg) = (header[0], header[1]);
                if cmf & 0x0f != 8 || (u16::from(cmf) << 8 | u16::from(flg)) % 31 != 0 {
                    return Err(SpdyError::HeaderBlock("not a zlib stream".into()));
                }
                let wanted = if flg & 0x20 != 0 { 6 } else { 2 };
                while header.len() < wanted && !input.is_empty() {
                    header.push(input[0]);
                    input = &input[1..];
                }
                if header.len() == wanted {
                    if wanted == 6 {
                        let id = u32::from_be_bytes([header[2], header[3], header[4], header[5]]);
                        if id != adler32(DICTIONARY) {
                            return Err(SpdyError::HeaderBlock(format!(
                                "unknown dictionary {id:#010x}"
                            )));
                        }
                    }
                    self.header = None;
                }
            }
            if self.header.is_some() {
                return Ok(Vec::new());
            }
        }
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let r = inflate(&mut self.state, input, &mut buf, MZFlush::None);
            input = &input[r.bytes_consumed..];
            out.extend_from_slice(&buf[..r.bytes_written]);
            if out.len() > MAX_HEADER_BLOCK {
                return Err(SpdyError::HeaderBlock("too large".into()));
            }
            match r.status {
                Ok(MZStatus::Ok) => {}
                // The stream ended, or no progress is possible without more input.
                Ok(MZStatus::StreamEnd) | Err(MZError::Buf) => break,
                Ok(MZStatus::NeedDict) | Err(_) => {
                    return Err(SpdyError::HeaderBlock("corrupt deflate data".into()));
                }
            }
            if input.is_empty() && r.bytes_written < buf.len() {
                break;
            }
        }
        Ok(out)
    }
}

/// The deflater of our header blocks: a zlib stream without dictionary, each block a
/// stored deflate block ended by a sync flush (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct HeaderDeflater {
    started: bool,
}

impl HeaderDeflater {
    /// `block`, as the next piece of the zlib stream.
    pub(crate) fn block(&mut self, block: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(block.len() + 16);
        if !self.started {
            // CM=8 (deflate), CINFO=7 (32 KiB window), no FDICT, check bits.
            out.extend_from_slice(&[0x78, 0x01]);
            self.started = true;
        }
        for chunk in block.chunks(0xffff) {
            let len = chunk.len() as u16;
            out.push(0);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(chunk);
        }
        // An empty stored block: zlib's sync flush. Go's inflater hands a stored block's
        // bytes over only at this marker (or a full window); without it, it reads on past
        // the frame's end and the stream is broken for every later header block.
        out.extend_from_slice(&[0, 0, 0, 0xff, 0xff]);
        out
    }
}

/// The Adler-32 checksum (a zlib dictionary's id).
pub(crate) fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in data {
        a = (a + u32::from(byte)) % 65521;
        b = (b + a) % 65521;
    }
    b << 16 | a
}

/// A name/value header block, uncompressed.
fn encode_headers(headers: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.put_u32(headers.len() as u32);
    for (name, value) in headers {
        out.put_u32(name.len() as u32);
        out.put_slice(name.to_ascii_lowercase().as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value.as_bytes());
    }
    out
}

fn decode_headers(mut block: &[u8]) -> Result<Vec<(String, String)>, SpdyError> {
    let bad = || SpdyError::HeaderBlock("truncated name/value block".into());
    if block.len() < 4 {
        return Err(bad());
    }
    let count = block.get_u32();
    if count > MAX_HEADERS {
        return Err(SpdyError::HeaderBlock(format!("{count} headers")));
    }
    let string = |block: &mut &[u8]| -> Result<String, SpdyError> {
        if block.len() < 4 {
            return Err(bad());
        }
        let len = block.get_u32() as usize;
        if block.len() < len {
            return Err(bad());
        }
        let s = String::from_utf8_lossy(&block[..len]).into_owned();
        block.advance(len);
        Ok(s)
    };
    let mut headers = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let name = string(&mut block)?.to_ascii_lowercase();
        let value = string(&mut block)?;
        headers.push((name, value));
    }
    Ok(headers)
}

/// The first value of header `name` (values are NUL-separated).
pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.split('\0').next().unwrap_or(""))
}

/// Reads frames from the peer.
pub(crate) struct FrameReader<R> {
    io: R,
    buf: BytesMut,
    inflater: HeaderInflater,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Frames from `io`.
    pub(crate) fn new(io: R) -> Self {
        FrameReader {
            io,
            buf: BytesMut::with_capacity(16 << 10),
            inflater: HeaderInflater::new(),
        }
    }

    /// The next frame, `None` at the end of the connection. Cancel-safe: a frame is taken
    /// from the buffer only once whole.
    pub(crate) async fn next(&mut self) -> Result<Option<Frame>, SpdyError> {
        loop {
            if let Some(frame) = self.parse()? {
                return Ok(Some(frame));
            }
            if self.io.read_buf(&mut self.buf).await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(SpdyError::Io(std::io::ErrorKind::UnexpectedEof.into()))
                };
            }
        }
    }

    fn parse(&mut self) -> Result<Option<Frame>, SpdyError> {
        if self.buf.len() < 8 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([0, self.buf[5], self.buf[6], self.buf[7]]) as usize;
        if len > MAX_FRAME {
            return Err(SpdyError::TooLarge(len));
        }
        if self.buf.len() < 8 + len {
            self.buf.reserve(8 + len - self.buf.len());
            return Ok(None);
        }
        let mut head = self.buf.split_to(8);
        let payload = self.buf.split_to(len).freeze();
        let first = head.get_u32();
        let flags = head.get_u8();
        let fin = flags & FLAG_FIN != 0;
        if first & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data {
                stream_id: first & 0x7fff_ffff,
                fin,
                data: payload,
            }));
        }
        let version = ((first >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(SpdyError::Version(version));
        }
        let kind = (first & 0xffff) as u16;
        let mut p = payload;
        let need = |p: &Bytes, n: usize, what: &'static str| {
            if p.len() < n {
                Err(SpdyError::Invalid(what))
            } else {
                Ok(())
            }
        };
        Ok(Some(match kind {
            SYN_STREAM => {
                need(&p, 10, "SYN_STREAM")?;
                let stream_id = p.get_u32() & 0x7fff_ffff;
                let _associated = p.get_u32();
                let _priority_and_slot = p.get_u16();
                let block = self.inflater.block(&p)?;
                Frame::SynStream {
                    stream_id,
                    fin,
                    headers: decode_headers(&block)?,
                }
            }
            SYN_REPLY => {
                need(&p, 4, "SYN_REPLY")?;
                let stream_id = p.get_u32() & 0x7fff_ffff;
                let block = self.inflater.block(&p)?;
                Frame::SynReply {
                    stream_id,
                    fin,
                    headers: decode_headers(&block)?,
                }
            }
            RST_STREAM => {
                need(&p, 8, "RST_STREAM")?;
                Frame::RstStream {
                    stream_id: p.get_u32() & 0x7fff_ffff,
                    status: p.get_u32(),
                }
            }
            SETTINGS => Frame::Settings,
            PING => {
                need(&p, 4, "PING")?;
                Frame::Ping(p.get_u32())
            }
            GOAWAY => {
                need(&p, 4, "GOAWAY")?;
                let last_good_stream_id = p.get_u32() & 0x7fff_ffff;
                let status = if p.len() >= 4 { p.get_u32() } else { 0 };
                Frame::GoAway {
                    last_good_stream_id,
                    status,
                }
            }
            HEADERS => {
                need(&p, 4, "HEADERS")?;
                let stream_id = p.get_u32() & 0x7fff_ffff;
                // The block still advances the shared zlib stream.
                let block = self.inflater.block(&p)?;
                decode_headers(&block)?;
                Frame::Headers { stream_id, fin }
            }
            WINDOW_UPDATE => Frame::WindowUpdate,
            other => Frame::Unknown(other),
        }))
    }
}

/// Encodes frames for the peer (header blocks through `deflater`, in sending order).
pub(crate) fn encode(frame: &Frame, deflater: &mut HeaderDeflater) -> Vec<u8> {
    let control = |kind: u16, flags: u8, payload: &[u8]| {
        let mut out = Vec::with_capacity(payload.len() + 8);
        out.put_u16(0x8000 | VERSION);
        out.put_u16(kind);
        out.put_u32(u32::from(flags) << 24 | payload.len() as u32);
        out.put_slice(payload);
        out
    };
    let flag = |fin: bool| if fin { FLAG_FIN } else { 0 };
    match frame {
        Frame::SynStream {
            stream_id,
            fin,
            headers,
        } => {
            let mut p = Vec::new();
            p.put_u32(*stream_id);
            p.put_u32(0);
            p.put_u16(0);
            p.extend(deflater.block(&encode_headers(headers)));
            control(SYN_STREAM, flag(*fin), &p)
        }
        Frame::SynReply {
            stream_id,
            fin,
            headers,
        } => {
            let mut p = Vec::new();
            p.put_u32(*stream_id);
            p.extend(deflater.block(&encode_headers(headers)));
            control(SYN_REPLY, flag(*fin), &p)
        }
        Frame::RstStream { stream_id, status } => {
            let mut p = Vec::new();
            p.put_u32(*stream_id);
            p.put_u32(*status);
            control(RST_STREAM, 0, &p)
        }
        Frame::Settings => control(SETTINGS, 0, &0u32.to_be_bytes()),
        Frame::Ping(id) => control(PING, 0, &id.to_be_bytes()),
        Frame::GoAway {
            last_good_stream_id,
            status,
        } => {
            let mut p = Vec::new();
            p.put_u32(*last_good_stream_id);
            p.put_u32(*status);
            control(GOAWAY, 0, &p)
        }
        Frame::Headers { stream_id, fin } => {
            let mut p = Vec::new();
            p.put_u32(*stream_id);
            p.extend(deflater.block(&encode_headers(&[])));
            control(HEADERS, flag(*fin), &p)
        }
        Frame::WindowUpdate | Frame::Unknown(_) => Vec::new(),
        Frame::Data {
            stream_id,
            fin,
            data,
        } => {
            let mut out = Vec::with_capacity(data.len() + 8);
            out.put_u32(stream_id & 0x7fff_ffff);
            out.put_u32(u32::from(flag(*fin)) << 24 | data.len() as u32);
            out.put_slice(data);
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// The draft's dictionary: 1,423 bytes, and the id zlib streams name it by.
    #[test]
    fn the_dictionary_is_spdy3s() {
        assert_eq!(DICTIONARY.len(), 1423);
        assert!(DICTIONARY.ends_with(b"enq=0."));
    }

    /// What we write, our reader reads back: frames and a shared header stream.
    #[tokio::test]
    async fn frames_round_trip_through_one_header_stream() {
        let mut deflater = HeaderDeflater::default();
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                fin: false,
                headers: headers(&[("streamtype", "error"), ("port", "80"), ("requestid", "0")]),
            },
            Frame::SynReply {
                stream_id: 1,
                fin: false,
                headers: Vec::new(),
            },
            Frame::Data {
                stream_id: 3,
                fin: true,
                data: Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n"),
            },
            Frame::Ping(7),
            Frame::RstStream {
                stream_id: 5,
                status: RST_CANCEL,
            },
            Frame::GoAway {
                last_good_stream_id: 3,
                status: 0,
            },
        ];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend(encode(f, &mut deflater));
        }
        let mut reader = FrameReader::new(&wire[..]);
        for f in &frames {
            assert_eq!(reader.next().await.unwrap().as_ref(), Some(f));
        }
        assert_eq!(reader.next().await.unwrap(), None);
    }

    /// A header block compressed against the dictionary: a fixed-Huffman deflate block
    /// whose first bytes are a back-reference into the dictionary (`\x00\x00\x00\x07options`,
    /// 11 bytes at distance 1,423), as zlib with `deflateSetDictionary` writes one.
    #[test]
    fn back_references_into_the_dictionary_are_resolved() {
        // zlib header with FDICT and the dictionary's id.
        let mut stream = vec![0x78, 0xbb];
        stream.extend_from_slice(&adler32(DICTIONARY).to_be_bytes());
        let mut bits = BitWriter::default();
        bits.put(1, 1); // BFINAL
        bits.put(1, 2); // BTYPE = fixed Huffman
        // Length 11: code 265 (7-bit 0b0001001) with one extra bit 0.
        bits.put_rev(0b0001001, 7);
        bits.put(0, 1);
        // Distance 1423: code 20 (base 1025, 9 extra bits: 398).
        bits.put_rev(20, 5);
        bits.put(398, 9);
        bits.put_rev(0, 7); // end of block (256)
        stream.extend(bits.finish());
        let mut inflater = HeaderInflater::new();
        assert_eq!(inflater.block(&stream).unwrap(), &DICTIONARY[..11]);
    }

    /// The header blocks of kubectl's first two SYN_STREAMs (its error then its data
    /// stream), as kubectl v1.33 compresses them (zlib at best compression with the SPDY/3
    /// dictionary, each ended by a sync flush), read from one inflater in order.
    #[test]
    fn kubectls_header_blocks_inflate_to_its_stream_headers() {
        let error_stream = [
            0x78, 0xf9, 0xe3, 0xc6, 0xa7, 0xc2, 0x02, 0x25, 0x3a, 0x70, 0x3a, 0x2b, 0x29, 0x4a,
            0x4d, 0xcc, 0x85, 0x16, 0x25, 0xac, 0xa9, 0xa0, 0x80, 0x86, 0x14, 0xcb, 0x45, 0xa0,
            0x24, 0xcc, 0x64, 0x61, 0xc0, 0xc0, 0xc0, 0xc0, 0x59, 0x04, 0x89, 0xc4, 0x4c, 0x50,
            0xe2, 0x66, 0x34, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff,
        ];
        let data_stream = [
            0xc2, 0xaa, 0x15, 0x54, 0x0a, 0x25, 0x12, 0xd2, 0x09, 0x00, 0x00, 0x00, 0xff, 0xff,
        ];
        assert_eq!(adler32(DICTIONARY), 0xe3c6_a7c2);
        let mut inflater = HeaderInflater::new();
        let first = decode_headers(&inflater.block(&error_stream).unwrap()).unwrap();
        assert_eq!(header(&first, "streamtype"), Some("error"));
        assert_eq!(header(&first, "port"), Some("80"));
        assert_eq!(header(&first, "requestid"), Some("0"));
        let second = decode_headers(&inflater.block(&data_stream).unwrap()).unwrap();
        assert_eq!(header(&second, "streamtype"), Some("data"));
        assert_eq!(header(&second, "port"), Some("80"));
        assert_eq!(header(&second, "requestid"), Some("0"));
    }

    /// A stream naming another dictionary, or garbage, is an error, not a panic.
    #[test]
    fn foreign_dictionaries_and_garbage_are_errors() {
        let mut inflater = HeaderInflater::new();
        assert!(inflater.block(&[0x78, 0xbb, 1, 2, 3, 4, 0]).is_err());
        let mut inflater = HeaderInflater::new();
        assert!(inflater.block(&[0x12, 0x34, 0x56]).is_err());
        let mut inflater = HeaderInflater::new();
        assert!(
            inflater
                .block(&[0x78, 0x01, 0xff, 0xff, 0xff, 0xff])
                .is_err()
        );
    }

    /// Truncated, oversized and foreign-version frames are errors, never panics.
    #[tokio::test]
    async fn malformed_frames_are_errors() {
        // A SYN_STREAM too short for its fields.
        let short = [0x80, 3, 0, 1, 0, 0, 0, 2, 0, 0];
        assert!(FrameReader::new(&short[..]).next().await.is_err());
        let big = [0, 0, 0, 1, 0, 0xff, 0xff, 0xff];
        assert!(matches!(
            FrameReader::new(&big[..]).next().await,
            Err(SpdyError::TooLarge(_))
        ));
        let v2 = [0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1];
        assert!(matches!(
            FrameReader::new(&v2[..]).next().await,
            Err(SpdyError::Version(2))
        ));
        // A header block claiming more bytes than it has.
        let mut deflater = HeaderDeflater::default();
        let mut p = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        p.extend(deflater.block(&[0, 0, 0, 1, 0, 0, 0, 9, b'a']));
        let mut frame = vec![0x80, 3, 0, 1, 0, 0, 0, p.len() as u8];
        frame.extend(p);
        assert!(FrameReader::new(&frame[..]).next().await.is_err());
        // Cut mid-frame.
        assert!(
            FrameReader::new(&[0u8, 0, 0, 1, 0, 0, 0, 9, 1][..])
                .next()
                .await
                .is_err()
        );
    }

    #[derive(Default)]
    struct BitWriter {
        out: Vec<u8>,
        acc: u32,
        n: u32,
    }

    impl BitWriter {
        /// `count` bits of `value`, least significant first (deflate's extra bits).
        fn put(&mut self, value: u32, count: u32) {
            for i in 0..count {
                self.acc |= ((value >> i) & 1) << self.n;
                self.n += 1;
                if self.n == 8 {
                    self.out.push(self.acc as u8);
                    (self.acc, self.n) = (0, 0);
                }
            }
        }

        /// A Huffman code, most significant bit first.
        fn put_rev(&mut self, code: u32, count: u32) {
            for i in (0..count).rev() {
                self.put((code >> i) & 1, 1);
            }
        }

        fn finish(mut self) -> Vec<u8> {
            if self.n > 0 {
                self.out.push(self.acc as u8);
            }
            self.out
        }
    }
}
