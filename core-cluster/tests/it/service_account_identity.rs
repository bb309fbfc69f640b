//! A pod's service-account identity end to end: ServiceAccount admission
//! (`plugin/pkg/admission/serviceaccount/admission.go`), the serviceaccounts controller
//! (`pkg/controller/serviceaccount/serviceaccounts_controller.go`), the root-CA publisher
//! (`pkg/controller/certificates/rootcacertpublisher/publisher.go`), kubelet's projected
//! token and service environment (`pkg/kubelet/token/token_manager.go`,
//! `pkg/kubelet/kubelet_pods.go` `getServiceEnvVarMap`) and the bound token's validation
//! (`pkg/serviceaccount/claims.go`), over TLS with kubectl v1.32 and kube-rs.

use std::{path::PathBuf, time::Duration};

use ccm_testkit::{TestServer, eventually, kubectl::require_kubectl};
use core_cluster::{
    ApiServerConfig, KubeletClientConfig,
    controllers::{root_ca_publisher::RootCaPublisher, serviceaccounts::ServiceAccountsController},
    sim::{KubeletApiConfig, NodeSimulator, SimConfig},
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Cluster {
    server: TestServer,
    client: Client,
    stop: CancellationToken,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The API server with ServiceAccount admission over TLS, the two controllers, and a
/// simulated node serving the kubelet API.
async fn start(node: &str) -> Cluster {
    // As kubeadm sets it up: the API server presents a cluster-CA client certificate that
    // the kubelets authenticate and authorize for `exec`.
    let mut kubelet_api = KubeletApiConfig::default();
    let config = ApiServerConfig {
        service_account_admission: true,
        kubelet: KubeletClientConfig {
            preferred_address_types: vec!["InternalIP".into(), "Hostname".into()],
            timeout: Duration::from_secs(5),
            ..KubeletClientConfig::default()
        },
        ..ApiServerConfig::default()
    };
    let server =
        crate::kubelet_api::serve_with_kubelet_identity(config, &mut kubelet_api, true).await;
    let client = server.admin_client().await.unwrap();
    let stop = CancellationToken::new();
    let root_ca = server.security().pki.ca_pem().to_owned();
    tokio::spawn(ServiceAccountsController::new(client.clone()).run(stop.clone()));
    tokio::spawn(RootCaPublisher::new(client.clone(), root_ca).run(stop.clone()));
    let sim =
        NodeSimulator::new(client.clone(), SimConfig::default()).with_kubelet_api(kubelet_api);
    sim.add_nodes([node]);
    tokio::spawn({
        let stop = stop.clone();
        async move { sim.run(stop).await }
    });
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.admin_kubeconfig()).unwrap();
    Cluster {
        server,
        client,
        stop,
        dir,
        kubeconfig,
    }
}

async fn namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &ns).await.unwrap();
}

/// kubectl with `kubeconfig`: (exit code, stdout, stderr).
async fn kubectl(
    c: &Cluster,
    kubeconfig: &std::path::Path,
    args: &[&str],
) -> (i32, String, String) {
    let mut command = ccm_testkit::kubectl::command(c.dir.path(), kubeconfig);
    command.args(args);
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `serviceaccounts_controller.go` `syncNamespace` and `publisher.go` `syncNamespace`: a new
/// namespace gets its `default` ServiceAccount and its `kube-root-ca.crt` (the API server's
/// CA, with upstream's description); an edited `kube-root-ca.crt` is repaired, a deleted
/// one recreated, and a deleted `default` account recreated with a new UID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_namespace_gets_its_default_account_and_root_ca() {
    let c = start("id-a").await;
    namespace(&c.client, "team").await;
    let accounts: Api<ServiceAccount> = Api::namespaced(c.client.clone(), "team");
    let configmaps: Api<ConfigMap> = Api::namespaced(c.client.clone(), "team");
    let ca = c.server.security().pki.ca_pem().to_owned();
    let first = eventually(20, "the default account", || {
        let accounts = accounts.clone();
        async move { accounts.get_opt("default").await.ok()? }
    })
    .await;
    let ca_of = |cm: ConfigMap| cm.data.and_then(|d| d.get("ca.crt").cloned());
    let published = eventually(20, "kube-root-ca.crt", || {
        let configmaps = configmaps.clone();
        async move { configmaps.get_opt("kube-root-ca.crt").await.ok()? }
    })
    .await;
    assert_eq!(ca_of(published.clone()).as_deref(), Some(ca.as_str()));
    assert!(
        published.metadata.annotations.unwrap()["kubernetes.io/description"]
            .starts_with("Contains a CA bundle")
    );
    // Edited: put back.
    let mut edited = configmaps.get("kube-root-ca.crt").await.unwrap();
    edited.data = Some([("ca.crt".to_owned(), "forged".to_owned())].into());
    configmaps
        .replace("kube-root-ca.crt", &PostParams::default(), &edited)
        .await
        .unwrap();
    eventually(20, "the edited kube-root-ca.crt repaired", || {
        let (configmaps, ca) = (configmaps.clone(), ca.clone());
        async move {
            let cm = configmaps.get("kube-root-ca.crt").await.ok()?;
            (cm.data?.get("ca.crt")? == &ca).then_some(())
        }
    })
    .await;
    // Deleted: recreated.
    configmaps
        .delete("kube-root-ca.crt", &DeleteParams::default())
        .await
        .unwrap();
    let uid = published.metadata.uid.clone();
    eventually(20, "kube-root-ca.crt recreated", || {
        let (configmaps, uid) = (configmaps.clone(), uid.clone());
        async move {
            let cm = configmaps.get_opt("kube-root-ca.crt").await.ok()??;
            (cm.metadata.uid != uid).then_some(())
        }
    })
    .await;
    accounts
        .delete("default", &DeleteParams::default())
        .await
        .unwrap();
    eventually(20, "the default account recreated", || {
        let (accounts, uid) = (accounts.clone(), first.metadata.uid.clone());
        async move {
            let sa = accounts.get_opt("default").await.ok()??;
            (sa.metadata.uid != uid).then_some(())
        }
    })
    .await;
}

/// The whole path: a pod in a new namespace gets the `default` account and the projected
/// volume (admission); `cat` of the token, the CA and the namespace at
/// `/var/run/secrets/kubernetes.io/serviceaccount` in the running container (kubelet's
/// projected volume, the token minted by TokenRequest bound to the pod); `env` shows
/// `KUBERNETES_SERVICE_HOST/PORT` (`getServiceEnvVarMap`); `kubectl auth whoami` with the
/// token is the service account with the pod's name in its extra; once the pod is deleted
/// the token is refused with 401 (`claims.go`: the bound pod is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_token_is_its_service_account_until_the_pod_is_deleted() {
    require_kubectl("it runs `kubectl exec` and `kubectl auth whoami`");
    let c = start("id-b").await;
    namespace(&c.client, "shop").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "shop");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"nodeName": "id-b", "containers": [{"name": "app", "image": "nginx"}]},
    }))
    .unwrap();
    // Admission waits for the controller's `default` account if it is not there yet.
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let spec = created.spec.unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    let volume = &spec.volumes.unwrap()[0];
    assert!(
        volume.name.starts_with("kube-api-access-"),
        "{}",
        volume.name
    );
    eventually(20, "the pod runs", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("web").await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        }
    })
    .await;
    eventually(20, "kube-root-ca.crt in the namespace", || {
        let cms: Api<ConfigMap> = Api::namespaced(c.client.clone(), "shop");
        async move { cms.get_opt("kube-root-ca.crt").await.ok()? }
    })
    .await;
    let admin = c.kubeconfig.clone();
    let dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let (code, token, err) = kubectl(
        &c,
        &admin,
        &[
            "-n",
            "shop",
            "exec",
            "web",
            "--",
            "cat",
            &format!("{dir}/token"),
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    let (code, ca, err) = kubectl(
        &c,
        &admin,
        &[
            "-n",
            "shop",
            "exec",
            "web",
            "--",
            "cat",
            &format!("{dir}/ca.crt"),
        ],
    )
    .await;
    assert_eq!(
        (code, ca.as_str()),
        (0, c.server.security().pki.ca_pem()),
        "{err}"
    );
    let (code, ns, _) = kubectl(
        &c,
        &admin,
        &[
            "-n",
            "shop",
            "exec",
            "web",
            "--",
            "cat",
            &format!("{dir}/namespace"),
        ],
    )
    .await;
    assert_eq!((code, ns.as_str()), (0, "shop"));
    // The same token on a second read: kubelet keeps it until 80 % of its life is gone.
    let (_, again, _) = kubectl(
        &c,
        &admin,
        &[
            "-n",
            "shop",
            "exec",
            "web",
            "--",
            "cat",
            &format!("{dir}/token"),
        ],
    )
    .await;
    assert_eq!(again, token);
    let (code, env, err) = kubectl(&c, &admin, &["-n", "shop", "exec", "web", "--", "env"]).await;
    assert_eq!(code, 0, "{err}");
    for line in [
        "KUBERNETES_SERVICE_HOST=10.96.0.1\n",
        "KUBERNETES_SERVICE_PORT=443\n",
        "KUBERNETES_SERVICE_PORT_HTTPS=443\n",
        "KUBERNETES_PORT=tcp://10.96.0.1:443\n",
        "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1\n",
    ] {
        assert!(env.contains(line), "{line} in {env}");
    }

    let with_token = c.dir.path().join("token-kubeconfig");
    std::fs::write(&with_token, c.server.kubeconfig_with_token(&token)).unwrap();
    let (code, who, err) = kubectl(&c, &with_token, &["auth", "whoami", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let who: serde_json::Value = serde_json::from_str(&who).unwrap();
    let user = &who["status"]["userInfo"];
    assert_eq!(user["username"], "system:serviceaccount:shop:default");
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["web"])
    );

    pods.delete("web", &DeleteParams::default()).await.unwrap();
    eventually(30, "the pod is gone", || {
        let pods = pods.clone();
        async move { pods.get_opt("web").await.ok()?.is_none().then_some(()) }
    })
    .await;
    let (code, _, err) = kubectl(&c, &with_token, &["auth", "whoami"]).await;
    assert_ne!(code, 0);
    assert!(err.contains("Unauthorized"), "{err}");
}

/// `admission.go` `getServiceAccount`: a pod naming an account that does not exist is
/// refused with upstream's 403, through kubectl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_run_with_a_missing_account_is_refused() {
    require_kubectl("it runs `kubectl run`");
    let c = start("id-c").await;
    let admin = c.kubeconfig.clone();
    let (code, _, err) = kubectl(
        &c,
        &admin,
        &[
            "run",
            "p",
            "--image=nginx",
            "--overrides={\"spec\":{\"serviceAccountName\":\"ghost\"}}",
        ],
    )
    .await;
    assert_ne!(code, 0);
    assert!(
        err.contains(
            "pods \"p\" is forbidden: error looking up service account default/ghost: serviceaccount \"ghost\" not found"
        ),
        "{err}"
    );
}
