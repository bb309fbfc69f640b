//! The protobuf schema table of the API server (`apiserver/src/api/protobuf/schema.txt`), derived
//! from kube-rs' `k8s-pb` crate and checked against it.
//!
//! k8s-pb has prost structs only (no descriptors), so the table is generated from its
//! source: every `#[prost(...)]` field of every message reachable from the served kinds,
//! with its tag and type. prost snake-cased the proto field names (`podCIDR` became
//! `pod_cidr`), so the JSON names come from the k8s-openapi schemas the server publishes,
//! matched by normalised name (lower case, no `_`).
//!
//! `schema_table_matches_k8s_pb` regenerates the table in memory and compares it with the
//! committed file, so the table cannot drift from k8s-pb (or from the served resources).
//! After upgrading k8s-pb or serving a new kind, rewrite it with
//! `cargo test -p core-cluster --test it protobuf_schema -- --ignored regenerate`.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
};

use serde_json::Value;

/// Where the committed table lives, relative to the crate.
const TABLE: &str = "apiserver/src/api/protobuf/schema.txt";

/// Kinds that are not served resources but travel in request or response bodies: the
/// request kinds of subresources, metav1's kinds every group version carries, and the
/// envelope.
const EXTRA_ROOTS: &[&str] = &[
    "api.core.v1.Binding",
    "api.policy.v1.Eviction",
    "api.autoscaling.v1.Scale",
    "api.authentication.v1.TokenRequest",
    "api.authentication.v1.TokenReview",
    "api.authentication.v1.SelfSubjectReview",
    "apimachinery.pkg.apis.meta.v1.Status",
    "apimachinery.pkg.apis.meta.v1.WatchEvent",
    "apimachinery.pkg.apis.meta.v1.DeleteOptions",
    "apimachinery.pkg.apis.meta.v1.APIResourceList",
    "apimachinery.pkg.apis.meta.v1.APIGroupList",
    "apimachinery.pkg.apis.meta.v1.APIVersions",
    "apimachinery.pkg.apis.meta.v1.List",
    "apimachinery.pkg.apis.meta.v1.PartialObjectMetadata",
    "apimachinery.pkg.apis.meta.v1.PartialObjectMetadataList",
    "apimachinery.pkg.runtime.Unknown",
];

/// One field as k8s-pb declares it.
#[derive(Debug, Clone)]
struct PbField {
    tag: u32,
    rust_name: String,
    /// `string`, `int32`, …, `message`, or `map<V>` with V a scalar or `message`.
    kind: String,
    repeated: bool,
    /// The message of a message field or of a map's values.
    message: Option<String>,
}

/// The source directory of the k8s-pb package this workspace builds with.
fn k8s_pb_source() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Only the host's dependencies: without `--filter-platform`, `cargo metadata` resolves every
    // platform's and needs crates (Windows-only ones) that a Linux build never downloads.
    let host = host_triple();
    let output = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
            &host,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata JSON");
    let manifest = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "k8s-pb")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("k8s-pb is a dependency");
    Path::new(manifest)
        .parent()
        .expect("package directory")
        .join("src")
}

/// The host's target triple, as `rustc -vV` reports it (the platform this test was built for).
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = std::process::Command::new(rustc)
        .arg("-vV")
        .output()
        .expect("run rustc -vV");
    assert!(output.status.success(), "rustc -vV failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .trim()
        .to_owned()
}

/// Every prost message of k8s-pb, by dotted module path (`api.core.v1.Node`).
fn k8s_pb_messages() -> BTreeMap<String, Vec<PbField>> {
    let root = k8s_pb_source();
    let mut messages = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read k8s-pb source") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(&root).expect("under src");
            let mut module: Vec<String> = relative
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            let file = module.pop().expect("file name");
            if file != "mod.rs" && file != "lib.rs" {
                module.push(file.trim_end_matches(".rs").to_owned());
            }
            let source = std::fs::read_to_string(&path).expect("read source");
            let parsed = syn::parse_file(&source).expect("k8s-pb source parses");
            collect(&parsed.items, &module, &mut messages);
        }
    }
    messages
}

fn collect(items: &[syn::Item], module: &[String], out: &mut BTreeMap<String, Vec<PbField>>) {
    for item in items {
        match item {
            syn::Item::Mod(m) => {
                if let Some((_, items)) = &m.content {
                    let mut inner = module.to_vec();
                    inner.push(m.ident.to_string());
                    collect(items, &inner, out);
                }
            }
            syn::Item::Struct(s) if is_message(&s.attrs) => {
                let name = format!("{}.{}", module.join("."), s.ident);
                let mut fields: Vec<PbField> =
                    s.fields.iter().filter_map(|f| field(f, module)).collect();
                fields.sort_by_key(|f| f.tag);
                out.insert(name, fields);
            }
            _ => {}
        }
    }
}

fn is_message(attrs: &[syn::Attribute]) -> bool {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("derive"))
        .any(|a| {
            a.parse_args_with(
                syn::punctuated::Punctuated::<syn::Path, syn::Token![,]>::parse_terminated,
            )
            .is_ok_and(|paths| {
                paths
                    .iter()
                    .any(|p| p.segments.last().is_some_and(|s| s.ident == "Message"))
            })
        })
}

fn field(f: &syn::Field, module: &[String]) -> Option<PbField> {
    let attr = f.attrs.iter().find(|a| a.path().is_ident("prost"))?;
    let mut kind = None;
    let mut repeated = false;
    let mut tag = None;
    attr.parse_nested_meta(|meta| {
        let key = meta
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        let value = if meta.input.peek(syn::Token![=]) {
            Some(meta.value()?.parse::<syn::LitStr>()?.value())
        } else {
            None
        };
        match (key.as_str(), value) {
            ("tag", Some(v)) => tag = Some(v.parse::<u32>().expect("numeric tag")),
            ("repeated", None) => repeated = true,
            ("optional" | "boxed" | "packed", _) => {}
            ("btree_map" | "map", Some(v)) => {
                let value_type = v.split(',').nth(1).expect("map value type").trim();
                kind = Some(format!("map<{value_type}>"));
            }
            (scalar, _) => kind = Some(scalar.to_owned()),
        }
        Ok(())
    })
    .expect("prost attribute parses");
    let kind = kind.expect("a prost field has a type");
    let message = (kind == "message" || kind == "map<message>")
        .then(|| message_path(&f.ty, module).expect("a message field names its type"));
    Some(PbField {
        tag: tag.expect("a prost field has a tag"),
        rust_name: f
            .ident
            .as_ref()
            .expect("named field")
            .to_string()
            .trim_start_matches("r#")
            .to_owned(),
        kind,
        repeated,
        message,
    })
}

/// The dotted path of the message inside `Option<…>`, `Vec<…>`, `Box<…>` or the value of
/// a `BTreeMap<K, V>`, resolved against the module the field is declared in.
fn message_path(ty: &syn::Type, module: &[String]) -> Option<String> {
    let syn::Type::Path(path) = ty else {
        return None;
    };
    let last = path.path.segments.last()?;
    if let syn::PathArguments::AngleBracketed(args) = &last.arguments {
        let inner = args.args.iter().rev().find_map(|a| match a {
            syn::GenericArgument::Type(t) => Some(t),
            _ => None,
        })?;
        return message_path(inner, module);
    }
    let mut resolved = module.to_vec();
    let segments: Vec<String> = path
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    for segment in segments {
        match segment.as_str() {
            "super" => {
                resolved.pop();
            }
            "crate" => resolved.clear(),
            _ => resolved.push(segment),
        }
    }
    Some(resolved.join("."))
}

/// The k8s-pb message of a served kind, as the server names it.
fn message_of(group: &str, version: &str, kind: &str) -> String {
    format!(
        "{}.{version}.{kind}",
        core_cluster::api::protobuf::package_of(group)
    )
}

/// A field name with case, `_`, `-` and `$` ignored: prost's `x_kubernetes_list_type` and
/// `ref` are JSON's `x-kubernetes-list-type` and `$ref`.
fn normalise(name: &str) -> String {
    name.replace(['_', '-', '$'], "").to_ascii_lowercase()
}

/// The OpenAPI definition name of a k8s-pb message: its first module is a Go module path,
/// where `_` was `-` (`apiextensions_apiserver` is `apiextensions-apiserver`).
fn definition_name(message: &str) -> String {
    let (first, rest) = message.split_once('.').unwrap_or((message, ""));
    format!("io.k8s.{}.{rest}", first.replace('_', "-")).to_ascii_lowercase()
}

fn lower_camel(snake: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Every schema the server publishes, by upstream definition name in lower case.
fn published_schemas() -> HashMap<String, Value> {
    let resources = core_cluster::openapi::served_resources();
    let documents = core_cluster::openapi::OpenApiDocuments::new(&resources);
    let mut schemas = HashMap::new();
    // Kinds that travel in bodies without being served resources with a document.
    let mut generator = schemars::generate::SchemaSettings::openapi3().into_generator();
    {
        use k8s_openapi::{
            api::authentication::v1 as authn, apimachinery::pkg::apis::meta::v1 as meta,
        };
        generator.subschema_for::<meta::APIGroupList>();
        generator.subschema_for::<meta::APIResourceList>();
        generator.subschema_for::<meta::APIVersions>();
        generator.subschema_for::<meta::DeleteOptions>();
        generator.subschema_for::<meta::Status>();
        generator.subschema_for::<authn::TokenReview>();
        generator.subschema_for::<authn::SelfSubjectReview>();
    }
    for (name, schema) in generator.take_definitions(true) {
        schemas.insert(name.to_ascii_lowercase(), schema);
    }
    let paths: Vec<String> = documents.paths().map(str::to_owned).collect();
    for path in paths {
        let document: Value =
            serde_json::from_slice(documents.group_version(&path).expect("served document"))
                .expect("document JSON");
        if let Some(map) = document["components"]["schemas"].as_object() {
            for (name, schema) in map {
                schemas.insert(name.to_ascii_lowercase(), schema.clone());
            }
        }
    }
    schemas
}

/// The table's text: one `message <name>` line per message, then one
/// `<tag> <json name> <type>` line per field, where the type is a scalar, a message name,
/// `map<V>`, and ends in `[]` when repeated; the JSON name `*` marks an embedded message
/// whose fields JSON inlines into the parent.
fn generate() -> String {
    let messages = k8s_pb_messages();
    let schemas = published_schemas();
    // Every property name of every schema, for messages whose schema is not published.
    let mut all_names: HashMap<String, BTreeSet<String>> = HashMap::new();
    for schema in schemas.values() {
        if let Some(properties) = schema["properties"].as_object() {
            for name in properties.keys() {
                all_names
                    .entry(normalise(name))
                    .or_default()
                    .insert(name.clone());
            }
        }
    }

    let mut roots: Vec<String> = EXTRA_ROOTS.iter().map(|s| (*s).to_owned()).collect();
    for resource in core_cluster::openapi::served_resources() {
        let kind = message_of(resource.group, resource.version, resource.kind);
        roots.push(format!("{kind}List"));
        roots.push(kind);
    }
    let mut reachable = BTreeSet::new();
    let mut pending = roots;
    while let Some(name) = pending.pop() {
        let Some(fields) = messages.get(&name) else {
            assert!(
                !name.ends_with("List") || name.starts_with("api."),
                "k8s-pb has no message {name}"
            );
            continue;
        };
        if !reachable.insert(name) {
            continue;
        }
        pending.extend(fields.iter().filter_map(|f| f.message.clone()));
    }

    let mut out = String::from(
        "# Generated from k8s-pb by core-cluster/tests/protobuf_schema.rs; do not edit.\n",
    );
    for name in &reachable {
        out.push_str(&format!("message {name}\n"));
        // prost also re-cased message names (`HTTPGetAction` is `HttpGetAction`).
        let properties = schemas
            .get(&definition_name(name))
            .and_then(|s| s["properties"].as_object());
        for f in &messages[name] {
            let wanted = normalise(&f.rust_name);
            let from_schema = properties
                .and_then(|p| p.keys().find(|k| normalise(k) == wanted))
                .cloned();
            // Go structs embedded with `json:",inline"` (Probe's ProbeHandler, a
            // LocalObjectReference in a key selector, Volume's VolumeSource) are a nested
            // message in protobuf but flattened into the parent in JSON: their field is
            // absent from the parent's schema while the embedded message's fields are there.
            let inline = from_schema.is_none()
                && !f.repeated
                && f.kind == "message"
                && properties.is_some_and(|p| {
                    let inner = &messages[f.message.as_deref().expect("message field")];
                    // Most, not all: k8s-pb may be a release ahead of the schemas.
                    let found = inner
                        .iter()
                        .filter(|i| p.keys().any(|k| normalise(k) == normalise(&i.rust_name)))
                        .count();
                    found > 0 && found * 2 >= inner.len()
                });
            let json = from_schema.unwrap_or_else(|| match all_names.get(&wanted) {
                _ if inline => "*".to_owned(),
                Some(names) if names.len() == 1 => names.iter().next().expect("one").clone(),
                _ => lower_camel(&f.rust_name),
            });
            let mut ty = match (&f.message, f.kind.as_str()) {
                (Some(m), "map<message>") => format!("map<{m}>"),
                (Some(m), _) => m.clone(),
                (None, k) => k.to_owned(),
            };
            if f.repeated {
                ty.push_str("[]");
            }
            out.push_str(&format!("{} {json} {ty}\n", f.tag));
        }
    }
    out
}

#[test]
fn schema_table_matches_k8s_pb() {
    let generated = generate();
    let committed = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(TABLE))
        .unwrap_or_default();
    assert!(
        committed == generated,
        "{TABLE} is not what k8s-pb and the served resources give; regenerate it with \
         `cargo test -p core-cluster --test it protobuf_schema -- --ignored regenerate`"
    );
}

#[test]
#[ignore = "writes apiserver/src/api/protobuf/schema.txt"]
fn regenerate() {
    std::fs::write(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(TABLE),
        generate(),
    )
    .expect("write the table");
}
