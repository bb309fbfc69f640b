//! The `certificates.k8s.io/v1` CertificateSigningRequest API end to end with kubectl v1.32
//! (`kubectl certificate approve|deny` PUT `/approval`): upstream's validation
//! (`pkg/apis/certificates/validation`), strategy (`pkg/registry/certificates/certificates/
//! strategy.go`: the requester from the authenticated user, spec kept), the approval and
//! signing admission (`plugin/pkg/admission/certificates/approval`, `…/signing`), and the
//! `kubernetes.io/kubelet-serving` signer (`pkg/controller/certificates/signer`).

use std::sync::Arc;

use ccm_testkit::{
    TestServer, eventually,
    kubectl::{kubectl, require_kubectl},
};
use core_cluster::{
    ApiServer, ApiServerConfig,
    controllers::csr_signing::{CsrSigner, DEFAULT_SIGNING_DURATION, SigningCa},
    sim::ServingCa,
    store::MemoryStore,
};
use k8s_openapi::api::{
    certificates::v1::CertificateSigningRequest,
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{Api, api::PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Csrs {
    server: TestServer,
    api: Api<CertificateSigningRequest>,
    ca: ServingCa,
    dir: tempfile::TempDir,
    _stop: tokio_util::sync::DropGuard,
}

impl Csrs {
    /// A kubeconfig file for `user` in `groups` (the admin's when `user` is empty).
    fn kubeconfig(&self, user: &str, groups: &[&str]) -> std::path::PathBuf {
        let path = self
            .dir
            .path()
            .join(format!("kubeconfig-{}", user.replace(':', "-")));
        let text = if user.is_empty() {
            self.server.admin_kubeconfig()
        } else {
            self.server.kubeconfig_for(user, groups).unwrap()
        };
        std::fs::write(&path, text).unwrap();
        path
    }

    async fn kubectl_as(
        &self,
        user: &str,
        groups: &[&str],
        args: &[&str],
    ) -> ccm_testkit::kubectl::Output {
        kubectl(self.dir.path(), &self.kubeconfig(user, groups), args).await
    }

    /// `kubectl create -f` of a CSR named `name` for `cn`/`o` with `sans`, as `user`.
    async fn create(&self, user: &str, groups: &[&str], name: &str, cn: &str, sans: &[&str]) {
        let manifest = csr_manifest(name, cn, "system:nodes", sans);
        let path = self.dir.path().join(format!("{name}.json"));
        std::fs::write(&path, manifest.to_string()).unwrap();
        let out = self
            .kubectl_as(user, groups, &["create", "-f", path.to_str().unwrap()])
            .await;
        assert!(out.success, "{out:?}");
    }

    async fn issued(&self, name: &str) -> CertificateSigningRequest {
        eventually(20, "the certificate is issued", || {
            let api = self.api.clone();
            async move {
                let csr = api.get(name).await.ok()?;
                csr.status
                    .as_ref()?
                    .certificate
                    .as_ref()
                    .filter(|c| !c.0.is_empty())?;
                Some(csr)
            }
        })
        .await
    }
}

/// A PEM certificate request for `cn` in `o` with DNS or IP `sans`.
fn request_pem(cn: &str, o: &str, sans: &[&str]) -> String {
    let mut params =
        rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, o);
    let key = rcgen::KeyPair::generate().unwrap();
    params.serialize_request(&key).unwrap().pem().unwrap()
}

/// `bytes` as a `[]byte` field is written in JSON (base64).
fn b64(bytes: &[u8]) -> Value {
    serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).unwrap()
}

/// A kubelet-serving CSR, naming a forged requester that the server must replace.
fn csr_manifest(name: &str, cn: &str, o: &str, sans: &[&str]) -> Value {
    json!({
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": b64(request_pem(cn, o, sans).as_bytes()),
            "signerName": "kubernetes.io/kubelet-serving",
            "usages": ["digital signature", "key encipherment", "server auth"],
            "username": "mallory",
            "groups": ["system:masters"],
        },
    })
}

async fn start() -> Csrs {
    let api = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let server = TestServer::start(api).await.unwrap();
    let client = server.admin_client().await.unwrap();
    let ca = ServingCa::generate("kubelet-serving-ca").unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(
        CsrSigner::new(
            client.clone(),
            SigningCa {
                cert_pem: ca.cert_pem.clone(),
                key_pem: ca.key_pem.clone(),
            },
            DEFAULT_SIGNING_DURATION,
        )
        .run(stop.clone()),
    );
    Csrs {
        server,
        api: Api::all(client),
        ca,
        dir: tempfile::tempdir().unwrap(),
        _stop: stop.drop_guard(),
    }
}

/// Verifies `cert_pem` (the leaf) against the CA as a TLS client would for `name`.
fn verify(ca_pem: &str, cert_pem: &[u8], name: &str) -> Result<(), rustls::Error> {
    use rustls::{
        client::danger::ServerCertVerifier,
        pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .unwrap();
    let leaf = CertificateDer::from_pem_slice(cert_pem).unwrap();
    verifier
        .verify_server_cert(
            &leaf,
            &[],
            &ServerName::try_from(name.to_owned()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .map(|_| ())
}

fn conditions(csr: &CertificateSigningRequest) -> Vec<(String, String)> {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|c| {
            c.iter()
                .map(|c| (c.type_.clone(), c.reason.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

/// A node creates its serving request (the requester is the node, whatever `spec.username`
/// says: `strategy.go PrepareForCreate`), `kubectl certificate approve` approves it, and
/// the kubelet-serving signer (`signer.go handle`, `authority.go Sign`) issues a certificate
/// that verifies against the kubelet-serving CA for the node's name; `kubectl get csr`
/// shows `Approved,Issued`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_certificate_approve_gets_a_node_its_signed_serving_certificate() {
    require_kubectl("it runs `kubectl certificate approve`");
    let c = start().await;
    let node = ["system:node:csr-a", "system:nodes"];
    c.create(
        node[0],
        &node[1..],
        "csr-a",
        "system:node:csr-a",
        &["csr-a", "127.1.0.9"],
    )
    .await;
    let created = c.api.get("csr-a").await.unwrap();
    assert_eq!(created.spec.username.as_deref(), Some("system:node:csr-a"));
    let groups = created.spec.groups.clone().unwrap_or_default();
    assert!(groups.iter().any(|g| g == "system:nodes"), "{groups:?}");
    assert!(!groups.iter().any(|g| g == "system:masters"), "{groups:?}");

    let pending = c.kubectl_as("", &[], &["get", "csr", "csr-a"]).await;
    assert!(pending.stdout.contains("Pending"), "{pending:?}");
    assert!(pending.stdout.contains("system:node:csr-a"), "{pending:?}");
    // A node may not approve its own request (no `approve` on the signer).
    let own = c
        .kubectl_as(node[0], &node[1..], &["certificate", "approve", "csr-a"])
        .await;
    assert!(!own.success, "{own:?}");
    let approve = c
        .kubectl_as("", &[], &["certificate", "approve", "csr-a"])
        .await;
    assert!(approve.success, "{approve:?}");
    let csr = c.issued("csr-a").await;
    let cert = &csr.status.as_ref().unwrap().certificate.as_ref().unwrap().0;
    verify(&c.ca.cert_pem, cert, "csr-a").unwrap();
    verify(&c.ca.cert_pem, cert, "127.1.0.9").unwrap();
    assert!(verify(&c.ca.cert_pem, cert, "csr-b").is_err());
    let shown = c.kubectl_as("", &[], &["get", "csr", "csr-a"]).await;
    assert!(shown.stdout.contains("Approved,Issued"), "{shown:?}");
}

/// `kubectl certificate deny` sets Denied and nothing is issued; Approved and Denied are
/// exclusive (`validateConditions`), and an Approved or Denied condition cannot be
/// removed (`ValidateCertificateSigningRequestApprovalUpdate`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_is_never_signed_and_stays_denied() {
    require_kubectl("it runs `kubectl certificate deny`");
    let c = start().await;
    c.create("", &[], "csr-d", "system:node:csr-d", &["csr-d"])
        .await;
    let deny = c
        .kubectl_as("", &[], &["certificate", "deny", "csr-d"])
        .await;
    assert!(deny.success, "{deny:?}");
    // kubectl itself refuses (even with --force); through the API, the server refuses.
    let approve = c
        .kubectl_as("", &[], &["certificate", "approve", "--force", "csr-d"])
        .await;
    assert!(approve.stderr.contains("is already Denied"), "{approve:?}");
    let mut both = c.api.get("csr-d").await.unwrap();
    both.status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()
        .push(serde_json::from_value(json!({"type": "Approved", "status": "True"})).unwrap());
    let e = c
        .api
        .replace_subresource("approval", "csr-d", &PostParams::default(), &both)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 422
            && s.message.contains("Approved and Denied conditions are mutually exclusive")),
        "{e:?}"
    );
    let mut cleared = c.api.get("csr-d").await.unwrap();
    cleared.status.as_mut().unwrap().conditions = Some(Vec::new());
    let e = c
        .api
        .replace_subresource("approval", "csr-d", &PostParams::default(), &cleared)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 422 && s.message.contains("may not remove a condition of type \"Denied\"")),
        "{e:?}"
    );
    // The signer has had time to look at it; only Denied is there and no certificate.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let csr = c.api.get("csr-d").await.unwrap();
    assert_eq!(conditions(&csr), [("Denied".into(), "KubectlDeny".into())]);
    assert!(csr.status.unwrap().certificate.is_none());
}

/// A node asking for another node's name, or a request whose subject is not a node at
/// all, is approved by the administrator but refused by the signer with a Failed
/// condition (`signer.go`: `SignerValidationFailure`; `ValidateKubeletServingCSR`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_signer_refuses_a_request_for_another_nodes_name() {
    require_kubectl("it runs `kubectl certificate approve`");
    let c = start().await;
    let node = ["system:node:csr-x", "system:nodes"];
    c.create(
        node[0],
        &node[1..],
        "csr-other",
        "system:node:csr-y",
        &["csr-y"],
    )
    .await;
    c.create("", &[], "csr-not-node", "admin", &["admin.example"])
        .await;
    for name in ["csr-other", "csr-not-node"] {
        let out = c
            .kubectl_as("", &[], &["certificate", "approve", name])
            .await;
        assert!(out.success, "{out:?}");
    }
    for (name, message) in [
        ("csr-other", "does not name the requesting node"),
        (
            "csr-not-node",
            "subject common name does not begin with system:node:",
        ),
    ] {
        let csr = eventually(20, "the signer answers", || {
            let api = c.api.clone();
            async move {
                let csr = api.get(name).await.ok()?;
                conditions(&csr)
                    .iter()
                    .any(|(t, _)| t == "Failed")
                    .then_some(csr)
            }
        })
        .await;
        let failed = csr
            .status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Failed")
            .unwrap()
            .clone();
        assert_eq!(failed.reason.as_deref(), Some("SignerValidationFailure"));
        assert!(
            failed.message.unwrap_or_default().contains(message),
            "{name}"
        );
        assert!(csr.status.unwrap().certificate.is_none(), "{name}");
    }
}

/// `plugin/pkg/admission/certificates/approval`: updating `/approval` needs `approve` on
/// `certificates.k8s.io/signers` named by the signer (or `<domain>/*`), beside RBAC on
/// `certificatesigningrequests/approval`; `…/signing`: writing a certificate through
/// `/status` needs `sign` likewise. Validation refuses a request that is not a CSR PEM
/// (`parseCSR`), and the spec cannot be changed by an update (`PrepareForUpdate`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approving_and_signing_need_rights_on_the_signer() {
    require_kubectl("it runs `kubectl certificate approve`");
    let c = start().await;
    c.create("", &[], "csr-r", "system:node:csr-r", &["csr-r"])
        .await;
    let client = c.server.admin_client().await.unwrap();
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let role = |name: &str, rules: Value| -> ClusterRole {
        serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules})).unwrap()
    };
    let bind = |name: &str, user: &str| -> ClusterRoleBinding {
        serde_json::from_value(json!({"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}))
        .unwrap()
    };
    let csr_rules = json!([{"apiGroups": ["certificates.k8s.io"],
        "resources": ["certificatesigningrequests", "certificatesigningrequests/approval",
            "certificatesigningrequests/status"],
        "verbs": ["get", "list", "update"]}]);
    roles
        .create(&PostParams::default(), &role("csr-editor", csr_rules))
        .await
        .unwrap();
    bindings
        .create(&PostParams::default(), &bind("csr-editor", "carol"))
        .await
        .unwrap();
    let refused = c
        .kubectl_as("carol", &[], &["certificate", "approve", "csr-r"])
        .await;
    assert!(!refused.success, "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("user not permitted to approve requests with signerName \"kubernetes.io/kubelet-serving\""),
        "{refused:?}"
    );
    let approver_rules = json!([{"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
        "resourceNames": ["kubernetes.io/*"], "verbs": ["approve"]}]);
    roles
        .create(
            &PostParams::default(),
            &role("csr-approver", approver_rules),
        )
        .await
        .unwrap();
    bindings
        .create(&PostParams::default(), &bind("csr-approver", "carol"))
        .await
        .unwrap();
    let allowed = c
        .kubectl_as("carol", &[], &["certificate", "approve", "csr-r"])
        .await;
    assert!(allowed.success, "{allowed:?}");
    let issued = c.issued("csr-r").await;

    // carol may update /status but not sign for the signer.
    let carol = c
        .server
        .client(&c.server.kubeconfig_for("carol", &[]).unwrap())
        .await
        .unwrap();
    let as_carol: Api<CertificateSigningRequest> = Api::all(carol);
    c.create("", &[], "csr-s", "system:node:csr-s", &["csr-s"])
        .await;
    let mut forged = as_carol.get("csr-s").await.unwrap();
    forged
        .status
        .get_or_insert_with(Default::default)
        .certificate = issued.status.as_ref().unwrap().certificate.clone();
    let e = as_carol
        .replace_status("csr-s", &PostParams::default(), &forged)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 403 && s.message.contains("user not permitted to sign requests")),
        "{e:?}"
    );

    // The spec does not change through an update.
    let mut changed = c.api.get("csr-r").await.unwrap();
    changed.spec.signer_name = "example.com/other".into();
    let kept = c
        .api
        .replace("csr-r", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_eq!(kept.spec.signer_name, "kubernetes.io/kubelet-serving");

    // A request that is not a CERTIFICATE REQUEST PEM is refused.
    let mut bad = csr_manifest("csr-bad", "system:node:x", "system:nodes", &["x"]);
    bad["spec"]["request"] = b64(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
    let bad: CertificateSigningRequest = serde_json::from_value(bad).unwrap();
    let e = c
        .api
        .create(&PostParams::default(), &bad)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 422 && s.message.contains("PEM block type must be CERTIFICATE REQUEST")),
        "{e:?}"
    );
    let mut garbage = csr_manifest("csr-garbage", "system:node:x", "system:nodes", &["x"]);
    garbage["spec"]["request"] =
        b64(b"-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n");
    let garbage: CertificateSigningRequest = serde_json::from_value(garbage).unwrap();
    let e = c
        .api
        .create(&PostParams::default(), &garbage)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 422 && s.message.contains("spec.request")),
        "{e:?}"
    );
}

const BOOTSTRAP_NODES: &str = r#"
apiVersion: sim.ccm-rs.io/v1alpha1
kind: NodeSimulatorConfiguration
nodes:
  - name: tb-boot
    kubelet: {serverTLSBootstrap: true}
  - name: tb-self
"#;

/// `serverTLSBootstrap` (kubelet's serving certificate manager): the node asks for its
/// serving certificate by a `kubernetes.io/kubelet-serving` request with its name and IP,
/// and serves nothing until it is signed, so `kubectl logs` to its pod fails; once
/// `kubectl certificate approve` lets the signer issue it, `kubectl logs` works, verified
/// against `--kubelet-certificate-authority`. A node without it and without a serving CA
/// signs its own certificate (kubelet's self-signed one), which the API server refuses with
/// a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrapping_kubelet_serves_once_its_request_is_approved() {
    use core_cluster::sim::{KubeletApiConfig, NodeConfigFile, NodeSimulator, SimConfig, SimNode};

    use crate::kubelet_api::{internal_ip_first, running_pod, serve_with_kubelet_identity};
    require_kubectl("it runs `kubectl certificate approve` and `kubectl logs`");
    let ca = ServingCa::generate("kubelet-serving-ca").unwrap();
    let mut kubelet = internal_ip_first();
    kubelet.certificate_authority = Some(ca.cert_pem.clone());
    let mut sim_api = KubeletApiConfig::default();
    let server = serve_with_kubelet_identity(
        ApiServerConfig {
            kubelet,
            ..ApiServerConfig::default()
        },
        &mut sim_api,
        true,
    )
    .await;
    let client = server.admin_client().await.unwrap();
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(
        CsrSigner::new(
            client.clone(),
            SigningCa {
                cert_pem: ca.cert_pem.clone(),
                key_pem: ca.key_pem.clone(),
            },
            DEFAULT_SIGNING_DURATION,
        )
        .run(stop.clone()),
    );
    let file = NodeConfigFile::parse(BOOTSTRAP_NODES).unwrap();
    let (config, nodes) = file
        .apply(&SimConfig::default(), Vec::<SimNode>::new())
        .unwrap();
    // Each kubelet acts as its node (`system:node:<name>`), as in the embedded default.
    let mut node_clients = std::collections::HashMap::new();
    for node in ["tb-boot", "tb-self"] {
        let user = format!("system:node:{node}");
        let kubeconfig = server.kubeconfig_for(&user, &["system:nodes"]).unwrap();
        node_clients.insert(node.to_owned(), server.client(&kubeconfig).await.unwrap());
    }
    let fallback = client.clone();
    let sim = NodeSimulator::new(client.clone(), config)
        .with_node_clients(Arc::new(move |node: &str| {
            node_clients
                .get(node)
                .cloned()
                .unwrap_or_else(|| fallback.clone())
        }))
        .with_kubelet_api(sim_api);
    sim.add_nodes(nodes);
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await }
    });
    running_pod(&client, "web", "tb-boot").await;
    running_pod(&client, "self", "tb-self").await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.admin_kubeconfig()).unwrap();
    let run = |args: &'static [&'static str]| {
        let (dir, kubeconfig) = (dir.path().to_owned(), kubeconfig.clone());
        async move { kubectl(&dir, &kubeconfig, args).await }
    };

    let before = run(&["logs", "web"]).await;
    // The kubelet has no certificate to present: its handshake fails.
    assert!(
        !before.success && before.stderr.contains("received fatal alert"),
        "{before:?}"
    );
    let self_signed = run(&["logs", "self"]).await;
    assert!(
        !self_signed.success
            && self_signed
                .stderr
                .contains("invalid peer certificate: UnknownIssuer"),
        "{self_signed:?}"
    );

    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let csr = eventually(20, "the node's request", || {
        let api = api.clone();
        async move {
            api.list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|c| c.spec.username.as_deref() == Some("system:node:tb-boot"))
        }
    })
    .await;
    assert_eq!(csr.spec.signer_name, "kubernetes.io/kubelet-serving");
    let name = csr.metadata.name.clone().unwrap();
    let approve = kubectl(dir.path(), &kubeconfig, &["certificate", "approve", &name]).await;
    assert!(approve.success, "{approve:?}");
    let logs = eventually(20, "kubectl logs works", || {
        let run = &run;
        async move {
            let out = run(&["logs", "web"]).await;
            out.success.then_some(out.stdout)
        }
    })
    .await;
    assert!(logs.starts_with("Started container app"), "{logs}");
    // Only the bootstrapping node asked.
    let requests = api.list(&Default::default()).await.unwrap().items;
    assert_eq!(requests.len(), 1, "{requests:?}");
}
