//! The API server over real TLS on loopback: the cluster CA, client-certificate and
//! service-account-token authentication, anonymous requests (401 outside the health and
//! version endpoints, as kube-apiserver with KEP-4633's anonymous endpoints), kube-rs and
//! kubectl through the generated kubeconfig, and the connection limits (slowloris).

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result, bail};
use std::sync::atomic::{AtomicI64, Ordering};

use ccm_testkit::TestServer;
use core_cluster::{
    ApiServer, ApiServerConfig,
    auth::pki::{CertAndKey, Pki},
    serve::{Security, ServeOptions},
    store::MemoryStore,
};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use kube::{Api, api::ListParams};
use rustls::pki_types::{ServerName, pem::PemObject};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_rustls::{TlsConnector, client::TlsStream};

async fn api_server() -> ApiServer {
    ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .expect("API server")
}

async fn start() -> TestServer {
    TestServer::start(api_server().await)
        .await
        .expect("TLS server")
}

fn tls_connector(ca_pem: &str, client: Option<&CertAndKey>) -> Result<TlsConnector> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for der in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(der?)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match client {
        Some(c) => builder.with_client_auth_cert(c.cert_der()?, c.key_der()?)?,
        None => builder.with_no_client_auth(),
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

async fn connect(
    server: &TestServer,
    ca_pem: &str,
    client: Option<&CertAndKey>,
) -> Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(server.addr()).await?;
    let name = ServerName::try_from("127.0.0.1")?;
    Ok(tls_connector(ca_pem, client)?.connect(name, tcp).await?)
}

/// One HTTP/1.1 request on a fresh TLS connection: (status code, body).
async fn request(
    server: &TestServer,
    ca_pem: &str,
    client: Option<&CertAndKey>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String)> {
    send(server, ca_pem, client, method, path, headers, None).await
}

/// [`request`] with an optional JSON body.
async fn send(
    server: &TestServer,
    ca_pem: &str,
    client: Option<&CertAndKey>,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> Result<(u16, String)> {
    let mut tls = connect(server, ca_pem, client).await?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    if !body.is_empty() {
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            head.push_str("Content-Type: application/json\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    head.push_str(&body);
    tls.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    // A TLS close without close_notify still gave us the whole response.
    let _ = tls.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status: u16 = text
        .split(' ')
        .nth(1)
        .context("no status line")?
        .parse()
        .context("status code")?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    Ok((status, body))
}

/// kube-apiserver answers a request without credentials outside the anonymous endpoints
/// with 401 and this exact Status.
#[tokio::test]
async fn anonymous_requests_get_401_except_health_and_version() {
    let server = start().await;
    let ca = server.security().pki.ca_pem().to_owned();
    let (code, body) = request(&server, &ca, None, "GET", "/api/v1/nodes", &[])
        .await
        .unwrap();
    assert_eq!(code, 401);
    let status: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        status,
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": "Unauthorized", "reason": "Unauthorized", "code": 401})
    );
    for path in ["/api", "/apis", "/openapi/v3", "/metrics", "/healthz/ping"] {
        let (code, _) = request(&server, &ca, None, "GET", path, &[]).await.unwrap();
        assert_eq!(code, 401, "{path} needs authentication");
    }
    for path in ["/healthz", "/livez", "/readyz", "/version"] {
        let (code, _) = request(&server, &ca, None, "GET", path, &[]).await.unwrap();
        assert_eq!(code, 200, "{path} is open to anonymous requests");
    }
    // A bearer token that does not authenticate is refused even where anonymous is allowed.
    let (code, _) = request(
        &server,
        &ca,
        None,
        "GET",
        "/healthz",
        &[("Authorization", "Bearer not-a-token")],
    )
    .await
    .unwrap();
    assert_eq!(code, 401);
    // kube-rs without credentials gets the 401 too.
    let anonymous = server.client(&server.anonymous_kubeconfig()).await.unwrap();
    let err = Api::<Node>::all(anonymous)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 401),
        "{err:?}"
    );
}

#[tokio::test]
async fn admin_kubeconfig_works_for_kube_rs() {
    let server = start().await;
    let client = server.admin_client().await.unwrap();
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        namespaces
            .items
            .iter()
            .any(|ns| ns.metadata.name.as_deref() == Some("kube-system"))
    );
    // Writes and a node identity from the same CA.
    let node_config = server
        .kubeconfig_for("system:node:n1", &["system:nodes"])
        .unwrap();
    let node_client = server.client(&node_config).await.unwrap();
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}))
    .unwrap();
    Api::<Node>::all(node_client)
        .create(&Default::default(), &node)
        .await
        .unwrap();
    assert!(
        Api::<Node>::all(client)
            .get_opt("n1")
            .await
            .unwrap()
            .is_some()
    );
    server.stop().await.unwrap();
}

/// The identity each request carries is its client certificate's CN and O.
#[tokio::test]
async fn client_certificate_identity_reaches_the_request() {
    let api = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let security = Security::load(&api, dir.path(), &[]).unwrap();
    // A route of our own behind the same authentication layer shows what it puts into
    // the request.
    let probe = axum::Router::new()
        .route(
            "/whoami",
            axum::routing::get(
                |axum::Extension(user): axum::Extension<core_cluster::auth::UserInfo>| async move {
                    format!("{}|{}", user.name, user.groups.join(","))
                },
            ),
        )
        .layer(axum::middleware::from_fn_with_state(
            security.authenticator.clone(),
            core_cluster::auth::authn::layer,
        ));
    let (listener, addr) = core_cluster::serve::bind("127.0.0.1:0").await.unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(core_cluster::serve::serve_tls(
        probe,
        listener,
        security.tls.clone(),
        ServeOptions::default(),
        shutdown.clone(),
    ));
    let cert = security.pki.issue_client("alice", &["dev", "ops"]).unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = tls_connector(security.pki.ca_pem(), Some(&cert))
        .unwrap()
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"GET /whoami HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.ends_with("alice|dev,ops,system:authenticated"),
        "{text}"
    );
    shutdown.cancel();
}

/// A client that trusts another CA refuses the server's certificate, and a client
/// certificate signed by another CA is refused by the server (it does not become that user).
#[tokio::test]
async fn other_cas_are_refused_both_ways() {
    let server = start().await;
    let other_dir = tempfile::tempdir().unwrap();
    let other = Pki::load_or_create(other_dir.path(), &[]).unwrap();
    // The client trusts another CA: the handshake fails.
    let err = connect(&server, other.ca_pem(), None).await.unwrap_err();
    assert!(
        format!("{err:?}").contains("UnknownIssuer") || format!("{err:?}").contains("certificate"),
        "{err:?}"
    );
    let kubeconfig = other.kubeconfig(&server.url(), other.admin());
    let client = server.client(&kubeconfig).await.unwrap();
    assert!(
        Api::<Node>::all(client)
            .list(&ListParams::default())
            .await
            .is_err()
    );
    // A client certificate of `system:masters` from another CA is not accepted.
    let ca = server.security().pki.ca_pem().to_owned();
    let forged = other
        .issue_client("ccm-admin", &["system:masters"])
        .unwrap();
    let refused = request(&server, &ca, Some(&forged), "GET", "/api/v1/nodes", &[]).await;
    match refused {
        Err(_) => {}
        Ok((code, _)) => panic!("a foreign client certificate was served with {code}"),
    }
    // The server's own admin certificate works on the same server.
    let admin = server.security().pki.admin().clone();
    let (code, _) = request(&server, &ca, Some(&admin), "GET", "/api/v1/nodes", &[])
        .await
        .unwrap();
    assert_eq!(code, 200);
}

async fn read_closed(tls: &mut TlsStream<TcpStream>, within: Duration) -> Result<bool> {
    let mut buf = [0u8; 256];
    match tokio::time::timeout(within, tls.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => Ok(true),
        Ok(Ok(_)) => {
            // A response (408 or similar) then the close.
            match tokio::time::timeout(within, tls.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => Ok(true),
                _ => Ok(false),
            }
        }
        Err(_) => Ok(false),
    }
}

/// Slow clients that never finish their headers are closed by the
/// header read timeout, clients that never finish the TLS handshake by the handshake
/// timeout, and connections beyond the cap are closed at once (bounded: 16 connections,
/// a few seconds).
#[tokio::test]
async fn slowloris_connections_are_closed_and_capped() {
    const CAP: usize = 16;
    let options = ServeOptions {
        // Long enough that no slow client is closed while the others are still connecting
        // on a loaded machine (which would free a slot before the cap is probed).
        handshake_timeout: Duration::from_secs(3),
        header_read_timeout: Duration::from_secs(3),
        max_connections: CAP,
        ..ServeOptions::default()
    };
    let server = TestServer::start_with(api_server().await, options)
        .await
        .unwrap();
    let ca = server.security().pki.ca_pem().to_owned();
    let admin = server.security().pki.admin().clone();
    // CAP - 1 clients send half a request line and stop; one never starts TLS.
    let mut slow = Vec::new();
    for _ in 0..CAP - 1 {
        let mut tls = connect(&server, &ca, Some(&admin)).await.unwrap();
        tls.write_all(b"GET /api/v1/nodes HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        tls.flush().await.unwrap();
        slow.push(tls);
    }
    let mut silent = TcpStream::connect(server.addr()).await.unwrap();
    // The cap is reached once the server has accepted the silent connection: the next
    // connection is closed before any handshake.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let over = connect(&server, &ca, Some(&admin)).await;
    assert!(over.is_err(), "a connection beyond the cap was served");
    // The header timeout closes every slow client; the handshake timeout the silent one.
    for (i, tls) in slow.iter_mut().enumerate() {
        assert!(
            read_closed(tls, Duration::from_secs(5)).await.unwrap(),
            "slow client {i} still held"
        );
    }
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("the silent client is closed by the handshake timeout");
    assert!(matches!(n, Ok(0) | Err(_)));
    // The permits are back: a normal request is served again.
    let mut served = None;
    for _ in 0..50 {
        if let Ok((code, _)) = request(&server, &ca, Some(&admin), "GET", "/healthz", &[]).await {
            served = Some(code);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(served, Some(200));
}

/// An idle kept-alive HTTP/1 connection is closed after the header read timeout.
#[tokio::test]
async fn idle_keep_alive_connections_are_closed() -> Result<()> {
    let options = ServeOptions {
        header_read_timeout: Duration::from_millis(400),
        ..ServeOptions::default()
    };
    let server = TestServer::start_with(api_server().await, options).await?;
    let ca = server.security().pki.ca_pem().to_owned();
    let mut tls = connect(&server, &ca, None).await?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?;
    let mut buf = [0u8; 512];
    let n = tls.read(&mut buf).await?;
    if !String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200") {
        bail!("unexpected answer {:?}", String::from_utf8_lossy(&buf[..n]));
    }
    let closed = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    Ok(())
}

/// A test cluster whose token clock the test moves (Unix seconds).
async fn start_with_clock() -> (TestServer, Arc<AtomicI64>) {
    let api = api_server().await;
    let dir = tempfile::tempdir().unwrap();
    let now = Arc::new(AtomicI64::new(jiff::Timestamp::now().as_second()));
    let clock = now.clone();
    let security = Security::load(&api, dir.path(), &[])
        .unwrap()
        .with_token_clock(&api, Arc::new(move || clock.load(Ordering::SeqCst)))
        .unwrap();
    let server = TestServer::start_secured(api, security, ServeOptions::default(), dir)
        .await
        .unwrap();
    (server, now)
}

/// POSTs as the admin; (code, body as JSON).
async fn post_admin(server: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let ca = server.security().pki.ca_pem().to_owned();
    let admin = server.security().pki.admin().clone();
    let (code, text) = send(server, &ca, Some(&admin), "POST", path, &[], Some(&body))
        .await
        .unwrap();
    (code, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn service_account(server: &TestServer, name: &str) -> String {
    let (code, sa) = post_admin(
        server,
        "/api/v1/namespaces/default/serviceaccounts",
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}),
    )
    .await;
    assert_eq!(code, 201, "{sa}");
    sa["metadata"]["uid"].as_str().unwrap().to_owned()
}

/// Lets the service account `default/<name>` list namespaces and get nodes (RBAC), so a
/// request with its token shows authentication (200, not 401) rather than authorization.
async fn grant_reads(server: &TestServer, name: &str) {
    let (code, role) = post_admin(
        server,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": format!("{name}-reads")},
               "rules": [{"apiGroups": [""], "resources": ["namespaces", "nodes"],
                          "verbs": ["get", "list"]}]}),
    )
    .await;
    assert_eq!(code, 201, "{role}");
    let (code, binding) = post_admin(
        server,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": format!("{name}-reads")},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": format!("{name}-reads")},
               "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]}),
    )
    .await;
    assert_eq!(code, 201, "{binding}");
}

async fn token_request(server: &TestServer, name: &str, spec: Value) -> (u16, Value) {
    post_admin(
        server,
        &format!("/api/v1/namespaces/default/serviceaccounts/{name}/token"),
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}),
    )
    .await
}

async fn get_with_token(server: &TestServer, token: &str, path: &str) -> u16 {
    let ca = server.security().pki.ca_pem().to_owned();
    let bearer = format!("Bearer {token}");
    request(
        server,
        &ca,
        None,
        "GET",
        path,
        &[("Authorization", &bearer)],
    )
    .await
    .unwrap()
    .0
}

/// TokenRequest (`serviceaccounts/<name>/token`): default expiry 3600 s and the API
/// server's audience; the token authenticates as `system:serviceaccount:<ns>:<name>` in
/// upstream's groups until it expires by the server's clock.
#[tokio::test]
async fn token_request_authenticates_as_the_service_account_until_expiry() {
    let (server, now) = start_with_clock().await;
    let uid = service_account(&server, "robot").await;
    grant_reads(&server, "robot").await;
    let (code, answer) = token_request(&server, "robot", json!({})).await;
    assert_eq!(code, 201, "{answer}");
    assert_eq!(answer["kind"], "TokenRequest");
    assert_eq!(answer["spec"]["expirationSeconds"], 3600);
    assert_eq!(
        answer["spec"]["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    let token = answer["status"]["token"].as_str().unwrap().to_owned();
    // kube-rs with the token in a kubeconfig.
    let client = server
        .client(&server.kubeconfig_with_token(&token))
        .await
        .unwrap();
    Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap();
    // Who it is, by TokenReview.
    let (code, review) = post_admin(
        &server,
        "/apis/authentication.k8s.io/v1/tokenreviews",
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}),
    )
    .await;
    assert_eq!(code, 201, "{review}");
    let status = &review["status"];
    assert_eq!(status["authenticated"], true, "{review}");
    assert_eq!(
        status["user"]["username"],
        "system:serviceaccount:default:robot"
    );
    assert_eq!(status["user"]["uid"], uid);
    assert_eq!(
        status["user"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ])
    );
    assert_eq!(
        status["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    // One second before expiry it works, at expiry it does not.
    now.fetch_add(3599, Ordering::SeqCst);
    assert_eq!(get_with_token(&server, &token, "/api/v1/nodes").await, 200);
    now.fetch_add(1, Ordering::SeqCst);
    assert_eq!(get_with_token(&server, &token, "/api/v1/nodes").await, 401);
}

/// Upstream's ValidateTokenRequest: at least 10 minutes (422 Invalid below), and the
/// account must exist (404).
#[tokio::test]
async fn token_request_validation() {
    let server = start().await;
    service_account(&server, "robot").await;
    let (code, status) = token_request(&server, "robot", json!({"expirationSeconds": 599})).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["reason"], "Invalid");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"),
        "{status}"
    );
    let (code, answer) = token_request(&server, "robot", json!({"expirationSeconds": 600})).await;
    assert_eq!(code, 201, "{answer}");
    let (code, _) = token_request(&server, "nobody", json!({})).await;
    assert_eq!(code, 404);
    // A body labelled protobuf must be one (kubectl create token's real protobuf
    // TokenRequest is in the `protobuf_kubectl` tests): JSON sent as protobuf is a 400.
    let ca = server.security().pki.ca_pem().to_owned();
    let admin = server.security().pki.admin().clone();
    let (code, _) = send(
        &server,
        &ca,
        Some(&admin),
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/robot/token",
        &[("Content-Type", "application/vnd.kubernetes.protobuf")],
        Some(&json!({})),
    )
    .await
    .unwrap();
    assert_eq!(code, 400);
}

/// A token for another audience is refused by the API server but passes a TokenReview for
/// that audience; a token whose service account was deleted is refused.
#[tokio::test]
async fn wrong_audience_and_deleted_service_accounts_are_refused() {
    let server = start().await;
    service_account(&server, "robot").await;
    grant_reads(&server, "robot").await;
    let (_, vault) = token_request(&server, "robot", json!({"audiences": ["vault"]})).await;
    let vault = vault["status"]["token"].as_str().unwrap().to_owned();
    assert_eq!(get_with_token(&server, &vault, "/api/v1/nodes").await, 401);
    let review = |token: String, audiences: Value| {
        let server = &server;
        async move {
            post_admin(
                server,
                "/apis/authentication.k8s.io/v1/tokenreviews",
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                    "spec": {"token": token, "audiences": audiences}}),
            )
            .await
            .1
        }
    };
    let answer = review(vault.clone(), json!(["vault"])).await;
    assert_eq!(answer["status"]["authenticated"], true, "{answer}");
    assert_eq!(answer["status"]["audiences"], json!(["vault"]));
    let answer = review(vault, json!([])).await;
    assert_eq!(answer["status"]["authenticated"], false, "{answer}");
    assert!(
        answer["status"]["error"]
            .as_str()
            .unwrap()
            .contains("audiences")
    );

    let (_, ok) = token_request(&server, "robot", json!({})).await;
    let token = ok["status"]["token"].as_str().unwrap().to_owned();
    assert_eq!(get_with_token(&server, &token, "/api/v1/nodes").await, 200);
    let client = server.admin_client().await.unwrap();
    Api::<ServiceAccount>::namespaced(client, "default")
        .delete("robot", &Default::default())
        .await
        .unwrap();
    assert_eq!(get_with_token(&server, &token, "/api/v1/nodes").await, 401);
    // Recreated with the same name: a new UID, the old token stays refused.
    service_account(&server, "robot").await;
    assert_eq!(get_with_token(&server, &token, "/api/v1/nodes").await, 401);
}

/// Discovery lists `tokenreviews` (create only) and `serviceaccounts/token`.
#[tokio::test]
async fn discovery_lists_the_token_apis() {
    let server = start().await;
    let client = server.admin_client().await.unwrap();
    let discovery = kube::Discovery::new(client).run().await.unwrap();
    let (resource, caps) = discovery
        .resolve_gvk(&kube::api::GroupVersionKind::gvk(
            "authentication.k8s.io",
            "v1",
            "TokenReview",
        ))
        .expect("TokenReview is discovered");
    assert_eq!(resource.plural, "tokenreviews");
    assert!(caps.supports_operation(kube::discovery::verbs::CREATE));
    assert!(!caps.supports_operation(kube::discovery::verbs::LIST));
    let ca = server.security().pki.ca_pem().to_owned();
    let admin = server.security().pki.admin().clone();
    let (_, body) = request(&server, &ca, Some(&admin), "GET", "/api/v1", &[])
        .await
        .unwrap();
    let list: Value = serde_json::from_str(&body).unwrap();
    let token = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "serviceaccounts/token")
        .expect("serviceaccounts/token is listed");
    assert_eq!(token["kind"], "TokenRequest");
    assert_eq!(token["group"], "authentication.k8s.io");
    assert_eq!(token["verbs"], json!(["create"]));
}
