//! The out-of-tree proof: a binary that links the provider finds it by name and the provider
//! passes the conformance kit; a binary that only depends on it does not see it.

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
        .args(["--cloud-config", config.to_str().unwrap()])
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
