//! The watch window: a bounded ring of recent events with fan-out to watchers.
//!
//! Every backend feeds every committed write into [`WatchWindow::publish`] in revision
//! order. The ring keeps the last `window_capacity` events; it always holds *every*
//! event with a revision in `(floor, last published]`, so a watch from any revision
//! `>= floor` can be replayed exactly, and one from below `floor` gets
//! [`StoreError::Expired`].
//!
//! Registration and publication take the same lock, so a new watcher gets the replay
//! (a snapshot of the ring) and then exactly the events published after it: no gap and
//! no duplicate. Live events go through a bounded channel per watcher; when it is full
//! the watcher is removed and marked lagged, and its stream yields the buffered events
//! and then [`StoreError::WatcherLagged`]. Publishing never blocks on a watcher.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
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
}

struct State {
    events: VecDeque<Arc<WatchEvent>>,
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
        };
        Self {
            config,
            state: Mutex::new(State {
                events: VecDeque::with_capacity(config.window_capacity.min(65_536)),
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
                match watcher.tx.try_send(event.clone()) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        tracing::warn!(
                            prefix = %watcher.prefix,
                            buffer = self.config.watcher_buffer,
                            revision = event.revision,
                            "watcher fell behind; ending it"
                        );
                        watcher.end.store(END_LAGGED, Ordering::Release);
                        dead = true;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => dead = true,
                }
            }
            if state.events.len() == self.config.window_capacity
                && let Some(evicted) = state.events.pop_front()
            {
                state.floor = evicted.revision;
            }
            state.events.push_back(event);
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
            state.events.pop_front();
        }
        state.floor = state.floor.max(revision);
    }

    /// The oldest revision a watch may start from.
    #[cfg(test)]
    pub(crate) fn floor(&self) -> u64 {
        self.state.lock().floor
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
        state.watchers.push(Watcher {
            prefix: prefix.to_owned(),
            from_revision,
            tx,
            end: end.clone(),
        });
        Ok(Box::pin(WindowStream {
            replay,
            rx,
            end,
            buffer: self.config.watcher_buffer,
            done: false,
        }))
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
            Poll::Ready(Some(event)) => Poll::Ready(Some(Ok(Arc::unwrap_or_clone(event)))),
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
    use crate::store::EventKind;
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
