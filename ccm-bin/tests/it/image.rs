//! The image `scripts/image.sh` builds with buildah from the binary these tests built (no
//! network, no daemon): its config runs `/usr/local/bin/ccm` as uid/gid 65532, and its root
//! filesystem, mounted read-only with a tmpfs on /tmp as `podman run --read-only` does and
//! entered as that user, runs `ccm --version` (the version and the git commit) and
//! `ccm --sim-nodes 1`, whose secure port answers `/readyz`.
//!
//! The root filesystem is run with `unshare`, `mount` and `chroot --userspec` rather than
//! podman: in this sandbox crun cannot set the container's rlimits (`setrlimit RLIMIT_NOFILE:
//! Operation not permitted`), so `podman run` fails before the binary starts. It needs root
//! (CI runs as root). buildah comes from PATH (scripts/test installs it with
//! scripts/buildah.sh); the test fails, never skips, without it.

use std::{
    path::Path,
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use ccm_testkit::free_port;

use crate::support::{https_get_anonymous, wait_until};

const IMAGE: &str = "localhost/ccm-rs/ccm:test";

fn require_buildah() {
    let out = Command::new("buildah").arg("--version").output();
    assert!(
        out.as_ref().is_ok_and(|o| o.status.success()),
        "buildah is required on PATH for this test; scripts/buildah.sh installs it \
         (scripts/test runs it): {out:?}"
    );
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn buildah(storage: &Path, args: &[&str]) -> Output {
    Command::new("buildah")
        .arg("--root")
        .arg(storage.join("root"))
        .arg("--runroot")
        .arg(storage.join("run"))
        .args(["--storage-driver", "vfs"])
        .args(args)
        .output()
        .expect("run buildah")
}

/// `ccm args…` inside `rootfs`: a private mount namespace where the root filesystem is
/// read-only, /tmp a tmpfs and /proc mounted, entered as 65532:65532.
fn in_container(rootfs: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-euc"])
        .arg(
            r#"r="$1"; shift
mount --bind "$r" "$r"
mount -o remount,bind,ro "$r"
mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
mount -t proc proc "$r/proc"
exec chroot --userspec=65532:65532 "$r" /usr/local/bin/ccm "$@""#,
        )
        .arg("sh")
        .arg(rootfs)
        .args(args);
    cmd
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_image_runs_ccm_as_non_root_on_a_read_only_root_filesystem() {
    require_buildah();
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("storage");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/image.sh");
    let built = ok(
        Command::new(&script)
            .args([env!("CARGO_BIN_EXE_ccm"), IMAGE, "--strip"])
            .env("IMAGE_STORAGE_ROOT", &storage)
            .env("BUILDAH", "buildah")
            .output()
            .unwrap(),
        "scripts/image.sh",
    );
    assert_eq!(built, IMAGE);

    // The image's config: the entrypoint and the non-root user, as in the Dockerfile.
    let config: serde_json::Value = serde_json::from_str(&ok(
        buildah(&storage, &["inspect", "--type", "image", IMAGE]),
        "buildah inspect",
    ))
    .unwrap();
    let oci = &config["OCIv1"]["config"];
    assert_eq!(oci["User"], "65532:65532", "{oci}");
    assert_eq!(oci["Entrypoint"], serde_json::json!(["/usr/local/bin/ccm"]));

    let container = ok(
        buildah(&storage, &["from", "--quiet", IMAGE]),
        "buildah from",
    );
    let rootfs = ok(buildah(&storage, &["mount", &container]), "buildah mount");
    let rootfs = Path::new(&rootfs);
    // Nothing but the binary, its libraries and a little of /etc: no shell.
    assert!(!rootfs.join("bin/sh").exists());

    let host = ok(
        Command::new(env!("CARGO_BIN_EXE_ccm"))
            .arg("--version")
            .output()
            .unwrap(),
        "ccm --version",
    );
    let inside = ok(
        in_container(rootfs, &["--version"]).output().unwrap(),
        "ccm --version in the image",
    );
    assert_eq!(inside, host);
    assert!(inside.contains("(commit "), "{inside}");

    let port = free_port();
    let log = std::fs::File::create(dir.path().join("ccm.log")).unwrap();
    let port_flag = format!("--secure-port={port}");
    let mut child = in_container(
        rootfs,
        &[
            "--sim-nodes",
            "1",
            "--listen",
            "127.0.0.1:0",
            "--write-kubeconfig",
            "/tmp/ccm.kubeconfig",
            &port_flag,
        ],
    );
    let ccm = Killed(
        child
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start ccm in the image"),
    );
    let ready = wait_until(Duration::from_secs(60), || {
        https_get_anonymous(port, "/readyz").is_some_and(|(code, _)| code == 200)
    });
    let log = || std::fs::read_to_string(dir.path().join("ccm.log")).unwrap_or_default();
    assert!(ready, "/readyz never answered 200: {}", log());

    // The serving process (unshare, sh and chroot each exec the next) is uid/gid 65532 and
    // its root is mounted read-only.
    let pid = ccm.0.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let ids = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    assert!(status.contains("Name:\tccm"), "{status}");
    assert_eq!(ids("Uid:"), "65532 65532 65532 65532");
    assert_eq!(ids("Gid:"), "65532 65532 65532 65532");
    assert_eq!(ids("CapEff:"), "0000000000000000");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .unwrap_or_else(|| panic!("no root mount in {mounts}"));
    let options: Vec<&str> = root.split_whitespace().nth(5).unwrap().split(',').collect();
    assert!(options.contains(&"ro"), "{root}");
    drop(ccm);
    let _ = buildah(&storage, &["umount", &container]);
    let _ = buildah(&storage, &["rm", &container]);
}
