//! The store conformance suite: the same cases against every backend.
//!
//! Each case is an `async fn(Open)` where `Open` builds a fresh, empty store with a given
//! watch configuration; the `conformance!` macro at the bottom instantiates every case
//! once per backend.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ccm_testkit::etcd::Etcd;
use core_cluster::store::{
    EtcdOptions, EtcdStore, EventKind, KeyValue, MemoryStore, SqliteOptions, SqliteStore, Store,
    StoreError, WatchConfig, WatchEvent, WatchStream,
};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use tempfile::TempDir;

/// A store under test and whatever must live as long as it.
struct Fixture {
    store: Arc<dyn Store>,
    /// The revision of the empty store: 0 for ours, 1 for etcd (an empty etcd is at
    /// revision 1 and its first write is at 2).
    base: u64,
    _dir: Option<TempDir>,
    _etcd: Option<Etcd>,
}

type Open = fn(WatchConfig) -> BoxFuture<'static, Fixture>;

fn open_memory(config: WatchConfig) -> BoxFuture<'static, Fixture> {
    Box::pin(async move {
        Fixture {
            store: Arc::new(MemoryStore::with_watch_config(config)),
            base: 0,
            _dir: None,
            _etcd: None,
        }
    })
}

fn open_sqlite(config: WatchConfig) -> BoxFuture<'static, Fixture> {
    Box::pin(async move {
        let dir = tempfile::tempdir().expect("temp dir");
        let options = SqliteOptions {
            watch: config,
            ..SqliteOptions::default()
        };
        let store = SqliteStore::open(dir.path(), options)
            .await
            .expect("open sqlite store");
        Fixture {
            store: Arc::new(store),
            base: 0,
            _dir: Some(dir),
            _etcd: None,
        }
    })
}

/// A fresh single-member etcd on free loopback ports with its own data directory, and the
/// store on it (upstream's `etcd3/store.go` semantics).
fn open_etcd(config: WatchConfig) -> BoxFuture<'static, Fixture> {
    Box::pin(async move {
        let etcd = Etcd::start().await;
        let options = EtcdOptions {
            endpoints: etcd.endpoints(),
            watch: config,
            ..EtcdOptions::default()
        };
        let store = EtcdStore::connect(options)
            .await
            .expect("connect to the test etcd");
        Fixture {
            store: Arc::new(store),
            base: 1,
            _dir: None,
            _etcd: Some(etcd),
        }
    })
}

fn v(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn keys(items: &[KeyValue]) -> Vec<&str> {
    items.iter().map(|kv| kv.key.as_str()).collect()
}

async fn next(stream: &mut WatchStream) -> Option<Result<WatchEvent, StoreError>> {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("watch stream stalled for 10s")
}

async fn next_event(stream: &mut WatchStream) -> WatchEvent {
    match next(stream).await {
        Some(Ok(event)) => event,
        other => panic!("expected an event, got {other:?}"),
    }
}

/// Asserts that nothing more arrives within a short while.
async fn assert_quiet(stream: &mut WatchStream) {
    if let Ok(item) = tokio::time::timeout(Duration::from_millis(200), stream.next()).await {
        panic!("expected no event, got {item:?}");
    }
}

async fn crud_semantics(open: Open) {
    let f = open(WatchConfig::default()).await;
    let s = &f.store;
    assert_eq!(s.current_revision().await.unwrap(), f.base);
    assert_eq!(s.get("/registry/pods/ns/a").await.unwrap(), None);

    let r1 = s.create("/registry/pods/ns/a", v("one")).await.unwrap();
    assert_eq!(r1, f.base + 1);
    let kv = s.get("/registry/pods/ns/a").await.unwrap().unwrap();
    assert_eq!(
        kv,
        KeyValue {
            key: "/registry/pods/ns/a".into(),
            value: v("one"),
            create_revision: r1,
            mod_revision: r1,
        }
    );
    assert!(matches!(
        s.create("/registry/pods/ns/a", v("again")).await,
        Err(StoreError::AlreadyExists { key }) if key == "/registry/pods/ns/a"
    ));

    let r2 = s
        .update("/registry/pods/ns/a", v("two"), None)
        .await
        .unwrap();
    assert_eq!(r2, r1 + 1, "a failed create must not consume a revision");
    let kv = s.get("/registry/pods/ns/a").await.unwrap().unwrap();
    assert_eq!(
        (kv.value, kv.create_revision, kv.mod_revision),
        (v("two"), r1, r2)
    );

    assert!(matches!(
        s.update("/registry/pods/ns/missing", v("x"), None).await,
        Err(StoreError::NotFound { key }) if key == "/registry/pods/ns/missing"
    ));
    assert!(matches!(
        s.update("/registry/pods/ns/missing", v("x"), Some(1)).await,
        Err(StoreError::NotFound { .. })
    ));

    let (r3, prev) = s.delete("/registry/pods/ns/a", None).await.unwrap();
    assert_eq!(r3, r2 + 1);
    assert_eq!(
        (prev.value, prev.create_revision, prev.mod_revision),
        (v("two"), r1, r2)
    );
    assert_eq!(s.get("/registry/pods/ns/a").await.unwrap(), None);
    assert!(matches!(
        s.delete("/registry/pods/ns/a", None).await,
        Err(StoreError::NotFound { .. })
    ));
    assert!(matches!(
        s.update("/registry/pods/ns/a", v("x"), None).await,
        Err(StoreError::NotFound { .. })
    ));

    // A re-created key is a new incarnation.
    let r4 = s.create("/registry/pods/ns/a", v("new")).await.unwrap();
    assert_eq!(r4, r3 + 1);
    let kv = s.get("/registry/pods/ns/a").await.unwrap().unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision), (r4, r4));
    assert_eq!(s.current_revision().await.unwrap(), r4);

    // Empty values are values.
    let r5 = s.create("/registry/empty", Bytes::new()).await.unwrap();
    assert_eq!(
        s.get("/registry/empty")
            .await
            .unwrap()
            .unwrap()
            .mod_revision,
        r5
    );
}

async fn optimistic_concurrency(open: Open) {
    let f = open(WatchConfig::default()).await;
    let s = &f.store;
    let r1 = s.create("/k", v("1")).await.unwrap();
    let r2 = s.update("/k", v("2"), Some(r1)).await.unwrap();

    match s.update("/k", v("stale"), Some(r1)).await {
        Err(StoreError::Conflict {
            key,
            expected,
            actual,
        }) => assert_eq!((key.as_str(), expected, actual), ("/k", r1, r2)),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(s.get("/k").await.unwrap().unwrap().value, v("2"));
    assert_eq!(
        s.current_revision().await.unwrap(),
        r2,
        "a conflict writes nothing"
    );

    match s.delete("/k", Some(r1)).await {
        Err(StoreError::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (r1, r2)),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(s.get("/k").await.unwrap().is_some());

    let r3 = s.update("/k", v("3"), Some(r2)).await.unwrap();
    let (r4, prev) = s.delete("/k", Some(r3)).await.unwrap();
    assert_eq!((prev.mod_revision, prev.value), (r3, v("3")));
    assert_eq!(r4, r3 + 1);
}

async fn revisions_are_global_and_increasing(open: Open) {
    let f = open(WatchConfig::default()).await;
    let s = &f.store;
    let mut revisions = Vec::new();
    for i in 0..10 {
        revisions.push(s.create(&format!("/a/{i}"), v("x")).await.unwrap());
        revisions.push(s.create(&format!("/b/{i}"), v("x")).await.unwrap());
        revisions.push(s.update(&format!("/a/{i}"), v("y"), None).await.unwrap());
    }
    revisions.push(s.delete("/b/3", None).await.unwrap().0);
    let expected: Vec<u64> = (f.base + 1..=f.base + revisions.len() as u64).collect();
    assert_eq!(
        revisions, expected,
        "one revision per write, shared by all keys"
    );
    assert_eq!(
        s.current_revision().await.unwrap(),
        f.base + revisions.len() as u64
    );
}

async fn list_prefix_and_pagination(open: Open) {
    let f = open(WatchConfig::default()).await;
    let s = &f.store;
    for name in ["c", "a", "e", "b", "d"] {
        s.create(&format!("/registry/pods/ns/{name}"), v(name))
            .await
            .unwrap();
    }
    s.create("/registry/podsx/ns/a", v("other")).await.unwrap();
    s.create("/registry/pods", v("bare")).await.unwrap();
    s.create("/registry/pod/ns/a", v("other")).await.unwrap();
    s.create("/registry/pods/ns/gone", v("x")).await.unwrap();
    s.delete("/registry/pods/ns/gone", None).await.unwrap();

    let all = s.list("/registry/pods/", None, None, None).await.unwrap();
    assert_eq!(
        keys(&all.items),
        [
            "/registry/pods/ns/a",
            "/registry/pods/ns/b",
            "/registry/pods/ns/c",
            "/registry/pods/ns/d",
            "/registry/pods/ns/e"
        ]
    );
    assert!(!all.more);
    assert_eq!(all.revision, s.current_revision().await.unwrap());
    assert_eq!(all.items[2].value, v("c"));
    assert_eq!(
        s.list("/registry/pods/", None, Some(0), None)
            .await
            .unwrap()
            .items
            .len(),
        5,
        "limit 0 means no limit"
    );
    assert_eq!(
        s.list("", None, None, None).await.unwrap().items.len(),
        8,
        "the empty prefix matches everything live"
    );

    // Page through with limit 2 while writes go on: every page shows the first one's
    // snapshot.
    let page1 = s
        .list("/registry/pods/", None, Some(2), None)
        .await
        .unwrap();
    assert_eq!(
        keys(&page1.items),
        ["/registry/pods/ns/a", "/registry/pods/ns/b"]
    );
    assert!(page1.more);
    let at = page1.revision;

    s.update("/registry/pods/ns/c", v("c2"), None)
        .await
        .unwrap();
    s.create("/registry/pods/ns/bb", v("bb")).await.unwrap();
    s.delete("/registry/pods/ns/d", None).await.unwrap();
    s.create("/registry/pods/ns/f", v("f")).await.unwrap();

    let page2 = s
        .list(
            "/registry/pods/",
            Some("/registry/pods/ns/b"),
            Some(2),
            Some(at),
        )
        .await
        .unwrap();
    assert_eq!(page2.revision, at);
    assert_eq!(
        keys(&page2.items),
        ["/registry/pods/ns/c", "/registry/pods/ns/d"]
    );
    assert_eq!(
        page2.items[0].value,
        v("c"),
        "old value at the old revision"
    );
    assert!(page2.more);
    let page3 = s
        .list(
            "/registry/pods/",
            Some("/registry/pods/ns/d"),
            Some(2),
            Some(at),
        )
        .await
        .unwrap();
    assert_eq!(keys(&page3.items), ["/registry/pods/ns/e"]);
    assert!(!page3.more);

    // The current view has the new state.
    let now = s.list("/registry/pods/", None, None, None).await.unwrap();
    assert_eq!(
        keys(&now.items),
        [
            "/registry/pods/ns/a",
            "/registry/pods/ns/b",
            "/registry/pods/ns/bb",
            "/registry/pods/ns/c",
            "/registry/pods/ns/e",
            "/registry/pods/ns/f"
        ]
    );
    assert_eq!(now.items[3].value, v("c2"));
    assert_eq!(now.revision, at + 4);

    // An exact page boundary still reports whether more follow.
    let exact = s
        .list(
            "/registry/pods/",
            Some("/registry/pods/ns/c"),
            Some(2),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        keys(&exact.items),
        ["/registry/pods/ns/e", "/registry/pods/ns/f"]
    );
    assert!(!exact.more);
}

async fn list_revision_errors(open: Open) {
    let f = open(WatchConfig::default()).await;
    let s = &f.store;
    let r1 = s.create("/a", v("1")).await.unwrap();
    let r2 = s.update("/a", v("2"), None).await.unwrap();
    let r3 = s.update("/a", v("3"), None).await.unwrap();
    assert!(matches!(
        s.list("/", None, None, Some(r3 + 1)).await,
        Err(StoreError::FutureRevision { requested, current }) if requested == r3 + 1 && current == r3
    ));
    assert_eq!(
        s.list("/", None, None, Some(r1)).await.unwrap().items[0].value,
        v("1")
    );

    s.compact(r2).await.unwrap();
    match s.list("/", None, None, Some(r1)).await {
        Err(StoreError::Expired {
            requested,
            oldest_available,
        }) => assert_eq!((requested, oldest_available), (r1, r2)),
        other => panic!("expected Expired, got {other:?}"),
    }
    let at_r2 = s.list("/", None, None, Some(r2)).await.unwrap();
    assert_eq!(
        at_r2.items[0].value,
        v("2"),
        "the compaction revision stays readable"
    );
    assert_eq!(s.get("/a").await.unwrap().unwrap().value, v("3"));
    // Compacting again at or below is a no-op; above the current revision is an error.
    s.compact(r1).await.unwrap();
    assert!(matches!(
        s.compact(r3 + 5).await,
        Err(StoreError::FutureRevision { .. })
    ));
}

async fn watch_replays_then_goes_live(open: Open) {
    let f = open(WatchConfig::default()).await;
    let s = &f.store;
    let r1 = s.create("/registry/pods/ns/a", v("a1")).await.unwrap();
    let r2 = s.create("/registry/podsx/ns/a", v("x")).await.unwrap();
    let r3 = s
        .update("/registry/pods/ns/a", v("a2"), None)
        .await
        .unwrap();
    let r4 = s.create("/registry/pods/ns/b", v("b1")).await.unwrap();
    let r5 = s.delete("/registry/pods/ns/a", None).await.unwrap().0;
    assert!(r1 < r2);

    // From r1: r1 itself is excluded, /registry/podsx/ is filtered out.
    let mut w = s.watch("/registry/pods/", r1).await.unwrap();
    let e = next_event(&mut w).await;
    assert_eq!(
        (e.kind, e.key.as_str(), e.revision, e.is_create()),
        (EventKind::Put, "/registry/pods/ns/a", r3, false)
    );
    assert_eq!(e.value, Some(v("a2")));
    assert_eq!(e.create_revision, r1);
    let prev = e
        .prev_value
        .expect("a modification carries the previous value");
    assert_eq!((prev.value, prev.mod_revision), (v("a1"), r1));

    let e = next_event(&mut w).await;
    assert_eq!(
        (e.kind, e.revision, e.is_create()),
        (EventKind::Put, r4, true)
    );
    assert_eq!(e.prev_value, None);
    assert_eq!(e.kv().unwrap().mod_revision, r4);

    let e = next_event(&mut w).await;
    assert_eq!(
        (e.kind, e.key.as_str(), e.revision),
        (EventKind::Delete, "/registry/pods/ns/a", r5)
    );
    assert_eq!(e.value, None);
    assert_eq!(e.prev_value.map(|p| p.value), Some(v("a2")));
    assert_quiet(&mut w).await;

    // Live.
    s.create("/registry/podsx/ns/b", v("ignored"))
        .await
        .unwrap();
    let r7 = s
        .update("/registry/pods/ns/b", v("b2"), None)
        .await
        .unwrap();
    let e = next_event(&mut w).await;
    assert_eq!((e.revision, e.value), (r7, Some(v("b2"))));
    assert_quiet(&mut w).await;

    // A watch from the current revision sees only what comes next; one from the
    // future sees only events after that revision.
    let mut now = s.watch("/registry/", r7).await.unwrap();
    let mut future = s.watch("/registry/", r7 + 1).await.unwrap();
    let r8 = s.create("/registry/pods/ns/c", v("c")).await.unwrap();
    let r9 = s.create("/registry/pods/ns/d", v("d")).await.unwrap();
    assert_eq!(next_event(&mut now).await.revision, r8);
    assert_eq!(next_event(&mut now).await.revision, r9);
    assert_eq!(next_event(&mut future).await.revision, r9);
}

async fn watch_too_old_is_expired(open: Open) {
    let f = open(WatchConfig {
        window_capacity: 16,
        watcher_buffer: 64,
        ..WatchConfig::default()
    })
    .await;
    let s = &f.store;
    for i in 0..40 {
        s.create(&format!("/k/{i}"), v("x")).await.unwrap();
    }
    let b = f.base;
    match s.watch("/k/", b).await {
        Err(StoreError::Expired {
            requested,
            oldest_available,
        }) => assert_eq!((requested, oldest_available), (b, b + 24)),
        Err(other) => panic!("expected Expired, got {other:?}"),
        Ok(_) => panic!("expected Expired, got a stream"),
    }
    let mut w = s.watch("/k/", b + 24).await.unwrap();
    for want in b + 25..=b + 40 {
        assert_eq!(next_event(&mut w).await.revision, want);
    }
    assert_quiet(&mut w).await;

    // Compaction raises the floor even while the window still holds the events.
    s.compact(b + 30).await.unwrap();
    match s.watch("/k/", b + 29).await {
        Err(StoreError::Expired {
            requested,
            oldest_available,
        }) => assert_eq!((requested, oldest_available), (b + 29, b + 30)),
        Err(other) => panic!("expected Expired, got {other:?}"),
        Ok(_) => panic!("expected Expired, got a stream"),
    }
    let mut w = s.watch("/k/", b + 30).await.unwrap();
    assert_eq!(next_event(&mut w).await.revision, b + 31);
}

async fn slow_watcher_is_ended(open: Open) {
    let f = open(WatchConfig {
        window_capacity: 1_000,
        watcher_buffer: 4,
        ..WatchConfig::default()
    })
    .await;
    let s = &f.store;
    let base = s.current_revision().await.unwrap();
    let mut slow = s.watch("/k/", base).await.unwrap();
    for i in 0..20 {
        s.create(&format!("/k/{i}"), v("x")).await.unwrap();
    }
    // The buffered events come first, in order, then the error, then the end.
    let mut last = base;
    for _ in 0..4 {
        let e = next_event(&mut slow).await;
        assert_eq!(e.revision, last + 1, "no event may be skipped");
        last = e.revision;
    }
    assert!(
        matches!(
            next(&mut slow).await,
            Some(Err(StoreError::WatcherLagged { buffer: 4 }))
        ),
        "a watcher that fell behind must be told"
    );
    assert!(next(&mut slow).await.is_none(), "and its stream ends");

    // The client re-watches from the last revision it saw and gets the rest.
    let mut again = s.watch("/k/", last).await.unwrap();
    for want in last + 1..=base + 20 {
        assert_eq!(next_event(&mut again).await.revision, want);
    }
    // The store keeps working for everyone else.
    let r = s.create("/k/after", v("x")).await.unwrap();
    assert_eq!(next_event(&mut again).await.revision, r);
}

async fn concurrent_writers_get_distinct_revisions(open: Open) {
    const TASKS: usize = 64;
    const PER_TASK: usize = 8;
    let f = open(WatchConfig::default()).await;
    let s = f.store.clone();
    let base = s.current_revision().await.unwrap();
    let mut watch = s.watch("/c/", base).await.unwrap();
    let mut handles = Vec::new();
    for t in 0..TASKS {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            for i in 0..PER_TASK {
                let key = format!("/c/{t:02}/{i}");
                revisions.push(s.create(&key, v("x")).await.expect("create"));
                if i % 2 == 1 {
                    revisions.push(s.update(&key, v("y"), None).await.expect("update"));
                }
            }
            revisions
        }));
    }
    let mut all = Vec::new();
    for handle in handles {
        all.extend(handle.await.unwrap());
    }
    let total = TASKS * (PER_TASK + PER_TASK / 2);
    assert_eq!(all.len(), total);
    let distinct: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(distinct.len(), total, "every write gets its own revision");
    assert_eq!(
        distinct,
        (base + 1..=base + total as u64).collect::<BTreeSet<_>>(),
        "and revisions have no gaps"
    );
    assert_eq!(s.current_revision().await.unwrap(), base + total as u64);
    let listed = s.list("/c/", None, None, None).await.unwrap();
    assert_eq!(listed.items.len(), TASKS * PER_TASK);
    // A watcher sees every one of them, in revision order.
    for want in base + 1..=base + total as u64 {
        assert_eq!(next_event(&mut watch).await.revision, want);
    }
}

async fn concurrent_compare_and_swap_has_one_winner(open: Open) {
    let f = open(WatchConfig::default()).await;
    let s = f.store.clone();
    let r0 = s.create("/cas", v("0")).await.unwrap();
    let handles: Vec<_> = (0..64)
        .map(|t| {
            let s = s.clone();
            tokio::spawn(async move { s.update("/cas", v(&format!("{t}")), Some(r0)).await })
        })
        .collect();
    let mut winners = Vec::new();
    let mut conflicts = 0;
    for handle in handles {
        match handle.await.unwrap() {
            Ok(revision) => winners.push(revision),
            Err(StoreError::Conflict {
                expected, actual, ..
            }) => {
                assert_eq!(expected, r0);
                assert_eq!(actual, r0 + 1);
                conflicts += 1;
            }
            Err(other) => panic!("unexpected error {other}"),
        }
    }
    assert_eq!(winners, vec![r0 + 1], "exactly one update wins");
    assert_eq!(conflicts, 63);
    assert_eq!(s.current_revision().await.unwrap(), r0 + 1);
}

/// The window and a watcher's buffer are bounded by bytes as well as by events: large
/// values push the window's floor up long before its event count is reached, and a slow
/// watcher of large values is ended long before its event count is reached.
async fn watch_memory_is_bounded_by_bytes(open: Open) {
    let f = open(WatchConfig {
        window_capacity: 10_000,
        window_bytes: 256 * 1024,
        watcher_buffer: 1_000,
        watcher_buffer_bytes: 64 * 1024,
    })
    .await;
    let s = &f.store;
    let base = s.current_revision().await.unwrap();
    let mut slow = s.watch("/k/", base).await.unwrap();
    let large = Bytes::from(vec![b'x'; 16 * 1024]);
    for i in 0..40 {
        s.create(&format!("/k/{i}"), large.clone()).await.unwrap();
    }
    let last = base + 40;
    // About 15 of the 40 events fit in 256 KiB: older watches are refused...
    let oldest = match s.watch("/k/", base).await {
        Err(StoreError::Expired {
            requested,
            oldest_available,
        }) => {
            assert_eq!(requested, base);
            oldest_available
        }
        Err(other) => panic!("expected Expired, got {other:?}"),
        Ok(_) => panic!("the window kept 40 large events past its byte bound"),
    };
    assert!(
        (last - 16..=last - 10).contains(&oldest),
        "oldest {oldest}, last {last}"
    );
    // ...and the ones it still covers replay exactly.
    let mut w = s.watch("/k/", oldest).await.unwrap();
    for want in oldest + 1..=last {
        assert_eq!(next_event(&mut w).await.revision, want);
    }
    // The slow watcher held about 64 KiB (3 events), then was told it fell behind.
    let mut got = 0;
    loop {
        match next(&mut slow).await {
            Some(Ok(e)) => {
                got += 1;
                assert_eq!(e.revision, base + got, "no event may be skipped");
            }
            Some(Err(StoreError::WatcherLagged { .. })) => break,
            other => panic!("expected WatcherLagged, got {other:?}"),
        }
    }
    assert!((1..=4).contains(&got), "{got} events buffered");
    assert!(next(&mut slow).await.is_none());
}

/// Once `current_revision` returns a revision, every event up to it is ready in the
/// matching watch streams (what makes it a safe bookmark, like etcd's progress notify),
/// and a serving store reports itself healthy.
async fn current_revision_is_a_safe_bookmark_and_health_is_ok(open: Open) {
    let f = open(WatchConfig::default()).await;
    let s = &f.store;
    s.health().await.expect("a fresh store is healthy");
    let base = s.current_revision().await.unwrap();
    let mut w = s.watch("/k/", base).await.unwrap();
    let writes = (0..32).map(|i| {
        let s = s.clone();
        async move { s.create(&format!("/k/{i}"), v("x")).await.unwrap() }
    });
    futures::future::join_all(writes).await;
    s.create("/other/x", v("x")).await.unwrap();
    let current = s.current_revision().await.unwrap();
    assert_eq!(current, base + 33);
    // Without waiting: every event up to `current` is already in the stream.
    let mut seen = Vec::new();
    while let Some(item) = tokio::task::coop::unconstrained(w.next()).now_or_never() {
        seen.push(item.expect("the stream goes on").unwrap().revision);
    }
    assert_eq!(seen, (base + 1..=base + 32).collect::<Vec<_>>());
    s.health().await.expect("still healthy");
}

macro_rules! conformance {
    ($backend:ident, $open:expr) => {
        mod $backend {
            conformance!(@cases $open;
                crud_semantics,
                optimistic_concurrency,
                revisions_are_global_and_increasing,
                list_prefix_and_pagination,
                list_revision_errors,
                watch_replays_then_goes_live,
                watch_too_old_is_expired,
                slow_watcher_is_ended,
                concurrent_writers_get_distinct_revisions,
                concurrent_compare_and_swap_has_one_winner,
                watch_memory_is_bounded_by_bytes,
                current_revision_is_a_safe_bookmark_and_health_is_ok,
            );
        }
    };
    (@cases $open:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case($open).await;
            }
        )*
    };
}

conformance!(memory, super::open_memory);
conformance!(sqlite, super::open_sqlite);
conformance!(etcd, super::open_etcd);
