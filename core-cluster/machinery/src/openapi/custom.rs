//! The OpenAPI v3 documents of custom resources, after upstream's
//! `apiextensions-apiserver/pkg/controller/openapi/builder/builder.go BuildOpenAPIV3`: one
//! document per custom group-version, with the same operations a built-in resource has
//! (`x-kubernetes-group-version-kind` on each), the version's `openAPIV3Schema` stored as
//! `<reversed group>.<version>.<Kind>` with `apiVersion`, `kind` and `metadata` (a reference
//! to `ObjectMeta`) added and the GVK extension set, and a `<Kind>List`.
//!
//! How they follow definitions as they come and go: the caller passes the custom
//! resources served now (from the [`Registry`](crate::registry::Registry)). A document is
//! built on the first request after its group-version's set of served definitions changed
//! and kept, keyed by the identities of those definitions (each built once per definition
//! content, see [`crate::crd`]), so an unchanged set costs one comparison; a group-version
//! no longer served is dropped.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::{Schema, SchemaGenerator};
use serde_json::{Map, Value, json};

use super::{
    Components, Document, OpenApiDocuments, OpenApiResource, assemble, fallback_schema_name,
    fnv1a64, group_version_path, gvk_value, paths,
};
use crate::registry::ResourceDef;

/// A built custom document and the definitions it describes.
#[derive(Debug)]
pub(super) struct Built {
    defs: Vec<(usize, u64)>,
    document: Document,
}

/// Never called: a custom resource's schema is stored before its paths are added.
fn stored_before(_: &mut SchemaGenerator) -> Schema {
    Schema::default()
}

/// What identifies a served custom definition: its address and its schema's
/// [`Custom::id`](crate::crd::Custom::id) (a shell is reused by a later definition with the
/// same names, see [`crate::crd`], so its address alone is not enough).
fn identity(def: &ResourceDef) -> (usize, u64) {
    (
        def as *const ResourceDef as usize,
        crate::crd::custom(def).map_or(0, |c| c.id),
    )
}

const API_VERSION: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

/// `builder.go addTypeMetaProperties` and the `metadata` reference: the version's schema
/// as the kind's schema.
fn kind_schema(schema: &Value, object_meta: Value) -> Value {
    let mut out = match schema {
        Value::Object(_) => schema.clone(),
        _ => json!({"type": "object"}),
    };
    let map = out.as_object_mut().expect("an object");
    let properties = map.entry("properties").or_insert_with(|| json!({}));
    if !properties.is_object() {
        *properties = json!({});
    }
    properties["apiVersion"] = json!({"description": API_VERSION, "type": "string"});
    properties["kind"] = json!({"description": KIND, "type": "string"});
    properties["metadata"] = json!({"allOf": [object_meta], "description": METADATA});
    out
}

/// The document of one custom group-version; `defs` all share group and version.
fn build(defs: &[&'static ResourceDef]) -> Value {
    let mut components = Components::new();
    let mut paths = Map::new();
    for def in defs {
        let schema = crate::crd::custom(def).map_or_else(
            || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
            |c| c.schema.clone(),
        );
        let object_meta = components.reference::<ObjectMeta>();
        let name = fallback_schema_name(def.group, def.version, def.kind);
        components
            .extra
            .insert(name.clone(), kind_schema(&schema, object_meta));
        components
            .gvks
            .entry(name.clone())
            .or_default()
            .push(gvk_value(def.group, def.version, def.kind));
        let scale = def.extra_subresources.contains(&"scale");
        let resource = OpenApiResource {
            group: def.group,
            version: def.version,
            kind: def.kind,
            plural: def.plural,
            namespaced: def.namespaced,
            subresources: match (def.status, scale) {
                (true, true) => &["status", "scale"],
                (true, false) => &["status"],
                (false, true) => &["scale"],
                (false, false) => &[],
            },
            schema: stored_before,
        };
        paths::add_paths_of_kind(&mut paths, &mut components, &resource, &name);
    }
    only_custom_resource_patch_types(&mut paths);
    assemble(paths, components)
}

/// A custom resource's PATCH operations offer only the patch types it takes
/// ([`crate::crd::PATCH_TYPES`]: no strategic merge patch), as upstream's CRD OpenAPI builder.
/// kubectl reads this: `apply` sends a strategic merge patch only to a kind whose PATCH
/// offers one, and a merge patch otherwise.
fn only_custom_resource_patch_types(paths: &mut Map<String, Value>) {
    for item in paths.values_mut() {
        if let Some(content) = item
            .pointer_mut("/patch/requestBody/content")
            .and_then(Value::as_object_mut)
        {
            content
                .retain(|content_type, _| crate::crd::PATCH_TYPES.contains(&content_type.as_str()));
        }
    }
}

impl OpenApiDocuments {
    /// The custom group-versions' documents for the custom resources `custom` served now,
    /// built where their definitions changed (see the [module docs](self)). A custom
    /// group-version that a built-in document already has is left to the built-in one.
    fn custom_documents(&self, custom: &[&'static ResourceDef]) -> BTreeMap<String, Document> {
        let mut by_path: BTreeMap<String, Vec<&'static ResourceDef>> = BTreeMap::new();
        for def in custom {
            let path = group_version_path(def.group, def.version);
            if !self.documents.contains_key(&path) {
                by_path.entry(path).or_default().push(def);
            }
        }
        let mut cache = self.custom.lock();
        cache.retain(|path, _| by_path.contains_key(path));
        let mut out = BTreeMap::new();
        for (path, defs) in by_path {
            let key: Vec<(usize, u64)> = defs.iter().map(|d| identity(d)).collect();
            let fresh = cache.get(&path).is_some_and(|b| b.defs == key);
            if !fresh {
                // A `Value` has string keys only, so serializing it cannot fail.
                let body =
                    serde_json::to_vec(&build(&defs)).expect("a JSON value always serializes");
                let hash = format!("{:016X}", fnv1a64(&body));
                cache.insert(
                    path.clone(),
                    Built {
                        defs: key,
                        document: Document { body, hash },
                    },
                );
            }
            if let Some(built) = cache.get(&path) {
                out.insert(path, built.document.clone());
            }
        }
        out
    }

    /// The body of `GET /openapi/v3` with the custom resources `custom` served now: the
    /// built-in group-versions and each custom one.
    pub fn index_with_custom(&self, custom: &[&'static ResourceDef]) -> Vec<u8> {
        if custom.is_empty() {
            return self.index.clone();
        }
        let mut paths: BTreeMap<String, Value> = self
            .index_paths
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (path, document) in self.custom_documents(custom) {
            let url = format!("/openapi/v3/{path}?hash={}", document.hash);
            paths.insert(path, json!({ "serverRelativeURL": url }));
        }
        let paths: Map<String, Value> = paths.into_iter().collect();
        serde_json::to_vec(&json!({ "paths": paths })).expect("a JSON value always serializes")
    }

    /// The body of `GET /openapi/v3/<path>` with the custom resources `custom` served now,
    /// or `None` if no such group-version is served.
    pub fn group_version_with_custom(
        &self,
        custom: &[&'static ResourceDef],
        path: &str,
    ) -> Option<Vec<u8>> {
        let path = path.strip_prefix('/').unwrap_or(path);
        if let Some(body) = self.group_version(path) {
            return Some(body.to_vec());
        }
        self.custom_documents(custom)
            .remove(path)
            .map(|document| document.body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::served_defs;

    fn crd(plural: &str, kind: &str) -> Value {
        json!({
            "metadata": {"name": format!("{plural}.openapi.example.com")},
            "spec": {
                "group": "openapi.example.com", "scope": "Namespaced",
                "names": {"plural": plural, "kind": kind},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "description": "A thing.",
                        "properties": {"spec": {"type": "object", "description": "What is wanted.",
                            "properties": {"size": {"type": "integer"}}}}}}}],
            },
        })
    }

    /// `builder.go BuildOpenAPIV3`: the custom group-version is in the index once served,
    /// its document has the collection path with the GVK and the kind's schema with the
    /// GVK, the version's fields and `metadata` as `ObjectMeta`; it changes (new hash)
    /// when a definition is added and leaves the index when none is served.
    #[test]
    fn a_custom_group_version_document_follows_its_definitions() {
        let docs = OpenApiDocuments::new(&[]);
        let path = "apis/openapi.example.com/v1";
        assert!(docs.group_version_with_custom(&[], path).is_none());
        let things_served = served_defs(&crd("things", "Thing")).unwrap();
        let things = things_served.defs().to_vec();
        let index: Value = serde_json::from_slice(&docs.index_with_custom(&things)).unwrap();
        let first = index["paths"][path]["serverRelativeURL"].clone();
        assert!(
            first
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/apis/openapi.example.com/v1?hash=")
        );
        let doc: Value =
            serde_json::from_slice(&docs.group_version_with_custom(&things, path).unwrap())
                .unwrap();
        let collection =
            &doc["paths"]["/apis/openapi.example.com/v1/namespaces/{namespace}/things"];
        assert_eq!(
            collection["get"]["x-kubernetes-group-version-kind"],
            json!({"group": "openapi.example.com", "version": "v1", "kind": "Thing"})
        );
        assert!(doc["paths"]["/apis/openapi.example.com/v1/namespaces/{namespace}/things/{name}/status"].is_object());
        let schema = &doc["components"]["schemas"]["com.example.openapi.v1.Thing"];
        assert_eq!(
            schema["x-kubernetes-group-version-kind"],
            json!([{"group": "openapi.example.com", "version": "v1", "kind": "Thing"}])
        );
        assert_eq!(
            schema["properties"]["spec"]["description"],
            "What is wanted."
        );
        assert_eq!(
            schema["properties"]["metadata"]["allOf"][0]["$ref"],
            "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
        assert!(
            doc["components"]["schemas"]["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]
                .is_object()
        );
        assert!(doc["components"]["schemas"]["com.example.openapi.v1.ThingList"].is_object());

        let mut both = things.clone();
        let gears = served_defs(&crd("gears", "Gear")).unwrap();
        both.extend(gears.defs().iter().copied());
        let index: Value = serde_json::from_slice(&docs.index_with_custom(&both)).unwrap();
        assert_ne!(index["paths"][path]["serverRelativeURL"], first);
        let doc: Value =
            serde_json::from_slice(&docs.group_version_with_custom(&both, path).unwrap()).unwrap();
        assert!(doc["components"]["schemas"]["com.example.openapi.v1.Gear"].is_object());

        let index: Value = serde_json::from_slice(&docs.index_with_custom(&[])).unwrap();
        assert!(index["paths"].get(path).is_none());
        assert!(docs.group_version_with_custom(&[], path).is_none());
    }
}
