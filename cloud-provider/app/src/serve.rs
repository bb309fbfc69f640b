//! The health, metrics and configuration endpoints, served with axum over
//! HTTPS on `--bind-address:--secure-port` ([`crate::secure_serving`]) behind delegated
//! authentication and authorization ([`crate::delegated`]): `/healthz`, `/readyz` and
//! `/livez` are always allowed, `/metrics` and `/configz` need an identity the cluster
//! allows (`get` on the path).
//!
//! - `/healthz` aggregates named checks (`leaderElection`, one per started controller) with
//!   apiserver semantics ([`ccm_serving::healthz`]): `?verbose` lists `[+]name ok` /
//!   `[-]name failed`, `?exclude=name` skips one; each check is also at `/healthz/<name>`
//!   (upstream mounts only the exact path).
//! - `/readyz` and `/livez` (beyond upstream, which does not serve them) answer the same checks.
//! - `/metrics`: Prometheus text format.
//! - `/configz`: the component configuration as JSON ([`crate::configz`]).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use ccm_serving::healthz::{self, HealthQuery};
use parking_lot::{Mutex, RwLock};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::controllers::{CloudPriority, CloudRateLimiter};
use crate::delegated::DelegatedAuth;
use crate::secure_serving::MAX_HANDSHAKES;

/// One named health check: `Ok` when healthy, else the reason.
pub type HealthCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The named checks behind `/healthz`; cheap to clone, shared with whoever adds checks.
#[derive(Clone, Default)]
pub struct HealthChecks {
    checks: Arc<RwLock<Vec<(String, HealthCheck)>>>,
}

impl std::fmt::Debug for HealthChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl HealthChecks {
    /// No checks: the endpoints answer `ok` (upstream's ping).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the check called `name`.
    pub fn add(&self, name: impl Into<String>, check: HealthCheck) {
        let name = name.into();
        let mut checks = self.checks.write();
        checks.retain(|(n, _)| *n != name);
        checks.push((name, check));
    }

    /// Adds a check called `name` that always passes (upstream's ping for a started
    /// controller without its own health checker).
    pub fn add_ping(&self, name: impl Into<String>) {
        self.add(name, Arc::new(|| Ok(())));
    }

    /// The names of the checks, in the order they were added.
    pub fn names(&self) -> Vec<String> {
        self.checks.read().iter().map(|(n, _)| n.clone()).collect()
    }

    fn get(&self, name: &str) -> Option<HealthCheck> {
        self.checks
            .read()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c.clone())
    }
}

type Labels = Vec<(String, String)>;

/// The `/metrics` registry: `running_managed_controllers`, the cloud rate limiter's counters,
/// and whatever the controllers register through [`ManagerMetrics::registry`].
#[derive(Clone)]
pub(crate) struct ManagerMetrics {
    registry: Arc<Mutex<Registry>>,
    running: Family<Labels, Gauge>,
    limiter: Arc<CloudRateLimiter>,
    granted: Counter,
    waited: Counter<f64, std::sync::atomic::AtomicU64>,
    by_priority: PriorityFamilies,
}

type F64Counter = Counter<f64, std::sync::atomic::AtomicU64>;

/// The limiter's counters per [`CloudPriority`] and its current rate.
#[derive(Clone, Default)]
struct PriorityFamilies {
    granted: Family<Labels, Counter>,
    waited: Family<Labels, F64Counter>,
    throttled: Family<Labels, Counter>,
    rate: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl PriorityFamilies {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "cloud_api_rate_limiter_priority_granted",
            "Cloud API calls let through by the shared cloud rate limiter, by caller priority",
            self.granted.clone(),
        );
        registry.register(
            "cloud_api_rate_limiter_priority_wait_seconds",
            "Total time callers waited on the shared cloud rate limiter, by caller priority",
            self.waited.clone(),
        );
        registry.register(
            "cloud_api_rate_limiter_throttled",
            "Cloud API calls the cloud refused as throttled, by caller priority",
            self.throttled.clone(),
        );
        registry.register(
            "cloud_api_rate_limiter_rate",
            "Calls per second the shared cloud rate limiter lets through now (0 = unlimited)",
            self.rate.clone(),
        );
    }

    /// Brings the families up to the limiter's counts.
    fn sync(&self, limiter: &CloudRateLimiter) {
        for priority in CloudPriority::ALL {
            let labels = vec![("priority".to_owned(), priority.as_str().to_owned())];
            let stats = limiter.priority_stats(priority);
            let granted = self.granted.get_or_create(&labels);
            granted.inc_by(stats.granted.saturating_sub(granted.get()));
            let throttled = self.throttled.get_or_create(&labels);
            throttled.inc_by(stats.throttled.saturating_sub(throttled.get()));
            let waited = self.waited.get_or_create(&labels);
            let more = stats.waited.as_secs_f64() - waited.get();
            if more > 0.0 {
                waited.inc_by(more);
            }
        }
        self.rate.set(limiter.current_rate());
    }
}

impl std::fmt::Debug for ManagerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagerMetrics").finish_non_exhaustive()
    }
}

impl ManagerMetrics {
    /// A registry reporting on `limiter`.
    pub(crate) fn new(limiter: Arc<CloudRateLimiter>) -> Self {
        let mut registry = Registry::default();
        let running = Family::<Labels, Gauge>::default();
        registry.register(
            "running_managed_controllers",
            "Indicates where instances of a controller are currently running",
            running.clone(),
        );
        let granted = Counter::default();
        registry.register(
            "cloud_api_rate_limiter_granted",
            "Cloud API calls let through by the shared cloud rate limiter",
            granted.clone(),
        );
        let waited = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "cloud_api_rate_limiter_wait_seconds",
            "Total time callers waited on the shared cloud rate limiter",
            waited.clone(),
        );
        let by_priority = PriorityFamilies::default();
        by_priority.register(&mut registry);
        ManagerMetrics {
            by_priority,
            registry: Arc::new(Mutex::new(registry)),
            running,
            limiter,
            granted,
            waited,
        }
    }

    /// The registry, for controllers to register their own metrics in.
    pub(crate) fn registry(&self) -> Arc<Mutex<Registry>> {
        self.registry.clone()
    }

    /// Sets `running_managed_controllers{name,manager="cloud-controller-manager"}`.
    pub(crate) fn set_controller_running(&self, name: &str, running: bool) {
        self.running
            .get_or_create(&vec![
                ("manager".to_owned(), "cloud-controller-manager".to_owned()),
                ("name".to_owned(), name.to_owned()),
            ])
            .set(i64::from(running));
    }

    /// The metrics in Prometheus text format.
    pub(crate) fn encode(&self) -> String {
        let stats = self.limiter.stats();
        self.granted
            .inc_by(stats.granted.saturating_sub(self.granted.get()));
        let waited = stats.waited.as_secs_f64() - self.waited.get();
        if waited > 0.0 {
            self.waited.inc_by(waited);
        }
        self.by_priority.sync(&self.limiter);
        let mut out = String::new();
        if let Err(error) =
            prometheus_client::encoding::text::encode(&mut out, &self.registry.lock())
        {
            tracing::warn!(%error, "encoding metrics");
        }
        out
    }
}

#[derive(Clone)]
struct AppState {
    checks: HealthChecks,
    metrics: ManagerMetrics,
}

/// The router of the endpoints.
pub(crate) fn router(checks: HealthChecks, metrics: ManagerMetrics) -> Router {
    Router::new()
        .route("/healthz", get(|s, q| aggregate("healthz", s, q)))
        .route("/readyz", get(|s, q| aggregate("readyz", s, q)))
        .route("/livez", get(|s, q| aggregate("livez", s, q)))
        .route("/healthz/{name}", get(single))
        .route("/readyz/{name}", get(single))
        .route("/livez/{name}", get(single))
        .route("/metrics", get(metrics_handler))
        .with_state(AppState { checks, metrics })
}

async fn aggregate(
    endpoint: &'static str,
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = HealthQuery::parse(query.as_deref());
    let checks: Vec<(String, HealthCheck)> = state.checks.checks.read().clone();
    healthz::aggregate(
        endpoint,
        &query,
        checks.iter().map(|(name, _)| name.as_str()),
        |name| match checks.iter().find(|(n, _)| n == name) {
            Some((_, check)) => check(),
            None => Ok(()),
        },
    )
    .into_response()
}

async fn single(State(state): State<AppState>, Path(name): Path<String>) -> Response {
    healthz::single(state.checks.get(&name).map(|check| check())).into_response()
}

async fn metrics_handler(State(state): State<AppState>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

/// Adds `/configz`, answering `config` as JSON.
pub(crate) fn with_configz(router: Router, config: serde_json::Value) -> Router {
    let body = config.to_string();
    router.route(
        "/configz",
        get(move || {
            let body = body.clone();
            async move { ([(header::CONTENT_TYPE, "application/json")], body) }
        }),
    )
}

/// `router` behind delegated authentication and authorization.
pub(crate) fn secured(router: Router, auth: DelegatedAuth) -> Router {
    router.layer(axum::middleware::from_fn_with_state(
        auth,
        crate::delegated::layer,
    ))
}

/// Serves `router` over TLS (`tls`) on `listener` until `shutdown` is cancelled, with Go's
/// server timeouts as upstream's secure serving sets them and at most [`MAX_HANDSHAKES`]
/// TLS handshakes in progress; every request carries its connection's
/// [`Peer`](crate::secure_serving::Peer).
pub(crate) async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    ccm_serving::serve(
        router,
        listener,
        tls,
        ccm_serving::HandshakeLimit::new(MAX_HANDSHAKES),
        ccm_serving::Timeouts::default(),
        shutdown,
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(router: &Router, uri: &str) -> (StatusCode, String) {
        let response = router
            .clone()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    fn setup() -> (HealthChecks, ManagerMetrics, Router) {
        let checks = HealthChecks::new();
        let metrics = ManagerMetrics::new(Arc::new(CloudRateLimiter::unlimited()));
        let router = router(checks.clone(), metrics.clone());
        (checks, metrics, router)
    }

    /// Before any check is added, /healthz answers ping.
    #[tokio::test]
    async fn healthz_without_checks_is_ok() {
        let (_, _, router) = setup();
        for path in ["/healthz", "/readyz", "/livez"] {
            assert_eq!(get(&router, path).await, (StatusCode::OK, "ok".to_owned()));
        }
    }

    /// Named checks (`leaderElection`, per controller), `?verbose`,
    /// `?exclude=`, per-check paths.
    #[tokio::test]
    async fn healthz_aggregates_named_checks() {
        let (checks, _, router) = setup();
        let healthy = Arc::new(parking_lot::Mutex::new(true));
        let flag = healthy.clone();
        checks.add(
            "leaderElection",
            Arc::new(move || {
                if *flag.lock() {
                    Ok(())
                } else {
                    Err("lease overdue".into())
                }
            }),
        );
        checks.add_ping("cloud-node-controller");
        let (status, body) = get(&router, "/healthz?verbose").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body,
            "[+]leaderElection ok\n[+]cloud-node-controller ok\nhealthz check passed\n"
        );
        assert_eq!(get(&router, "/healthz").await.1, "ok");
        *healthy.lock() = false;
        let (status, body) = get(&router, "/healthz").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.contains("[-]leaderElection failed"), "{body}");
        assert!(body.ends_with("healthz check failed\n"), "{body}");
        assert_eq!(
            get(&router, "/readyz").await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let (status, body) = get(&router, "/healthz?exclude=leaderElection").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
        let (status, body) = get(&router, "/healthz/leaderElection").await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.contains("lease overdue"));
        assert_eq!(
            get(&router, "/healthz/cloud-node-controller").await,
            (StatusCode::OK, "ok".to_owned())
        );
        assert_eq!(get(&router, "/healthz/nope").await.0, StatusCode::NOT_FOUND);
    }

    /// `running_managed_controllers{name,manager}` and the limiter's counters.
    #[tokio::test]
    async fn metrics_in_prometheus_text_format() {
        let limiter = Arc::new(CloudRateLimiter::unlimited());
        let metrics = ManagerMetrics::new(limiter.clone());
        let router = router(HealthChecks::new(), metrics.clone());
        metrics.set_controller_running("service-lb-controller", true);
        limiter.acquire().await;
        limiter.acquire().await;
        let extra = Counter::<u64>::default();
        metrics
            .registry()
            .lock()
            .register("my_controller_syncs", "Syncs", extra.clone());
        extra.inc();
        let (status, body) = get(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains(
                "running_managed_controllers{manager=\"cloud-controller-manager\",name=\"service-lb-controller\"} 1"
            ),
            "{body}"
        );
        assert!(
            body.contains("cloud_api_rate_limiter_granted_total 2"),
            "{body}"
        );
        assert!(
            body.contains("cloud_api_rate_limiter_wait_seconds_total"),
            "{body}"
        );
        assert!(body.contains("my_controller_syncs_total 1"), "{body}");
        assert!(
            body.contains("cloud_api_rate_limiter_priority_granted_total{priority=\"status\"} 2"),
            "{body}"
        );
        // Counters follow the limiter, not the number of scrapes.
        limiter.acquire().await;
        let (_, body) = get(&router, "/metrics").await;
        assert!(
            body.contains("cloud_api_rate_limiter_granted_total 3"),
            "{body}"
        );
    }

    /// The limiter's metrics per caller priority: calls, waits and throttled answers, and
    /// the rate it lets calls through at now (lowered by throttling when adapting).
    #[tokio::test(start_paused = true)]
    async fn limiter_metrics_by_priority_and_rate() {
        let limiter = Arc::new(CloudRateLimiter::new(10.0, 1).adaptive(true));
        let metrics = ManagerMetrics::new(limiter.clone());
        limiter.acquire_at(CloudPriority::NodeLifecycle).await;
        limiter.acquire_at(CloudPriority::LoadBalancer).await;
        limiter.observe(
            CloudPriority::LoadBalancer,
            &cloud_provider::CloudError::throttled(None, "quota"),
        );
        let body = metrics.encode();
        for line in [
            "cloud_api_rate_limiter_priority_granted_total{priority=\"node_lifecycle\"} 1",
            "cloud_api_rate_limiter_priority_granted_total{priority=\"load_balancer\"} 1",
            "cloud_api_rate_limiter_priority_granted_total{priority=\"route\"} 0",
            "cloud_api_rate_limiter_throttled_total{priority=\"load_balancer\"} 1",
            "cloud_api_rate_limiter_throttled_total{priority=\"node_lifecycle\"} 0",
            "cloud_api_rate_limiter_priority_wait_seconds_total{priority=\"load_balancer\"} 0.1",
            "cloud_api_rate_limiter_rate 5.0",
        ] {
            assert!(body.contains(line), "{line} in {body}");
        }
    }
}
