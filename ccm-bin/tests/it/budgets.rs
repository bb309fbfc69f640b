//! The embedded default as a newcomer finds it: quiet when nothing is wrong, and
//! PodDisruptionBudgets that `kubectl drain` has to wait for.

use std::time::Duration;

use crate::{
    embedded::Embedded,
    support::{require_kubectl, wait_until},
};

/// Upstream's garbage collector watches only what discovery says can be listed and
/// watched (`pkg/controller/garbagecollector/garbagecollector.go GetDeletableResources`),
/// so a cluster where nothing is wrong logs nothing at warning level: the embedded default
/// runs for 30 s while kubectl looks around (a PodDisruptionBudget made, the resources
/// listed) and its log, in JSON, has info lines and no WARN or ERROR line.
#[test]
// A real process on the real clock: the 30 s are wall time on purpose.
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
fn the_embedded_default_logs_no_warning_in_its_first_30_seconds() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("ccm.log");
    let cluster = Embedded::start_logging_to(&log, &["--logging-format", "json"]);
    let ready = wait_until(Duration::from_secs(30), || {
        let out = cluster.kubectl(&["get", "nodes", "--no-headers"]);
        out.lines().count() == 3 && out.lines().all(|l| l.contains(" Ready "))
    });
    assert!(ready, "{}", cluster.kubectl(&["get", "nodes"]));
    let made = cluster.kubectl_stdin(
        &[
            "create",
            "pdb",
            "quiet",
            "--selector=app=quiet",
            "--min-available=1",
        ],
        "",
    );
    assert!(
        made.contains("poddisruptionbudget.policy/quiet created"),
        "{made}"
    );
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        cluster.kubectl(&["get", "all,pdb,endpoints", "-A"]);
        std::thread::sleep(Duration::from_secs(2));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "INFO"),
        "the log has no info line, so it proves nothing: {text}"
    );
    let loud: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["level"] == "WARN" || l["level"] == "ERROR")
        .collect();
    assert!(loud.is_empty(), "warnings in a healthy cluster: {loud:#?}");
}

/// `kubectl drain` evicts through the Eviction subresource, which refuses (429, "Cannot
/// evict pod as it would violate the pod's disruption budget.") while the pod's budget
/// allows no disruption (`pkg/registry/core/pod/storage/eviction.go checkAndDecrement`);
/// kubectl retries until its timeout. The disruption controller
/// (`pkg/controller/disruption/disruption.go`) keeps the budget's status; once the budget
/// allows one disruption the drain goes through and the ReplicaSet replaces the pod on
/// another node.
#[test]
fn kubectl_drain_waits_for_a_pod_disruption_budget() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let cluster = Embedded::start();
    let ready = wait_until(Duration::from_secs(30), || {
        let out = cluster.kubectl(&["get", "nodes", "--no-headers"]);
        out.lines().count() == 3 && out.lines().all(|l| l.contains(" Ready "))
    });
    assert!(ready, "{}", cluster.kubectl(&["get", "nodes"]));
    let created = cluster.kubectl_stdin(
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=2",
        ],
        "",
    );
    assert!(created.contains("deployment.apps/web created"), "{created}");
    let rollout = cluster.kubectl_stdin(
        &["rollout", "status", "deployment/web", "--timeout=90s"],
        "",
    );
    assert!(rollout.contains("successfully rolled out"), "{rollout}");
    let made = cluster.kubectl_stdin(
        &[
            "create",
            "pdb",
            "web",
            "--selector=app=web",
            "--min-available=2",
        ],
        "",
    );
    assert!(
        made.contains("poddisruptionbudget.policy/web created"),
        "{made}"
    );
    let counted = wait_until(Duration::from_secs(30), || {
        cluster.kubectl(&[
            "get",
            "pdb",
            "web",
            "-o",
            "jsonpath={.status.currentHealthy}/{.status.desiredHealthy}/{.status.expectedPods}/{.status.disruptionsAllowed}",
        ]) == "2/2/2/0"
    });
    assert!(
        counted,
        "{}",
        cluster.kubectl(&["get", "pdb", "web", "-o", "yaml"])
    );
    let table = cluster.kubectl(&["get", "pdb", "web"]);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split("  ")
        .filter(|c| !c.is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "MIN AVAILABLE",
            "MAX UNAVAILABLE",
            "ALLOWED DISRUPTIONS",
            "AGE"
        ],
        "{table}"
    );
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|row| row.split_whitespace().take(4).eq(["web", "2", "N/A", "0"])),
        "{table}"
    );

    let node = cluster.kubectl(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[0].spec.nodeName}",
    ]);
    assert!(!node.is_empty());
    let refused = cluster
        .command()
        .args(["drain", &node, "--ignore-daemonsets", "--timeout=8s"])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{said}"
    );
    let on_node = |node: &str| {
        cluster
            .kubectl(&[
                "get",
                "pods",
                "-l",
                "app=web",
                "--field-selector",
                &format!("spec.nodeName={node}"),
                "--no-headers",
            ])
            .lines()
            .count()
    };
    assert!(on_node(&node) >= 1, "the budget kept the pod on {node}");

    // The budget relaxed, the drain goes through.
    let patched = cluster.kubectl_stdin(
        &[
            "patch",
            "pdb",
            "web",
            "--type=merge",
            "-p",
            r#"{"spec":{"minAvailable":1}}"#,
        ],
        "",
    );
    assert!(patched.contains("patched"), "{patched}");
    let drained = cluster
        .command()
        .args(["drain", &node, "--ignore-daemonsets", "--timeout=60s"])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&drained.stdout),
        String::from_utf8_lossy(&drained.stderr)
    );
    assert!(drained.status.success(), "{said}");
    assert!(said.contains(&format!("node/{node} drained")), "{said}");
    let moved = wait_until(Duration::from_secs(60), || {
        on_node(&node) == 0
            && cluster.kubectl(&[
                "get",
                "deployment",
                "web",
                "-o",
                "jsonpath={.status.readyReplicas}",
            ]) == "2"
    });
    assert!(moved, "{}", cluster.kubectl(&["get", "pods", "-o", "wide"]));
}
