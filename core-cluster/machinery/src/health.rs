//! Checks of the API server's `/livez` added from outside the server.

/// A named check of `/livez` added from outside the server, such as one per controller of
/// the process (upstream's `healthz.HealthChecker`, added with `AddLivezChecks`).
pub trait HealthChecker: Send + Sync {
    /// The check's name: `/livez/<name>` and its `[+]<name> ok` line.
    fn name(&self) -> &str;
    /// `Err(reason)` while failing.
    fn check(&self) -> Result<(), String>;
}
