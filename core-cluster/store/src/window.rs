//! The watch window: a bounded ring of recent events with fan-out to watchers.
//!
//! Every backend feeds every committed write into [`WatchWindow::publish`] in revision
//! order. The ring keeps the last `window_capacity` events, and fewer when they hold
//! more than `window_bytes`; it always holds *every* event with a revision in
//! `(floor, last published]`, so a watch from any revision `>= floor` can be replayed
//! exactly, and one from below `floor` gets [`StoreError::Expired`].
//!
//! Registration and publication take the same lock, so a new watcher gets the replay
//! (a snapshot of the ring) and then exactly the events published after it: no gap and
//! no duplicate. Live events go through a bounded channel per watcher, bounded by count
//! (`watcher_buffer`) and by the bytes waiting in it (`watcher_buffer_bytes`); when
//! either is exceeded the watcher is removed and marked lagged, and its stream yields the
//! buffered events and then [`StoreError::WatcherLagged`]. Publishing never blocks on a
//! watcher.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::{StoreError, WatchConfig, WatchEvent, WatchStream};

const END_NONE: u8 = 0;
const END_LAGGED: u8 = 1;
const END_CLOSED: u8 = 2;

struct Watcher {
    prefix: String,
    from_revision: u64,
    tx: mpsc::Sender<Arc<WatchEvent>>,
    end: Arc<AtomicU8>,
    /// Bytes of the events in `tx` not yet taken by the stream.
    pending_bytes: Arc<AtomicUsize>,
}

struct State {
    events: VecDeque<Arc<WatchEvent>>,
    /// The sum of [`WatchEvent::size_bytes`] over `events`.
    bytes: usize,
    /// Every event with a revision above `floor` (up to the last published) is in
    /// `events`.
    floor: u64,
    watchers: Vec<Watcher>,
    /// Set once the store behind the window stops: no more events will come.
    closed: bool,
}

/// The bounded ring of recent events and the registered watchers.
pub(crate) struct WatchWindow {
    config: WatchConfig,
    state: Mutex<State>,
}

impl WatchWindow {
    /// A window whose history starts after `start_revision` (the store's revision when
    /// it was opened).
    pub(crate) fn new(config: WatchConfig, start_revision: u64) -> Self {
        let config = WatchConfig {
            window_capacity: config.window_capacity.max(1),
            watcher_buffer: config.watcher_buffer.max(1),
            ..config
        };
        Self {
            config,
            state: Mutex::new(State {
                events: VecDeque::with_capacity(config.window_capacity.min(65_536)),
                bytes: 0,
                floor: start_revision,
                watchers: Vec::new(),
                closed: false,
            }),
        }
    }

    /// Appends committed events (in increasing revision order) and hands them to the
    /// matching watchers.
    pub(crate) fn publish(&self, events: impl IntoIterator<Item = WatchEvent>) {
        let mut state = self.state.lock();
        let state = &mut *state;
        let mut dead = false;
        for event in events {
            let size = event.size_bytes();
            let event = Arc::new(event);
            debug_assert!(
                state
                    .events
                    .back()
                    .is_none_or(|last| last.revision < event.revision),
                "events must be published in increasing revision order"
            );
            for watcher in &state.watchers {
                if event.revision <= watcher.from_revision
                    || !event.key.starts_with(&watcher.prefix)
                    || watcher.end.load(Ordering::Relaxed) != END_NONE
                {
                    continue;
                }
                let pending = watcher.pending_bytes.load(Ordering::Acquire);
                let over_bytes = pending > 0 && pending + size > self.config.watcher_buffer_bytes;
                let full = over_bytes || {
                    // Counted before the send: the stream may take the event at once.
                    watcher.pending_bytes.fetch_add(size, Ordering::AcqRel);
                    match watcher.tx.try_send(event.clone()) {
                        Ok(()) => continue,
                        Err(e) => {
                            watcher.pending_bytes.fetch_sub(size, Ordering::AcqRel);
                            matches!(e, mpsc::error::TrySendError::Full(_))
                        }
                    }
                };
                if full {
                    tracing::warn!(
                        prefix = %watcher.prefix,
                        buffer = self.config.watcher_buffer,
                        buffer_bytes = self.config.watcher_buffer_bytes,
                        pending_bytes = pending,
                        revision = event.revision,
                        "watcher fell behind; ending it"
                    );
                    watcher.end.store(END_LAGGED, Ordering::Release);
                }
                dead = true;
            }
            state.events.push_back(event);
            state.bytes += size;
            // Keep within both bounds; every evicted event raises the floor, so the ring
            // still holds every event above it.
            while state.events.len() > self.config.window_capacity
                || state.bytes > self.config.window_bytes
            {
                let Some(evicted) = state.events.pop_front() else {
                    break;
                };
                state.bytes -= evicted.size_bytes();
                state.floor = evicted.revision;
            }
        }
        if dead {
            // Dropping a lagged watcher's sender lets its stream drain and then end.
            state
                .watchers
                .retain(|w| w.end.load(Ordering::Acquire) == END_NONE && !w.tx.is_closed());
        }
    }

    /// Drops events at or below `revision` and makes `revision` the floor (if higher).
    pub(crate) fn compact(&self, revision: u64) {
        let mut state = self.state.lock();
        while state
            .events
            .front()
            .is_some_and(|event| event.revision <= revision)
        {
            if let Some(dropped) = state.events.pop_front() {
                state.bytes -= dropped.size_bytes();
            }
        }
        state.floor = state.floor.max(revision);
    }

    /// The oldest revision a watch may start from.
    #[cfg(test)]
    pub(crate) fn floor(&self) -> u64 {
        self.state.lock().floor
    }

    /// How many events the ring holds and their size in bytes
    /// ([`WatchEvent::size_bytes`]).
    #[cfg(test)]
    pub(crate) fn held(&self) -> (usize, usize) {
        let state = self.state.lock();
        (state.events.len(), state.bytes)
    }

    /// Registers a watcher for keys under `prefix` with revisions `> from_revision`.
    pub(crate) fn watch(
        &self,
        prefix: &str,
        from_revision: u64,
    ) -> Result<WatchStream, StoreError> {
        let mut state = self.state.lock();
        if state.closed {
            return Err(StoreError::Closed);
        }
        if from_revision < state.floor {
            return Err(StoreError::Expired {
                requested: from_revision,
                oldest_available: state.floor,
            });
        }
        // Drop watchers whose streams are gone, so idle prefixes don't accumulate them.
        state.watchers.retain(|w| !w.tx.is_closed());
        // Events are in revision order: skip the ones at or below `from_revision`.
        let start = state
            .events
            .partition_point(|event| event.revision <= from_revision);
        let replay: VecDeque<Arc<WatchEvent>> = state
            .events
            .range(start..)
            .filter(|event| event.key.starts_with(prefix))
            .cloned()
            .collect();
        let (tx, rx) = mpsc::channel(self.config.watcher_buffer);
        let end = Arc::new(AtomicU8::new(END_NONE));
        let pending_bytes = Arc::new(AtomicUsize::new(0));
        state.watchers.push(Watcher {
            prefix: prefix.to_owned(),
            from_revision,
            tx,
            end: end.clone(),
            pending_bytes: pending_bytes.clone(),
        });
        Ok(Box::pin(WindowStream {
            replay,
            rx,
            end,
            pending_bytes,
            buffer: self.config.watcher_buffer,
            done: false,
        }))
    }

    /// Ends every watcher with [`StoreError::Closed`] (after what it has buffered), drops
    /// the ring and starts history afresh after `revision`: the feed behind the window lost
    /// events (etcd compacted them before they were delivered), so no watcher may go on.
    #[cfg(feature = "etcd")]
    pub(crate) fn reset(&self, revision: u64) {
        let mut state = self.state.lock();
        end_all(&mut state.watchers);
        state.events.clear();
        state.bytes = 0;
        state.floor = state.floor.max(revision);
    }

    /// Ends every watcher with [`StoreError::Closed`] (after what it has buffered) and
    /// refuses new watches: the store behind the window has stopped writing.
    pub(crate) fn close(&self) {
        let mut state = self.state.lock();
        state.closed = true;
        end_all(&mut state.watchers);
    }
}

fn end_all(watchers: &mut Vec<Watcher>) {
    for watcher in watchers.drain(..) {
        // Lagged stays lagged: that is the more useful message.
        let _ =
            watcher
                .end
                .compare_exchange(END_NONE, END_CLOSED, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl Drop for WatchWindow {
    fn drop(&mut self) {
        end_all(&mut self.state.get_mut().watchers);
    }
}

struct WindowStream {
    replay: VecDeque<Arc<WatchEvent>>,
    rx: mpsc::Receiver<Arc<WatchEvent>>,
    end: Arc<AtomicU8>,
    pending_bytes: Arc<AtomicUsize>,
    buffer: usize,
    done: bool,
}

impl Stream for WindowStream {
    type Item = Result<WatchEvent, StoreError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(event) = this.replay.pop_front() {
            return Poll::Ready(Some(Ok(Arc::unwrap_or_clone(event))));
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(event)) => {
                this.pending_bytes
                    .fetch_sub(event.size_bytes(), Ordering::AcqRel);
                Poll::Ready(Some(Ok(Arc::unwrap_or_clone(event))))
            }
            Poll::Ready(None) => {
                this.done = true;
                Poll::Ready(match this.end.load(Ordering::Acquire) {
                    END_LAGGED => Some(Err(StoreError::WatcherLagged {
                        buffer: this.buffer,
                    })),
                    _ => Some(Err(StoreError::Closed)),
                })
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventKind;
    use bytes::Bytes;
    use futures::StreamExt;

    fn put(key: &str, revision: u64) -> WatchEvent {
        WatchEvent {
            kind: EventKind::Put,
            key: key.into(),
            value: Some(Bytes::from_static(b"v")),
            prev_value: None,
            create_revision: revision,
            revision,
        }
    }

    fn config(window_capacity: usize, watcher_buffer: usize) -> WatchConfig {
        WatchConfig {
            window_capacity,
            watcher_buffer,
            ..WatchConfig::default()
        }
    }

    #[tokio::test]
    async fn eviction_raises_floor_and_replay_is_exact() {
        let window = WatchWindow::new(config(3, 8), 10);
        window.publish((11..=15).map(|r| put("/a/x", r)));
        assert_eq!(window.floor(), 12);
        assert!(matches!(
            window.watch("/a/", 11),
            Err(StoreError::Expired {
                requested: 11,
                oldest_available: 12
            })
        ));
        let mut stream = window.watch("/a/", 12).unwrap();
        for want in 13..=15 {
            assert_eq!(stream.next().await.unwrap().unwrap().revision, want);
        }
    }

    /// A deletion event of an object of `size` bytes: it holds the deleted object.
    fn big_delete(key: &str, revision: u64, size: usize) -> WatchEvent {
        WatchEvent {
            kind: EventKind::Delete,
            key: key.into(),
            value: None,
            prev_value: Some(crate::KeyValue {
                key: key.into(),
                value: Bytes::from(vec![b'x'; size]),
                create_revision: 1,
                mod_revision: revision - 1,
            }),
            create_revision: 1,
            revision,
        }
    }

    #[tokio::test]
    async fn window_is_bounded_by_bytes_and_replay_stays_exact() {
        const OBJECT: usize = 64 * 1024;
        // Count alone would keep all 200 deletions: about 13 MB.
        let count_only = WatchWindow::new(config(10_000, 8), 0);
        count_only.publish((1..=200).map(|r| big_delete(&format!("/a/{r}"), r + 1, OBJECT)));
        let (events, bytes) = count_only.held();
        assert_eq!(events, 200);
        assert!(bytes > 200 * OBJECT, "{bytes}");

        let bounded = WatchWindow::new(
            WatchConfig {
                window_bytes: 1024 * 1024,
                ..config(10_000, 8)
            },
            1,
        );
        bounded.publish((2..=201).map(|r| big_delete(&format!("/a/{r}"), r, OBJECT)));
        let (events, bytes) = bounded.held();
        assert!(bytes <= 1024 * 1024, "held {bytes} bytes");
        assert!((10..16).contains(&events), "{events} events");
        // The floor follows what was dropped: older watches are refused, newer ones
        // replay every event above the floor.
        let floor = bounded.floor();
        assert_eq!(floor, 201 - events as u64);
        assert!(matches!(
            bounded.watch("/a/", floor - 1),
            Err(StoreError::Expired { .. })
        ));
        let mut stream = bounded.watch("/a/", floor).unwrap();
        for want in floor + 1..=201 {
            assert_eq!(stream.next().await.unwrap().unwrap().revision, want);
        }
    }

    #[tokio::test]
    async fn watcher_buffer_is_bounded_by_bytes() {
        const OBJECT: usize = 100_000;
        let window = WatchWindow::new(
            WatchConfig {
                watcher_buffer_bytes: 350_000,
                ..config(100, 1_000)
            },
            0,
        );
        let mut slow = window.watch("/a/", 0).unwrap();
        let mut fast = window.watch("/a/", 0).unwrap();
        // One event larger than the whole budget is still delivered to an empty buffer.
        window.publish([big_delete("/a/huge", 1, 1_000_000)]);
        assert_eq!(fast.next().await.unwrap().unwrap().revision, 1);
        assert_eq!(slow.next().await.unwrap().unwrap().revision, 1);
        for r in 2..=10 {
            window.publish([big_delete("/a/x", r, OBJECT)]);
            assert_eq!(fast.next().await.unwrap().unwrap().revision, r);
        }
        // The slow watcher took three events' worth of bytes, then was ended, far below
        // its count bound of 1,000: it gets what was buffered, then WatcherLagged.
        for want in 2..=4 {
            assert_eq!(slow.next().await.unwrap().unwrap().revision, want);
        }
        assert!(matches!(
            slow.next().await,
            Some(Err(StoreError::WatcherLagged { .. }))
        ));
        assert!(slow.next().await.is_none());
        // The watcher that kept up keeps going.
        window.publish([big_delete("/a/x", 11, OBJECT)]);
        assert_eq!(fast.next().await.unwrap().unwrap().revision, 11);
    }

    #[tokio::test]
    async fn compaction_raises_floor() {
        let window = WatchWindow::new(config(100, 8), 0);
        window.publish((1..=5).map(|r| put("/a", r)));
        window.compact(3);
        assert!(matches!(
            window.watch("", 2),
            Err(StoreError::Expired {
                requested: 2,
                oldest_available: 3
            })
        ));
        let mut stream = window.watch("", 3).unwrap();
        assert_eq!(stream.next().await.unwrap().unwrap().revision, 4);
    }

    #[tokio::test]
    async fn dropping_the_window_ends_streams_with_closed() {
        let window = WatchWindow::new(config(100, 8), 0);
        let mut stream = window.watch("", 0).unwrap();
        window.publish([put("/a", 1)]);
        drop(window);
        assert_eq!(stream.next().await.unwrap().unwrap().revision, 1);
        assert!(matches!(stream.next().await, Some(Err(StoreError::Closed))));
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn closing_ends_streams_and_refuses_new_watches() {
        let window = WatchWindow::new(config(100, 8), 0);
        let mut stream = window.watch("", 0).unwrap();
        window.publish([put("/a", 1)]);
        window.close();
        assert_eq!(stream.next().await.unwrap().unwrap().revision, 1);
        assert!(matches!(stream.next().await, Some(Err(StoreError::Closed))));
        assert!(matches!(window.watch("", 1), Err(StoreError::Closed)));
    }

    #[tokio::test]
    async fn dropped_streams_are_unregistered() {
        let window = WatchWindow::new(config(100, 1), 0);
        for _ in 0..10 {
            drop(window.watch("/quiet/", 0).unwrap());
        }
        let _live = window.watch("/other/", 0).unwrap();
        assert_eq!(window.state.lock().watchers.len(), 1);
    }
}
