//! The `ccm` binary as an operator runs it.

use std::process::{Command, Output};

fn ccm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args(args)
        .output()
        .expect("run ccm")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("ccm-cli-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

/// The providers the build links: `aws` with the default `aws` feature, `fake` always.
fn linked_providers() -> &'static [&'static str] {
    if cfg!(feature = "aws") {
        &["aws", "fake"]
    } else {
        &["fake"]
    }
}

#[test]
fn the_aws_and_fake_providers_are_linked() {
    let out = ccm(&["providers"]);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout).lines().collect::<Vec<_>>(),
        linked_providers()
    );
}

#[test]
fn conformance_on_the_demo_cloud_passes_every_check() {
    let out = ccm(&["conformance"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("conformance report for cloud provider \"fake\""),
        "{stdout}"
    );
    assert!(stdout.contains("PASS  instances-v2/stopped"), "{stdout}");
    // The demo wires the fake's backend probe, so the update check observes the backends.
    assert!(
        stdout.contains("  PASS  load-balancer/update-backends\n"),
        "{stdout}"
    );
    assert!(stdout.contains("PASS  routes/round-trip"), "{stdout}");
    assert!(
        stdout.trim_end().ends_with("0 failed, 0 skipped"),
        "{stdout}"
    );
}

#[test]
fn conformance_with_a_config_file_and_named_nodes() {
    let config = temp_file(
        "good.toml",
        "[[instances]]\nid = \"i-1\"\nname = \"w1\"\ninternal_ips = [\"10.9.0.1\"]\n\n\
         [[instances]]\nid = \"i-2\"\nname = \"w2\"\ninternal_ips = [\"10.9.0.2\"]\n",
    );
    let out = ccm(&[
        "conformance",
        "--cloud-config",
        config.to_str().unwrap(),
        "--running-node",
        "w1",
        "--running-node",
        "w2",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("SKIP  instances-v2/stopped"), "{stdout}");
}

#[test]
fn a_failing_provider_gives_a_report_and_exit_code_1() {
    // Every call fails: the report says which checks failed and why.
    let config = temp_file(
        "faulty.toml",
        "[[instances]]\nid = \"i-1\"\nname = \"w1\"\ninternal_ips = [\"10.9.0.1\"]\n\n\
         [[faults]]\nkind = \"error\"\nmessage = \"cloud down\"\n",
    );
    let out = ccm(&[
        "conformance",
        "--cloud-config",
        config.to_str().unwrap(),
        "--running-node",
        "w1",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let metadata_line = stdout
        .lines()
        .find(|l| l.contains("FAIL  instances-v2/metadata "))
        .unwrap_or_else(|| panic!("no failed metadata check in:\n{stdout}"));
    assert!(
        metadata_line.ends_with(
            "w1: instance_metadata failed: injected fault in instance-metadata: cloud down"
        ),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with("skipped"), "{stdout}");
    assert!(!stdout.contains(" 0 failed"), "{stdout}");
}

#[test]
fn an_unknown_provider_lists_the_registered_ones() {
    let out = ccm(&["conformance", "--cloud-provider", "nope"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains(&format!(
            "unknown cloud provider \"nope\"; registered providers: {}",
            linked_providers().join(", ")
        )),
        "{stderr}"
    );
}

#[test]
fn external_means_no_provider_and_is_refused_clearly() {
    let out = ccm(&["conformance", "--cloud-provider", "external"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains("means no provider in this process"),
        "{stderr}"
    );
}

#[test]
fn a_malformed_config_names_path_line_and_column() {
    let config = temp_file(
        "bad.toml",
        "seed = 1\n[[instances]]\nid = \"i-1\"\nname = 5\n",
    );
    let out = ccm(&[
        "conformance",
        "--cloud-config",
        config.to_str().unwrap(),
        "--running-node",
        "x",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    let location = format!("{}:4:8", config.display());
    assert!(stderr.contains(&location), "{stderr}");
    assert!(
        stderr.contains("could not init cloud provider \"fake\""),
        "{stderr}"
    );
}

#[test]
fn an_unreadable_config_names_the_path() {
    let out = ccm(&[
        "conformance",
        "--cloud-config",
        "/nonexistent/cloud.toml",
        "--running-node",
        "x",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr.contains(
            "could not read cloud config /nonexistent/cloud.toml for cloud provider \"fake\""
        ),
        "{stderr}"
    );
}

#[test]
fn bad_flags_are_refused_with_usage() {
    let out = ccm(&["conformance", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unexpected argument '--no-such-flag'"));
    let out = ccm(&["--sim-zones", ""]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "an empty zone list is refused before anything starts"
    );
    assert!(text(&out.stderr).contains("--sim-zones must name at least one zone"));
    let out = ccm(&["--node-monitor-period", "5"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("missing unit"),
        "{}",
        text(&out.stderr)
    );
    let out = ccm(&["--cluster-cidr", "10.0.0.0/33"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--cluster-cidr"),
        "{}",
        text(&out.stderr)
    );
}

/// `ccm --version` names the version and the git commit the binary was built from (the
/// image's test and operators read it), as upstream's `version.Get()` carries `gitCommit`.
#[test]
fn version_prints_the_version_and_the_git_commit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ccm"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let line = String::from_utf8(out.stdout).unwrap();
    let commit = line
        .trim()
        .strip_prefix(&format!("ccm {} (commit ", env!("CARGO_PKG_VERSION")))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("unexpected --version: {line:?}"));
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    match head {
        // Built from this checkout: the commit is the checkout's.
        Some(head) => assert_eq!(commit, head),
        None => assert!(!commit.is_empty(), "{line:?}"),
    }
}
