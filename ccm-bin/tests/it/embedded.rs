//! The embedded default, driven with kubectl as a newcomer would:
//! - the node side: simulated nodes register, get pod CIDRs and go Ready; a node whose
//!   heartbeats are stopped through kubectl turns Unknown and gets the unreachable taints;
//!   resumed, its taints go;
//! - the cloud side: the fake cloud and the cloud controllers initialize the nodes, program
//!   their routes and give a `kubectl expose`d LoadBalancer Service an external IP.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::support::{https_get, https_get_with_token, require_kubectl, wait_until};

/// The embedded default run as a process (other modules drive it too).
pub(crate) struct Embedded {
    child: Child,
    pub(crate) dir: tempfile::TempDir,
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Embedded {
    pub(crate) fn start() -> Self {
        // Tests run side by side: no fixed port for the ccm's health endpoint.
        Self::start_serving(0)
    }

    /// The embedded default with the ccm's secure port on `secure_port` (0 = not served).
    fn start_serving(secure_port: u16) -> Self {
        Self::start_with(secure_port, &[], Stdio::null())
    }

    /// The embedded default with its logs (stderr) in `log`, with `extra` flags.
    pub(crate) fn start_logging_to(log: &std::path::Path, extra: &[&str]) -> Self {
        let file = std::fs::File::create(log).expect("create the log file");
        Self::start_with(0, extra, Stdio::from(file))
    }

    /// [`start_logging_to`](Self::start_logging_to) a control plane that joins `first`'s
    /// cluster: its data directory starts with `first`'s CA and service-account key, as
    /// kubeadm copies them to each control-plane node.
    pub(crate) fn join_logging_to(first: &Self, log: &std::path::Path, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("data").join("pki");
        std::fs::create_dir_all(&pki).unwrap();
        for file in ["ca.crt", "ca.key", "sa.key"] {
            std::fs::copy(
                first.dir.path().join("data").join("pki").join(file),
                pki.join(file),
            )
            .unwrap_or_else(|e| panic!("copy the first control plane's {file}: {e}"));
        }
        let file = std::fs::File::create(log).expect("create the log file");
        Self::start_in(dir, 0, extra, Stdio::from(file))
    }

    fn start_with(secure_port: u16, extra: &[&str], stderr: Stdio) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), secure_port, extra, stderr)
    }

    fn start_in(dir: tempfile::TempDir, secure_port: u16, extra: &[&str], stderr: Stdio) -> Self {
        let secure_port = secure_port.to_string();
        let mut child = Command::new(env!("CARGO_BIN_EXE_ccm"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--secure-port",
                &secure_port,
                "--sim-nodes",
                "3",
                "--sim-zones",
                "zone-a",
            ])
            .args([
                "--node-monitor-period",
                "500ms",
                "--node-monitor-grace-period",
                "4s",
            ])
            .args([
                "--sim-node-lease-duration",
                "2s",
                "--sim-node-status-update-frequency",
                "1s",
            ])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--write-kubeconfig")
            .arg(dir.path().join("kubeconfig"))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start ccm");
        let stdout = child.stdout.take().unwrap();
        let mut reader = BufReader::new(stdout);
        let mut first = String::new();
        reader.read_line(&mut first).unwrap();
        assert!(
            first.starts_with("embedded cluster: API server on https://"),
            "{first}"
        );
        // Keep reading the progress lines so the pipe never fills or closes.
        std::thread::spawn(move || for _ in reader.lines() {});
        Embedded { child, dir }
    }

    /// SIGTERM, as a person stopping it, then its exit status (within a minute).
    pub(crate) fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        let mut status = None;
        let exited = wait_until(Duration::from_secs(60), || {
            status = self.child.try_wait().expect("wait for ccm");
            status.is_some()
        });
        assert!(exited, "ccm did not exit within a minute of SIGTERM");
        status.unwrap()
    }

    /// kubectl against this cluster, with its own cache directory.
    pub(crate) fn command(&self) -> Command {
        let mut c = Command::new("kubectl");
        c.env("KUBECONFIG", self.dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"));
        c
    }

    pub(crate) fn kubectl(&self, args: &[&str]) -> String {
        let out = self.command().args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Applies `json` with kubectl.
    pub(crate) fn apply(&self, json: &str) {
        let out = self.kubectl_output(&["apply", "-f", "-"], json);
        assert!(out.status.success(), "kubectl apply {json}");
    }

    /// kubectl with `input` on stdin; stdout and stderr together.
    pub(crate) fn kubectl_stdin(&self, args: &[&str], input: &str) -> String {
        let out = self.kubectl_output(args, input);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// kubectl with `input` on stdin, run to completion.
    pub(crate) fn kubectl_output(&self, args: &[&str], input: &str) -> std::process::Output {
        use std::io::Write;
        let mut child = self
            .command()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// A token for the service account `default/<name>` (TokenRequest).
    pub(crate) fn token(&self, name: &str) -> String {
        self.apply(&format!(
            r#"{{"apiVersion":"v1","kind":"ServiceAccount","metadata":{{"name":"{name}","namespace":"default"}}}}"#
        ));
        let out = self
            .command()
            .args([
                "create",
                "--raw",
                &format!("/api/v1/namespaces/default/serviceaccounts/{name}/token"),
                "-f",
                "-",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(
                    br#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{}}"#,
                )?;
                child.wait_with_output()
            })
            .unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        answer["status"]["token"].as_str().unwrap().to_owned()
    }
}

/// The ccm's secure port in the embedded default, as upstream's delegated serving: a
/// service-account token is checked with a TokenReview by the embedded cluster and its
/// access with a SubjectAccessReview (RBAC `nonResourceURLs: [/metrics]` allows, none
/// denies with 403), the written kubeconfig's admin certificate is allowed, anonymous
/// `/healthz` is served.
#[test]
fn the_secure_port_delegates_auth_to_the_embedded_cluster() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let port = ccm_testkit::free_port();
    let cluster = Embedded::start_serving(port);
    let kubeconfig = cluster.dir.path().join("kubeconfig");
    assert!(
        wait_until(Duration::from_secs(30), || {
            https_get(port, "/metrics", &kubeconfig).is_some_and(|(code, _)| code == 200)
        }),
        "the admin never read /metrics"
    );
    cluster.apply(
        r#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"scrape"},
            "rules":[{"nonResourceURLs":["/metrics"],"verbs":["get"]}]}"#,
    );
    cluster.apply(
        r#"{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"scrape"},
            "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"scrape"},
            "subjects":[{"kind":"ServiceAccount","name":"prometheus","namespace":"default"}]}"#,
    );
    let scraper = cluster.token("prometheus");
    let (code, metrics) = https_get_with_token(port, "/metrics", &scraper).unwrap();
    assert_eq!(code, 200, "{metrics}");
    assert!(
        metrics.contains("running_managed_controllers{"),
        "{metrics}"
    );
    let stranger = cluster.token("stranger");
    let (code, message) = https_get_with_token(port, "/metrics", &stranger).unwrap();
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("system:serviceaccount:default:stranger"),
        "{message}"
    );
    assert_eq!(
        https_get_with_token(port, "/metrics", "forged").map(|(code, _)| code),
        Some(401)
    );
    assert_eq!(
        https_get_with_token(port, "/healthz", &stranger).map(|(code, _)| code),
        Some(200)
    );
}

#[test]
fn a_node_whose_heartbeats_stop_turns_unknown_and_is_tainted() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let cluster = Embedded::start();
    let ready = wait_until(Duration::from_secs(30), || {
        let out = cluster.kubectl(&["get", "nodes", "--no-headers"]);
        out.lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("Ready"))
            .count()
            == 3
    });
    assert!(
        ready,
        "3 simulated nodes never went Ready: {}",
        cluster.kubectl(&["get", "nodes"])
    );
    let cidrs = cluster.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].spec.podCIDR}"]);
    assert_eq!(
        cidrs.split_whitespace().count(),
        3,
        "IPAM gives every node a pod CIDR: {cidrs}"
    );

    cluster.kubectl(&[
        "annotate",
        "node",
        "sim-node-1",
        "sim.ccm-rs.io/heartbeat=stopped",
    ]);
    let tainted = wait_until(Duration::from_secs(30), || {
        let yaml = cluster.kubectl(&["get", "node", "sim-node-1", "-o", "yaml"]);
        yaml.contains("reason: NodeStatusUnknown")
            && yaml.contains("key: node.kubernetes.io/unreachable")
            && yaml.contains("effect: NoExecute")
            && yaml.contains("effect: NoSchedule")
    });
    assert!(
        tainted,
        "{}",
        cluster.kubectl(&["get", "node", "sim-node-1", "-o", "yaml"])
    );
    // The other nodes are untouched.
    let others = cluster.kubectl(&[
        "get",
        "node",
        "sim-node-0",
        "sim-node-2",
        "-o",
        "jsonpath={.items[*].spec.taints}",
    ]);
    assert!(!others.contains("unreachable"), "{others}");

    cluster.kubectl(&[
        "annotate",
        "--overwrite",
        "node",
        "sim-node-1",
        "sim.ccm-rs.io/heartbeat=running",
    ]);
    let recovered = wait_until(Duration::from_secs(30), || {
        let taints =
            cluster.kubectl(&["get", "node", "sim-node-1", "-o", "jsonpath={.spec.taints}"]);
        let ready = cluster.kubectl(&[
            "get",
            "node",
            "sim-node-1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        !taints.contains("unreachable") && ready == "True"
    });
    assert!(
        recovered,
        "{}",
        cluster.kubectl(&["get", "node", "sim-node-1", "-o", "yaml"])
    );
}

/// The whole cloud side through the API: every simulated node is initialized by the fake
/// cloud (providerID, zone and instance-type labels, the uninitialized taint removed), gets
/// its route (NetworkUnavailable=False, RouteCreated), and a LoadBalancer Service made with
/// `kubectl expose` gets the fake's ingress IP; deleted, the Service's finalizer is released.
#[test]
fn the_fake_cloud_initializes_nodes_routes_them_and_ensures_load_balancers() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let cluster = Embedded::start();
    let initialized = wait_until(Duration::from_secs(30), || {
        let ids = cluster.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].spec.providerID}"]);
        let taints = cluster.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].spec.taints}"]);
        ids.split_whitespace()
            .filter(|id| id.starts_with("fake://i-"))
            .count()
            == 3
            && !taints.contains("node.cloudprovider.kubernetes.io/uninitialized")
    });
    assert!(
        initialized,
        "{}",
        cluster.kubectl(&["get", "nodes", "-o", "yaml"])
    );
    let labels = cluster.kubectl(&[
        "get",
        "node",
        "sim-node-0",
        "-o",
        "jsonpath={.metadata.labels}",
    ]);
    for expected in [
        "\"topology.kubernetes.io/zone\":\"zone-a\"",
        "\"topology.kubernetes.io/region\":\"fake-region-1\"",
        "\"node.kubernetes.io/instance-type\":\"fake.medium\"",
    ] {
        assert!(labels.contains(expected), "{expected} in {labels}");
    }
    let routed = wait_until(Duration::from_secs(30), || {
        cluster.kubectl(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[*].status.conditions[?(@.type==\"NetworkUnavailable\")].reason}",
        ]) == "RouteCreated RouteCreated RouteCreated"
    });
    assert!(
        routed,
        "{}",
        cluster.kubectl(&["get", "nodes", "-o", "yaml"])
    );

    cluster.kubectl(&["run", "web", "--image=nginx", "--labels=app=web"]);
    let exposed = cluster.kubectl(&["expose", "pod", "web", "--type=LoadBalancer", "--port=80"]);
    assert!(exposed.contains("service/web exposed"), "{exposed}");
    let ensured = wait_until(Duration::from_secs(30), || {
        let ip = cluster.kubectl(&[
            "get",
            "service",
            "web",
            "-o",
            "jsonpath={.status.loadBalancer.ingress[0].ip}",
        ]);
        ip.parse::<std::net::IpAddr>().is_ok()
    });
    assert!(
        ensured,
        "{}",
        cluster.kubectl(&["get", "service", "web", "-o", "yaml"])
    );
    let finalizers = cluster.kubectl(&[
        "get",
        "service",
        "web",
        "-o",
        "jsonpath={.metadata.finalizers}",
    ]);
    assert!(
        finalizers.contains("service.kubernetes.io/load-balancer-cleanup"),
        "{finalizers}"
    );
    // `kubectl delete` waits for the finalizer: the controller deletes the LB, then lets go.
    let deleted = cluster.kubectl(&["delete", "service", "web", "--timeout=30s"]);
    assert!(deleted.contains("deleted"), "{deleted}");
    let events = cluster.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=web",
    ]);
    assert!(events.contains("EnsuredLoadBalancer"), "{events}");
    assert!(events.contains("DeletedLoadBalancer"), "{events}");
}

/// The README's workload walkthrough: a Deployment made with `kubectl create deployment`
/// (a protobuf body) rolls out (`kubectl rollout status` watches it), `kubectl scale` uses
/// the scale subresource, a Job runs to Complete on the simulated kubelets, `kubectl create
/// job` starts one, `kubectl run` pods are scheduled and Running, and deleting the
/// Deployment cascades to its ReplicaSet and pods (kube-scheduler, Deployment, ReplicaSet,
/// Job controllers; GC background deletion).
#[test]
fn workloads_roll_out_and_run_with_kubectl() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let cluster = Embedded::start();
    let ready = wait_until(Duration::from_secs(30), || {
        let out = cluster.kubectl(&["get", "nodes", "--no-headers"]);
        out.lines().count() == 3 && out.lines().all(|l| l.contains(" Ready "))
    });
    assert!(ready, "{}", cluster.kubectl(&["get", "nodes"]));
    // kubectl's typed `create` sends the Deployment as protobuf.
    let created = cluster.kubectl_stdin(
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=3",
        ],
        "",
    );
    assert!(created.contains("deployment.apps/web created"), "{created}");
    let rollout = cluster.kubectl_stdin(
        &["rollout", "status", "deployment/web", "--timeout=90s"],
        "",
    );
    assert!(rollout.contains("successfully rolled out"), "{rollout}");
    let row = cluster.kubectl(&["get", "deployment", "web", "--no-headers"]);
    assert!(row.split_whitespace().nth(1) == Some("3/3"), "{row}");
    let scaled = cluster.kubectl_stdin(&["scale", "deployment/web", "--replicas=5"], "");
    assert!(scaled.contains("deployment.apps/web scaled"), "{scaled}");
    let rollout = cluster.kubectl_stdin(
        &["rollout", "status", "deployment/web", "--timeout=90s"],
        "",
    );
    assert!(rollout.contains("successfully rolled out"), "{rollout}");
    let running = cluster.kubectl(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "--field-selector=status.phase=Running",
        "--no-headers",
    ]);
    assert_eq!(running.lines().count(), 5, "{running}");

    let job = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: pi}\nspec:\n  completions: 2\n  template:\n    metadata:\n      annotations: {sim.ccm-rs.io/run-duration: 2s}\n    spec:\n      restartPolicy: Never\n      containers: [{name: pi, image: perl}]\n";
    let applied = cluster.kubectl_stdin(&["apply", "-f", "-"], job);
    assert!(applied.contains("job.batch/pi created"), "{applied}");
    let waited = cluster.kubectl_stdin(
        &[
            "wait",
            "--for=condition=Complete",
            "job/pi",
            "--timeout=60s",
        ],
        "",
    );
    assert!(waited.contains("condition met"), "{waited}");
    let row = cluster.kubectl(&["get", "job", "pi", "--no-headers"]);
    assert!(row.contains("Complete") && row.contains("2/2"), "{row}");

    // `kubectl create job` (protobuf too): without a run-duration annotation the simulated
    // kubelet still ends a Job's pod (kwok's `pod-complete` stage), so the Job completes.
    let created = cluster.kubectl_stdin(&["create", "job", "once", "--image=busybox"], "");
    assert!(created.contains("job.batch/once created"), "{created}");
    let once = wait_until(Duration::from_secs(30), || {
        cluster.kubectl(&["get", "job", "once", "-o", "jsonpath={.status.succeeded}"]) == "1"
    });
    assert!(
        once,
        "{}",
        cluster.kubectl(&["get", "job,pods", "-l", "job-name=once", "-o", "wide"])
    );

    cluster.kubectl(&["run", "solo", "--image=nginx"]);
    let solo = wait_until(Duration::from_secs(30), || {
        cluster.kubectl(&["get", "pod", "solo", "-o", "jsonpath={.status.phase}"]) == "Running"
    });
    assert!(
        solo,
        "{}",
        cluster.kubectl(&["get", "pod", "solo", "-o", "yaml"])
    );

    let deleted = cluster.kubectl_stdin(&["delete", "deployment", "web"], "");
    assert!(deleted.contains("deleted"), "{deleted}");
    let gone = wait_until(Duration::from_secs(60), || {
        cluster
            .kubectl(&["get", "replicasets,pods", "-l", "app=web", "--no-headers"])
            .trim()
            .is_empty()
    });
    assert!(gone, "{}", cluster.kubectl(&["get", "all"]));
}

/// The embedded controllers against hostile numbers, through kubectl (upstream's outcomes:
/// `getMinTolerationTime` treats `math.MaxInt64` seconds as forever, `fitsRequest` leaves
/// an overflowing request Pending "Insufficient cpu"): after a toleration of
/// 9223372036854775807 and 2^62 seconds meets its NoExecute taint, and a pod asks 2 ×
/// `cpu: 5e15`, taint eviction still evicts and the scheduler still binds. `/livez` names
/// each supervised controller, as kube-controller-manager's health checks do.
#[test]
fn hostile_numbers_leave_the_embedded_controllers_running() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let cluster = Embedded::start();
    let ready = wait_until(Duration::from_secs(30), || {
        let out = cluster.kubectl(&["get", "nodes", "--no-headers"]);
        out.lines().count() == 3 && out.lines().all(|l| l.contains(" Ready "))
    });
    assert!(ready, "{}", cluster.kubectl(&["get", "nodes"]));
    let livez = cluster.kubectl(&["get", "--raw", "/livez?verbose"]);
    for check in [
        "[+]taint-eviction-controller ok",
        "[+]scheduler ok",
        "[+]node-lifecycle-controller ok",
        "[+]job-controller ok",
    ] {
        assert!(livez.contains(check), "{check} in {livez}");
    }

    for (name, seconds) in [
        ("forever", "9223372036854775807"),
        ("huge", "4611686018427387904"),
    ] {
        cluster.apply(&format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"default"}},
            "spec":{{"nodeName":"sim-node-2","containers":[{{"name":"c","image":"x"}}],
            "tolerations":[{{"key":"k2","operator":"Exists","effect":"NoExecute","tolerationSeconds":{seconds}}}]}}}}"#
        ));
    }
    cluster.kubectl(&["taint", "nodes", "sim-node-2", "k2=:NoExecute"]);
    cluster.apply(
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"victim","namespace":"default"},
        "spec":{"nodeName":"sim-node-1","containers":[{"name":"c","image":"x"}]}}"#,
    );
    cluster.kubectl(&["taint", "nodes", "sim-node-1", "k3=:NoExecute"]);
    let evicted = wait_until(Duration::from_secs(20), || {
        cluster
            .kubectl(&["get", "pod", "victim", "--ignore-not-found", "-o", "name"])
            .trim()
            .is_empty()
    });
    assert!(
        evicted,
        "{}",
        cluster.kubectl(&["get", "pods", "-o", "wide"])
    );

    cluster.apply(
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"hostile","namespace":"default"},
        "spec":{"containers":[{"name":"a","image":"x","resources":{"requests":{"cpu":"5e15"}}},
        {"name":"b","image":"x","resources":{"requests":{"cpu":"5e15"}}}]}}"#,
    );
    let pending = wait_until(Duration::from_secs(20), || {
        cluster
            .kubectl(&[
                "get",
                "events",
                "--field-selector",
                "involvedObject.name=hostile,reason=FailedScheduling",
            ])
            .contains("Insufficient cpu")
    });
    assert!(pending, "{}", cluster.kubectl(&["get", "events"]));
    cluster.kubectl(&["run", "plain", "--image=nginx"]);
    let running = wait_until(Duration::from_secs(30), || {
        cluster.kubectl(&["get", "pod", "plain", "-o", "jsonpath={.status.phase}"]) == "Running"
    });
    assert!(
        running,
        "{}",
        cluster.kubectl(&["get", "pods", "-o", "wide"])
    );
    for name in ["forever", "huge"] {
        let phase = cluster.kubectl(&[
            "get",
            "pod",
            name,
            "-o",
            "jsonpath={.metadata.deletionTimestamp}",
        ]);
        assert!(phase.is_empty(), "{name} is being deleted: {phase}");
    }
    let livez = cluster.kubectl(&["get", "--raw", "/livez?verbose"]);
    assert!(livez.contains("livez check passed"), "{livez}");
}
