//! Services' endpoints with kube-rs against the in-process API server: the EndpointSlice,
//! Endpoints and EndpointSlice mirroring controllers, on pods given IPs and readiness
//! directly (no kubelet).

use ccm_testkit::eventually;
use core_cluster::controllers::{
    endpoints::EndpointsController, endpointslice::EndpointSliceController,
    endpointslice_mirroring::EndpointSliceMirroringController,
};
use k8s_openapi::api::{
    core::v1::{Endpoints, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

async fn pod(pods: &Api<Pod>, i: usize, ready: bool) {
    let name = format!("web-{i:03}");
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "nginx",
            "ports": [{"name": "http", "containerPort": 8080}]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let ip = format!("10.1.{}.{}", i / 200, i % 200 + 1);
    pods.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
        }})),
    )
    .await
    .unwrap();
}

/// `pkg/controller/endpointslice` and `staging/src/k8s.io/endpointslice/reconciler.go`:
/// 150 pods make two slices (100 + 50) labelled with the Service's name and the
/// controller's `managed-by`, owned by the Service, with the named target port resolved
/// and conditions from readiness and deletion; `pkg/controller/endpoint` puts the same pods
/// in the Endpoints (unready ones under `notReadyAddresses`, terminating ones left out).
#[tokio::test]
async fn a_service_gets_slices_of_at_most_100_endpoints_and_its_endpoints() {
    let client = Client::new(ccm_testkit::memory_server().await.router(), "default");
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(EndpointSliceController::new(client.clone()).run(stop.clone()));
    tokio::spawn(EndpointsController::new(client.clone()).run(stop.clone()));
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"tier": "front"}},
        "spec": {"selector": {"app": "web"},
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))
    .unwrap();
    let svc = services.create(&PostParams::default(), &svc).await.unwrap();
    for i in 0..150 {
        pod(&pods, i, i != 0).await;
    }
    // A pod on its node being deleted is terminating (graceful deletion).
    pods.delete("web-001", &DeleteParams::default())
        .await
        .unwrap();

    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    let listed = eventually(20, "two slices of 100 and 50 endpoints", || async {
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await
            .ok()?;
        let mut sizes: Vec<usize> = list.items.iter().map(|s| s.endpoints.len()).collect();
        sizes.sort_unstable();
        let terminating = list
            .items
            .iter()
            .flat_map(|s| &s.endpoints)
            .any(|e| e.conditions.as_ref().and_then(|c| c.terminating) == Some(true));
        (sizes == [50, 100] && terminating).then_some(list.items)
    })
    .await;
    for s in &listed {
        assert_eq!(s.address_type, "IPv4");
        assert_eq!(
            s.labels()
                .get("endpointslice.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("endpointslice-controller.k8s.io")
        );
        assert_eq!(s.labels().get("tier").map(String::as_str), Some("front"));
        let owner = &s.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Service", svc.uid().unwrap().as_str())
        );
        assert_eq!(owner.controller, Some(true));
        let ports = s.ports.clone().unwrap();
        assert_eq!(
            (ports[0].name.as_deref(), ports[0].port),
            (Some("http"), Some(8080))
        );
        assert!(s.name_any().starts_with("web-"));
    }
    let by_pod = |name: &str| {
        listed
            .iter()
            .flat_map(|s| &s.endpoints)
            .find(|e| e.target_ref.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .and_then(|e| e.conditions.clone())
            .unwrap()
    };
    let unready = by_pod("web-000");
    assert_eq!(
        (unready.ready, unready.serving, unready.terminating),
        (Some(false), Some(false), Some(false))
    );
    let terminating = by_pod("web-001");
    assert_eq!(
        (
            terminating.ready,
            terminating.serving,
            terminating.terminating
        ),
        (Some(false), Some(true), Some(true))
    );
    assert_eq!(by_pod("web-002").ready, Some(true));

    let endpoints: Api<Endpoints> = Api::default_namespaced(client.clone());
    let ep = eventually(20, "the Endpoints of web", || async {
        let ep = endpoints.get_opt("web").await.ok()??;
        let subset = ep.subsets.clone()?.into_iter().next()?;
        (subset.addresses.as_ref().map(Vec::len) == Some(148)).then_some(ep)
    })
    .await;
    let subset = &ep.subsets.as_ref().unwrap()[0];
    let not_ready: Vec<&str> = subset
        .not_ready_addresses
        .iter()
        .flatten()
        .filter_map(|a| a.target_ref.as_ref()?.name.as_deref())
        .collect();
    assert_eq!(not_ready, ["web-000"]);
    assert_eq!(subset.ports.as_ref().unwrap()[0].port, 8080);
    assert_eq!(
        ep.labels()
            .get("endpointslice.kubernetes.io/skip-mirror")
            .map(String::as_str),
        Some("true")
    );
}

/// `pkg/controller/endpointslicemirroring`: the Endpoints of a Service without a selector
/// are mirrored as a slice managed by the mirroring controller and owned by the Endpoints.
#[tokio::test]
async fn a_selectorless_services_endpoints_are_mirrored_as_a_slice() {
    let client = Client::new(ccm_testkit::memory_server().await.router(), "default");
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(EndpointSliceMirroringController::new(client.clone()).run(stop.clone()));
    let services: Api<Service> = Api::default_namespaced(client.clone());
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "external"},
        "spec": {"ports": [{"name": "https", "port": 443}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let endpoints: Api<Endpoints> = Api::default_namespaced(client.clone());
    let ep: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": "external"},
        "subsets": [{"addresses": [{"ip": "192.0.2.10"}], "notReadyAddresses": [{"ip": "192.0.2.11"}],
                     "ports": [{"name": "https", "port": 8443, "protocol": "TCP"}]}],
    }))
    .unwrap();
    let ep = endpoints.create(&PostParams::default(), &ep).await.unwrap();
    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    let slice = eventually(20, "the mirrored slice", || async {
        let list = slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=external"))
            .await
            .ok()?;
        list.items.into_iter().next()
    })
    .await;
    assert_eq!(
        slice
            .labels()
            .get("endpointslice.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("endpointslicemirroring-controller.k8s.io")
    );
    assert_eq!(slice.owner_references()[0].uid, ep.uid().unwrap());
    let addresses: Vec<(&str, Option<bool>)> = slice
        .endpoints
        .iter()
        .map(|e| {
            (
                e.addresses[0].as_str(),
                e.conditions.as_ref().and_then(|c| c.ready),
            )
        })
        .collect();
    assert_eq!(
        addresses,
        [("192.0.2.10", Some(true)), ("192.0.2.11", Some(false))]
    );
    assert_eq!(slice.ports.unwrap()[0].port, Some(8443));
}
