//! Service ClusterIPs and NodePorts allocated in the store, as kube-apiserver allocates them
//! (`pkg/registry/core/service/allocator/storage/storage.go` `Etcd`): each range is a
//! RangeAllocation object at `/registry/ranges/serviceips` (`secondaryserviceips` for the
//! second family) and `/registry/ranges/servicenodeports`, holding a bitmap. An allocation
//! marks the bitmap in a cached copy and writes it back compared on the object's
//! `mod_revision`; when another API server wrote first, the write conflicts and the
//! allocation is redone on a fresh read. Every API server sharing the store therefore hands
//! out distinct IPs and ports.
//!
//! Writes of one server are serialized by a local lock (upstream's `Etcd.lock`), so the
//! compare-and-swap races only between servers. The ClusterIP and the NodePorts live in
//! separate objects, as upstream's: what a crash leaves between the two writes (or between
//! a Service's deletion and its release) is a leak that [`ServiceRanges::repair`], upstream's
//! repair loop, takes back.

use std::{collections::BTreeSet, net::IpAddr, sync::Arc};

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::Value;

use super::{ObjectReader, status::ApiError};
use crate::{
    registry::{
        FieldError, ResourceDef,
        allocator::{
            Allocation, Item, RangeId, RangeSnapshot, Repair, RepairOutcome, ServiceAllocator,
        },
    },
    store::{Store, StoreError},
};

/// How many times one allocation or release is redone after losing a race to another
/// server before it gives up with a retryable error.
const MAX_ATTEMPTS: u32 = 128;

/// Waits a random while, growing with `attempt` up to 32 ms, after a lost race: a server
/// that rereads the ranges while another writes them back to back would otherwise lose
/// every race until the other has no more to write.
async fn back_off(attempt: u32) {
    use std::hash::BuildHasher;
    let ceiling = 1u64 << attempt.min(5);
    let millis = std::collections::hash_map::RandomState::new().hash_one(attempt) % (ceiling + 1);
    tokio::time::sleep(std::time::Duration::from_millis(millis)).await;
}

/// The store key of a range's RangeAllocation.
pub(crate) fn range_key(id: RangeId) -> String {
    format!("/registry/ranges/{}", id.name())
}

/// Why an allocation failed.
#[derive(Debug)]
pub(crate) enum AllocateError {
    /// The Service asks for what it may not have (422).
    Invalid(Vec<FieldError>),
    /// The store failed.
    Store(StoreError),
    /// Other servers won every race (retryable).
    Contended,
}

impl AllocateError {
    /// The API's answer for a Service `name` of `def`.
    pub(crate) fn into_api(self, def: &ResourceDef, name: &str) -> ApiError {
        match self {
            AllocateError::Invalid(errors) => super::invalid(def, name, errors),
            AllocateError::Store(e) => ApiError::from_store(&super::qualified(def, name), e),
            AllocateError::Contended => ApiError::service_unavailable(
                "the service IP and port ranges are being changed by other API servers; try again",
            ),
        }
    }
}

/// What this server last read of the ranges.
struct Cached {
    allocator: ServiceAllocator,
    /// The `mod_revision` of each stored range; absent when it is not stored.
    revisions: std::collections::HashMap<RangeId, u64>,
    /// Whether `allocator` is what was last read or written (else reread before use).
    fresh: bool,
}

/// The store-backed ClusterIP and NodePort allocator of one API server.
pub(crate) struct ServiceRanges {
    store: Arc<dyn Store>,
    first_ip: Option<IpAddr>,
    cached: tokio::sync::Mutex<Cached>,
    repair: Mutex<Repair>,
}

impl std::fmt::Debug for ServiceRanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceRanges").finish_non_exhaustive()
    }
}

/// A lost race: another writer changed (or created, or deleted) the range first.
fn lost_race(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Conflict { .. }
            | StoreError::AlreadyExists { .. }
            | StoreError::NotFound { .. }
    )
}

fn ranges_of(allocator: &ServiceAllocator, items: &[Item]) -> BTreeSet<RangeId> {
    items
        .iter()
        .filter_map(|item| allocator.range_of(*item))
        .collect()
}

fn taken(allocation: &Allocation) -> Vec<Item> {
    allocation
        .ips
        .iter()
        .map(|ip| Item::Ip(*ip))
        .chain(allocation.ports.iter().map(|p| Item::Port(*p)))
        .collect()
}

fn given_back(allocation: &Allocation) -> Vec<Item> {
    allocation
        .released_ips
        .iter()
        .map(|ip| Item::Ip(*ip))
        .chain(allocation.released_ports.iter().map(|p| Item::Port(*p)))
        .collect()
}

impl ServiceRanges {
    /// Ranges over `store` for `allocator`'s CIDRs and ports; nothing is read until used.
    pub(crate) fn new(store: Arc<dyn Store>, allocator: ServiceAllocator) -> Self {
        ServiceRanges {
            store,
            first_ip: allocator.first_ip(),
            cached: tokio::sync::Mutex::new(Cached {
                allocator,
                revisions: Default::default(),
                fresh: false,
            }),
            repair: Mutex::new(Repair::default()),
        }
    }

    /// The first IP of the first range: the `kubernetes` Service's.
    pub(crate) fn first_ip(&self) -> Option<IpAddr> {
        self.first_ip
    }

    /// Rereads every range from the store.
    async fn load(&self, cached: &mut Cached) -> Result<(), StoreError> {
        for id in cached.allocator.range_ids() {
            match self.store.get(&range_key(id)).await? {
                Some(kv) => {
                    let snapshot = RangeSnapshot::from_json(&kv.value).unwrap_or_else(|e| {
                        tracing::error!(key = %kv.key, error = %e, "an unreadable service range: the repair rebuilds it");
                        RangeSnapshot::default()
                    });
                    if !cached.allocator.restore(id, &snapshot) {
                        tracing::warn!(key = %kv.key, stored = %snapshot.range, "the stored service range is of another range: the repair rebuilds it");
                    }
                    cached.revisions.insert(id, kv.mod_revision);
                }
                None => {
                    cached.allocator.restore(id, &RangeSnapshot::default());
                    cached.revisions.remove(&id);
                }
            }
        }
        cached.fresh = true;
        Ok(())
    }

    /// Writes ranges `ids` as cached, each compared on the revision last read. The writes
    /// go to the store together, so a Service's ClusterIP and NodePort ranges cost one commit
    /// of a batching store (SQLite's writer), not one each in turn: the lock that serializes
    /// this server's allocations is held for one round trip. Returns the ranges written,
    /// and the first failure if any write failed (the cache is then reread before use).
    async fn store_ranges(
        &self,
        cached: &mut Cached,
        ids: &BTreeSet<RangeId>,
    ) -> (Vec<RangeId>, Option<StoreError>) {
        let writes = ids.iter().map(|&id| {
            let bytes = Bytes::from(cached.allocator.snapshot(id).to_json().to_string());
            let expected = cached.revisions.get(&id).copied();
            let store = &self.store;
            async move {
                let key = range_key(id);
                let written = match expected {
                    Some(revision) => store.update(&key, bytes, Some(revision)).await,
                    None => store.create(&key, bytes).await,
                };
                (id, written)
            }
        });
        let mut stored = Vec::new();
        let mut failure = None;
        for (id, written) in futures::future::join_all(writes).await {
            match written {
                Ok(revision) => {
                    cached.revisions.insert(id, revision);
                    stored.push(id);
                }
                Err(e) => {
                    cached.fresh = false;
                    failure.get_or_insert(e);
                }
            }
        }
        (stored, failure)
    }

    /// Fills the ClusterIPs and NodePorts of a Service being created (`old == None`) or
    /// updated and records what it took in the store. On success the caller must either
    /// [`commit`](Self::commit) (the Service was written) or [`rollback`](Self::rollback).
    pub(crate) async fn allocate(
        &self,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<Allocation, AllocateError> {
        let mut cached = self.cached.lock().await;
        let mut reread = false;
        for attempt in 0..MAX_ATTEMPTS {
            if !cached.fresh {
                self.load(&mut cached).await.map_err(AllocateError::Store)?;
                reread = true;
            }
            let mut candidate = obj.clone();
            let allocation = match cached.allocator.allocate(&mut candidate, old) {
                Ok(allocation) => allocation,
                // "Already allocated" or "full" from a copy another server may have
                // changed since: decided on a fresh read only.
                Err(_) if !reread => {
                    cached.fresh = false;
                    continue;
                }
                Err(errors) => return Err(AllocateError::Invalid(errors)),
            };
            let items = taken(&allocation);
            let ids = ranges_of(&cached.allocator, &items);
            let (written, failure) = self.store_ranges(&mut cached, &ids).await;
            let Some(error) = failure else {
                *obj = candidate;
                return Ok(allocation);
            };
            cached.allocator.rollback(&allocation);
            // What was stored of this attempt goes back before the next.
            let stored: Vec<Item> = items
                .into_iter()
                .filter(|i| {
                    cached
                        .allocator
                        .range_of(*i)
                        .is_some_and(|r| written.contains(&r))
                })
                .collect();
            if !stored.is_empty() {
                self.release_locked(&mut cached, &stored).await;
            }
            if !lost_race(&error) {
                return Err(AllocateError::Store(error));
            }
            tracing::debug!(error = %error, "a service range changed under this allocation: redone on a fresh read");
            back_off(attempt).await;
        }
        Err(AllocateError::Contended)
    }

    /// A Service's write failed after [`allocate`](Self::allocate): gives back what it took.
    pub(crate) async fn rollback(&self, allocation: &Allocation) {
        self.release(&taken(allocation)).await;
    }

    /// A Service's write succeeded: gives back what the old object had and the new does not.
    pub(crate) async fn commit(&self, allocation: &Allocation) {
        self.release(&given_back(allocation)).await;
    }

    /// Gives back everything `items` lists. Best effort: what cannot be written back is a
    /// leak the repair takes back.
    pub(crate) async fn release(&self, items: &[Item]) {
        if items.is_empty() {
            return;
        }
        let mut cached = self.cached.lock().await;
        self.release_locked(&mut cached, items).await;
    }

    async fn release_locked(&self, cached: &mut Cached, items: &[Item]) {
        'attempts: for attempt in 0..MAX_ATTEMPTS {
            if !cached.fresh
                && let Err(e) = self.load(cached).await
            {
                tracing::warn!(error = %e, ?items, "service ranges unreadable: the release is left to the repair");
                return;
            }
            for item in items {
                cached.allocator.unmark(*item);
            }
            let ids = ranges_of(&cached.allocator, items);
            if let (_, Some(e)) = self.store_ranges(cached, &ids).await {
                if lost_race(&e) {
                    back_off(attempt).await;
                    continue 'attempts;
                }
                tracing::warn!(error = %e, ?items, "a service range could not be written: the release is left to the repair");
            }
            return;
        }
        tracing::warn!(
            ?items,
            "other API servers won every race: the release is left to the repair"
        );
    }

    /// One pass of upstream's repair loop: reads the ranges, then lists the Services, and
    /// writes back ranges that mark exactly what the Services hold (plus allocations no
    /// Service holds yet, for a few passes). Creates the ranges if the store has none. Fails
    /// (to be retried) when another server changed a range meanwhile.
    pub(crate) async fn repair(
        &self,
        reader: &ObjectReader,
        services: &'static ResourceDef,
    ) -> Result<RepairOutcome, ApiError> {
        let mut cached = self.cached.lock().await;
        let q = super::qualified(services, "");
        self.load(&mut cached)
            .await
            .map_err(|e| ApiError::from_store(&q, e))?;
        let listed = reader.list(services, None).await?;
        let outcome = self.repair.lock().run(&cached.allocator, &listed);
        for item in &outcome.missing {
            tracing::warn!(%item, "allocated to a Service but not marked in its range: repairing");
        }
        for item in &outcome.released {
            tracing::warn!(%item, "no Service holds it: released");
        }
        for item in &outcome.duplicates {
            tracing::error!(%item, "held by more than one Service: recreate one of them");
        }
        for item in &outcome.out_of_range {
            tracing::warn!(%item, "a Service holds it outside the configured ranges: recreate the Service");
        }
        let ids: BTreeSet<RangeId> = cached
            .allocator
            .range_ids()
            .into_iter()
            .filter(|id| {
                !cached.revisions.contains_key(id)
                    || outcome.allocator.snapshot(*id) != cached.allocator.snapshot(*id)
            })
            .collect();
        cached.allocator = outcome.allocator.clone();
        if let (_, Some(e)) = self.store_ranges(&mut cached, &ids).await {
            return Err(ApiError::from_store(&q, e));
        }
        Ok(outcome)
    }
}
