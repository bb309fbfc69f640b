//! [`MemoryStore`]: the whole multi-version history in a `BTreeMap`, for tests.

use std::collections::BTreeMap;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;

use super::window::WatchWindow;
use super::{
    EventKind, KeyValue, ListResult, Store, StoreError, WatchConfig, WatchEvent, WatchStream,
};

/// One version of a key; `value: None` marks a deletion.
#[derive(Clone)]
struct Version {
    mod_revision: u64,
    create_revision: u64,
    value: Option<Bytes>,
}

#[derive(Default)]
struct State {
    revision: u64,
    compacted: u64,
    /// Every key's versions, oldest first.
    keys: BTreeMap<String, Vec<Version>>,
}

impl State {
    fn live(&self, key: &str) -> Option<KeyValue> {
        let version = self.keys.get(key)?.last()?;
        Some(KeyValue {
            key: key.to_owned(),
            value: version.value.clone()?,
            create_revision: version.create_revision,
            mod_revision: version.mod_revision,
        })
    }

    fn check_revision(&self, revision: u64) -> Result<(), StoreError> {
        if revision > self.revision {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: self.revision,
            });
        }
        if revision < self.compacted {
            return Err(StoreError::Expired {
                requested: revision,
                oldest_available: self.compacted,
            });
        }
        Ok(())
    }
}

/// An in-memory [`Store`] with the same semantics as the durable one (history,
/// compaction, watch window); nothing survives the process. Meant for tests.
pub struct MemoryStore {
    state: Mutex<State>,
    window: WatchWindow,
}

impl MemoryStore {
    /// An empty store at revision 0 with the default [`WatchConfig`].
    pub fn new() -> Self {
        Self::with_watch_config(WatchConfig::default())
    }

    /// An empty store at revision 0 with the given watch window sizes.
    pub fn with_watch_config(config: WatchConfig) -> Self {
        Self {
            state: Mutex::new(State::default()),
            window: WatchWindow::new(config, 0),
        }
    }

    /// Checks, then appends a version for `key` and publishes the event, under the lock
    /// so that revisions are assigned and published in order.
    fn write(
        &self,
        key: &str,
        value: Option<Bytes>,
        must_exist: bool,
        expected: Option<u64>,
    ) -> Result<(u64, Option<KeyValue>), StoreError> {
        let mut state = self.state.lock();
        let prev = state.live(key);
        match (&prev, must_exist) {
            (None, true) => {
                return Err(StoreError::NotFound {
                    key: key.to_owned(),
                });
            }
            (Some(_), false) => {
                return Err(StoreError::AlreadyExists {
                    key: key.to_owned(),
                });
            }
            _ => {}
        }
        if let (Some(prev), Some(expected)) = (&prev, expected)
            && prev.mod_revision != expected
        {
            return Err(StoreError::Conflict {
                key: key.to_owned(),
                expected,
                actual: prev.mod_revision,
            });
        }
        state.revision += 1;
        let revision = state.revision;
        let create_revision = prev.as_ref().map_or(revision, |p| p.create_revision);
        state.keys.entry(key.to_owned()).or_default().push(Version {
            mod_revision: revision,
            create_revision,
            value: value.clone(),
        });
        self.window.publish([WatchEvent {
            kind: if value.is_some() {
                EventKind::Put
            } else {
                EventKind::Delete
            },
            key: key.to_owned(),
            value,
            prev_value: prev.clone(),
            create_revision,
            revision,
        }]);
        Ok((revision, prev))
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        Ok(self.state.lock().live(key))
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        at_revision: Option<u64>,
    ) -> Result<ListResult, StoreError> {
        let state = self.state.lock();
        let revision = at_revision.unwrap_or(state.revision);
        state.check_revision(revision)?;
        let limit = limit.filter(|&l| l > 0).unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut more = false;
        for (key, versions) in state.keys.range::<str, _>((
            std::ops::Bound::Included(prefix),
            std::ops::Bound::Unbounded,
        )) {
            if !key.starts_with(prefix) {
                break;
            }
            if start_after.is_some_and(|after| key.as_str() <= after) {
                continue;
            }
            let visible = versions.partition_point(|v| v.mod_revision <= revision);
            let Some(version) = visible.checked_sub(1).map(|i| &versions[i]) else {
                continue;
            };
            let Some(value) = &version.value else {
                continue;
            };
            if items.len() == limit {
                more = true;
                break;
            }
            items.push(KeyValue {
                key: key.clone(),
                value: value.clone(),
                create_revision: version.create_revision,
                mod_revision: version.mod_revision,
            });
        }
        Ok(ListResult {
            items,
            revision,
            more,
        })
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<u64, StoreError> {
        self.write(key, Some(value), false, None)
            .map(|(rev, _)| rev)
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_mod_revision: Option<u64>,
    ) -> Result<u64, StoreError> {
        self.write(key, Some(value), true, expected_mod_revision)
            .map(|(rev, _)| rev)
    }

    async fn delete(
        &self,
        key: &str,
        expected_mod_revision: Option<u64>,
    ) -> Result<(u64, KeyValue), StoreError> {
        let (revision, prev) = self.write(key, None, true, expected_mod_revision)?;
        let prev = prev.ok_or_else(|| StoreError::NotFound {
            key: key.to_owned(),
        })?;
        Ok((revision, prev))
    }

    async fn current_revision(&self) -> Result<u64, StoreError> {
        Ok(self.state.lock().revision)
    }

    async fn health(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn watch(&self, prefix: &str, from_revision: u64) -> Result<WatchStream, StoreError> {
        // Under the state lock so no write slips between the checks and registration.
        let _state = self.state.lock();
        self.window.watch(prefix, from_revision)
    }

    async fn compact(&self, revision: u64) -> Result<(), StoreError> {
        let mut state = self.state.lock();
        if revision > state.revision {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current: state.revision,
            });
        }
        if revision <= state.compacted {
            return Ok(());
        }
        state.keys.retain(|_, versions| {
            let visible = versions.partition_point(|v| v.mod_revision <= revision);
            if visible > 0 {
                // Keep the version visible at `revision` (unless it is a deletion).
                let keep_from = if versions[visible - 1].value.is_some() {
                    visible - 1
                } else {
                    visible
                };
                versions.drain(..keep_from);
            }
            !versions.is_empty()
        });
        state.compacted = revision;
        self.window.compact(revision);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn compaction_drops_superseded_versions_and_tombstones() {
        let store = MemoryStore::new();
        store.create("/a", Bytes::from_static(b"1")).await.unwrap(); // 1
        store
            .update("/a", Bytes::from_static(b"2"), None)
            .await
            .unwrap(); // 2
        store.create("/b", Bytes::from_static(b"1")).await.unwrap(); // 3
        store.delete("/b", None).await.unwrap(); // 4
        store
            .update("/a", Bytes::from_static(b"3"), None)
            .await
            .unwrap(); // 5
        store.compact(4).await.unwrap();
        let state = store.state.lock();
        let a: Vec<u64> = state.keys["/a"].iter().map(|v| v.mod_revision).collect();
        assert_eq!(a, vec![2, 5]);
        assert!(!state.keys.contains_key("/b"));
    }
}
