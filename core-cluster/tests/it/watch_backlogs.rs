//! What a watch holds for its client, over HTTP: the watch flag read one way by every
//! layer, streams never buffered by the protobuf codec, one encoding of each event shared by
//! every watcher, watchers that stop reading closed and their backlog freed, and a watch
//! from a resourceVersion the store has not reached, each as kube-apiserver behaves.

use std::{sync::Arc, time::Duration};

use axum::{Router, body::Body, http::Request};
use core_cluster::{ApiServer, ApiServerConfig, WatchLimits, store::MemoryStore};
use http_body_util::BodyExt;
use k8s_pb::apimachinery::pkg::{
    apis::meta::v1::{Status, WatchEvent},
    runtime::Unknown,
};
use prost::Message;
use serde_json::{Value, json};
use tower::ServiceExt;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

async fn router_with(config: ApiServerConfig) -> Router {
    ApiServer::new(Arc::new(MemoryStore::new()), config)
        .await
        .expect("the server starts")
        .router()
}

async fn router() -> Router {
    router_with(ApiServerConfig::default()).await
}

/// Opens a watch and returns its response (headers, and the body unread).
async fn open_watch(router: &Router, query: &str, accept: &str) -> axum::response::Response {
    let request = Request::get(format!("{CONFIGMAPS}?{query}"))
        .header("accept", accept)
        .body(Body::empty())
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), router.clone().oneshot(request))
        .await
        .expect("the watch's headers come at once")
        .unwrap()
}

/// Creates a ConfigMap with `size` bytes of data; returns its resourceVersion.
async fn create(router: &Router, name: &str, size: usize) -> u64 {
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": name}, "data": {"k": "x".repeat(size)}});
    let (code, _, bytes) = ccm_testkit::send(
        router,
        "POST",
        CONFIGMAPS,
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&bytes));
    let created: Value = serde_json::from_slice(&bytes).unwrap();
    created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// The value of one series of `/metrics` (0 when absent).
async fn metric(router: &Router, series: &str) -> f64 {
    let (code, _, body) = ccm_testkit::send(router, "GET", "/metrics", &[], Vec::new()).await;
    assert_eq!(code, 200);
    let text = String::from_utf8(body.to_vec()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Reads protobuf watch frames from `body` until `n` arrived: (type, object name or
/// Status message).
async fn protobuf_events(body: &mut Body, n: usize) -> Vec<(String, String)> {
    let mut buffer = Vec::new();
    let mut events = Vec::new();
    while events.len() < n {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("an event in time")
            .expect("the stream is open")
            .expect("the stream is not cut");
        buffer.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d.as_ref()));
        while buffer.len() >= 4 {
            let len = u32::from_be_bytes(buffer[..4].try_into().unwrap()) as usize;
            if buffer.len() < 4 + len {
                break;
            }
            let event = WatchEvent::decode(&buffer[4..4 + len]).expect("a bare WatchEvent");
            buffer.drain(..4 + len);
            let raw = event.object.and_then(|o| o.raw).unwrap_or_default();
            let unknown = Unknown::decode(&raw[4..]).expect("an envelope");
            let inner = unknown.raw.unwrap_or_default();
            let what = match unknown.type_meta.and_then(|t| t.kind).as_deref() {
                Some("Status") => Status::decode(inner.as_slice())
                    .unwrap()
                    .message
                    .unwrap_or_default(),
                _ => k8s_pb::api::core::v1::ConfigMap::decode(inner.as_slice())
                    .unwrap()
                    .metadata
                    .and_then(|m| m.name)
                    .unwrap_or_default(),
            };
            events.push((event.r#type.unwrap_or_default(), what));
        }
    }
    events
}

/// Reads JSON watch lines from `body` until `n` arrived.
async fn json_events(body: &mut Body, n: usize) -> Vec<Value> {
    let mut buffer = Vec::new();
    let mut events = Vec::new();
    while events.len() < n {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("an event in time")
            .expect("the stream is open")
            .expect("the stream is not cut");
        buffer.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d.as_ref()));
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            events.push(serde_json::from_slice(&line).unwrap());
        }
    }
    events
}

/// Upstream reads `watch` as every other boolean list option
/// (`runtime.Convert_Slice_string_To_bool`: anything but "0" and "false" is true), so
/// `watch=True` (the Python client) and `watch=yes` are watches for the handler, the
/// authorizer and the protobuf codec alike: the stream starts at once, framed.
#[tokio::test]
async fn any_true_spelling_of_watch_streams_protobuf_frames_at_once() {
    let router = router().await;
    create(&router, "first", 10).await;
    for flag in ["True", "yes", "1", "true"] {
        let response = open_watch(
            &router,
            &format!("watch={flag}&resourceVersion=0"),
            &format!("{PROTOBUF}, */*"),
        )
        .await;
        assert_eq!(response.status(), 200, "watch={flag}");
        assert_eq!(
            response.headers()["content-type"],
            "application/vnd.kubernetes.protobuf;stream=watch",
            "watch={flag}"
        );
        let mut body = response.into_body();
        let events = protobuf_events(&mut body, 1).await;
        assert_eq!(events, [("ADDED".to_owned(), "first".to_owned())], "{flag}");
    }
    // "false" and "0" are lists, answered whole.
    for flag in ["false", "0", "False"] {
        let (code, headers, _) = ccm_testkit::send(
            &router,
            "GET",
            &format!("{CONFIGMAPS}?watch={flag}"),
            &[("accept", PROTOBUF)],
            Vec::new(),
        )
        .await;
        assert_eq!(
            (code, &headers["content-type"]),
            (200, &PROTOBUF.parse().unwrap())
        );
    }
}

/// The same over TLS on a socket, as the Python client sends it: headers and the first
/// frame arrive, where the codec used to buffer the endless stream.
#[tokio::test]
async fn watch_true_with_protobuf_streams_over_tcp() {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let serving = ccm_testkit::TestServer::start(server).await.unwrap();
    let client = serving.admin_client().await.unwrap();
    let router = serving.api().router();
    create(&router, "over-tcp", 10).await;
    let request = Request::get(format!("{CONFIGMAPS}?watch=True&resourceVersion=0"))
        .header("accept", PROTOBUF)
        .body(Vec::new())
        .unwrap();
    let response =
        tokio::time::timeout(Duration::from_secs(5), client.send(request.map(Into::into)))
            .await
            .expect("headers within 5 s")
            .unwrap();
    assert_eq!(
        response.headers()["content-type"],
        "application/vnd.kubernetes.protobuf;stream=watch"
    );
    let mut body = response.into_body();
    let mut first = Vec::new();
    while first.len() < 4 {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("the first frame within 5 s")
            .expect("open")
            .unwrap();
        first.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d.as_ref()));
    }
    let len = u32::from_be_bytes(first[..4].try_into().unwrap()) as usize;
    assert!(
        len > 10 && len < 10_000,
        "a frame's length prefix, not JSON: {len}"
    );
    drop(body);
    tokio::time::timeout(Duration::from_secs(10), serving.stop())
        .await
        .expect("the server stops")
        .unwrap();
}

/// Upstream's cacher serializes each event once per format and every watcher sends those
/// bytes (`cachingObject`, staging/src/k8s.io/apiserver/pkg/storage/cacher/caching_object.go):
/// ten JSON and ten protobuf watchers cost one JSON and one protobuf encoding per event.
#[tokio::test]
async fn watchers_share_one_encoding_of_each_event_per_format() {
    let router = router().await;
    let rv = create(&router, "before", 10).await;
    let mut json_bodies = Vec::new();
    let mut protobuf_bodies = Vec::new();
    for _ in 0..10 {
        let query = format!("watch=1&resourceVersion={rv}");
        json_bodies.push(
            open_watch(&router, &query, "application/json")
                .await
                .into_body(),
        );
        protobuf_bodies.push(open_watch(&router, &query, PROTOBUF).await.into_body());
    }
    let json_series = "apiserver_watch_event_encodings_total{format=\"json\"}";
    let protobuf_series = "apiserver_watch_event_encodings_total{format=\"protobuf\"}";
    let (json_before, protobuf_before) = (
        metric(&router, json_series).await,
        metric(&router, protobuf_series).await,
    );
    create(&router, "shared", 50_000).await;
    for body in &mut json_bodies {
        let events = json_events(body, 1).await;
        assert_eq!(events[0]["type"], "ADDED");
        assert_eq!(events[0]["object"]["metadata"]["name"], "shared");
        assert_eq!(
            events[0]["object"]["data"]["k"].as_str().unwrap().len(),
            50_000
        );
    }
    for body in &mut protobuf_bodies {
        let events = protobuf_events(body, 1).await;
        assert_eq!(events, [("ADDED".to_owned(), "shared".to_owned())]);
    }
    assert_eq!(metric(&router, json_series).await - json_before, 1.0);
    assert_eq!(
        metric(&router, protobuf_series).await - protobuf_before,
        1.0
    );
}

/// A watcher whose client stops reading is closed once its backlog (100 events, 2 MiB)
/// stays full while a live event waits (upstream's `cacheWatcher.add`: "Forcing ... watcher
/// close due to unresponsiveness", counted in `apiserver_terminated_watchers_total`); what
/// it held is freed at once and its stream is cut. A watcher that reads keeps going.
#[tokio::test(start_paused = true)]
async fn watchers_that_stop_reading_are_closed_and_their_backlog_freed() {
    let router = router().await;
    let rv = create(&router, "start", 10).await;
    let query = format!("watch=1&resourceVersion={rv}");
    let mut stalled = Vec::new();
    for accept in ["application/json", PROTOBUF, "application/json", PROTOBUF] {
        stalled.push(open_watch(&router, &query, accept).await.into_body());
    }
    let mut reader = open_watch(&router, &query, "application/json")
        .await
        .into_body();
    let terminated = "apiserver_terminated_watchers_total{resource=\"configmaps\"}";
    let pending = "apiserver_watch_pending_bytes";
    // 15 objects of 100 KB: within the 2 MiB backlogs, nobody is closed.
    for i in 0..15 {
        create(&router, &format!("a{i}"), 100_000).await;
    }
    assert_eq!(json_events(&mut reader, 15).await.len(), 15);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(metric(&router, terminated).await, 0.0);
    let held = metric(&router, pending).await;
    assert!(
        held > 4.0 * 1_400_000.0,
        "four backlogs of 15 events: {held}"
    );
    // Ten more fill the stalled backlogs; after the grace they are closed.
    for i in 0..10 {
        create(&router, &format!("b{i}"), 100_000).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(metric(&router, terminated).await, 4.0);
    // The reader got every event and is still served; nothing is held any more.
    assert_eq!(json_events(&mut reader, 10).await.len(), 10);
    assert_eq!(metric(&router, pending).await, 0.0);
    create(&router, "after", 10).await;
    let after = json_events(&mut reader, 1).await;
    assert_eq!(after[0]["object"]["metadata"]["name"], "after");
    // A closed watcher's stream is cut: whatever it was handed before, then an error.
    for mut body in stalled {
        let outcome = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match body.frame().await {
                    Some(Ok(_)) => continue,
                    Some(Err(_)) => return true,
                    None => return false,
                }
            }
        })
        .await
        .expect("the stream ends");
        assert!(outcome, "the stream is cut, not ended cleanly");
    }
}

/// All backlogs together are bounded: past `pending_bytes` the watchers holding the most
/// are closed, however many there are.
#[tokio::test(start_paused = true)]
async fn backlogs_together_stay_within_the_budget() {
    let limits = WatchLimits {
        pending_bytes: 1_000_000,
        ..WatchLimits::default()
    };
    let router = router_with(ApiServerConfig {
        watch_limits: limits,
        ..ApiServerConfig::default()
    })
    .await;
    let rv = create(&router, "start", 10).await;
    let query = format!("watch=1&resourceVersion={rv}");
    let mut stalled = Vec::new();
    for _ in 0..8 {
        stalled.push(
            open_watch(&router, &query, "application/json")
                .await
                .into_body(),
        );
    }
    let pending = "apiserver_watch_pending_bytes";
    let mut most = 0.0f64;
    for i in 0..12 {
        create(&router, &format!("c{i}"), 50_000).await;
        // Lets the watches take the event.
        tokio::time::sleep(Duration::from_millis(10)).await;
        most = most.max(metric(&router, pending).await);
    }
    assert!(most <= 1_000_000.0, "{most}");
    let closed = metric(
        &router,
        "apiserver_terminated_watchers_total{resource=\"configmaps\"}",
    )
    .await;
    // 8 watchers × 12 events × 50 KB would be 4.8 MB.
    assert!(closed >= 6.0, "{closed} closed");
    drop(stalled);
    assert_eq!(metric(&router, pending).await, 0.0);
}

/// A watch from a resourceVersion the store has not reached, as upstream's cacher answers
/// it (`Cacher.Watch`): with `sendInitialEvents` it waits up to 3 s for the store
/// (`waitUntilWatchCacheFreshAndForceAllEvents`, `watchCache.waitUntilFreshAndBlock`), then
/// the stream is one ERROR event, 504 "Too large resource version" with a
/// `ResourceVersionTooLarge` cause; without it the watch is established at once and sends
/// the events newer than the version once they come.
#[tokio::test(start_paused = true)]
async fn a_watch_from_a_future_resource_version_is_answered_as_upstream() {
    let router = router().await;
    let current = create(&router, "now", 10).await;
    let future = current + 50;
    let started = tokio::time::Instant::now();
    let response = open_watch(
        &router,
        &format!(
            "watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion={future}"
        ),
        "application/json",
    )
    .await;
    assert_eq!(response.status(), 200);
    let waited = started.elapsed();
    assert!(
        (Duration::from_secs(3)..Duration::from_secs(4)).contains(&waited),
        "{waited:?}"
    );
    let mut body = response.into_body();
    let events = json_events(&mut body, 1).await;
    let status = &events[0]["object"];
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(status["code"], 504);
    assert_eq!(status["reason"], "Timeout");
    assert_eq!(
        status["message"],
        format!("Too large resource version: {future}, current: {current}")
    );
    assert_eq!(
        status["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
    assert_eq!(status["details"]["retryAfterSeconds"], 1);
    assert!(
        body.frame().await.is_none(),
        "the stream ends after the error"
    );

    // Without sendInitialEvents: established at once, events above the version only.
    let started = tokio::time::Instant::now();
    let response = open_watch(
        &router,
        &format!("watch=1&resourceVersion={}", current + 2),
        "application/json",
    )
    .await;
    assert_eq!(response.status(), 200);
    assert!(started.elapsed() < Duration::from_millis(100));
    let mut body = response.into_body();
    create(&router, "skipped-1", 10).await;
    create(&router, "skipped-2", 10).await;
    create(&router, "sent", 10).await;
    let events = json_events(&mut body, 1).await;
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "sent");
}
