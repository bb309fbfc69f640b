//! Running the machine's kubectl (v1.32 or newer) against a test server.
//!
//! Tests that need kubectl fail, rather than skip, when it is missing: a skipped test would
//! pass a machine that never ran it. `scripts/kubectl.sh` installs it.

use std::{path::Path, process::Command};

use serde_json::Value;

/// The oldest kubectl minor version the tests accept (v1.32, within the ±1 version skew of
/// the 1.33 API server, as upstream's version-skew policy allows).
pub const MIN_MINOR: u32 = 32;

/// The output of one kubectl run.
#[derive(Debug)]
pub struct Output {
    /// Whether kubectl exited 0.
    pub success: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Fails (rather than skips) when kubectl is missing or older than v1.32; `why` says what
/// the test needs it for.
pub fn require_kubectl(why: &str) {
    let required = format!(
        "kubectl v1.{MIN_MINOR} or newer is required on PATH for this test ({why}); \
         scripts/kubectl.sh installs it"
    );
    let output = Command::new("kubectl")
        .args(["version", "--client", "-o", "json"])
        .output()
        .unwrap_or_else(|error| panic!("{required}: running `kubectl` failed: {error}"));
    let version: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{required}: unreadable `kubectl version`: {error}"));
    let minor: u32 = version["clientVersion"]["minor"]
        .as_str()
        .and_then(|minor| minor.trim_end_matches('+').parse().ok())
        .unwrap_or(0);
    assert!(
        version["clientVersion"]["major"] == "1" && minor >= MIN_MINOR,
        "{required}; found {}",
        version["clientVersion"]
    );
}

/// A kubectl command using `kubeconfig`, with its home and cache in `dir`: no kubeconfig or
/// home-directory state of the machine leaks in. Add the arguments and run it.
pub fn command(dir: &Path, kubeconfig: &Path) -> Command {
    let mut command = Command::new("kubectl");
    command
        .arg(format!("--cache-dir={}", dir.join("cache").display()))
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", dir);
    command
}

/// Runs kubectl with `args` (see [`command`]) on a blocking thread, so the test's runtime
/// keeps serving an in-process API server meanwhile.
pub async fn kubectl(dir: &Path, kubeconfig: &Path, args: &[&str]) -> Output {
    let mut command = command(dir, kubeconfig);
    command.args(args);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("kubectl thread")
        .expect("kubectl runs");
    Output {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
