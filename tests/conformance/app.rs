//! The cloud-controller-manager application against the in-process API server: leader
//! election on a Lease (client-go's `tools/leaderelection` semantics), with paused time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ccm_testkit::client;
use cloud_provider_app::{LeaderElectionConfig, LeaderElector, LeaderError};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{PostParams, WatchEvent, WatchParams};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

const NS: &str = "kube-system";
const NAME: &str = "cloud-controller-manager";

fn config(identity: &str) -> LeaderElectionConfig {
    LeaderElectionConfig::new(NS, NAME).with_identity(identity)
}

async fn lease(client: &kube::Client) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), NS)
        .get_opt(NAME)
        .await
        .expect("lease GET")
}

fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

/// Leads until its token is cancelled, counting the leaders alive at once.
struct Candidate {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), LeaderError>>,
    started: Arc<parking_lot::Mutex<Option<Instant>>>,
    cancelled: Arc<parking_lot::Mutex<bool>>,
}

fn spawn(
    client: &kube::Client,
    identity: &str,
    leaders: Arc<AtomicUsize>,
    max_leaders: Arc<AtomicUsize>,
) -> Candidate {
    spawn_with(client, identity, false, leaders, max_leaders)
}

fn spawn_with(
    client: &kube::Client,
    identity: &str,
    release_on_cancel: bool,
    leaders: Arc<AtomicUsize>,
    max_leaders: Arc<AtomicUsize>,
) -> Candidate {
    let shutdown = CancellationToken::new();
    let started = Arc::new(parking_lot::Mutex::new(None));
    let cancelled = Arc::new(parking_lot::Mutex::new(false));
    let elector = LeaderElector::new(client.clone(), config(identity))
        .with_shutdown(shutdown.clone())
        .with_release_on_cancel(release_on_cancel);
    let (started2, cancelled2) = (started.clone(), cancelled.clone());
    let task = tokio::spawn(elector.run(move |token| async move {
        *started2.lock() = Some(Instant::now());
        let now = leaders.fetch_add(1, Ordering::SeqCst) + 1;
        max_leaders.fetch_max(now, Ordering::SeqCst);
        token.cancelled().await;
        leaders.fetch_sub(1, Ordering::SeqCst);
        *cancelled2.lock() = true;
        Ok::<(), String>(())
    }));
    Candidate {
        shutdown,
        task,
        started,
        cancelled,
    }
}

/// A single candidate creates the Lease and leads.
#[tokio::test(start_paused = true)]
async fn single_candidate_acquires() {
    let client = client().await;
    let counters = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = spawn(&client, "a", counters.0.clone(), counters.1.clone());
    sleep(Duration::from_secs(1)).await;
    assert!(
        a.started.lock().is_some(),
        "the only candidate leads at once"
    );
    let first = lease(&client).await.expect("the lease is created");
    assert_eq!(holder(&first), Some("a"));
    let spec = first.spec.clone().unwrap();
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(0));
    // It keeps renewing: renewTime moves, acquireTime does not.
    sleep(Duration::from_secs(30)).await;
    let later = lease(&client).await.unwrap().spec.unwrap();
    assert_eq!(later.holder_identity.as_deref(), Some("a"));
    assert_ne!(later.renew_time, spec.renew_time, "renewed");
    assert_eq!(later.acquire_time, spec.acquire_time);
    assert_eq!(later.lease_transitions, Some(0));
    a.shutdown.cancel();
    assert!(a.task.await.unwrap().is_ok(), "shutdown is not an error");
}

/// A standby takes over within the lease duration after the leader stops renewing, and
/// `leaseTransitions` counts the takeover.
#[tokio::test(start_paused = true)]
async fn standby_takes_over_after_the_lease_expires() {
    let client = client().await;
    let (leaders, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = spawn(&client, "a", leaders.clone(), max.clone());
    sleep(Duration::from_secs(1)).await;
    let b = spawn(&client, "b", leaders.clone(), max.clone());
    sleep(Duration::from_secs(60)).await;
    assert!(
        b.started.lock().is_none(),
        "no takeover while the leader renews"
    );
    a.shutdown.cancel();
    let stopped = Instant::now();
    assert!(a.task.await.unwrap().is_ok());
    // The Lease is not released on shutdown (as upstream's CCM).
    assert_eq!(holder(&lease(&client).await.unwrap()), Some("a"));
    sleep(Duration::from_secs(30)).await;
    let took_over = b.started.lock().expect("the standby took over");
    let after = took_over - stopped;
    // Not before the lease expired (the standby last saw a renewal at most one retry period
    // before the stop), and within the lease duration plus one retry period.
    assert!(
        after >= Duration::from_secs(13),
        "took over too early: {after:?}"
    );
    assert!(
        after <= Duration::from_secs(17),
        "took over too late: {after:?}"
    );
    let spec = lease(&client).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_transitions, Some(1));
    assert_eq!(max.load(Ordering::SeqCst), 1);
    b.shutdown.cancel();
    b.task.await.unwrap().unwrap();
}

/// client-go's `ReleaseOnCancel` (`tools/leaderelection/leaderelection.go` `release`): a
/// leader shut down gracefully, once its work has returned, writes the Lease with an empty
/// holder, `leaseDurationSeconds: 1` and renew and acquire times of now, keeping
/// `leaseTransitions`; the standby then takes over at its next retry (2 s), not after the
/// 15 s lease.
#[tokio::test(start_paused = true)]
async fn a_leader_releasing_on_cancel_hands_over_at_the_standbys_next_retry() {
    let client = client().await;
    let (leaders, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = spawn_with(&client, "a", true, leaders.clone(), max.clone());
    sleep(Duration::from_secs(1)).await;
    let b = spawn_with(&client, "b", true, leaders.clone(), max.clone());
    sleep(Duration::from_secs(30)).await;
    assert!(b.started.lock().is_none(), "no takeover while a leads");
    let held = lease(&client).await.unwrap();
    // Every write to the Lease from here on, to see the released record whoever is faster.
    let api = Api::<Lease>::namespaced(client.clone(), NS);
    let version = held.metadata.resource_version.clone().unwrap();
    let mut writes = api
        .watch(&WatchParams::default(), &version)
        .await
        .unwrap()
        .boxed();
    let held = held.spec.unwrap();
    assert_eq!(held.holder_identity.as_deref(), Some("a"));

    a.shutdown.cancel();
    let stopped = Instant::now();
    assert!(a.task.await.unwrap().is_ok(), "shutdown is not an error");
    assert!(*a.cancelled.lock(), "a's work returned before the release");
    sleep(Duration::from_secs(5)).await;
    let took_over = b.started.lock().expect("the standby took over");
    let after = took_over - stopped;
    assert!(
        after <= Duration::from_secs(2),
        "took over after {after:?}: one retry period at most"
    );
    // The first write not by a renewing `a` is a's release.
    let released = loop {
        let event = tokio::time::timeout(Duration::from_secs(5), writes.next())
            .await
            .expect("a write to the Lease")
            .expect("the watch goes on")
            .unwrap();
        let WatchEvent::Modified(lease) = event else {
            panic!("{event:?}");
        };
        let spec = lease.spec.unwrap();
        if spec.holder_identity.as_deref() != Some("a") {
            break spec;
        }
    };
    assert_eq!(
        released.holder_identity.as_deref(),
        Some(""),
        "{released:?}"
    );
    assert_eq!(released.lease_duration_seconds, Some(1));
    assert_eq!(released.lease_transitions, held.lease_transitions);
    assert_ne!(released.renew_time, held.renew_time, "renew time is now");
    assert_eq!(released.acquire_time, released.renew_time);
    let spec = lease(&client).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("b"));
    assert_eq!(spec.lease_duration_seconds, Some(15), "b's own duration");
    assert_eq!(spec.lease_transitions, Some(1));
    assert_eq!(max.load(Ordering::SeqCst), 1, "never two leaders at once");
    b.shutdown.cancel();
    b.task.await.unwrap().unwrap();
    let last = lease(&client).await.unwrap().spec.unwrap();
    assert_eq!(last.holder_identity.as_deref(), Some(""), "b released too");
}

/// A leader whose Lease is taken by force cannot renew: it steps down within the renew
/// deadline, its token is cancelled, and `run` reports the loss (the app exits 1).
#[tokio::test(start_paused = true)]
async fn leader_that_cannot_renew_steps_down() {
    let client = client().await;
    let (leaders, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let a = spawn(&client, "a", leaders.clone(), max.clone());
    sleep(Duration::from_secs(5)).await;
    assert_eq!(leaders.load(Ordering::SeqCst), 1);
    // An intruder takes the Lease and keeps renewing it.
    let api = Api::<Lease>::namespaced(client.clone(), NS);
    let intruder = tokio::spawn({
        let api = api.clone();
        async move {
            loop {
                let mut lease = api.get(NAME).await.unwrap();
                let spec = lease.spec.as_mut().unwrap();
                spec.holder_identity = Some("intruder".into());
                spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
                let _ = api.replace(NAME, &PostParams::default(), &lease).await;
                sleep(Duration::from_secs(1)).await;
            }
        }
    });
    let taken = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(30), a.task)
        .await
        .expect("the leader steps down")
        .unwrap();
    let after = taken.elapsed();
    assert!(
        matches!(result, Err(LeaderError::Lost { .. })),
        "{result:?}"
    );
    assert!(*a.cancelled.lock(), "the leader's token was cancelled");
    assert_eq!(leaders.load(Ordering::SeqCst), 0);
    // One retry period to notice, then the renew deadline.
    assert!(
        after <= Duration::from_secs(13),
        "stepped down after {after:?}"
    );
    assert_eq!(holder(&api.get(NAME).await.unwrap()), Some("intruder"));
    intruder.abort();
}

/// Three candidates over several leader changes: never two leaders at once, and after each
/// change exactly one leads again.
#[tokio::test(start_paused = true)]
async fn never_two_leaders() {
    let client = client().await;
    let (leaders, max) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut candidates: Vec<(String, Candidate)> = ["a", "b", "c"]
        .iter()
        .map(|id| {
            (
                id.to_string(),
                spawn(&client, id, leaders.clone(), max.clone()),
            )
        })
        .collect();
    for round in 0..2 {
        sleep(Duration::from_secs(40)).await;
        assert_eq!(
            leaders.load(Ordering::SeqCst),
            1,
            "round {round}: one leader"
        );
        let current = holder(&lease(&client).await.unwrap()).unwrap().to_owned();
        let index = candidates
            .iter()
            .position(|(id, _)| *id == current)
            .unwrap();
        let (_, leader) = candidates.remove(index);
        assert!(
            leader.started.lock().is_some(),
            "the holder is the one leading"
        );
        leader.shutdown.cancel();
        leader.task.await.unwrap().unwrap();
    }
    sleep(Duration::from_secs(40)).await;
    assert_eq!(
        leaders.load(Ordering::SeqCst),
        1,
        "the last candidate leads"
    );
    assert_eq!(max.load(Ordering::SeqCst), 1, "never two leaders at once");
    let spec = lease(&client).await.unwrap().spec.unwrap();
    assert_eq!(spec.lease_transitions, Some(2));
    for (_, c) in candidates {
        c.shutdown.cancel();
        c.task.await.unwrap().unwrap();
    }
}

/// A cloud with nothing but a name; `tagged` is its cluster ID answer.
struct TinyCloud {
    tagged: bool,
}

impl cloud_provider::CloudProvider for TinyCloud {
    fn provider_name(&self) -> &str {
        "tiny"
    }
    fn has_cluster_id(&self) -> bool {
        self.tagged
    }
}

static STARTED_A: AtomicUsize = AtomicUsize::new(0);
static STARTED_B: AtomicUsize = AtomicUsize::new(0);

fn start_a(
    ctx: cloud_provider_app::controllers::ControllerContext,
    _: &cloud_provider_app::CloudControllerManagerOptions,
) -> Result<Option<cloud_provider_app::ControllerFuture>, cloud_provider::BoxError> {
    STARTED_A.fetch_add(1, Ordering::SeqCst);
    Ok(Some(Box::pin(async move {
        ctx.shutdown.cancelled().await;
        Ok(())
    })))
}

fn start_b(
    ctx: cloud_provider_app::controllers::ControllerContext,
    _: &cloud_provider_app::CloudControllerManagerOptions,
) -> Result<Option<cloud_provider_app::ControllerFuture>, cloud_provider::BoxError> {
    STARTED_B.fetch_add(1, Ordering::SeqCst);
    Ok(Some(Box::pin(async move {
        ctx.shutdown.cancelled().await;
        Ok(())
    })))
}

static STOPPED_C: AtomicUsize = AtomicUsize::new(0);

fn start_c(
    ctx: cloud_provider_app::controllers::ControllerContext,
    _: &cloud_provider_app::CloudControllerManagerOptions,
) -> Result<Option<cloud_provider_app::ControllerFuture>, cloud_provider::BoxError> {
    Ok(Some(Box::pin(async move {
        ctx.shutdown.cancelled().await;
        STOPPED_C.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })))
}

fn options(args: &[&str]) -> cloud_provider_app::CloudControllerManagerOptions {
    let mut all = vec!["ccm", "--cloud-provider", "tiny", "--secure-port", "0"];
    all.extend_from_slice(args);
    cloud_provider_app::CloudControllerManagerOptions::try_parse_from(all).unwrap()
}

/// `--controllers` decides which registered controllers start; healthz gets
/// `leaderElection` and one check per started controller; shutdown ends `run_with` with Ok.
/// (One test, since the dummy controllers count starts in statics.)
#[tokio::test(start_paused = true)]
async fn run_starts_the_enabled_controllers() {
    use cloud_provider_app::{AppError, ControllerRegistry, HealthChecks, run_with};
    let registry = || {
        ControllerRegistry::new()
            .with("a", start_a)
            .with("b", start_b)
    };
    for (flags, expect_a, expect_b, checks_expected) in [
        ("*,-b", 1, 0, vec!["leaderElection", "a"]),
        ("b", 1, 1, vec!["leaderElection", "b"]),
        ("*", 2, 2, vec!["leaderElection", "a", "b"]),
    ] {
        let client = client().await;
        let shutdown = CancellationToken::new();
        let checks = HealthChecks::new();
        let app = tokio::spawn(run_with(
            options(&["--controllers", flags]),
            registry(),
            Arc::new(TinyCloud { tagged: true }),
            client.clone(),
            shutdown.clone(),
            checks.clone(),
        ));
        sleep(Duration::from_secs(5)).await;
        assert_eq!(STARTED_A.load(Ordering::SeqCst), expect_a, "{flags}");
        assert_eq!(STARTED_B.load(Ordering::SeqCst), expect_b, "{flags}");
        assert_eq!(checks.names(), checks_expected, "{flags}");
        assert!(
            holder(&lease(&client).await.unwrap()).is_some(),
            "leader elected"
        );
        shutdown.cancel();
        app.await.unwrap().expect("graceful shutdown is Ok");
    }
    // Unknown controllers and untagged clouds are rejected before anything starts.
    let client = client().await;
    let err = run_with(
        options(&["--controllers", "c"]),
        registry(),
        Arc::new(TinyCloud { tagged: true }),
        client.clone(),
        CancellationToken::new(),
        HealthChecks::new(),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("\"c\" is not in the list of known controllers"),
        "{err}"
    );
    let err = run_with(
        options(&[]),
        registry(),
        Arc::new(TinyCloud { tagged: false }),
        client.clone(),
        CancellationToken::new(),
        HealthChecks::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, AppError::NoClusterId), "{err}");
    assert!(
        lease(&client).await.is_none(),
        "no election after a fatal config error"
    );
    // --allow-untagged-cloud runs anyway, and without leader election starts at once.
    let shutdown = CancellationToken::new();
    let checks = HealthChecks::new();
    let app = tokio::spawn(run_with(
        options(&[
            "--allow-untagged-cloud",
            "--leader-elect=false",
            "--controllers",
            "a",
        ]),
        registry(),
        Arc::new(TinyCloud { tagged: false }),
        client.clone(),
        shutdown.clone(),
        checks.clone(),
    ));
    sleep(Duration::from_secs(1)).await;
    assert_eq!(checks.names(), vec!["a"]);
    assert!(
        lease(&client).await.is_none(),
        "no lease without --leader-elect"
    );
    shutdown.cancel();
    app.await.unwrap().unwrap();
}

/// When the manager loses its Lease, `run_with` returns the loss (exit 1) and
/// the controllers are stopped.
#[tokio::test(start_paused = true)]
async fn run_returns_an_error_when_leadership_is_lost() {
    use cloud_provider_app::{AppError, ControllerRegistry, HealthChecks, run_with};
    let client = client().await;
    let app = tokio::spawn(run_with(
        options(&["--controllers", "*"]),
        ControllerRegistry::new().with("c", start_c),
        Arc::new(TinyCloud { tagged: true }),
        client.clone(),
        CancellationToken::new(),
        HealthChecks::new(),
    ));
    sleep(Duration::from_secs(3)).await;
    assert!(holder(&lease(&client).await.unwrap()).is_some());
    let api = Api::<Lease>::namespaced(client.clone(), NS);
    let intruder = tokio::spawn(async move {
        loop {
            let mut lease = api.get(NAME).await.unwrap();
            let spec = lease.spec.as_mut().unwrap();
            spec.holder_identity = Some("intruder".into());
            spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now(),
            ));
            let _ = api.replace(NAME, &PostParams::default(), &lease).await;
            sleep(Duration::from_secs(1)).await;
        }
    });
    let result = tokio::time::timeout(Duration::from_secs(30), app)
        .await
        .expect("run returns after losing the lease")
        .unwrap();
    assert!(
        matches!(result, Err(AppError::Leader(LeaderError::Lost { .. }))),
        "{result:?}"
    );
    assert_eq!(
        STOPPED_C.load(Ordering::SeqCst),
        1,
        "the controller was stopped"
    );
    intruder.abort();
}

/// A provider that, in `initialize`, reads Nodes through `clients.client("my-informer")` twice
/// and once through `clients.client("my-writer")`, recording when each read returned.
struct InformingCloud {
    reads: Arc<parking_lot::Mutex<Vec<(&'static str, Instant)>>>,
}

#[async_trait::async_trait]
impl cloud_provider::CloudProvider for InformingCloud {
    async fn initialize(
        &self,
        ctx: cloud_provider::InitContext,
    ) -> cloud_provider::CloudResult<()> {
        let informer = ctx.clients.client("my-informer").await?;
        let writer = ctx.clients.client("my-writer").await?;
        for (name, client) in [
            ("my-informer", &informer),
            ("my-writer", &writer),
            ("my-informer", &informer),
        ] {
            Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
                .list(&Default::default())
                .await
                .map_err(cloud_provider::CloudError::other)?;
            self.reads.lock().push((name, Instant::now()));
        }
        Ok(())
    }
    fn provider_name(&self) -> &str {
        "informing"
    }
}

/// Upstream's `cloud.Initialize(c.ClientBuilder, stop)` (`app/controllermanager.go`): the
/// provider's `initialize` gets the manager's client builder, so each client it asks for
/// carries its name in the user agent and has its own `--kube-api-qps` bucket.
#[tokio::test(start_paused = true)]
async fn initialize_gets_the_managers_client_builder() {
    use cloud_provider_app::{ControllerRegistry, HealthChecks, run_with};
    let server = ccm_testkit::memory_server().await;
    let agents = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let seen = agents.clone();
    let router = server.router().layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let seen = seen.clone();
            async move {
                if request.uri().path() == "/api/v1/nodes" {
                    let agent = request
                        .headers()
                        .get(axum::http::header::USER_AGENT)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    seen.lock().push(agent);
                }
                next.run(request).await
            }
        },
    ));
    let client = kube::Client::new(router, "default");
    let reads = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let shutdown = CancellationToken::new();
    let start = Instant::now();
    let app = tokio::spawn(run_with(
        options(&[
            "--leader-elect=false",
            "--kube-api-qps",
            "1",
            "--kube-api-burst",
            "1",
        ]),
        ControllerRegistry::new(),
        Arc::new(InformingCloud {
            reads: reads.clone(),
        }),
        client,
        shutdown.clone(),
        HealthChecks::new(),
    ));
    sleep(Duration::from_secs(5)).await;
    let reads = reads.lock().clone();
    assert_eq!(reads.len(), 3, "{reads:?}");
    assert_eq!(reads[0].1 - start, Duration::ZERO, "first read at once");
    assert_eq!(
        reads[1].1 - start,
        Duration::ZERO,
        "my-writer has its own bucket"
    );
    assert_eq!(
        reads[2].1 - start,
        Duration::from_secs(1),
        "my-informer's second read waits for its own bucket (1 per second)"
    );
    // The provider's reads come first: the controllers' caches start after `initialize`.
    let agents = agents.lock().clone();
    assert!(agents.len() >= 3, "{agents:?}");
    assert!(agents[0].ends_with("ccm-rs/my-informer"), "{agents:?}");
    assert!(agents[1].ends_with("ccm-rs/my-writer"), "{agents:?}");
    assert!(agents[2].ends_with("ccm-rs/my-informer"), "{agents:?}");
    shutdown.cancel();
    app.await.unwrap().unwrap();
}
