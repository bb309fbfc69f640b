//! The out-of-tree proof: a binary that links the provider finds it by name, runs the
//! cloud-controller-manager with it, and the provider passes the conformance kit; a binary
//! that only depends on it does not see it.

use std::process::Command;

fn config_file(name: &str, contents: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("hello-cloud-{}-{name}.conf", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn linked_binary_finds_the_provider_and_passes_the_kit() {
    let config = config_file(
        "good",
        "# name zone ip\nnode-a hello-zone-1 10.0.0.1\nnode-b hello-zone-2 fd00::2\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_hello-ccm"))
        .args([
            "conformance",
            "--cloud-config",
            config.to_str().unwrap(),
            "node-a",
            "node-b",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("registered providers: hello"), "{stdout}");
    assert!(stdout.contains("PASS  instances-v2/metadata"), "{stdout}");
    assert!(stdout.contains("PASS  instances-v2/unknown"), "{stdout}");
    assert!(stdout.contains("SKIP  load-balancer/ensure"), "{stdout}");
    assert!(stdout.contains(" 0 failed"), "{stdout}");
}

#[test]
fn a_bad_config_is_a_clear_error_naming_provider_and_path() {
    let config = config_file("bad", "node-a hello-zone-1 not-an-ip\n");
    let out = Command::new(env!("CARGO_BIN_EXE_hello-ccm"))
        .args(["conformance", "--cloud-config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("could not init cloud provider \"hello\""),
        "{stderr}"
    );
    assert!(stderr.contains(config.to_str().unwrap()), "{stderr}");
    assert!(stderr.contains("line 1: want `name zone ip`"), "{stderr}");
}

#[test]
fn a_binary_that_does_not_reference_the_crate_does_not_register_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_hello-ccm-unlinked"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert_eq!(
        stdout.trim(),
        "registered providers:",
        "the linker pitfall changed: {stdout}"
    );
}

/// The vendor `main` is `cloud_provider_app::run` with the provider linked: `--cloud-provider
/// hello` is found (an unknown name lists it), its config is read, and the manager goes on to
/// reach the cluster, whose unreadable kubeconfig is the error.
#[test]
fn the_vendor_main_runs_the_manager_with_the_linked_provider() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hello-ccm"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(&["--cloud-provider", "nope"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("unknown cloud provider \"nope\"; registered providers: hello"),
        "{stderr}"
    );
    let bad = config_file("main-bad", "node-a hello-zone-1 not-an-ip\n");
    let (code, stderr) = run(&[
        "--cloud-provider",
        "hello",
        "--cloud-config",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("line 1: want `name zone ip`"), "{stderr}");
    let good = config_file("main-good", "node-a hello-zone-1 10.0.0.1\n");
    let kubeconfig = std::env::temp_dir().join("hello-ccm-no-such-dir/kubeconfig");
    let (code, stderr) = run(&[
        "--cloud-provider",
        "hello",
        "--cloud-config",
        good.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cluster access"), "{stderr}");
    assert!(stderr.contains(kubeconfig.to_str().unwrap()), "{stderr}");
}
