//! `application/vnd.kubernetes.protobuf` over HTTP, checked with kube-rs' k8s-pb prost
//! structs (independently of the server's transcoder): request bodies, objects, lists,
//! `Status` errors and watch frames, negotiated by `Content-Type` and `Accept` as
//! kube-apiserver does.

use std::sync::Arc;

use axum::{Router, body::Body};
use core_cluster::{ApiServer, ApiServerConfig, store::MemoryStore};
use http_body_util::BodyExt;
use k8s_pb::{
    api::core::v1 as core,
    apimachinery::pkg::{
        apis::meta::v1::{ObjectMeta, Status, WatchEvent},
        runtime::{TypeMeta, Unknown},
    },
};
use prost::Message;
use serde_json::{Value, json};
use tower::ServiceExt;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// client-go's Accept with a protobuf content config.
const CLIENT_GO_ACCEPT: &str = "application/vnd.kubernetes.protobuf, */*";

async fn router() -> Router {
    ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .expect("the server starts")
        .router()
}

struct Answer {
    code: u16,
    content_type: String,
    body: Vec<u8>,
}

async fn send(
    router: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Answer {
    let (code, headers, body) = ccm_testkit::send(router, method, uri, headers, body).await;
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    Answer {
        code,
        content_type,
        body: body.to_vec(),
    }
}

/// An object as client-go's protobuf serializer writes it: `k8s\0` + runtime.Unknown.
fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let mut out = b"k8s\0".to_vec();
    Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    }
    .encode(&mut out)
    .unwrap();
    out
}

/// The typed message inside an enveloped answer, with its apiVersion and kind.
fn open<M: Message + Default>(bytes: &[u8]) -> (String, String, M) {
    assert_eq!(&bytes[..4], b"k8s\0", "a protobuf object");
    let unknown = Unknown::decode(&bytes[4..]).expect("runtime.Unknown");
    let type_meta = unknown.type_meta.unwrap_or_default();
    let message = M::decode(unknown.raw.unwrap_or_default().as_slice()).expect("the message");
    (
        type_meta.api_version.unwrap_or_default(),
        type_meta.kind.unwrap_or_default(),
        message,
    )
}

fn config_map(name: &str, value: &str) -> Vec<u8> {
    let cm = core::ConfigMap {
        metadata: Some(ObjectMeta {
            name: Some(name.into()),
            namespace: Some(String::new()),
            ..Default::default()
        }),
        data: [("greeting".to_owned(), value.to_owned())].into(),
        ..Default::default()
    };
    envelope("v1", "ConfigMap", cm.encode_to_vec())
}

async fn create_config_map(router: &Router, name: &str, value: &str) -> Answer {
    send(
        router,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        &[("content-type", PROTOBUF), ("accept", CLIENT_GO_ACCEPT)],
        config_map(name, value),
    )
    .await
}

/// Create, get, update and list in protobuf, as client-go does by default; JSON clients
/// see the same objects.
#[tokio::test]
async fn objects_and_lists_round_trip_in_protobuf() {
    let router = router().await;
    let created = create_config_map(&router, "hello", "hi").await;
    assert_eq!(created.code, 201);
    assert_eq!(created.content_type, PROTOBUF);
    let (api_version, kind, cm) = open::<core::ConfigMap>(&created.body);
    assert_eq!((api_version.as_str(), kind.as_str()), ("v1", "ConfigMap"));
    let meta = cm.metadata.unwrap();
    assert_eq!(meta.namespace.as_deref(), Some("default"), "from the URL");
    assert!(meta.uid.is_some_and(|u| !u.is_empty()));
    assert!(meta.creation_timestamp.and_then(|t| t.seconds).unwrap_or(0) > 0);

    // Update with the resourceVersion just read.
    let updated = core::ConfigMap {
        metadata: Some(ObjectMeta {
            name: Some("hello".into()),
            resource_version: meta.resource_version.clone(),
            ..Default::default()
        }),
        data: [("greeting".to_owned(), "hello again".to_owned())].into(),
        ..Default::default()
    };
    let put = send(
        &router,
        "PUT",
        "/api/v1/namespaces/default/configmaps/hello",
        &[("content-type", PROTOBUF), ("accept", PROTOBUF)],
        envelope("v1", "ConfigMap", updated.encode_to_vec()),
    )
    .await;
    assert_eq!(put.code, 200, "{}", String::from_utf8_lossy(&put.body));
    assert_eq!(
        open::<core::ConfigMap>(&put.body).2.data["greeting"],
        "hello again"
    );

    // A JSON client sees what the protobuf client wrote.
    let json = send(
        &router,
        "GET",
        "/api/v1/namespaces/default/configmaps/hello",
        &[],
        Vec::new(),
    )
    .await;
    assert_eq!(json.content_type, "application/json");
    let value: Value = serde_json::from_slice(&json.body).unwrap();
    assert_eq!(value["data"], json!({"greeting": "hello again"}));

    create_config_map(&router, "second", "2").await;
    let list = send(
        &router,
        "GET",
        "/api/v1/namespaces/default/configmaps?limit=1",
        &[("accept", CLIENT_GO_ACCEPT)],
        Vec::new(),
    )
    .await;
    assert_eq!(list.content_type, PROTOBUF);
    let (_, kind, list) = open::<core::ConfigMapList>(&list.body);
    assert_eq!(kind, "ConfigMapList");
    assert_eq!(list.items.len(), 1);
    let list_meta = list.metadata.unwrap();
    assert!(list_meta.r#continue.is_some_and(|c| !c.is_empty()), "paged");
    assert!(list_meta.resource_version.is_some_and(|rv| !rv.is_empty()));
}

/// Errors are `Status` objects in the negotiated encoding (upstream's
/// `responsewriters.ErrorNegotiated`): 404, 409 and 422 with its causes.
#[tokio::test]
async fn status_errors_are_protobuf_statuses() {
    let router = router().await;
    let missing = send(
        &router,
        "GET",
        "/api/v1/namespaces/default/configmaps/nope",
        &[("accept", CLIENT_GO_ACCEPT)],
        Vec::new(),
    )
    .await;
    assert_eq!(missing.code, 404);
    assert_eq!(missing.content_type, PROTOBUF);
    let (api_version, kind, status) = open::<Status>(&missing.body);
    assert_eq!((api_version.as_str(), kind.as_str()), ("v1", "Status"));
    assert_eq!(status.reason.as_deref(), Some("NotFound"));
    assert_eq!(status.code, Some(404));
    assert_eq!(status.details.and_then(|d| d.name).as_deref(), Some("nope"));

    assert_eq!(create_config_map(&router, "dup", "1").await.code, 201);
    let conflict = create_config_map(&router, "dup", "1").await;
    assert_eq!(conflict.code, 409);
    assert_eq!(
        open::<Status>(&conflict.body).2.reason.as_deref(),
        Some("AlreadyExists")
    );

    let invalid = create_config_map(&router, "Not_A_Name", "1").await;
    assert_eq!(invalid.code, 422);
    let status = open::<Status>(&invalid.body).2;
    assert_eq!(status.reason.as_deref(), Some("Invalid"));
    let causes = status.details.unwrap().causes;
    assert_eq!(causes[0].field.as_deref(), Some("metadata.name"));
}

/// Watch streams are length-prefixed frames of bare `WatchEvent`s whose `object.raw` is an
/// enveloped object (upstream's `LengthDelimitedFramer` with the raw serializer), with
/// `Content-Type: application/vnd.kubernetes.protobuf;stream=watch`.
#[tokio::test]
async fn watch_streams_are_length_prefixed_watch_events() {
    let router = router().await;
    create_config_map(&router, "first", "1").await;
    let response = router
        .clone()
        .oneshot(
            axum::http::Request::get(
                "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0",
            )
            .header("accept", CLIENT_GO_ACCEPT)
            .body(Body::empty())
            .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/vnd.kubernetes.protobuf;stream=watch"
    );
    let mut body = response.into_body();
    create_config_map(&router, "second", "2").await;
    let mut buffer = Vec::new();
    let mut events = Vec::new();
    while events.len() < 2 {
        let frame = tokio::time::timeout(std::time::Duration::from_secs(10), body.frame())
            .await
            .expect("an event in time")
            .expect("the stream is open")
            .unwrap();
        buffer.extend_from_slice(frame.data_ref().map_or(&[][..], |d| d.as_ref()));
        while buffer.len() >= 4 {
            let len = u32::from_be_bytes(buffer[..4].try_into().unwrap()) as usize;
            if buffer.len() < 4 + len {
                break;
            }
            let event = WatchEvent::decode(&buffer[4..4 + len]).expect("a bare WatchEvent");
            buffer.drain(..4 + len);
            let raw = event.object.and_then(|o| o.raw).unwrap_or_default();
            let (_, kind, cm) = open::<core::ConfigMap>(&raw);
            assert_eq!(kind, "ConfigMap");
            events.push((
                event.r#type.unwrap_or_default(),
                cm.metadata.and_then(|m| m.name).unwrap_or_default(),
            ));
        }
    }
    assert_eq!(
        events,
        [
            ("ADDED".to_owned(), "first".to_owned()),
            ("ADDED".to_owned(), "second".to_owned())
        ]
    );
}

/// Negotiation as kube-apiserver: JSON first wins, tables stay JSON, `/version` is raw JSON
/// whatever is asked, discovery's APIVersions is protobuf, PATCH bodies cannot be protobuf
/// (415), and a broken protobuf body is a 400 that stores nothing.
#[tokio::test]
async fn negotiation_follows_kube_apiserver() {
    let router = router().await;
    create_config_map(&router, "hello", "hi").await;
    let json_first = send(
        &router,
        "GET",
        "/api/v1/namespaces/default/configmaps/hello",
        &[(
            "accept",
            "application/json, application/vnd.kubernetes.protobuf",
        )],
        Vec::new(),
    )
    .await;
    assert_eq!(json_first.content_type, "application/json");

    let table = send(
        &router,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        &[(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )],
        Vec::new(),
    )
    .await;
    // The Table's media type without its `as=` (as kube-apiserver writes it); the body is
    // the Table.
    assert_eq!(table.content_type, "application/json");
    assert!(
        String::from_utf8_lossy(&table.body).contains("\"kind\":\"Table\""),
        "{}",
        String::from_utf8_lossy(&table.body)
    );

    // Upstream's /version handler writes raw JSON whatever the Accept header says.
    let version = send(
        &router,
        "GET",
        "/version",
        &[("accept", PROTOBUF)],
        Vec::new(),
    )
    .await;
    assert_eq!(version.code, 200);
    assert_eq!(version.content_type, "application/json");
    // Legacy discovery is a meta.k8s.io object upstream serves in protobuf.
    let api = send(&router, "GET", "/api", &[("accept", PROTOBUF)], Vec::new()).await;
    let (_, kind, versions) =
        open::<k8s_pb::apimachinery::pkg::apis::meta::v1::APIVersions>(&api.body);
    assert_eq!(kind, "APIVersions");
    assert_eq!(versions.versions, ["v1"]);

    let patch = send(
        &router,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/hello",
        &[("content-type", PROTOBUF)],
        config_map("hello", "x"),
    )
    .await;
    assert_eq!(patch.code, 415);

    let mut broken = config_map("broken", "x");
    broken.truncate(broken.len() - 3);
    let bad = send(
        &router,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        &[("content-type", PROTOBUF), ("accept", CLIENT_GO_ACCEPT)],
        broken,
    )
    .await;
    assert_eq!(bad.code, 400);
    assert_eq!(
        open::<Status>(&bad.body).2.reason.as_deref(),
        Some("BadRequest")
    );
    let gone = send(
        &router,
        "GET",
        "/api/v1/namespaces/default/configmaps/broken",
        &[],
        Vec::new(),
    )
    .await;
    assert_eq!(gone.code, 404, "nothing was stored");
}

/// A typed client-go delete sends `DeleteOptions` in protobuf (`meta.k8s.io/v1` kind
/// DeleteOptions, registered in every group version upstream).
#[tokio::test]
async fn delete_options_in_protobuf() {
    let router = router().await;
    create_config_map(&router, "bye", "1").await;
    let options = k8s_pb::apimachinery::pkg::apis::meta::v1::DeleteOptions {
        propagation_policy: Some("Background".into()),
        ..Default::default()
    };
    let deleted = send(
        &router,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/bye",
        &[("content-type", PROTOBUF), ("accept", CLIENT_GO_ACCEPT)],
        envelope("meta.k8s.io/v1", "DeleteOptions", options.encode_to_vec()),
    )
    .await;
    assert_eq!(
        deleted.code,
        200,
        "{}",
        String::from_utf8_lossy(&deleted.body)
    );
    let gone = send(
        &router,
        "GET",
        "/api/v1/namespaces/default/configmaps/bye",
        &[],
        Vec::new(),
    )
    .await;
    assert_eq!(gone.code, 404);
}

/// Go's marshalers write a non-pointer IntOrString even when unset: a Service port from a
/// protobuf client carries `targetPort` as the zero IntOrString and `nodePort: 0`, which
/// upstream's SetDefaults_Service and node-port allocator treat as unset.
#[tokio::test]
async fn a_zero_target_port_from_go_defaults_to_the_port() {
    let router = router().await;
    let service = core::Service {
        metadata: Some(ObjectMeta {
            name: Some("web".into()),
            ..Default::default()
        }),
        spec: Some(core::ServiceSpec {
            r#type: Some("NodePort".into()),
            ports: vec![core::ServicePort {
                port: Some(8080),
                target_port: Some(Default::default()),
                node_port: Some(0),
                protocol: Some(String::new()),
                name: Some(String::new()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(Default::default()),
    };
    let created = send(
        &router,
        "POST",
        "/api/v1/namespaces/default/services",
        &[("content-type", PROTOBUF), ("accept", CLIENT_GO_ACCEPT)],
        envelope("v1", "Service", service.encode_to_vec()),
    )
    .await;
    assert_eq!(
        created.code,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let port = open::<core::Service>(&created.body).2.spec.unwrap().ports[0].clone();
    let target = port.target_port.unwrap();
    assert_eq!((target.r#type, target.int_val), (Some(0), Some(8080)));
    assert_eq!(port.protocol.as_deref(), Some("TCP"));
    assert!((30000..=32767).contains(&port.node_port.unwrap_or(0)));
}

/// Upstream routes a request before its serializer reads the body: a resource the server
/// does not serve is 404 whatever the body's content type (kubectl auth whoami's v1beta1
/// SelfSubjectReview, whose kind has no protobuf message here, used to get 400 from the
/// decoder) — a `Status` "the server could not find the requested resource" inside a
/// served group (whatever the version), go's plain "404 page not found" of kube-apiserver's
/// mux outside one — and a user who may not reach a served resource is refused (403) before a
/// malformed body is looked at.
#[tokio::test]
async fn unknown_resources_are_404_whatever_the_body() {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .expect("the server starts");
    let router = server.router();
    let review = envelope(
        "authentication.k8s.io/v1beta1",
        "SelfSubjectReview",
        Vec::new(),
    );
    for (uri, body) in [
        (
            "/apis/authentication.k8s.io/v1beta1/selfsubjectreviews",
            review.clone(),
        ),
        ("/apis/example.com/v1/widgets", review),
        (
            "/api/v1/namespaces/default/widgets",
            b"k8s\0garbage".to_vec(),
        ),
    ] {
        let answer = send(
            &router,
            "POST",
            uri,
            &[("content-type", PROTOBUF), ("accept", CLIENT_GO_ACCEPT)],
            body,
        )
        .await;
        assert_eq!(answer.code, 404, "{uri}");
        if uri.starts_with("/apis/example.com/") {
            assert_eq!(answer.body, b"404 page not found\n", "{uri}");
            continue;
        }
        let (_, kind, status) = open::<Status>(&answer.body);
        assert_eq!(kind, "Status");
        assert_eq!(status.reason.as_deref(), Some("NotFound"), "{uri}");
        assert!(
            status
                .message
                .unwrap_or_default()
                .starts_with("the server could not find the requested resource"),
            "{uri}"
        );
    }
    // A served resource still decodes its body (and a malformed one is a 400) ...
    let answer = send(
        &router,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        &[("content-type", PROTOBUF)],
        b"k8s\0garbage".to_vec(),
    )
    .await;
    assert_eq!(answer.code, 400);
    // ... but only once the request is authorized.
    let nobody = core_cluster::auth::UserInfo::new("nobody", Vec::<String>::new());
    let answer = send(
        &server.router_as(nobody),
        "POST",
        "/api/v1/namespaces/default/configmaps",
        &[("content-type", PROTOBUF)],
        b"k8s\0garbage".to_vec(),
    )
    .await;
    assert_eq!(answer.code, 403);
}

/// A CustomResourceDefinition created in protobuf, as client-go (the conformance suite's
/// apiextensions client) sends it, with every plain `bool` of its schema written false as
/// Go's marshaller does: established, its resource served, and read back in protobuf and in
/// JSON without those false fields (kube-apiserver's `omitempty`). APIServices likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resource_definitions_round_trip_in_protobuf() {
    use k8s_pb::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    let router = router().await;
    let plain = |r#type: &str| apiext::JsonSchemaProps {
        r#type: Some(r#type.into()),
        exclusive_maximum: Some(false),
        exclusive_minimum: Some(false),
        unique_items: Some(false),
        nullable: Some(false),
        x_kubernetes_embedded_resource: Some(false),
        x_kubernetes_int_or_string: Some(false),
        ..Default::default()
    };
    let spec_schema = apiext::JsonSchemaProps {
        properties: [
            ("size".to_owned(), plain("integer")),
            (
                "labels".to_owned(),
                apiext::JsonSchemaProps {
                    additional_properties: Some(Box::new(apiext::JsonSchemaPropsOrBool {
                        allows: Some(true),
                        schema: Some(Box::new(plain("string"))),
                    })),
                    ..plain("object")
                },
            ),
        ]
        .into(),
        ..plain("object")
    };
    let crd = apiext::CustomResourceDefinition {
        metadata: Some(ObjectMeta {
            name: Some("gizmos.pb.example.com".into()),
            ..Default::default()
        }),
        spec: Some(apiext::CustomResourceDefinitionSpec {
            group: Some("pb.example.com".into()),
            names: Some(apiext::CustomResourceDefinitionNames {
                plural: Some("gizmos".into()),
                singular: Some("gizmo".into()),
                kind: Some("Gizmo".into()),
                list_kind: Some("GizmoList".into()),
                ..Default::default()
            }),
            scope: Some("Namespaced".into()),
            versions: vec![apiext::CustomResourceDefinitionVersion {
                name: Some("v1".into()),
                served: Some(true),
                storage: Some(true),
                schema: Some(apiext::CustomResourceValidation {
                    open_apiv3_schema: Some(apiext::JsonSchemaProps {
                        properties: [("spec".to_owned(), spec_schema)].into(),
                        ..plain("object")
                    }),
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    };
    let created = send(
        &router,
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        &[("content-type", PROTOBUF), ("accept", CLIENT_GO_ACCEPT)],
        envelope(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            crd.encode_to_vec(),
        ),
    )
    .await;
    assert_eq!(
        created.code,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    assert_eq!(created.content_type, PROTOBUF);
    let (_, kind, back) = open::<apiext::CustomResourceDefinition>(&created.body);
    assert_eq!(kind, "CustomResourceDefinition");
    let schema = back.spec.unwrap().versions[0]
        .schema
        .clone()
        .unwrap()
        .open_apiv3_schema
        .unwrap();
    let labels = &schema.properties["spec"].properties["labels"];
    assert_eq!(
        labels
            .additional_properties
            .as_ref()
            .unwrap()
            .schema
            .as_ref()
            .unwrap()
            .r#type
            .as_deref(),
        Some("string")
    );
    let json = send(
        &router,
        "GET",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gizmos.pb.example.com",
        &[],
        Vec::new(),
    )
    .await;
    let value: Value = serde_json::from_slice(&json.body).unwrap();
    assert_eq!(
        value["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"],
        json!({"type": "object", "properties": {
            "size": {"type": "integer"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}}}})
    );
    // Established and served, and listed in protobuf.
    ccm_testkit::eventually(30, "gizmos are served", || {
        let router = router.clone();
        async move {
            let answer = send(
                &router,
                "GET",
                "/apis/pb.example.com/v1/namespaces/default/gizmos",
                &[],
                Vec::new(),
            )
            .await;
            (answer.code == 200).then_some(())
        }
    })
    .await;
    let list = send(
        &router,
        "GET",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        &[("accept", CLIENT_GO_ACCEPT)],
        Vec::new(),
    )
    .await;
    assert_eq!(list.content_type, PROTOBUF);
    let (_, kind, list) = open::<apiext::CustomResourceDefinitionList>(&list.body);
    assert_eq!(kind, "CustomResourceDefinitionList");
    assert!(
        list.items
            .iter()
            .any(|c| c.metadata.as_ref().and_then(|m| m.name.as_deref())
                == Some("gizmos.pb.example.com"))
    );
    let services = send(
        &router,
        "GET",
        "/apis/apiregistration.k8s.io/v1/apiservices",
        &[("accept", CLIENT_GO_ACCEPT)],
        Vec::new(),
    )
    .await;
    assert_eq!(services.content_type, PROTOBUF);
    let (_, kind, services) = open::<
        k8s_pb::kube_aggregator::pkg::apis::apiregistration::v1::APIServiceList,
    >(&services.body);
    assert_eq!(kind, "APIServiceList");
    assert!(!services.items.is_empty());
}
