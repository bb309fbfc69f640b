//! One tunnelled byte stream: an HTTP/2 stream's two bodies as `AsyncRead + AsyncWrite`.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::{Buf, Bytes};
use h2::{RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A byte stream carried by one HTTP/2 stream: what is written goes out as DATA frames
/// within the peer's flow-control window, what the peer sends is read back. At most one
/// received frame is held unread, and its window is given back as soon as it is taken, so
/// a reader that stops reading stops the peer's writing after one window, never more.
/// Dropping the stream before it ended resets it at the peer.
pub struct TunnelStream {
    send: SendStream<Bytes>,
    recv: RecvStream,
    unread: Bytes,
    write_closed: bool,
}

impl std::fmt::Debug for TunnelStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelStream")
            .field("unread", &self.unread.len())
            .field("write_closed", &self.write_closed)
            .finish_non_exhaustive()
    }
}

impl TunnelStream {
    pub(crate) fn new(send: SendStream<Bytes>, recv: RecvStream) -> Self {
        TunnelStream {
            send,
            recv,
            unread: Bytes::new(),
            write_closed: false,
        }
    }
}

/// An HTTP/2 error as an I/O error: a stream reset by the peer reads as a reset connection.
fn io_error(error: h2::Error) -> io::Error {
    if error.is_io() {
        return error
            .into_io()
            .unwrap_or_else(|| io::Error::other("agent tunnel: I/O error"));
    }
    let kind = if error.is_reset() || error.is_go_away() {
        io::ErrorKind::ConnectionReset
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, error)
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.unread.is_empty() {
            match ready!(this.recv.poll_data(cx)) {
                None => return Poll::Ready(Ok(())),
                Some(Err(e)) if e.reason() == Some(h2::Reason::NO_ERROR) => {
                    return Poll::Ready(Ok(()));
                }
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
                Some(Ok(data)) => {
                    // The window is given back now: the frame is ours to hand out.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    this.unread = data;
                }
            }
        }
        let n = this.unread.len().min(buf.remaining());
        buf.put_slice(&this.unread[..n]);
        this.unread.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if this.write_closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "agent tunnel: written after shutdown",
            )));
        }
        this.send.reserve_capacity(buf.len());
        loop {
            match ready!(this.send.poll_capacity(cx)) {
                None => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "agent tunnel: the stream is closed",
                    )));
                }
                Some(Err(e)) => return Poll::Ready(Err(io_error(e))),
                Some(Ok(0)) => continue,
                Some(Ok(n)) => {
                    let n = n.min(buf.len());
                    this.send
                        .send_data(Bytes::copy_from_slice(&buf[..n]), false)
                        .map_err(io_error)?;
                    return Poll::Ready(Ok(n));
                }
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // DATA frames go out as the connection task writes them; there is nothing held here.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.write_closed {
            this.write_closed = true;
            // The peer may have reset the stream already: then there is nothing to end.
            let _ = this.send.send_data(Bytes::new(), true);
        }
        Poll::Ready(Ok(()))
    }
}
