//! The ccm's secure port end to end against core-cluster, which serves TokenReview and
//! SubjectAccessReview under RBAC: HTTPS with a self-signed certificate in `--cert-dir`,
//! delegated authentication (bearer tokens by TokenReview, client certificates against
//! `--client-ca-file` or the `extension-apiserver-authentication` ConfigMap) and delegated
//! authorization (SubjectAccessReview for `get /metrics`), as upstream's
//! `DelegatingAuthenticationOptions` / `DelegatingAuthorizationOptions`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::Request;
use ccm_testkit::{TestServer, free_port};
use cloud_provider_app::{
    AppError, CloudControllerManagerOptions, ControllerRegistry, HealthChecks,
};
use cloud_provider_fake::FakeCloud;
use core_cluster::auth::pki::{CertAndKey, Credentials, kubeconfig_yaml};
use core_cluster::serve::client_config;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

async fn cluster() -> TestServer {
    let api = ccm_testkit::memory_server().await;
    TestServer::start(api).await.expect("TLS server")
}

/// A ccm serving its secure port, with the admin's connection to `cluster`.
struct Ccm {
    port: u16,
    cert_dir: PathBuf,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), AppError>>,
}

impl Ccm {
    async fn start(cluster: &TestServer, dir: &Path, extra: &[&str]) -> Ccm {
        let port = free_port();
        let cert_dir = dir.join("ccm-certs");
        let port_arg = port.to_string();
        let cert_arg = cert_dir.display().to_string();
        let mut args = vec![
            "ccm",
            "--cloud-provider",
            "fake",
            "--leader-elect=false",
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &port_arg,
            "--cert-dir",
            &cert_arg,
        ];
        args.extend_from_slice(extra);
        let options = CloudControllerManagerOptions::try_parse_from(args).expect("flags");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(cloud_provider_app::run_with(
            options,
            ControllerRegistry::new(),
            Arc::new(FakeCloud::default()),
            cluster.admin_client().await.expect("admin client"),
            shutdown.clone(),
            HealthChecks::new(),
        ));
        let ccm = Ccm {
            port,
            cert_dir,
            shutdown,
            task,
        };
        for _ in 0..200 {
            if ccm.cert_dir.join("cloud-controller-manager.crt").is_file()
                && let Ok((200, _)) =
                    get(&ccm.client(Credentials::Anonymous).await, "/healthz").await
            {
                return ccm;
            }
            assert!(!ccm.task.is_finished(), "the ccm stopped");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the secure port never answered /healthz");
    }

    fn ca_pem(&self) -> String {
        generated_ca_pem(&self.cert_dir)
    }

    async fn client(&self, credentials: Credentials<'_>) -> kube::Client {
        self.client_trusting(&self.ca_pem(), credentials).await
    }

    async fn client_trusting(&self, ca: &str, credentials: Credentials<'_>) -> kube::Client {
        secure_port_client(self.port, ca, credentials).await
    }
}

/// The CA of the serving certificate a ccm generated in `cert_dir` (the second certificate of
/// the file, as client-go's `GenerateSelfSignedCertKey` writes it).
pub(crate) fn generated_ca_pem(cert_dir: &Path) -> String {
    let pem = std::fs::read_to_string(cert_dir.join("cloud-controller-manager.crt"))
        .expect("generated certificate");
    let start = pem[1..].find("-----BEGIN CERTIFICATE-----").expect("a CA") + 1;
    pem[start..].to_owned()
}

/// A client of the ccm's secure port on loopback `port`, trusting `ca`.
pub(crate) async fn secure_port_client(
    port: u16,
    ca: &str,
    credentials: Credentials<'_>,
) -> kube::Client {
    let url = format!("https://127.0.0.1:{port}");
    let config = client_config(&kubeconfig_yaml(&url, ca, credentials))
        .await
        .expect("client config");
    kube::Client::try_from(config).expect("client")
}

impl Drop for Ccm {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// GET `path`: (code, body or Status message); `Err` when no HTTP answer came (TLS refused).
pub(crate) async fn get(client: &kube::Client, path: &str) -> Result<(u16, String), kube::Error> {
    match client
        .request_text(Request::get(path).body(Vec::new()).expect("request"))
        .await
    {
        Ok(body) => Ok((200, body)),
        Err(kube::Error::Api(status)) => Ok((status.code, status.message)),
        Err(error) => Err(error),
    }
}

/// A service account in `default` and a token for it.
async fn service_account_token(admin: &kube::Client, name: &str) -> String {
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), "default");
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts
        .create(&PostParams::default(), &account)
        .await
        .expect("service account");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("token")
        .status
        .expect("token status")
        .token
}

/// Lets `default/<name>` `get` the non-resource URL `/metrics` (RBAC `nonResourceURLs`, as
/// Prometheus' ClusterRole does).
async fn grant_metrics(admin: &kube::Client, name: &str) {
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(format!("{name}-metrics")),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            non_resource_urls: Some(vec!["/metrics".into()]),
            verbs: vec!["get".into()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("cluster role");
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{name}-metrics")),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: format!("{name}-metrics"),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some("default".into()),
            ..Subject::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("cluster role binding");
}

/// Upstream's delegated secure serving: `/healthz` is always allowed (anonymous 200);
/// `/metrics` needs an identity the cluster allows `get /metrics` (SubjectAccessReview):
/// an allowed service-account token gets 200, one without the role 403; no credentials is
/// `system:anonymous` (upstream enables anonymous authentication on the delegated port),
/// so 403 with upstream's message, not 401; a token that does not authenticate
/// (TokenReview) is 401; `/configz` is behind authorization too; a client certificate of
/// `--client-ca-file`'s CA in `system:masters` is allowed everything, one from another CA
/// fails the TLS handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_port_delegates_authentication_and_authorization() {
    let cluster = cluster().await;
    let admin = cluster.admin_client().await.unwrap();
    let dir = cluster.dir();
    let client_ca = dir.join("client-ca.crt");
    std::fs::write(&client_ca, cluster.security().pki.ca_pem()).unwrap();
    let client_ca_arg = client_ca.display().to_string();
    let ccm = Ccm::start(&cluster, &dir, &["--client-ca-file", &client_ca_arg]).await;

    let anonymous = ccm.client(Credentials::Anonymous).await;
    for path in ["/healthz", "/readyz", "/livez"] {
        assert_eq!(get(&anonymous, path).await.unwrap(), (200, "ok".into()));
    }
    assert_eq!(
        get(&anonymous, "/metrics").await.unwrap(),
        (
            403,
            "forbidden: User \"system:anonymous\" cannot get path \"/metrics\"".into()
        )
    );

    let scraper = service_account_token(&admin, "prometheus").await;
    grant_metrics(&admin, "prometheus").await;
    let allowed = ccm.client(Credentials::Token(&scraper)).await;
    let (code, body) = get(&allowed, "/metrics").await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("cloud_api_rate_limiter_granted"), "{body}");
    let (code, message) = get(&allowed, "/configz").await.unwrap();
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("system:serviceaccount:default:prometheus")
            && message.contains("cannot get path \"/configz\""),
        "{message}"
    );

    let other = service_account_token(&admin, "nobody").await;
    let denied = ccm.client(Credentials::Token(&other)).await;
    let (code, message) = get(&denied, "/metrics").await.unwrap();
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("system:serviceaccount:default:nobody"),
        "{message}"
    );
    assert_eq!(get(&denied, "/healthz").await.unwrap().0, 200);

    let forged = ccm.client(Credentials::Token("not-a-token")).await;
    assert_eq!(get(&forged, "/metrics").await.unwrap().0, 401);
    assert_eq!(
        get(&forged, "/healthz").await.unwrap().0,
        401,
        "authentication runs before the always-allowed paths, as upstream"
    );

    // Client certificates of the client CA: system:masters is always allowed.
    let master = cluster
        .security()
        .pki
        .issue_client("ops", &["system:masters"])
        .unwrap();
    let masters = ccm.client(Credentials::Certificate(&master)).await;
    assert_eq!(get(&masters, "/metrics").await.unwrap().0, 200);
    let (code, configz) = get(&masters, "/configz").await.unwrap();
    assert_eq!(code, 200);
    let configz: serde_json::Value = serde_json::from_str(&configz).unwrap();
    assert_eq!(
        configz["cloudcontrollermanager"]["KubeCloudShared"]["CloudProvider"]["Name"],
        "fake"
    );
    // A certificate user without the role is denied by the SubjectAccessReview.
    let dev = cluster
        .security()
        .pki
        .issue_client("dev", &["devs"])
        .unwrap();
    let devs = ccm.client(Credentials::Certificate(&dev)).await;
    let (code, message) = get(&devs, "/metrics").await.unwrap();
    assert_eq!(
        (code, message.contains("User \"dev\"")),
        (403, true),
        "{message}"
    );

    // A certificate from another CA fails the handshake.
    let elsewhere = cluster_ca_elsewhere().await;
    let stranger = ccm.client(Credentials::Certificate(&elsewhere)).await;
    assert!(
        get(&stranger, "/healthz").await.is_err(),
        "wrong CA accepted"
    );
    // And a client that does not trust the ccm's CA refuses the ccm.
    let wrong_trust = ccm
        .client_trusting(cluster.security().pki.ca_pem(), Credentials::Anonymous)
        .await;
    assert!(get(&wrong_trust, "/healthz").await.is_err());
}

/// An admin certificate from another cluster's CA.
async fn cluster_ca_elsewhere() -> CertAndKey {
    let other = cluster().await;
    other.security().pki.admin().clone()
}

/// Without `--client-ca-file`, upstream reads the client CA from
/// `kube-system/extension-apiserver-authentication` (key `client-ca-file`), which the API
/// server publishes as kube-apiserver does; with
/// `--authentication-skip-lookup` it does not, and client certificates then carry no
/// identity (anonymous: 403 on /metrics).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ca_comes_from_the_extension_apiserver_authentication_configmap() {
    let cluster = cluster().await;
    let admin = cluster.admin_client().await.unwrap();
    // The server publishes its client CA there, as kube-apiserver does.
    let published = Api::<ConfigMap>::namespaced(admin.clone(), "kube-system")
        .get("extension-apiserver-authentication")
        .await
        .unwrap();
    assert_eq!(
        published.data.unwrap()["client-ca-file"],
        cluster.security().pki.ca_pem()
    );
    let master = cluster
        .security()
        .pki
        .issue_client("ops", &["system:masters"])
        .unwrap();

    let dir = cluster.dir().join("lookup");
    let ccm = Ccm::start(&cluster, &dir, &[]).await;
    let masters = ccm.client(Credentials::Certificate(&master)).await;
    assert_eq!(get(&masters, "/metrics").await.unwrap().0, 200);
    drop(ccm);

    let dir = cluster.dir().join("skip");
    let ccm = Ccm::start(&cluster, &dir, &["--authentication-skip-lookup"]).await;
    let masters = ccm.client(Credentials::Certificate(&master)).await;
    assert_eq!(get(&masters, "/metrics").await.unwrap().0, 403);
}

/// The admin kubeconfig of `cluster`, written to a file (as `--kubeconfig` takes it).
fn admin_kubeconfig_file(cluster: &TestServer, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("admin.kubeconfig");
    std::fs::write(&path, cluster.admin_kubeconfig()).unwrap();
    path
}

/// Upstream's `DynamicControllerClientBuilder` (`--use-service-account-credentials`): each
/// controller's client is its own service account in kube-system (created when missing,
/// with a TokenRequest token), under upstream's client names, so the cluster's RBAC sees
/// `system:serviceaccount:kube-system:route-controller`, not the manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_credentials_give_each_controller_its_own_identity() {
    use cloud_provider_app::ControllerClients;
    use k8s_openapi::api::core::v1::Node;

    let cluster = cluster().await;
    let admin = cluster.admin_client().await.unwrap();
    let config = client_config(&cluster.admin_kubeconfig()).await.unwrap();
    let clients = ControllerClients::new(admin.clone(), Some(config))
        .with_rate_limit(20.0, 30)
        .with_service_account_credentials(true);
    let shutdown = CancellationToken::new();
    for (controller, account) in [
        ("node-route-controller", "route-controller"),
        ("cloud-node-lifecycle-controller", "node-controller"),
    ] {
        let client = clients
            .controller_client(controller, shutdown.child_token())
            .await
            .expect("a service-account client");
        let error = Api::<Node>::all(client)
            .list(&Default::default())
            .await
            .expect_err("the controller's account has no role yet");
        let kube::Error::Api(status) = error else {
            panic!("not an API error: {error}");
        };
        assert_eq!(status.code, 403, "{}", status.message);
        assert!(
            status
                .message
                .contains(&format!("system:serviceaccount:kube-system:{account}")),
            "{}",
            status.message
        );
        Api::<ServiceAccount>::namespaced(admin.clone(), "kube-system")
            .get(account)
            .await
            .expect("the account was created");
    }
    shutdown.cancel();
    // Without the flag, the manager's identity (the admin here) is kept.
    let config = client_config(&cluster.admin_kubeconfig()).await.unwrap();
    let shared = ControllerClients::new(admin.clone(), Some(config))
        .controller_client("node-route-controller", CancellationToken::new())
        .await
        .unwrap();
    Api::<Node>::all(shared)
        .list(&Default::default())
        .await
        .expect("the admin lists nodes");
}

/// The flags of upstream's example DaemonSet (kubernetes.io, "Cloud Controller
/// Manager Administration") start the manager through `app::run` against a cluster given by
/// `--kubeconfig`: it serves HTTPS, leads, starts the controllers with their own service
/// accounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_example_daemonset_flags_start_the_manager() {
    let cluster = cluster().await;
    let dir = cluster.dir().join("example");
    let kubeconfig = admin_kubeconfig_file(&cluster, &dir).display().to_string();
    let port = free_port();
    let port_arg = port.to_string();
    let cert_dir = dir.join("certs").display().to_string();
    let options = CloudControllerManagerOptions::try_parse_from([
        "cloud-controller-manager",
        // The example's container args.
        "--cloud-provider=fake",
        "--leader-elect=true",
        "--use-service-account-credentials",
        "--allocate-node-cidrs=true",
        "--configure-cloud-routes=true",
        "--cluster-cidr=172.17.0.0/16",
        // How this test reaches its cluster and port.
        "--kubeconfig",
        &kubeconfig,
        "--bind-address=127.0.0.1",
        "--secure-port",
        &port_arg,
        "--cert-dir",
        &cert_dir,
    ])
    .expect("upstream's flags parse");
    let manager = tokio::spawn(cloud_provider_app::run(
        options,
        cloud_provider_app::default_registry(),
    ));
    let ccm = Ccm {
        port,
        cert_dir: dir.join("certs"),
        shutdown: CancellationToken::new(),
        task: manager,
    };
    let admin = cluster.admin_client().await.unwrap();
    let accounts = Api::<ServiceAccount>::namespaced(admin, "kube-system");
    let mut healthz = String::new();
    for _ in 0..200 {
        assert!(!ccm.task.is_finished(), "the manager stopped");
        if ccm.cert_dir.join("cloud-controller-manager.crt").is_file()
            && let Ok((200, body)) = get(
                &ccm.client(Credentials::Anonymous).await,
                "/healthz?verbose",
            )
            .await
        {
            healthz = body;
            if healthz.contains("node-route-controller")
                && accounts
                    .get_opt("route-controller")
                    .await
                    .unwrap()
                    .is_some()
            {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for check in [
        "leaderElection",
        "cloud-node-controller",
        "cloud-node-lifecycle-controller",
        "service-lb-controller",
        "node-route-controller",
    ] {
        assert!(healthz.contains(check), "{check} in {healthz}");
    }
    for account in [
        "cloud-node-controller",
        "node-controller",
        "service-controller",
        "route-controller",
    ] {
        assert!(
            accounts.get_opt(account).await.unwrap().is_some(),
            "kube-system/{account}"
        );
    }
    ccm.task.abort();
}

/// Upstream's `lookupMissingConfigInCluster`: a client-CA ConfigMap the manager may not read
/// is a startup error naming `--authentication-tolerate-lookup-failure`; with that flag the
/// manager starts without client-certificate authentication.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_client_ca_lookup_fails_unless_tolerated() {
    let cluster = cluster().await;
    let nobody = cluster
        .client(&cluster.kubeconfig_for("nobody", &[]).unwrap())
        .await
        .unwrap();
    let options = |extra: &[&str]| {
        let port = free_port().to_string();
        let mut args = vec![
            "ccm",
            "--cloud-provider=fake",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            "--secure-port",
            &port,
        ];
        args.extend_from_slice(extra);
        CloudControllerManagerOptions::try_parse_from(args).unwrap()
    };
    let error = cloud_provider_app::run_with(
        options(&[]),
        ControllerRegistry::new(),
        Arc::new(FakeCloud::default()),
        nobody.clone(),
        CancellationToken::new(),
        HealthChecks::new(),
    )
    .await
    .expect_err("the lookup is forbidden");
    assert!(matches!(error, AppError::Delegation(_)), "{error}");
    assert!(
        error
            .to_string()
            .contains("extension-apiserver-authentication")
            && error
                .to_string()
                .contains("--authentication-tolerate-lookup-failure"),
        "{error}"
    );

    let shutdown = CancellationToken::new();
    let tolerated = tokio::spawn(cloud_provider_app::run_with(
        options(&["--authentication-tolerate-lookup-failure"]),
        ControllerRegistry::new(),
        Arc::new(FakeCloud::default()),
        nobody,
        shutdown.clone(),
        HealthChecks::new(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!tolerated.is_finished(), "{:?}", tolerated.await);
    shutdown.cancel();
    tolerated
        .await
        .unwrap()
        .expect("a clean stop after a tolerated lookup failure");
}
