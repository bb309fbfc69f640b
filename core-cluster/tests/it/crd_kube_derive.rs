//! A kube-rs `#[derive(CustomResource)]` type end to end, as a controller written with
//! kube-rs installs and uses its own resource: `CustomResourceExt::crd()` posted as
//! generated, `await_condition(is_crd_established())`, CRUD through `Api<Gizmo>`,
//! `patch_status`, the `scale` subresource and `kube::runtime::watcher`; and the CEL rules
//! its `#[derive(KubeSchema)]` writes into the schema. Upstream serves the
//! generated definition through `apiextensions-apiserver/pkg/apiserver/customresource_handler.go`
//! (and validates it with `pkg/apis/apiextensions/validation`).

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_testkit::memory_server;
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{
    Api, Client, CustomResource, CustomResourceExt, KubeSchema, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    runtime::{conditions, wait::await_condition, watcher, watcher::Event as WatchEvent},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// How a gizmo spins.
#[derive(Deserialize, Serialize, Clone, Debug, JsonSchema, PartialEq)]
enum Spin {
    Left,
    Right,
}

/// A nested object, optional.
#[derive(Deserialize, Serialize, Clone, Debug, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Housing {
    material: String,
    #[serde(default)]
    thickness_mm: u32,
}

/// A gizmo's desired state: the field shapes kube-rs' schema generation produces most
/// (an `i32` with `format: int32`, a `u32` with `minimum: 0`, an `f64`, an enum, an
/// `Option` as `nullable`, a map as `additionalProperties`, a list, free-form JSON with
/// `x-kubernetes-preserve-unknown-fields`, doc comments as descriptions).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "derive.example.com",
    version = "v1",
    kind = "Gizmo",
    namespaced,
    status = "GizmoStatus",
    shortname = "gz",
    category = "gadgetry",
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    selectable = ".spec.colour"
)]
#[serde(rename_all = "camelCase")]
struct GizmoSpec {
    /// How many gizmos.
    replicas: i32,
    /// Their colour.
    colour: String,
    spin: Spin,
    weight_kg: f64,
    housing: Option<Housing>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    parts: Vec<String>,
    #[schemars(schema_with = "free_form")]
    #[serde(default)]
    extra: serde_json::Value,
}

fn free_form(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// What a gizmo controller reports.
#[derive(Deserialize, Serialize, Clone, Debug, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
struct GizmoStatus {
    replicas: i32,
    selector: Option<String>,
    #[serde(default)]
    conditions: Vec<Condition>,
}

fn spec(replicas: i32) -> GizmoSpec {
    GizmoSpec {
        replicas,
        colour: "green".into(),
        spin: Spin::Left,
        weight_kg: 1.5,
        housing: Some(Housing {
            material: "steel".into(),
            thickness_mm: 2,
        }),
        labels: BTreeMap::from([("tier".into(), "gold".into())]),
        parts: vec!["cog".into()],
        extra: json!({"anything": {"goes": [1, "two"]}}),
    }
}

/// `customresource_handler.go` with the definition kube-rs generates: the posted
/// `Gizmo::crd()` is accepted as structural and becomes Established (what kube-runtime's
/// `is_crd_established` waits for); objects of the derived type are created, read, listed
/// (also by `selectableFields`), replaced and patched with every field kept as typed;
/// `patch_status` writes status without bumping the generation; `get_scale`/`patch_scale`
/// move `.spec.replicas` through the scale subresource; a `watcher` sees the create,
/// the updates and the delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kube_derived_custom_resource_works_end_to_end() {
    let client = Client::new(memory_server().await.router(), "default");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = Gizmo::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("gizmos.derive.example.com")
    );
    crds.create(&PostParams::default(), &crd).await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(
            crds.clone(),
            "gizmos.derive.example.com",
            conditions::is_crd_established(),
        ),
    )
    .await
    .expect("the definition is Established within 30 s")
    .unwrap();

    let gizmos: Api<Gizmo> = Api::namespaced(client.clone(), "default");
    // The watcher starts before the first object, so it sees every change.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watching = tokio::spawn({
        let gizmos = gizmos.clone();
        async move {
            let mut stream = watcher(gizmos, watcher::Config::default()).boxed();
            while let Some(event) = stream.next().await {
                if tx.send(event).is_err() {
                    break;
                }
            }
        }
    });
    let initialised = next_event(&mut rx, |e| matches!(e, WatchEvent::InitDone)).await;
    assert!(matches!(initialised, WatchEvent::InitDone));

    // Create and read back: every typed field round-trips through the schema's pruning.
    let created = gizmos
        .create(&PostParams::default(), &Gizmo::new("g1", spec(2)))
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let got = gizmos.get("g1").await.unwrap();
    assert_eq!(got.spec.spin, Spin::Left);
    assert_eq!(got.spec.weight_kg, 1.5);
    assert_eq!(got.spec.housing, spec(2).housing);
    assert_eq!(got.spec.labels["tier"], "gold");
    assert_eq!(got.spec.parts, vec!["cog".to_owned()]);
    assert_eq!(got.spec.extra, json!({"anything": {"goes": [1, "two"]}}));
    assert!(got.status.is_none());

    gizmos
        .create(&PostParams::default(), &{
            let mut other = Gizmo::new("g2", spec(1));
            other.spec.colour = "blue".into();
            other
        })
        .await
        .unwrap();
    let all = gizmos.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 2);
    let blue = gizmos
        .list(&ListParams::default().fields("spec.colour=blue"))
        .await
        .unwrap();
    assert_eq!(
        blue.items.iter().map(|g| g.name_any()).collect::<Vec<_>>(),
        ["g2"]
    );

    // Replace, then a merge patch of the spec: generation follows the spec.
    let mut g1 = got.clone();
    g1.spec.spin = Spin::Right;
    let replaced = gizmos
        .replace("g1", &PostParams::default(), &g1)
        .await
        .unwrap();
    assert_eq!(replaced.spec.spin, Spin::Right);
    assert_eq!(replaced.metadata.generation, Some(2));
    let patched = gizmos
        .patch(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"parts": ["cog", "spring"]}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.parts, ["cog", "spring"]);
    assert_eq!(patched.metadata.generation, Some(3));

    // A bad value is refused with the schema's message, as kube-rs reports a 422.
    let err = gizmos
        .patch(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"spin": "Sideways"}})),
        )
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422);
            assert!(
                status
                    .message
                    .contains("spec.spin: Unsupported value: \"Sideways\""),
                "{}",
                status.message
            );
        }
        other => panic!("expected a 422, got {other:?}"),
    }

    // Status through its subresource: kept apart from the spec, no new generation.
    let status = gizmos
        .patch_status(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "replicas": 2,
                "selector": "app=gizmo",
                "conditions": [{"type": "Ready", "status": "True", "reason": "Spun",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "spec": {"replicas": 9},
            }})),
        )
        .await
        .unwrap();
    let st = status.status.clone().expect("status is written");
    assert_eq!(st.replicas, 2);
    assert_eq!(st.conditions[0].reason, "Spun");
    assert_eq!(status.spec.replicas, 2);
    assert_eq!(status.metadata.generation, Some(3));

    // Scale: read from the declared paths, written to .spec.replicas.
    let scale = gizmos.get_scale("g1").await.unwrap();
    assert_eq!(scale.spec.as_ref().and_then(|s| s.replicas), Some(2));
    let status_of_scale = scale.status.expect("scale has a status");
    assert_eq!(status_of_scale.replicas, 2);
    assert_eq!(status_of_scale.selector.as_deref(), Some("app=gizmo"));
    gizmos
        .patch_scale(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 5}})),
        )
        .await
        .unwrap();
    let scaled = gizmos.get("g1").await.unwrap();
    assert_eq!(scaled.spec.replicas, 5);
    assert_eq!(scaled.metadata.generation, Some(4));

    gizmos.delete("g1", &DeleteParams::default()).await.unwrap();

    // The watcher saw g1 come, change (to 5 replicas) and go.
    let mut seen_replicas = Vec::new();
    loop {
        match next_event(&mut rx, |_| true).await {
            WatchEvent::Apply(g) if g.name_any() == "g1" => seen_replicas.push(g.spec.replicas),
            WatchEvent::Delete(g) if g.name_any() == "g1" => break,
            _ => {}
        }
    }
    assert_eq!(seen_replicas.first(), Some(&2));
    assert_eq!(seen_replicas.last(), Some(&5));
    watching.abort();
}

async fn next_event(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<watcher::Result<WatchEvent<Gizmo>>>,
    want: impl Fn(&WatchEvent<Gizmo>) -> bool,
) -> WatchEvent<Gizmo> {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("a watch event within 30 s")
            .expect("the watcher runs")
            .expect("the watch does not fail");
        if want(&event) {
            return event;
        }
    }
}

/// A range whose rules kube-rs' `KubeSchema` derive writes into the generated schema.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug)]
#[kube(
    group = "derive.example.com",
    version = "v1",
    kind = "Span",
    namespaced
)]
#[x_kube(validation = Rule::new("self.min <= self.max").message("min must not exceed max"))]
struct SpanSpec {
    min: i32,
    max: i32,
    #[x_kube(validation = Rule::new("self == oldSelf").message("zone is immutable"))]
    zone: String,
}

/// `apiserver/schema/cel/validation.go` with the rules kube-rs' `#[derive(KubeSchema)]`
/// generates (`#[x_kube(validation = ...)]`): the definition is accepted, a spec breaking
/// its rule is refused with `spec: Invalid value: "object": <message>`, and the field's
/// transition rule lets the create through and refuses the change on update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_rules_from_the_kube_schema_derive_are_enforced() {
    let client = Client::new(memory_server().await.router(), "default");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = Span::crd();
    assert!(
        serde_json::to_string(&crd)
            .unwrap()
            .contains("x-kubernetes-validations")
    );
    crds.create(&PostParams::default(), &crd).await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(
            crds.clone(),
            "spans.derive.example.com",
            conditions::is_crd_established(),
        ),
    )
    .await
    .expect("the definition is Established within 30 s")
    .unwrap();
    let spans: Api<Span> = Api::namespaced(client, "default");
    let refused = |err: kube::Error| match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422, "{status:?}");
            status.message
        }
        other => panic!("expected a 422, got {other:?}"),
    };
    let spec = |min, max, zone: &str| SpanSpec {
        min,
        max,
        zone: zone.into(),
    };
    let message = refused(
        spans
            .create(&PostParams::default(), &Span::new("s", spec(5, 1, "a")))
            .await
            .unwrap_err(),
    );
    assert!(
        message.contains(r#"spec: Invalid value: "object": min must not exceed max"#),
        "{message}"
    );
    let created = spans
        .create(&PostParams::default(), &Span::new("s", spec(1, 5, "a")))
        .await
        .unwrap();
    let mut moved = created.clone();
    moved.spec.zone = "b".into();
    let message = refused(
        spans
            .replace("s", &PostParams::default(), &moved)
            .await
            .unwrap_err(),
    );
    assert!(
        message.contains(r#"spec.zone: Invalid value: "string": zone is immutable"#),
        "{message}"
    );
    let mut widened = created;
    widened.spec.max = 9;
    let replaced = spans
        .replace("s", &PostParams::default(), &widened)
        .await
        .unwrap();
    assert_eq!(replaced.spec.max, 9);
}
