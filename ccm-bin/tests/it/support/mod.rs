//! Starting `ccm apiserver` as a process, and running kubectl against it.

#![allow(dead_code, unreachable_pub)]

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

pub use ccm_testkit::kubectl::require_kubectl;

/// A running `ccm apiserver`, killed on drop.
pub struct ApiServerProcess {
    pub child: Child,
    pub addr: String,
    pub dir: PathBuf,
}

impl ApiServerProcess {
    /// Starts `ccm apiserver` on a free loopback port with its store in `dir/data`.
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, &[])
    }

    /// [`ApiServerProcess::start`] with more flags.
    pub fn start_with(dir: &Path, flags: &[&str]) -> Self {
        Self::start_in(dir, &dir.join("data"), flags)
    }

    /// A second server with `first`'s data directory (its PKI: an etcd-backed server keeps
    /// only that there) and its own kubeconfig in `dir`.
    pub fn start_sharing(dir: &Path, first: &ApiServerProcess, flags: &[&str]) -> Self {
        Self::start_in(dir, &first.dir.join("data"), flags)
    }

    /// `ccm apiserver --in-memory`: no store on disk, a throwaway PKI, its kubeconfig in
    /// `dir`.
    pub fn start_in_memory(dir: &Path, flags: &[&str]) -> Self {
        let mut all = vec!["--in-memory"];
        all.extend_from_slice(flags);
        Self::spawn(dir, &all)
    }

    fn start_in(dir: &Path, data_dir: &Path, flags: &[&str]) -> Self {
        let mut all = vec![
            "--data-dir",
            data_dir.to_str().expect("a UTF-8 data directory"),
        ];
        all.extend_from_slice(flags);
        Self::spawn(dir, &all)
    }

    fn spawn(dir: &Path, flags: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ccm"))
            .args(["apiserver", "--listen", "127.0.0.1:0"])
            .arg("--write-kubeconfig")
            .arg(dir.join("kubeconfig"))
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ccm apiserver");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the serving line");
        let addr = line
            .trim()
            .rsplit("https://")
            .next()
            .filter(|a| a.contains(':'))
            .unwrap_or_else(|| panic!("unexpected first line from ccm apiserver: {line:?}"))
            .to_owned();
        ApiServerProcess {
            child,
            addr,
            dir: dir.to_owned(),
        }
    }

    /// The kubeconfig the server wrote.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// Runs kubectl against this server.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        kubectl_cmd(&self.kubeconfig(), &self.dir)
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// Runs kubectl and returns stdout, failing the test on a non-zero exit.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl with `stdin` as the manifest (`-f -`).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        use std::io::Write;
        let mut child = kubectl_cmd(&self.kubeconfig(), &self.dir)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ApiServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn kubectl_cmd(kubeconfig: &Path, dir: &Path) -> Command {
    let mut cmd = ccm_testkit::kubectl::command(dir, kubeconfig);
    cmd.arg("--request-timeout=20s");
    cmd
}

/// Polls `f` until it is true or `timeout` passes. Real processes run on the real clock, so
/// this one waits in wall time on purpose.
#[allow(clippy::disallowed_types, clippy::disallowed_methods)]
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// `GET path` over HTTPS on the ccm's secure port `127.0.0.1:port`, authenticated by the
/// client certificate of `kubeconfig`'s user (the cluster admin, `system:masters`, which
/// upstream's delegated authorizer always allows); the ccm's self-signed serving
/// certificate is not verified. `(status, body)`, or `None` while nothing answers.
pub fn https_get(port: u16, path: &str, kubeconfig: &Path) -> Option<(u16, String)> {
    let yaml = std::fs::read_to_string(kubeconfig).ok()?;
    https_get_as(port, path, &yaml)
}

/// [`https_get`] with a bearer `token` instead of a client certificate.
pub fn https_get_with_token(port: u16, path: &str, token: &str) -> Option<(u16, String)> {
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: https://127.0.0.1}}}}]\nusers: [{{name: u, user: {{token: {token}}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n"
    );
    https_get_as(port, path, &yaml)
}

/// [`https_get`] with no credentials at all (what a kubelet's probe sends).
pub fn https_get_anonymous(port: u16, path: &str) -> Option<(u16, String)> {
    let yaml = "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: https://127.0.0.1}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n";
    https_get_as(port, path, yaml)
}

/// [`https_get_anonymous`] to any `host:port` (a simulated kubelet's endpoint).
pub fn https_get_anonymous_at(authority: &str, path: &str) -> Option<(u16, String)> {
    let yaml = "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: https://127.0.0.1}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n";
    https_get_at(&format!("https://{authority}"), path, yaml)
}

fn https_get_as(port: u16, path: &str, kubeconfig_yaml: &str) -> Option<(u16, String)> {
    https_get_at(&format!("https://127.0.0.1:{port}"), path, kubeconfig_yaml)
}

fn https_get_at(url: &str, path: &str, kubeconfig_yaml: &str) -> Option<(u16, String)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    runtime.block_on(async {
        let file = kube::config::Kubeconfig::from_yaml(kubeconfig_yaml).ok()?;
        let mut config = kube::Config::from_custom_kubeconfig(file, &Default::default())
            .await
            .ok()?;
        config.cluster_url = url.parse().ok()?;
        config.root_cert = None;
        config.accept_invalid_certs = true;
        let client = kube::Client::try_from(config).ok()?;
        let request = http::Request::get(path).body(Vec::new()).ok()?;
        match client.request_text(request).await {
            Ok(body) => Some((200, body)),
            Err(kube::Error::Api(status)) => Some((status.code, status.message)),
            Err(_) => None,
        }
    })
}
