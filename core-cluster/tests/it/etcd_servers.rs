//! Several API servers on one etcd keep what they cache in step with writes made through
//! another: kube-apiserver's authorizers are fed by informers over its watch cache
//! (`plugin/pkg/auth/authorizer/rbac/rbac.go` on the RBAC listers), so a Role written through
//! one server of an HA control plane is enforced by every server.

use std::sync::Arc;

use ccm_testkit::etcd::Etcd;
use core_cluster::{
    ApiServer, ApiServerConfig,
    auth::UserInfo,
    store::{EtcdOptions, EtcdStore, Store},
};
use k8s_openapi::api::{
    core::v1::ConfigMap,
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};

async fn etcd_server(etcd: &Etcd) -> ApiServer {
    let store: Arc<dyn Store> = Arc::new(
        EtcdStore::connect(EtcdOptions {
            endpoints: etcd.endpoints(),
            ..EtcdOptions::default()
        })
        .await
        .expect("etcd"),
    );
    ApiServer::new(store, ApiServerConfig::default())
        .await
        .unwrap()
}

/// Whether the client's user may list ConfigMaps in `default`: allowed, or forbidden (403).
async fn may_list(client: &Client) -> bool {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    match api.list(&ListParams::default()).await {
        Ok(_) => true,
        Err(kube::Error::Api(status)) if status.code == 403 => false,
        Err(e) => panic!("neither allowed nor forbidden: {e}"),
    }
}

/// RBAC follows writes made through another server (`rbac.go`'s listers on the shared
/// store): a Role and RoleBinding created through server A let alice list ConfigMaps through
/// server B, and deleting the binding through A takes that away on B again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_written_through_one_api_server_is_enforced_by_another() {
    let etcd = Etcd::start().await;
    let a = etcd_server(&etcd).await;
    let b = etcd_server(&etcd).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    b.spawn_store_follower(shutdown.clone());
    let alice_on_b = Client::new(b.router_as(UserInfo::new("alice", ["dev"])), "default");
    assert!(!may_list(&alice_on_b).await, "alice starts with no grant");

    let admin_a = Client::new(a.router(), "default");
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cm-reader", "namespace": "default"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "alice-reads", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin_a.clone(), "default")
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let bindings = Api::<RoleBinding>::namespaced(admin_a.clone(), "default");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    ccm_testkit::eventually(20, "B enforces the Role written through A", || async {
        may_list(&alice_on_b).await.then_some(())
    })
    .await;

    bindings
        .delete("alice-reads", &DeleteParams::default())
        .await
        .unwrap();
    ccm_testkit::eventually(20, "B drops the binding deleted through A", || async {
        (!may_list(&alice_on_b).await).then_some(())
    })
    .await;
    shutdown.cancel();
}
