//! A custom resource's validation (its schema, its compiled patterns and its CEL rules), off
//! the async workers.
//!
//! Upstream validates a custom resource in the request's goroutine, under the request's
//! context: a slow one costs its own goroutine, and CEL evaluation stops when the context
//! ends. Here a request is a task on a few async worker threads, so validation that takes
//! CPU time would stall every other request on its worker. It runs instead on a small pool
//! of threads of its own ([`pool_threads`]: one per core, at least two), one job at a time
//! per thread, so that heavy validations queue behind each other rather than take every
//! core. The request waits for its job without holding a worker; when the request goes
//! away (the client left, or the request's deadline dropped it) its job is interrupted: not
//! started if still queued, and a running CEL rule stops at its next step (`operation
//! interrupted`, as cel-go's `ContextEval`).

use std::sync::{Arc, OnceLock, mpsc};

use serde_json::Value;

use crate::{
    crd::{Custom, cel::Interrupt},
    registry::FieldError,
};

/// How much stack each validation thread starts with (a deeply nested rule grows it further
/// as it runs, see `crd::cel`).
const STACK_BYTES: usize = 8 << 20;

/// How many validation threads run: one per core, at least two.
pub(crate) fn pool_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}

type Job = Box<dyn FnOnce() + Send + 'static>;

fn pool() -> &'static mpsc::Sender<Job> {
    static POOL: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(parking_lot::Mutex::new(rx));
        for i in 0..pool_threads() {
            let rx = rx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("validate-{i}"))
                .stack_size(STACK_BYTES)
                .spawn(move || {
                    loop {
                        let job = rx.lock().recv();
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "starting a custom resource validation thread failed");
            }
        }
        tx
    })
}

/// Interrupts its job when dropped (the request went away; a finished job does not care).
struct InterruptOnDrop(Interrupt);

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The errors of `obj` (an update's `old` too) against `custom`'s schema and rules, found on
/// the validation pool (see the [module docs](self)).
pub(crate) async fn validate(
    custom: Arc<Custom>,
    obj: &Value,
    old: Option<&Value>,
) -> Vec<FieldError> {
    let interrupt = Interrupt::new();
    let _guard = InterruptOnDrop(interrupt.clone());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let obj = obj.clone();
    let old = old.cloned();
    let job: Job = Box::new(move || {
        if interrupt.is_interrupted() {
            return;
        }
        let errors = custom.validate_with(&obj, old.as_ref(), &interrupt);
        let _ = tx.send(errors);
    });
    if pool().send(job).is_err() {
        return vec![unavailable()];
    }
    rx.await.unwrap_or_else(|_| vec![unavailable()])
}

fn unavailable() -> FieldError {
    FieldError::invalid(
        "<nil>",
        &Value::Null,
        "the custom resource could not be validated: no validation thread is running",
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn served(schema: Value) -> Arc<crate::crd::Served> {
        crate::crd::served_defs(&json!({
            "metadata": {"name": "pooled.pool.example.com"},
            "spec": {"group": "pool.example.com", "scope": "Namespaced",
                     "names": {"plural": "pooled", "kind": "Pooled"},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "schema": {"openAPIV3Schema": schema}}]},
        }))
        .expect("served")
    }

    /// Validation runs on the pool's threads, not on the async worker that awaits it.
    #[tokio::test(flavor = "current_thread")]
    async fn validation_runs_off_the_async_worker() {
        let served = served(
            json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"n": {"type": "integer", "maximum": 3}}}}}),
        );
        let custom = crate::crd::custom(served.defs()[0]).unwrap();
        let errors = validate(custom, &json!({"spec": {"n": 4}}), None).await;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "spec.n");
    }
}
