use serde_json::{Value, json};

use super::*;

fn document(documents: &OpenApiDocuments, path: &str) -> Value {
    let body = documents
        .group_version(path)
        .unwrap_or_else(|| panic!("no document for {path}"));
    serde_json::from_slice(body).expect("document is JSON")
}

fn served() -> OpenApiDocuments {
    OpenApiDocuments::new(&served_resources())
}

/// Every `$ref` in `value`, with the keys of the object holding it.
fn refs<'a>(value: &'a Value, out: &mut Vec<(&'a str, usize)>) {
    match value {
        Value::Object(object) => {
            if let Some(Value::String(reference)) = object.get("$ref") {
                out.push((reference, object.len()));
            }
            object.values().for_each(|value| refs(value, out));
        }
        Value::Array(values) => values.iter().for_each(|value| refs(value, out)),
        _ => {}
    }
}

#[test]
fn node_patch_carries_gvk_and_field_validation() {
    let doc = document(&served(), "api/v1");
    assert_eq!(doc["openapi"], "3.0.0");
    let patch = &doc["paths"]["/api/v1/nodes/{name}"]["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        json!({ "group": "", "version": "v1", "kind": "Node" })
    );
    assert_eq!(patch["x-kubernetes-action"], "patch");
    assert_eq!(patch["operationId"], "patchCoreV1Node");
    let parameters: Vec<(&str, &str)> = patch["parameters"]
        .as_array()
        .expect("PATCH has parameters")
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["in"].as_str().unwrap()))
        .collect();
    for name in ["fieldValidation", "fieldManager", "dryRun", "force"] {
        assert!(
            parameters.contains(&(name, "query")),
            "{name} missing in {parameters:?}"
        );
    }
    let content = patch["requestBody"]["content"].as_object().unwrap();
    let mut types: Vec<&str> = content.keys().map(String::as_str).collect();
    types.sort_unstable();
    assert_eq!(
        types,
        [
            "application/apply-patch+yaml",
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ]
    );
    assert_eq!(
        content["application/merge-patch+json"]["schema"]["$ref"],
        "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Patch"
    );
    assert_eq!(
        patch["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/io.k8s.api.core.v1.Node"
    );
}

#[test]
fn node_schema_carries_gvk_and_references_resolve() {
    let doc = document(&served(), "api/v1");
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let node = &schemas["io.k8s.api.core.v1.Node"];
    assert_eq!(
        node["x-kubernetes-group-version-kind"],
        json!([{ "group": "", "version": "v1", "kind": "Node" }])
    );
    // The field keeps its description next to the reference, wrapped in allOf.
    assert_eq!(
        node["properties"]["spec"]["allOf"][0]["$ref"],
        "#/components/schemas/io.k8s.api.core.v1.NodeSpec"
    );
    assert!(
        node["properties"]["spec"]["description"]
            .as_str()
            .unwrap()
            .starts_with("Spec defines")
    );
    let spec = &schemas["io.k8s.api.core.v1.NodeSpec"];
    assert_eq!(spec["properties"]["podCIDRs"]["type"], "array");
    assert_eq!(
        schemas["io.k8s.api.core.v1.NodeList"]["x-kubernetes-group-version-kind"],
        json!([{ "group": "", "version": "v1", "kind": "NodeList" }])
    );
    assert!(schemas.contains_key("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"));

    let mut found = Vec::new();
    refs(&doc, &mut found);
    assert!(found.len() > 100, "only {} refs", found.len());
    for (reference, keys) in found {
        assert_eq!(keys, 1, "{reference} has sibling keywords");
        let name = reference
            .strip_prefix(SCHEMA_REF_PREFIX)
            .unwrap_or_else(|| panic!("{reference} is not a components ref"));
        assert!(schemas.contains_key(name), "{reference} does not resolve");
    }
}

#[test]
fn pod_paths_and_subresources() {
    let doc = document(&served(), "api/v1");
    let paths = &doc["paths"];
    let collection = &paths["/api/v1/namespaces/{namespace}/pods"];
    assert_eq!(collection["get"]["operationId"], "listCoreV1NamespacedPod");
    assert_eq!(collection["get"]["x-kubernetes-action"], "list");
    assert_eq!(
        collection["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/io.k8s.api.core.v1.PodList"
    );
    assert_eq!(
        collection["post"]["operationId"],
        "createCoreV1NamespacedPod"
    );
    assert_eq!(
        collection["delete"]["operationId"],
        "deleteCoreV1CollectionNamespacedPod"
    );
    assert_eq!(collection["parameters"][0]["name"], "namespace");
    assert_eq!(
        paths["/api/v1/pods"]["get"]["operationId"],
        "listCoreV1PodForAllNamespaces"
    );
    assert_eq!(
        paths["/api/v1/namespaces/{namespace}/pods/{name}/status"]["patch"]["operationId"],
        "patchCoreV1NamespacedPodStatus"
    );
    let binding = &paths["/api/v1/namespaces/{namespace}/pods/{name}/binding"]["post"];
    assert_eq!(
        binding["x-kubernetes-group-version-kind"],
        json!({ "group": "", "version": "v1", "kind": "Binding" })
    );
    let eviction = &paths["/api/v1/namespaces/{namespace}/pods/{name}/eviction"]["post"];
    assert_eq!(eviction["operationId"], "createCoreV1NamespacedPodEviction");
    assert_eq!(
        eviction["x-kubernetes-group-version-kind"],
        json!({ "group": "policy", "version": "v1", "kind": "Eviction" })
    );
    assert_eq!(
        doc["components"]["schemas"]["io.k8s.api.policy.v1.Eviction"]["x-kubernetes-group-version-kind"],
        json!([{ "group": "policy", "version": "v1", "kind": "Eviction" }])
    );
    // kube-apiserver: POST serviceaccounts/{name}/token takes and returns a TokenRequest.
    let token = &paths["/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"]["post"];
    assert_eq!(
        token["operationId"],
        "createCoreV1NamespacedServiceAccountToken"
    );
    assert_eq!(
        token["x-kubernetes-group-version-kind"],
        json!({ "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest" })
    );
    // Cluster-scoped kinds have no all-namespaces path and no namespace parameter.
    assert!(paths.get("/api/v1/namespaces/{namespace}/nodes").is_none());
    assert_eq!(
        paths["/api/v1/nodes/{name}"]["parameters"][0]["name"],
        "name"
    );
    assert_eq!(
        paths["/api/v1/nodes/{name}"]["parameters"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn index_links_every_group_version_with_its_hash() {
    let documents = served();
    let index: Value = serde_json::from_slice(documents.index()).unwrap();
    let paths = index["paths"].as_object().unwrap();
    let mut keys: Vec<&str> = paths.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "api/v1",
            "apis/apiextensions.k8s.io/v1",
            "apis/apiregistration.k8s.io/v1",
            "apis/apps/v1",
            "apis/authorization.k8s.io/v1",
            "apis/batch/v1",
            "apis/certificates.k8s.io/v1",
            "apis/coordination.k8s.io/v1",
            "apis/discovery.k8s.io/v1",
            "apis/events.k8s.io/v1",
            "apis/policy/v1",
            "apis/rbac.authorization.k8s.io/v1",
        ]
    );
    for key in keys {
        let hash = documents.hash(key).unwrap();
        assert_eq!(hash.len(), 16);
        assert_eq!(
            paths[key]["serverRelativeURL"],
            format!("/openapi/v3/{key}?hash={hash}")
        );
        assert_eq!(
            hash,
            format!("{:016X}", fnv1a64(documents.group_version(key).unwrap()))
        );
    }
    assert_ne!(
        documents.hash("api/v1"),
        documents.hash("apis/events.k8s.io/v1")
    );
    assert!(documents.group_version("apis/policy/v1").is_some());
    assert!(documents.group_version("apis/storage.k8s.io/v1").is_none());
    assert_eq!(
        documents.group_version("/api/v1"),
        documents.group_version("api/v1")
    );
    // Built twice, the bytes (and so the hashes) are identical.
    let again = served();
    assert_eq!(again.index(), documents.index());
    assert_eq!(
        again.group_version("api/v1"),
        documents.group_version("api/v1")
    );
}

#[test]
fn group_documents_name_operations_after_the_group() {
    let doc = document(&served(), "apis/coordination.k8s.io/v1");
    let list = &doc["paths"]["/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"]["get"];
    assert_eq!(list["operationId"], "listCoordinationV1NamespacedLease");
    assert_eq!(list["tags"], json!(["coordination_v1"]));
    assert_eq!(
        list["x-kubernetes-group-version-kind"],
        json!({ "group": "coordination.k8s.io", "version": "v1", "kind": "Lease" })
    );
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["io.k8s.api.coordination.v1.Lease"]["x-kubernetes-group-version-kind"],
        json!([{ "group": "coordination.k8s.io", "version": "v1", "kind": "Lease" }])
    );
    // Only this group-version's kinds are in it.
    assert!(schemas.get("io.k8s.api.core.v1.Pod").is_none());

    let events = document(&served(), "apis/events.k8s.io/v1");
    assert_eq!(
        events["components"]["schemas"]["io.k8s.api.events.v1.Event"]["x-kubernetes-group-version-kind"],
        json!([{ "group": "events.k8s.io", "version": "v1", "kind": "Event" }])
    );
}

fn inline_cron_tab(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "properties": { "spec": { "type": "object", "description": "The cron spec." } },
    })
}

#[test]
fn inline_schemas_get_the_reversed_group_name() {
    let documents = OpenApiDocuments::new(&[OpenApiResource {
        group: "stable.example.com",
        version: "v1",
        kind: "CronTab",
        plural: "crontabs",
        namespaced: true,
        subresources: &["status", "log"],
        schema: inline_cron_tab,
    }]);
    let doc = document(&documents, "apis/stable.example.com/v1");
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["com.example.stable.v1.CronTab"]["x-kubernetes-group-version-kind"],
        json!([{ "group": "stable.example.com", "version": "v1", "kind": "CronTab" }])
    );
    assert_eq!(
        schemas["com.example.stable.v1.CronTabList"]["properties"]["items"]["items"]["allOf"][0]["$ref"],
        "#/components/schemas/com.example.stable.v1.CronTab"
    );
    let item = "/apis/stable.example.com/v1/namespaces/{namespace}/crontabs/{name}";
    assert_eq!(
        doc["paths"][item]["get"]["operationId"],
        "readStableExampleComV1NamespacedCronTab"
    );
    assert_eq!(
        doc["paths"][item]["get"]["tags"],
        json!(["stableExampleCom_v1"])
    );
    assert!(doc["paths"].get(format!("{item}/status")).is_some());
    // Streaming subresources are left out.
    assert!(doc["paths"].get(format!("{item}/log")).is_none());
}

#[test]
fn ref_segments_are_decoded() {
    assert_eq!(decode_pointer_segment("a~1b~0c%20d"), "a/b~c d");
    assert_eq!(
        decode_pointer_segment("io.k8s.api.core.v1.Node"),
        "io.k8s.api.core.v1.Node"
    );
    assert_eq!(decode_pointer_segment("100%"), "100%");
    assert_eq!(decode_pointer_segment("%zz"), "%zz");
}

#[test]
fn hash_is_fnv1a_64() {
    // Published FNV-1a test vectors: the hash must not depend on the platform or the build.
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
}

/// Upstream's `/openapi/v3/api/v1` has no `deletecollectionCoreV1Namespace`: a collection
/// DELETE on namespaces is a 405 there and here, so the document does not offer it.
#[test]
fn namespaces_offer_no_deletecollection_and_other_collections_do() {
    let doc = document(&served(), "api/v1");
    let namespaces = &doc["paths"]["/api/v1/namespaces"];
    assert_eq!(namespaces["get"]["operationId"], "listCoreV1Namespace");
    assert_eq!(namespaces["post"]["operationId"], "createCoreV1Namespace");
    assert!(namespaces.get("delete").is_none(), "{namespaces}");
    assert_eq!(
        doc["paths"]["/api/v1/nodes"]["delete"]["operationId"],
        "deleteCoreV1CollectionNode"
    );
}
