//! The codec against k8s-pb's own prost structs: what we encode decodes with the typed
//! messages to the same fields, and what the typed messages encode (as Go's marshalers do,
//! every non-pointer field written) decodes to the JSON kube-apiserver would see.

use k8s_pb::{
    api::core::v1 as core,
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{ObjectMeta, Time, WatchEvent},
        runtime::Unknown,
        util::intstr::IntOrString,
    },
};
use prost::Message;
use serde_json::{Value, json};

use super::*;

fn unwrap_envelope(bytes: &[u8]) -> Unknown {
    assert_eq!(&bytes[..4], MAGIC, "every object starts with k8s\\0");
    Unknown::decode(&bytes[4..]).expect("a runtime.Unknown")
}

fn node() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "node-a",
            "uid": "0b9f3a4e-1111-2222-3333-444455556666",
            "resourceVersion": "42",
            "creationTimestamp": "2024-05-01T10:00:00Z",
            "labels": {"topology.kubernetes.io/zone": "zone-a"},
            "managedFields": [{"manager": "kubelet", "operation": "Update",
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:podCIDR": {}}}}]
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "podCIDRs": ["10.244.1.0/24", "fd00::/64"],
            "providerID": "fake://zone-a/node-a",
            "taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule",
                        "timeAdded": "2024-05-01T10:00:05Z"}]
        },
        "status": {
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.5"}],
            "conditions": [{"type": "Ready", "status": "True",
                            "lastHeartbeatTime": "2024-05-01T10:01:00Z",
                            "lastTransitionTime": "2024-05-01T10:00:10Z",
                            "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.33.0", "architecture": "amd64"}
        }
    })
}

#[test]
fn a_node_round_trips_and_k8s_pb_reads_the_same_fields() {
    let original = node();
    let bytes = encode_object(&original).expect("encode");
    assert_eq!(decode_object(&bytes).expect("decode"), original);

    let unknown = unwrap_envelope(&bytes);
    let type_meta = unknown.type_meta.expect("typeMeta");
    assert_eq!(type_meta.api_version.as_deref(), Some("v1"));
    assert_eq!(type_meta.kind.as_deref(), Some("Node"));
    let typed = core::Node::decode(unknown.raw.as_deref().unwrap_or_default()).expect("k8s-pb");
    let meta = typed.metadata.expect("metadata");
    assert_eq!(meta.name.as_deref(), Some("node-a"));
    assert_eq!(meta.resource_version.as_deref(), Some("42"));
    assert_eq!(
        meta.creation_timestamp.and_then(|t| t.seconds),
        Some(1_714_557_600)
    );
    assert_eq!(
        meta.labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some("zone-a")
    );
    let fields = meta.managed_fields[0].fields_v1.as_ref().expect("fieldsV1");
    let raw: Value = serde_json::from_slice(fields.raw.as_deref().unwrap_or_default()).unwrap();
    assert_eq!(raw, json!({"f:spec": {"f:podCIDR": {}}}));
    let spec = typed.spec.expect("spec");
    assert_eq!(spec.pod_cidr.as_deref(), Some("10.244.1.0/24"));
    assert_eq!(spec.pod_cid_rs, ["10.244.1.0/24", "fd00::/64"]);
    assert_eq!(spec.taints[0].effect.as_deref(), Some("NoSchedule"));
    let status = typed.status.expect("status");
    assert_eq!(
        status
            .capacity
            .get("memory")
            .and_then(|q| q.string.as_deref()),
        Some("16Gi")
    );
    assert_eq!(status.addresses[0].address.as_deref(), Some("10.0.0.5"));
    assert_eq!(
        status
            .daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .and_then(|e| e.port),
        Some(10250)
    );
    assert_eq!(
        status.conditions[0]
            .last_heartbeat_time
            .as_ref()
            .and_then(|t| t.seconds),
        Some(1_714_557_660)
    );
}

/// What Go's generated marshalers send for `kubectl create service nodeport web
/// --tcp=80:8080`: every non-pointer field written, so `""` strings, a `0` nodePort and a
/// zero creationTimestamp. Upstream decodes these into Go structs where "" and unset are
/// the same, so the JSON we hand the handlers leaves the empty strings out (defaulting then
/// sees no `type`, no `protocol`, no `namespace`); numbers stay.
#[test]
fn a_go_style_body_decodes_to_what_kube_apiserver_sees() {
    let empty = || Some(String::new());
    let service = core::Service {
        metadata: Some(ObjectMeta {
            name: Some("web".into()),
            generate_name: empty(),
            namespace: empty(),
            self_link: empty(),
            uid: empty(),
            resource_version: empty(),
            generation: Some(0),
            creation_timestamp: Some(Time::default()),
            labels: [("app".to_owned(), "web".to_owned())].into(),
            ..Default::default()
        }),
        spec: Some(core::ServiceSpec {
            ports: vec![core::ServicePort {
                name: Some("80-8080".into()),
                protocol: Some("TCP".into()),
                app_protocol: None,
                port: Some(80),
                target_port: Some(IntOrString {
                    r#type: Some(0),
                    int_val: Some(8080),
                    str_val: empty(),
                }),
                node_port: Some(0),
            }],
            selector: [("app".to_owned(), "web".to_owned())].into(),
            cluster_ip: empty(),
            r#type: Some("NodePort".into()),
            session_affinity: empty(),
            external_name: empty(),
            publish_not_ready_addresses: Some(false),
            ..Default::default()
        }),
        status: Some(core::ServiceStatus::default()),
    };
    let unknown = Unknown {
        type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
        }),
        raw: Some(service.encode_to_vec()),
        content_encoding: empty(),
        content_type: empty(),
    };
    let mut body = MAGIC.to_vec();
    body.extend(unknown.encode_to_vec());
    assert_eq!(
        decode_object(&body).expect("decode"),
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web", "generation": 0, "labels": {"app": "web"}},
            "spec": {
                "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80,
                           "targetPort": 8080, "nodePort": 0}],
                "selector": {"app": "web"},
                "type": "NodePort",
                "publishNotReadyAddresses": false
            },
            "status": {}
        })
    );
}

#[test]
fn secrets_carry_bytes_and_quantities_and_named_ports_survive() {
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "namespace": "default"},
        "type": "Opaque",
        "data": {"password": "aHVudGVyMg==", "empty": ""},
    });
    let bytes = encode_object(&secret).unwrap();
    assert_eq!(decode_object(&bytes).unwrap(), secret);
    let typed =
        core::Secret::decode(unwrap_envelope(&bytes).raw.unwrap_or_default().as_slice()).unwrap();
    assert_eq!(
        typed.data.get("password").map(Vec::as_slice),
        Some(&b"hunter2"[..])
    );

    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx",
            "resources": {"limits": {"cpu": "500m"}},
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}},
            "ports": [{"name": "http", "containerPort": 80}]}],
            "terminationGracePeriodSeconds": 0}
    });
    let bytes = encode_object(&pod).unwrap();
    assert_eq!(decode_object(&bytes).unwrap(), pod);
    let typed =
        core::Pod::decode(unwrap_envelope(&bytes).raw.unwrap_or_default().as_slice()).unwrap();
    let container = &typed.spec.as_ref().unwrap().containers[0];
    let port = container
        .readiness_probe
        .as_ref()
        .and_then(|p| p.handler.as_ref())
        .and_then(|h| h.http_get.as_ref())
        .and_then(|g| g.port.clone())
        .unwrap();
    assert_eq!(
        (port.r#type, port.str_val.as_deref()),
        (Some(1), Some("http"))
    );
    assert_eq!(
        container.resources.as_ref().unwrap().limits.get("cpu"),
        Some(&Quantity {
            string: Some("500m".into())
        })
    );
    // A pointer field's explicit zero survives (Go: terminationGracePeriodSeconds: 0).
    assert_eq!(
        typed.spec.unwrap().termination_grace_period_seconds,
        Some(0)
    );
}

#[test]
fn lists_statuses_and_micro_times() {
    let list = json!({
        "apiVersion": "v1", "kind": "NodeList",
        "metadata": {"resourceVersion": "7", "continue": "abc"},
        "items": [node(), node()],
    });
    let bytes = encode_object(&list).unwrap();
    let typed =
        core::NodeList::decode(unwrap_envelope(&bytes).raw.unwrap_or_default().as_slice()).unwrap();
    assert_eq!(typed.items.len(), 2);
    assert_eq!(
        typed.metadata.and_then(|m| m.r#continue).as_deref(),
        Some("abc")
    );
    // Items travel without apiVersion and kind, as upstream's do.
    let mut expected = list.clone();
    for item in expected["items"].as_array_mut().unwrap() {
        let item = item.as_object_mut().unwrap();
        item.remove("apiVersion");
        item.remove("kind");
    }
    assert_eq!(decode_object(&bytes).unwrap(), expected);

    let status = json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": "configmaps \"x\" not found", "reason": "NotFound",
        "details": {"name": "x", "kind": "configmaps"}, "code": 404
    });
    let bytes = encode_object(&status).unwrap();
    assert_eq!(decode_object(&bytes).unwrap(), status);
    let typed = k8s_pb::apimachinery::pkg::apis::meta::v1::Status::decode(
        unwrap_envelope(&bytes).raw.unwrap_or_default().as_slice(),
    )
    .unwrap();
    assert_eq!(
        (typed.code, typed.reason.as_deref()),
        (Some(404), Some("NotFound"))
    );

    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 40,
                 "renewTime": "2024-05-01T10:00:00.250000Z"}
    });
    let bytes = encode_object(&lease).unwrap();
    assert_eq!(decode_object(&bytes).unwrap(), lease);
    let typed = k8s_pb::api::coordination::v1::Lease::decode(
        unwrap_envelope(&bytes).raw.unwrap_or_default().as_slice(),
    )
    .unwrap();
    let renew = typed.spec.unwrap().renew_time.unwrap();
    assert_eq!(
        (renew.seconds, renew.nanos),
        (Some(1_714_557_600), Some(250_000_000))
    );
}

#[test]
fn a_watch_frame_is_a_length_and_a_bare_watch_event_around_an_enveloped_object() {
    let frame = encode_watch_frame("ADDED", &node()).unwrap();
    let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
    assert_eq!(len, frame.len() - 4);
    let event = WatchEvent::decode(&frame[4..]).expect("a bare WatchEvent");
    assert_eq!(event.r#type.as_deref(), Some("ADDED"));
    let raw = event.object.and_then(|o| o.raw).unwrap();
    assert_eq!(decode_object(&raw).unwrap(), node());
}

#[test]
fn every_served_kind_and_its_list_has_a_message() {
    // CustomResourceDefinitions and APIServices included (apiextensions' and
    // kube-aggregator's messages): Go clients such as the conformance suite's send them in
    // protobuf.
    for resource in crate::openapi::served_resources() {
        let api_version = if resource.group.is_empty() {
            resource.version.to_owned()
        } else {
            format!("{}/{}", resource.group, resource.version)
        };
        let mut kinds = vec![resource.kind.to_owned()];
        // The access reviews are create-only: they have no list.
        if resource.group != "authorization.k8s.io" {
            kinds.push(format!("{}List", resource.kind));
        }
        for kind in kinds {
            assert!(
                encodable(&api_version, &kind),
                "{api_version} {kind} has no protobuf message"
            );
        }
    }
    for (api_version, kind) in [
        ("v1", "Status"),
        ("meta.k8s.io/v1", "DeleteOptions"),
        ("authentication.k8s.io/v1", "TokenRequest"),
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview"),
        ("policy/v1", "Eviction"),
        ("autoscaling/v1", "Scale"),
        ("v1", "APIResourceList"),
    ] {
        assert!(encodable(api_version, kind), "{api_version} {kind}");
    }
    assert!(!encodable("example.com/v1", "Widget"));
}

#[test]
fn bad_bodies_are_errors() {
    assert_eq!(
        decode_object(b"{\"kind\":\"Pod\"}"),
        Err(ProtobufError::NoMagic)
    );
    assert!(matches!(
        decode_object(b"k8s\0\x0a\xff"),
        Err(ProtobufError::Envelope(_))
    ));
    let widget = Unknown {
        type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
            api_version: Some("example.com/v1".into()),
            kind: Some("Widget".into()),
        }),
        ..Default::default()
    };
    let mut body = MAGIC.to_vec();
    body.extend(widget.encode_to_vec());
    assert!(matches!(
        decode_object(&body),
        Err(ProtobufError::NoMessage { .. })
    ));
}

/// Go's `[]string` types (`ExtraValue`, `Verbs`) are a message with `items` in protobuf
/// and a bare list in JSON.
#[test]
fn extra_values_are_bare_lists() {
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "metadata": {},
        "spec": {"user": "jane", "groups": ["dev"], "extra": {"scopes": ["a", "b"]},
                 "resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "default"}},
        "status": {"allowed": true}
    });
    let bytes = encode_object(&review).unwrap();
    assert_eq!(decode_object(&bytes).unwrap(), review);
    let typed = k8s_pb::api::authorization::v1::SubjectAccessReview::decode(
        unwrap_envelope(&bytes).raw.unwrap_or_default().as_slice(),
    )
    .unwrap();
    let spec = typed.spec.unwrap();
    assert_eq!(spec.extra["scopes"].items, ["a", "b"]);
    assert_eq!(typed.status.unwrap().allowed, Some(true));
}

fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "x-kubernetes-validations": [{"rule": "self.size > 0", "message": "positive"}],
                            "properties": {
                                "size": {"type": "integer", "minimum": 1, "default": 3},
                                "color": {"type": "string", "enum": ["red", "blue"], "pattern": "^[a-z]+$"},
                                "tags": {"type": "array", "items": {"type": "string"},
                                         "x-kubernetes-list-type": "set"},
                                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                                "closed": {"type": "object", "additionalProperties": false},
                                "port": {"x-kubernetes-int-or-string": true},
                                "ref": {"$ref": "#/definitions/x"},
                            },
                        },
                    },
                }},
            }],
        },
    })
}

/// apiextensions' `generated.proto` read by an independent decoder (k8s-pb's prost
/// messages): a definition written by the server is what Go's client-go reads, every schema
/// union in its protobuf form (`additionalProperties` a schema or `allows`, `items` a
/// schema, `default` and `enum` raw JSON).
#[test]
fn a_custom_resource_definition_encodes_as_apiextensions_protobuf() {
    use k8s_pb::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    let bytes = encode_object(&crd()).unwrap();
    let envelope = unwrap_envelope(&bytes);
    let type_meta = envelope.type_meta.unwrap();
    assert_eq!(type_meta.kind.as_deref(), Some("CustomResourceDefinition"));
    let typed = apiext::CustomResourceDefinition::decode(envelope.raw.unwrap().as_slice()).unwrap();
    let spec = typed.spec.unwrap();
    assert_eq!(spec.group.as_deref(), Some("example.com"));
    let schema = spec.versions[0]
        .schema
        .clone()
        .unwrap()
        .open_apiv3_schema
        .unwrap();
    let inner = &schema.properties["spec"];
    assert_eq!(inner.required, ["size"]);
    assert_eq!(
        inner.x_kubernetes_validations[0].rule.as_deref(),
        Some("self.size > 0")
    );
    let size = &inner.properties["size"];
    assert_eq!(
        size.default.as_ref().unwrap().raw.as_deref(),
        Some(&b"3"[..])
    );
    let color = &inner.properties["color"];
    let values: Vec<&[u8]> = color
        .r#enum
        .iter()
        .map(|j| j.raw.as_deref().unwrap())
        .collect();
    assert_eq!(values, [&b"\"red\""[..], &b"\"blue\""[..]]);
    let tags = inner.properties["tags"].items.as_ref().unwrap();
    assert_eq!(
        tags.schema.as_ref().unwrap().r#type.as_deref(),
        Some("string")
    );
    let labels = inner.properties["labels"]
        .additional_properties
        .as_ref()
        .unwrap();
    assert_eq!(labels.allows, Some(true));
    assert_eq!(
        labels.schema.as_ref().unwrap().r#type.as_deref(),
        Some("string")
    );
    let closed = inner.properties["closed"]
        .additional_properties
        .as_ref()
        .unwrap();
    assert_eq!(
        (closed.allows, closed.schema.is_none()),
        (Some(false), true)
    );
    assert_eq!(
        inner.properties["free"].x_kubernetes_preserve_unknown_fields,
        Some(true)
    );
    assert_eq!(
        inner.properties["port"].x_kubernetes_int_or_string,
        Some(true)
    );
    assert_eq!(
        inner.properties["ref"].r#ref.as_deref(),
        Some("#/definitions/x")
    );
    // And back: decoding gives the JSON it came from.
    assert_eq!(decode_object(&bytes).unwrap(), crd());
}

/// What Go's client-go sends for a definition (its protobuf marshaller writes every plain
/// `bool` of `JSONSchemaProps`, false ones too) reads as the JSON kube-apiserver keeps, where
/// `omitempty` leaves false out.
#[test]
fn a_definition_from_a_go_client_reads_without_its_false_plain_bools() {
    use k8s_pb::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiext;
    let props = apiext::JsonSchemaProps {
        r#type: Some("object".into()),
        exclusive_maximum: Some(false),
        exclusive_minimum: Some(false),
        unique_items: Some(false),
        nullable: Some(false),
        x_kubernetes_embedded_resource: Some(false),
        x_kubernetes_int_or_string: Some(false),
        x_kubernetes_preserve_unknown_fields: Some(true),
        items: Some(Box::new(apiext::JsonSchemaPropsOrArray {
            schema: None,
            j_son_schemas: vec![
                apiext::JsonSchemaProps {
                    r#type: Some("string".into()),
                    ..Default::default()
                },
                apiext::JsonSchemaProps {
                    r#type: Some("integer".into()),
                    ..Default::default()
                },
            ],
        })),
        ..Default::default()
    };
    let mut raw = Vec::new();
    props.encode(&mut raw).unwrap();
    let value = wire::decode(
        "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaProps",
        &raw,
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        value,
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true,
               "items": [{"type": "string"}, {"type": "integer"}]})
    );
}

/// A projected volume's `downwardAPI` source is a struct with an `items` list
/// (`DownwardAPIProjection`), not one of Go's named `[]string` types: it keeps its `items`
/// key both ways, so a pod with a service-account token volume (every pod) reads back.
#[test]
fn a_projected_downward_api_source_keeps_its_items() {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
                 "volumes": [{"name": "v", "projected": {"sources": [{"downwardAPI": {"items": [
                     {"path": "labels", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels"}}]}}]}}]},
    });
    let bytes = encode_object(&pod).unwrap();
    let typed = core::Pod::decode(unwrap_envelope(&bytes).raw.unwrap().as_slice()).unwrap();
    let projection = typed.spec.unwrap().volumes[0]
        .volume_source
        .clone()
        .unwrap()
        .projected
        .unwrap()
        .sources[0]
        .downward_api
        .clone()
        .unwrap();
    assert_eq!(projection.items[0].path.as_deref(), Some("labels"));
    assert_eq!(decode_object(&bytes).unwrap(), pod);
}
