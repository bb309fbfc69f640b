//! Supervision of controller tasks: a controller that panics (or stops while the process
//! runs) is logged, counted and started again after an exponential backoff; one that keeps
//! failing fails its `/livez` check so that whatever watches the process restarts it.
//!
//! Upstream kube-controller-manager lets a panic crash the whole process
//! (`runtime.HandleCrash` re-panics) and relies on its supervisor to restart it, and
//! registers one health check per controller, named after it. Here the controllers share a
//! process with the API server, so a panic restarts only the controller, and the process
//! is only given up (its `/livez` fails) when a controller fails
//! [`SupervisorConfig::failure_threshold`] times within
//! [`SupervisorConfig::failure_window`]. Panics are counted in `controller_panics_total`
//! with a `controller` label (after controller-runtime's
//! `controller_runtime_reconcile_panics_total{controller}`).

use std::{any::Any, collections::BTreeMap, collections::VecDeque, future::Future, sync::Arc};

use parking_lot::Mutex;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};
use tokio::{task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use core_cluster_machinery::health::HealthChecker;

/// The metric counting controller panics.
pub const PANICS_METRIC: &str = "controller_panics";
/// Its help text.
pub const PANICS_HELP: &str = "Number of panics of each controller, after which it was restarted.";

/// How controllers are restarted and when one counts as failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisorConfig {
    /// The wait before the first restart; it doubles with each failure.
    pub initial_backoff: std::time::Duration,
    /// The longest wait between restarts.
    pub max_backoff: std::time::Duration,
    /// A run at least this long resets the backoff to `initial_backoff`.
    pub reset_after: std::time::Duration,
    /// This many failures within `failure_window` fail the controller's `/livez` check.
    pub failure_threshold: usize,
    /// See `failure_threshold`.
    pub failure_window: std::time::Duration,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            initial_backoff: std::time::Duration::from_secs(1),
            max_backoff: std::time::Duration::from_secs(60),
            reset_after: std::time::Duration::from_secs(300),
            failure_threshold: 5,
            failure_window: std::time::Duration::from_secs(600),
        }
    }
}

/// Labels of [`PANICS_METRIC`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// The controller's name.
    pub controller: String,
}

#[derive(Debug, Default)]
struct Record {
    /// When it failed, within the window.
    failures: VecDeque<Instant>,
    /// Panics since the process started.
    panics: u64,
    /// The last failure's reason.
    last_error: Option<String>,
}

#[derive(Debug)]
struct Inner {
    config: SupervisorConfig,
    records: Mutex<BTreeMap<String, Record>>,
    panics: Family<ControllerLabels, Counter>,
}

impl Inner {
    /// Records a failure of `name` now; its panic count if it panicked.
    fn failed(&self, name: &str, reason: String, panicked: bool) -> u64 {
        let mut records = self.records.lock();
        let record = records.entry(name.to_owned()).or_default();
        record.failures.push_back(Instant::now());
        record.last_error = Some(reason);
        if panicked {
            record.panics += 1;
            self.panics
                .get_or_create(&ControllerLabels {
                    controller: name.to_owned(),
                })
                .inc();
        }
        record.panics
    }

    fn check(&self, name: &str) -> Result<(), String> {
        let mut records = self.records.lock();
        let Some(record) = records.get_mut(name) else {
            return Ok(());
        };
        let now = Instant::now();
        while record
            .failures
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.config.failure_window)
        {
            record.failures.pop_front();
        }
        if record.failures.len() >= self.config.failure_threshold {
            return Err(format!(
                "controller {name} failed {} times within {:?}, last: {}",
                record.failures.len(),
                self.config.failure_window,
                record.last_error.as_deref().unwrap_or("")
            ));
        }
        Ok(())
    }
}

/// Runs controllers, restarting each after a panic; see the module documentation.
#[derive(Debug, Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

impl Default for Supervisor {
    fn default() -> Self {
        Self::new(SupervisorConfig::default())
    }
}

/// The `/livez` check of one supervised controller, named after it.
struct ControllerCheck {
    name: String,
    inner: Arc<Inner>,
}

impl HealthChecker for ControllerCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn check(&self) -> Result<(), String> {
        self.inner.check(&self.name)
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

impl Supervisor {
    /// A supervisor with `config`.
    pub fn new(config: SupervisorConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                records: Mutex::default(),
                panics: Family::default(),
            }),
        }
    }

    /// The panic counter by controller, to register as [`PANICS_METRIC`] (a counter, so
    /// exposed as `controller_panics_total`).
    pub fn panics_metric(&self) -> Family<ControllerLabels, Counter> {
        self.inner.panics.clone()
    }

    /// How often `name` panicked.
    pub fn panics(&self, name: &str) -> u64 {
        self.inner.records.lock().get(name).map_or(0, |r| r.panics)
    }

    /// Makes `name` known to [`Supervisor::health_checks`] before it first runs (a
    /// controller that runs only while its process leads).
    pub fn register(&self, name: &str) {
        self.inner
            .records
            .lock()
            .entry(name.to_owned())
            .or_default();
    }

    /// One `/livez` check per controller supervised so far, named after it.
    pub fn health_checks(&self) -> Vec<Arc<dyn HealthChecker>> {
        self.inner
            .records
            .lock()
            .keys()
            .map(|name| {
                Arc::new(ControllerCheck {
                    name: name.clone(),
                    inner: self.inner.clone(),
                }) as Arc<dyn HealthChecker>
            })
            .collect()
    }

    /// Runs the controller `name` until `shutdown`: `start` makes a fresh run of it (given
    /// `shutdown`), in a task of its own; a run that panics, or ends before `shutdown`, is
    /// logged at error, counted, and started again after the backoff. The controller is
    /// known to [`Supervisor::health_checks`] as soon as this is called.
    pub fn run<F, Fut>(
        &self,
        name: &str,
        shutdown: CancellationToken,
        mut start: F,
    ) -> impl Future<Output = ()> + Send + 'static
    where
        F: FnMut(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.inner
            .records
            .lock()
            .entry(name.to_owned())
            .or_default();
        let inner = self.inner.clone();
        let name = name.to_owned();
        async move {
            let config = inner.config.clone();
            let mut backoff = config.initial_backoff;
            loop {
                let started = Instant::now();
                // In a set of its own: dropping this future (a shutdown) aborts the run.
                let mut run = JoinSet::new();
                run.spawn(start(shutdown.clone()));
                let ended = run.join_next().await;
                if shutdown.is_cancelled() {
                    return;
                }
                if started.elapsed() >= config.reset_after {
                    backoff = config.initial_backoff;
                }
                match ended {
                    Some(Err(e)) if e.is_panic() => {
                        let reason = panic_message(e.into_panic().as_ref());
                        let panics = inner.failed(&name, format!("panicked: {reason}"), true);
                        error!(controller = %name, panics, ?backoff, panic = %reason, "controller panicked; restarting it");
                    }
                    _ => {
                        inner.failed(&name, "stopped".to_owned(), false);
                        error!(controller = %name, ?backoff, "controller stopped unexpectedly; restarting it");
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(config.max_backoff);
                info!(controller = %name, "restarting controller");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        sync::atomic::{AtomicUsize, Ordering},
        time::Duration,
    };

    use super::*;

    /// A controller that panics on its first `panics` runs, then runs until shutdown.
    fn flaky(
        panics: usize,
        runs: Arc<AtomicUsize>,
    ) -> impl FnMut(CancellationToken) -> futures::future::BoxFuture<'static, ()> + Send + 'static
    {
        move |shutdown| {
            let run = runs.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if run < panics {
                    panic!("hostile input number {run}");
                }
                shutdown.cancelled().await;
            })
        }
    }

    /// A panicking controller is started again after 1 s, 2 s, 4 s (tokio time), and each
    /// panic is counted; it stays healthy below the threshold.
    #[tokio::test(start_paused = true)]
    async fn a_panicking_controller_is_restarted_with_backoff_and_counted() {
        let supervisor = Supervisor::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let start = Instant::now();
        let task = tokio::spawn(supervisor.run("flaky", shutdown.clone(), flaky(3, runs.clone())));
        // Runs start at 0, then (each panicking after 10 ms) 1 s, 2 s and 4 s later.
        for (at_ms, expected) in [
            (500, 1),
            (1500, 2),
            (2900, 2),
            (3500, 3),
            (6900, 3),
            (7500, 4),
            (30_000, 4),
        ] {
            tokio::time::sleep_until(start + Duration::from_millis(at_ms)).await;
            assert_eq!(
                runs.load(Ordering::SeqCst),
                expected,
                "runs after {at_ms} ms"
            );
        }
        assert_eq!(supervisor.panics("flaky"), 3);
        let checks = supervisor.health_checks();
        assert_eq!(checks.len(), 1);
        assert_eq!(checks[0].name(), "flaky");
        assert_eq!(
            checks[0].check(),
            Ok(()),
            "3 failures are under the threshold"
        );
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register(PANICS_METRIC, PANICS_HELP, supervisor.panics_metric());
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("controller_panics_total{controller=\"flaky\"} 3"),
            "{text}"
        );
        shutdown.cancel();
        task.await.unwrap();
    }

    /// A controller that fails `failure_threshold` times within the window fails its check
    /// (the process is to be restarted); the check recovers once the window has passed.
    #[tokio::test(start_paused = true)]
    async fn a_controller_that_keeps_panicking_fails_its_check() {
        let supervisor = Supervisor::new(SupervisorConfig {
            max_backoff: Duration::from_secs(8),
            ..SupervisorConfig::default()
        });
        let runs = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(supervisor.run(
            "crashy",
            shutdown.clone(),
            flaky(usize::MAX, runs.clone()),
        ));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(supervisor.panics("crashy") >= 5);
        let check = supervisor.health_checks().remove(0);
        let reason = check.check().unwrap_err();
        assert!(
            reason.contains("panicked: hostile input number"),
            "{reason}"
        );
        shutdown.cancel();
        task.await.unwrap();
        let ran = runs.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(601)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            ran,
            "no restart after shutdown"
        );
        assert_eq!(check.check(), Ok(()), "the failures left the window");
    }

    /// A controller that returns while the process runs is restarted too (not counted as a
    /// panic); at shutdown it is not.
    #[tokio::test(start_paused = true)]
    async fn a_controller_that_stops_early_is_restarted() {
        let supervisor = Supervisor::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let counter = runs.clone();
        let task = tokio::spawn(supervisor.run("quitter", shutdown.clone(), move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            async {}
        }));
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3, "at 0, 1 and 3 s");
        assert_eq!(supervisor.panics("quitter"), 0);
        shutdown.cancel();
        task.await.unwrap();
    }
}
