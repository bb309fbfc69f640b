//! `ccm apiserver --etcd-servers`: the API server on a real etcd, as kube-apiserver runs;
//! etcd lost and back, and two API servers serving one cluster from one etcd.

use std::time::Duration;

use ccm_testkit::etcd::Etcd;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, Config,
    api::{ListParams, PostParams, WatchEvent, WatchParams},
};

use crate::support::{ApiServerProcess, wait_until};

async fn client(server: &ApiServerProcess) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(server.kubeconfig()).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

fn config_map(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": {"v": value}
    }))
    .unwrap()
}

/// What `kubectl get --raw /readyz?verbose` says, and whether it succeeded.
fn readyz(server: &ApiServerProcess) -> (bool, String) {
    let out = server.kubectl(&["get", "--raw", "/readyz?verbose"]);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// kube-apiserver's etcd readiness check (`storage/storagebackend/factory/etcd3.go`
/// `newETCD3Check`, served as `[-]etcd failed` by `server/healthz`): with etcd stopped,
/// `/readyz` fails naming etcd and writes fail with a 5xx, nothing panics; when etcd is
/// back, the server is ready again without a restart and every acknowledged write is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stopped_makes_readyz_fail_and_writes_5xx_then_service_resumes() {
    let mut etcd = Etcd::start().await;
    let dir = tempfile::tempdir().unwrap();
    let servers = format!("--etcd-servers={}", etcd.servers_flag());
    let server = ApiServerProcess::start_with(dir.path(), &[&servers]);
    assert!(readyz(&server).0, "{}", readyz(&server).1);
    let cms: Api<ConfigMap> = Api::namespaced(client(&server).await, "default");
    cms.create(&PostParams::default(), &config_map("before", "1"))
        .await
        .unwrap();

    etcd.members[0].stop();
    assert!(
        wait_until(Duration::from_secs(30), || {
            let (ok, said) = readyz(&server);
            !ok && said.contains("[-]etcd failed")
        }),
        "readyz never reported etcd: {}",
        readyz(&server).1
    );
    match cms
        .create(&PostParams::default(), &config_map("during", "2"))
        .await
    {
        Err(kube::Error::Api(status)) => {
            assert!(status.code >= 500, "{status:?}");
        }
        other => panic!("a write without etcd must fail with a 5xx, got {other:?}"),
    }

    etcd.members[0].restart().await;
    assert!(
        wait_until(Duration::from_secs(30), || readyz(&server).0),
        "readyz never recovered: {}",
        readyz(&server).1
    );
    assert_eq!(
        cms.get("before").await.unwrap().data.unwrap()["v"],
        "1",
        "the acknowledged write survived"
    );
    assert!(cms.get_opt("during").await.unwrap().is_none());
    cms.create(&PostParams::default(), &config_map("after", "3"))
        .await
        .expect("writes work again");
}

/// Two API servers on one etcd serve one cluster (upstream: every kube-apiserver of an HA
/// control plane on the same etcd, `etcd3/store.go` and `etcd3/watcher.go`): a write on one
/// is seen by get, list and watch on the other, a stale update gets 409 on either, and a
/// continue token from one pages on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_api_servers_on_one_etcd_serve_one_cluster() {
    let etcd = Etcd::start().await;
    let servers = format!("--etcd-servers={}", etcd.servers_flag());
    let dir_a = tempfile::tempdir().unwrap();
    let a = ApiServerProcess::start_with(dir_a.path(), &[&servers]);
    // The second server shares the first's PKI files (CA, signing keys), as control-plane
    // nodes of one cluster do, so one kubeconfig works against both.
    let dir_b = tempfile::tempdir().unwrap();
    let b = ApiServerProcess::start_sharing(dir_b.path(), &a, &[&servers]);
    let on_a: Api<ConfigMap> = Api::namespaced(client(&a).await, "default");
    let on_b: Api<ConfigMap> = Api::namespaced(client(&b).await, "default");

    // A watch on B from the current resourceVersion.
    let listed = on_b.list(&ListParams::default()).await.unwrap();
    let from = listed.metadata.resource_version.unwrap();
    let mut watch = Box::pin(
        on_b.watch(&WatchParams::default(), &from)
            .await
            .expect("watch on B"),
    );

    let created = on_a
        .create(&PostParams::default(), &config_map("shared", "1"))
        .await
        .unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    let seen = on_b.get("shared").await.expect("B reads A's write");
    assert_eq!(seen.metadata.resource_version.as_deref(), Some(rv.as_str()));
    let names: Vec<String> = on_b
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .collect();
    assert!(names.contains(&"shared".to_owned()), "{names:?}");
    let event = tokio::time::timeout(Duration::from_secs(10), futures_next(&mut watch))
        .await
        .expect("B's watch delivers A's write within 10 s");
    match event {
        Some(WatchEvent::Added(cm)) => {
            assert_eq!(cm.metadata.name.as_deref(), Some("shared"));
            assert_eq!(cm.metadata.resource_version.as_deref(), Some(rv.as_str()));
        }
        other => panic!("expected ADDED shared, got {other:?}"),
    }

    // B updates; then A's update from the stale resourceVersion gets 409.
    let mut fresh = seen.clone();
    fresh.data = Some([("v".to_owned(), "2".to_owned())].into());
    on_b.replace("shared", &PostParams::default(), &fresh)
        .await
        .unwrap();
    let mut stale = created.clone();
    stale.data = Some([("v".to_owned(), "stale".to_owned())].into());
    match on_a.replace("shared", &PostParams::default(), &stale).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("a stale update must conflict, got {other:?}"),
    }
    assert_eq!(on_a.get("shared").await.unwrap().data.unwrap()["v"], "2");

    // A continue token from A pages on B.
    for i in 0..5 {
        on_a.create(
            &PostParams::default(),
            &config_map(&format!("page-{i}"), "x"),
        )
        .await
        .unwrap();
    }
    let first = on_a.list(&ListParams::default().limit(2)).await.unwrap();
    let token = first.metadata.continue_.clone().expect("a continue token");
    let mut names: Vec<String> = first
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    let rest = on_b
        .list(&ListParams::default().continue_token(&token))
        .await
        .expect("B accepts A's continue token");
    names.extend(rest.items.into_iter().filter_map(|c| c.metadata.name));
    names.retain(|n| n != "kube-root-ca.crt");
    assert_eq!(
        names,
        ["page-0", "page-1", "page-2", "page-3", "page-4", "shared"]
    );
}

async fn futures_next<S>(stream: &mut S) -> Option<WatchEvent<ConfigMap>>
where
    S: futures::Stream<Item = Result<WatchEvent<ConfigMap>, kube::Error>> + Unpin,
{
    use futures::StreamExt;
    loop {
        match stream.next().await? {
            Ok(WatchEvent::Bookmark(_)) => continue,
            Ok(event) => return Some(event),
            Err(error) => panic!("watch failed: {error}"),
        }
    }
}

/// One of two API servers on one etcd is killed (SIGKILL) in the middle of a burst of
/// writes: every write it acknowledged reads back through the other (etcd commits before
/// kube-apiserver answers, `etcd3/store.go` `Create`), and the other keeps taking writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_two_api_servers_mid_burst_loses_no_acknowledged_write() {
    let etcd = Etcd::start().await;
    let servers = format!("--etcd-servers={}", etcd.servers_flag());
    let dir_a = tempfile::tempdir().unwrap();
    let mut a = ApiServerProcess::start_with(dir_a.path(), &[&servers]);
    let dir_b = tempfile::tempdir().unwrap();
    let b = ApiServerProcess::start_sharing(dir_b.path(), &a, &[&servers]);
    let on_a: Api<ConfigMap> = Api::namespaced(client(&a).await, "default");
    let on_b: Api<ConfigMap> = Api::namespaced(client(&b).await, "default");

    let acknowledged = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let writers: Vec<_> = (0..8)
        .map(|writer| {
            let (api, acknowledged) = (on_a.clone(), acknowledged.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    let name = format!("burst-{writer}-{i}");
                    match api
                        .create(&PostParams::default(), &config_map(&name, "x"))
                        .await
                    {
                        Ok(_) => acknowledged.lock().push(name),
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(60), || acknowledged.lock().len() >= 100),
        "the burst got going"
    );
    a.kill();
    for writer in writers {
        tokio::time::timeout(Duration::from_secs(60), writer)
            .await
            .expect("every writer sees the server go")
            .unwrap();
    }
    let acknowledged = acknowledged.lock().clone();
    let listed: std::collections::HashSet<String> = on_b
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .collect();
    let lost: Vec<&String> = acknowledged
        .iter()
        .filter(|n| !listed.contains(*n))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged through A, missing on B: {lost:?}"
    );
    on_b.create(&PostParams::default(), &config_map("after", "1"))
        .await
        .expect("B keeps taking writes");
}

/// The holder of the Lease `kube-system/<lease>` as `embedded`'s API server reports it.
fn lease_holder(embedded: &crate::embedded::Embedded, lease: &str) -> String {
    embedded.kubectl(&[
        "get",
        "lease",
        "-n",
        "kube-system",
        lease,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])
}

fn identity(embedded: &crate::embedded::Embedded) -> String {
    std::fs::read_to_string(embedded.dir.path().join("data").join("leader-identity"))
        .expect("the leader identity is kept in the data directory")
}

fn log_says(log: &std::path::Path, line: &str) -> bool {
    std::fs::read_to_string(log).is_ok_and(|l| l.contains(line))
}

/// The Leases of the node-side controllers and of the scheduler, in `kube-system`.
const LEADER_LEASES: [&str; 2] = ["kube-controller-manager", "kube-scheduler"];

/// Two embedded control planes on one etcd, each logging to a file.
struct TwoControlPlanes {
    /// Started first; leads both [`LEADER_LEASES`].
    a: crate::embedded::Embedded,
    /// Started once A leads, with its own simulated node `b-node`.
    b: crate::embedded::Embedded,
    log_a: std::path::PathBuf,
    log_b: std::path::PathBuf,
    /// Holds the log files.
    _logs: tempfile::TempDir,
}

/// Starts A on `etcd`, waits until it holds both [`LEADER_LEASES`], then starts B with
/// A's CA and service-account key (B refuses to start with a PKI of its own).
fn two_control_planes(etcd: &Etcd) -> TwoControlPlanes {
    let servers = format!("--etcd-servers={}", etcd.servers_flag());
    let logs = tempfile::tempdir().unwrap();
    let (log_a, log_b) = (logs.path().join("a.log"), logs.path().join("b.log"));
    let a = crate::embedded::Embedded::start_logging_to(&log_a, &[&servers]);
    for lease in LEADER_LEASES {
        assert!(
            wait_until(Duration::from_secs(60), || lease_holder(&a, lease)
                == identity(&a)),
            "A leads {lease}"
        );
    }
    // The embedded default checks the PKI as `ccm apiserver` does: a second control plane
    // with a CA of its own exits 1, naming the files to copy, before it serves anything.
    let own = tempfile::tempdir().unwrap();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--secure-port",
            "0",
            "--sim-nodes",
            "1",
        ])
        .arg("--data-dir")
        .arg(own.path().join("data"))
        .arg("--write-kubeconfig")
        .arg(own.path().join("kubeconfig"))
        .arg(&servers)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("copy ca.crt, ca.key, sa.key"), "{stderr}");
    assert!(
        !own.path().join("kubeconfig").exists(),
        "a refused control plane writes no kubeconfig"
    );
    let b = crate::embedded::Embedded::join_logging_to(
        &a,
        &log_b,
        &[&servers, "--sim-node-names", "b-node"],
    );
    TwoControlPlanes {
        a,
        b,
        log_a,
        log_b,
        _logs: logs,
    }
}

/// Two embedded control planes on one etcd: only the holder of kube-controller-manager's
/// and kube-scheduler's Leases runs the node-side controllers and the scheduler (client-go
/// `tools/leaderelection`, upstream's 15 s lease, 10 s renew deadline, 2 s retry), and when
/// it is killed the other takes both Leases over once they expire and starts acting.
/// Wall-clock bounds are generous (the lease alone takes 15 s to expire).
#[test]
fn two_embedded_control_planes_on_one_etcd_elect_one_leader_and_fail_over() {
    crate::support::require_kubectl("the leader-election test reads Leases with kubectl");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let etcd = runtime.block_on(Etcd::start());
    let TwoControlPlanes {
        a,
        b,
        log_a,
        log_b,
        _logs,
    } = two_control_planes(&etcd);
    let leases = LEADER_LEASES;
    // B campaigns for well over a lease duration and never leads while A renews.
    assert!(
        !wait_until(Duration::from_secs(25), || log_says(
            &log_b,
            "leader election: leading"
        )),
        "B must not lead while A renews: {}",
        std::fs::read_to_string(&log_b).unwrap_or_default()
    );
    for lease in leases {
        assert_eq!(lease_holder(&b, lease), identity(&a), "{lease}");
        let leading = format!("leading kube-system/{lease}");
        assert!(log_says(&log_a, &leading), "A acts as {lease}");
        assert!(!log_says(&log_b, &leading), "B must not act as {lease}");
    }

    let b_identity = identity(&b);
    drop(a);
    for lease in leases {
        let leading = format!("leading kube-system/{lease} as {b_identity}");
        assert!(
            wait_until(Duration::from_secs(90), || log_says(&log_b, &leading)),
            "B takes {lease} over after A is killed: {}",
            std::fs::read_to_string(&log_b).unwrap_or_default()
        );
        assert_eq!(lease_holder(&b, lease), b_identity);
    }
    drop(b);
    drop(etcd);
}

/// client-go's `ReleaseOnCancel` (`tools/leaderelection/leaderelection.go` `release`, which
/// kube-scheduler sets) between two embedded control planes on one etcd: A stopped with
/// SIGTERM has released kube-controller-manager's and kube-scheduler's Leases by the time it
/// exits (no holder, `leaseDurationSeconds: 1`), so B leads both without waiting out the
/// 15 s lease. Killed instead (the test above), A leaves its Leases held until they expire.
#[test]
fn a_control_plane_stopped_gracefully_releases_its_leases_to_the_other() {
    crate::support::require_kubectl("the leader-election test reads Leases with kubectl");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let etcd = runtime.block_on(Etcd::start());
    let TwoControlPlanes {
        mut a,
        b,
        log_b,
        _logs,
        ..
    } = two_control_planes(&etcd);
    let leases = LEADER_LEASES;
    let a_identity = identity(&a);
    for lease in leases {
        assert!(
            wait_until(Duration::from_secs(60), || lease_holder(&b, lease)
                == a_identity),
            "B serves and sees A lead {lease}"
        );
    }
    // B campaigns once its identity is in its data directory.
    let b_file = b.dir.path().join("data").join("leader-identity");
    assert!(
        wait_until(Duration::from_secs(60), || b_file.exists()),
        "B campaigns"
    );
    let b_identity = identity(&b);

    let status = a.terminate();
    assert!(status.success(), "SIGTERM stops A cleanly: {status}");
    // At once, well inside the 15 s lease A would otherwise hold: released, or already B's.
    for lease in leases {
        let record = b.kubectl(&[
            "get",
            "lease",
            "-n",
            "kube-system",
            lease,
            "-o",
            "jsonpath={.spec.holderIdentity}/{.spec.leaseDurationSeconds}",
        ]);
        assert!(
            record == "/1" || record == format!("{b_identity}/15"),
            "{lease} after A stopped: {record} (A was {a_identity})"
        );
    }
    for lease in leases {
        let leading = format!("leading kube-system/{lease} as {b_identity}");
        assert!(
            wait_until(Duration::from_secs(60), || log_says(&log_b, &leading)),
            "B takes {lease} over: {}",
            std::fs::read_to_string(&log_b).unwrap_or_default()
        );
        assert_eq!(lease_holder(&b, lease), b_identity);
    }
    drop(b);
    drop(etcd);
}

/// kubeadm's HA control plane: every kube-apiserver of one etcd gets the cluster's CA and
/// service-account key, copied to each control-plane node. A second `ccm apiserver` on the
/// etcd with a data directory of its own exits 1 naming the files to copy and where,
/// before it serves anything; with copies of the first's `ca.crt`, `ca.key` and `sa.key`
/// it starts, and the first server's kubeconfig works against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_api_server_with_a_pki_of_its_own_refuses_to_start_and_with_the_first_ones_serves()
{
    let etcd = Etcd::start().await;
    let servers = format!("--etcd-servers={}", etcd.servers_flag());
    let dir_a = tempfile::tempdir().unwrap();
    let a = ApiServerProcess::start_with(dir_a.path(), &[&servers]);
    let dir_b = tempfile::tempdir().unwrap();
    let data_b = dir_b.path().join("data");
    let mut refused = std::process::Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args(["apiserver", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data_b)
        .arg(&servers)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || refused
            .try_wait()
            .unwrap()
            .is_some()),
        "a server with a PKI of its own must not start"
    );
    let out = refused.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let pki_b = data_b.join("pki");
    for named in ["copy ca.crt, ca.key, sa.key", &pki_b.display().to_string()] {
        assert!(stderr.contains(named), "{named:?} not in: {stderr}");
    }

    for file in ["ca.crt", "ca.key", "sa.key"] {
        std::fs::copy(a.dir.join("data").join("pki").join(file), pki_b.join(file)).unwrap();
    }
    let b = ApiServerProcess::start_with(dir_b.path(), &[&servers]);
    let kubeconfig = std::fs::read_to_string(a.kubeconfig()).unwrap();
    let pointed = kubeconfig.replace(&a.addr, &b.addr);
    assert_ne!(pointed, kubeconfig);
    let config = Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&pointed).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let on_b: Api<ConfigMap> = Api::namespaced(Client::try_from(config).unwrap(), "default");
    on_b.create(&PostParams::default(), &config_map("from-a", "1"))
        .await
        .expect("the first server's admin writes through the second");
    let on_a: Api<ConfigMap> = Api::namespaced(client(&a).await, "default");
    assert_eq!(on_a.get("from-a").await.unwrap().data.unwrap()["v"], "1");
}
