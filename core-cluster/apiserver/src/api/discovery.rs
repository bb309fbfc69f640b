//! Discovery: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`, and the
//! aggregated form (`apidiscovery.k8s.io/v2`) that kubectl and kube-rs prefer.

use serde_json::{Value, json};

use crate::registry::{Registry, ResourceDef};

/// The Kubernetes version this server presents (within kubectl v1.32's ±1 skew).
pub const KUBERNETES_MAJOR: &str = "1";
/// Minor version.
pub const KUBERNETES_MINOR: &str = "33";

/// The body of `/version`.
pub fn version() -> Value {
    json!({
        "major": KUBERNETES_MAJOR,
        "minor": KUBERNETES_MINOR,
        "gitVersion": format!("v{KUBERNETES_MAJOR}.{KUBERNETES_MINOR}.0+ccm-rs.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a (Rust)",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

fn verbs(def: &ResourceDef) -> Vec<&'static str> {
    if crate::registry::resources::CREATE_ONLY.contains(&def.storage) {
        return vec!["create"];
    }
    vec![
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ]
    .into_iter()
    .filter(|v| def.deletecollection() || *v != "deletecollection")
    .collect()
}

fn subresource_verbs(sub: &str) -> Vec<&'static str> {
    match sub {
        "status" | "scale" | "ephemeralcontainers" | "approval" => vec!["get", "patch", "update"],
        "finalize" => vec!["update"],
        _ => vec!["create"],
    }
}

fn subresource_kind(def: &ResourceDef, sub: &str) -> (&'static str, &'static str, &'static str) {
    match sub {
        "binding" => ("", "v1", "Binding"),
        "eviction" => ("policy", "v1", "Eviction"),
        "token" => ("authentication.k8s.io", "v1", "TokenRequest"),
        "scale" => ("autoscaling", "v1", "Scale"),
        _ => ("", "", def.kind),
    }
}

/// The `APIResourceList` of one group-version.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let defs: Vec<&ResourceDef> = registry
        .all()
        .iter()
        .copied()
        .filter(|d| d.group == group && d.version == version)
        .collect();
    if defs.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for def in &defs {
        let mut r = json!({
            "name": def.plural,
            "singularName": def.singular,
            "namespaced": def.namespaced,
            "kind": def.kind,
            "verbs": verbs(def),
        });
        if !def.short_names.is_empty() {
            r["shortNames"] = json!(def.short_names);
        }
        if !def.categories.is_empty() {
            r["categories"] = json!(def.categories);
        }
        // Only what is stored has a storage version: not the reviews (create only).
        if !crate::registry::resources::CREATE_ONLY.contains(&def.storage) {
            r["storageVersionHash"] = json!(storage_version_hash(def));
        }
        resources.push(r);
        let subs = def
            .status
            .then_some("status")
            .into_iter()
            .chain(def.extra_subresources.iter().copied());
        for sub in subs {
            let (g, v, kind) = subresource_kind(def, sub);
            let mut r = json!({
                "name": format!("{}/{}", def.plural, sub),
                "singularName": "",
                "namespaced": def.namespaced,
                "kind": kind,
                "verbs": subresource_verbs(sub),
            });
            // Named only when it differs from the resource's group-version.
            if (!g.is_empty() || !v.is_empty()) && (g, v) != (group, version) {
                r["group"] = json!(g);
                r["version"] = json!(v);
            }
            resources.push(r);
        }
    }
    let group_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

/// The body of `/api` (legacy form).
pub fn core_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    })
}

fn group_json(group: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "name": group,
        "versions": vs,
        "preferredVersion": vs[0],
    })
}

fn groups(registry: &Registry) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
    for (g, v) in registry.group_versions() {
        if g.is_empty() {
            continue;
        }
        match out.iter_mut().find(|(name, _)| *name == g) {
            Some((_, vs)) => vs.push(v),
            None => out.push((g, vec![v])),
        }
    }
    out
}

/// The body of `/apis` (legacy form).
pub fn group_list(registry: &Registry) -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups(registry).iter().map(|(g, vs)| group_json(g, vs)).collect::<Vec<_>>(),
    })
}

/// The body of `/apis/<group>`.
pub fn group(registry: &Registry, name: &str) -> Option<Value> {
    groups(registry)
        .into_iter()
        .find(|(g, _)| *g == name)
        .map(|(g, vs)| {
            let mut body = group_json(g, &vs);
            body["kind"] = json!("APIGroup");
            body["apiVersion"] = json!("v1");
            body
        })
}

/// Upstream's `discovery.StorageVersionHash`: the first 8 bytes of the SHA-256 of the
/// storage version's `group/version/kind`, in base64 (clients compare it to notice a
/// storage migration). events.k8s.io Events are stored as core v1 Events, and
/// CustomResourceDefinitions still as apiextensions.k8s.io/v1beta1 ones.
fn storage_version_hash(def: &ResourceDef) -> String {
    use base64::Engine;
    let (group, version, kind) = match (def.storage, def.group, def.kind) {
        ("core/events", _, _) => ("", "v1", "Event"),
        (_, "apiextensions.k8s.io", "CustomResourceDefinition") => (
            "apiextensions.k8s.io",
            "v1beta1",
            "CustomResourceDefinition",
        ),
        _ => (def.group, def.version, def.kind),
    };
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{group}/{version}/{kind}").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(&digest.as_ref()[..8])
}

fn aggregated_version(registry: &Registry, group: &str, version: &str) -> Value {
    // A response kind of the resource's own group-version names neither (`"group": "",
    // "version": ""`), as kube-apiserver's aggregated discovery writes it.
    let own = |g: &str, v: &str| (g, v) == (group, version) || v.is_empty();
    let resources: Vec<Value> = registry
        .all()
        .iter()
        .filter(|d| d.group == group && d.version == version)
        .map(|def| {
            let subs: Vec<Value> = def
                .status
                .then_some("status")
                .into_iter()
                .chain(def.extra_subresources.iter().copied())
                .map(|sub| {
                    let (g, v, kind) = subresource_kind(def, sub);
                    json!({
                        "subresource": sub,
                        "responseKind": if own(g, v) {
                            json!({"group": "", "version": "", "kind": kind})
                        } else {
                            json!({"group": g, "version": v, "kind": kind})
                        },
                        "verbs": subresource_verbs(sub),
                    })
                })
                .collect();
            let mut r = json!({
                "resource": def.plural,
                "responseKind": {"group": "", "version": "", "kind": def.kind},
                "scope": if def.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": def.singular,
                "verbs": verbs(def),
                "subresources": subs,
            });
            if !def.short_names.is_empty() {
                r["shortNames"] = json!(def.short_names);
            }
            if !def.categories.is_empty() {
                r["categories"] = json!(def.categories);
            }
            r
        })
        .collect();
    json!({"version": version, "resources": resources, "freshness": "Current"})
}

/// The aggregated discovery document of `/api` (`core`) or `/apis` (the groups).
pub fn aggregated(registry: &Registry, core: bool) -> Value {
    let items: Vec<Value> = if core {
        vec![json!({
            "metadata": {"creationTimestamp": null},
            "versions": [aggregated_version(registry, "", "v1")],
        })]
    } else {
        groups(registry)
            .iter()
            .map(|(g, vs)| {
                json!({
                    "metadata": {"name": g, "creationTimestamp": null},
                    "versions": vs.iter().map(|v| aggregated_version(registry, g, v)).collect::<Vec<_>>(),
                })
            })
            .collect()
    };
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": "apidiscovery.k8s.io/v2",
        "metadata": {},
        "items": items,
    })
}

#[cfg(test)]
mod tests {

    // `discovery.StorageVersionHash` of the storage version: kube-apiserver 1.35's values.
    #[test]
    fn storage_version_hashes_are_kube_apiservers() {
        use crate::registry::resources::{CONFIG_MAPS, EVENTS};
        assert_eq!(storage_version_hash(&CONFIG_MAPS), "qFsyl6wFWjQ=");
        assert_eq!(storage_version_hash(&EVENTS), "r2yiGXH7wu8=");
        assert_eq!(
            storage_version_hash(&crate::crd::CUSTOM_RESOURCE_DEFINITIONS),
            "jfWCUB31mvA="
        );
    }
    use super::*;

    #[test]
    fn core_resource_list_has_subresources() {
        let list = resource_list(&Registry::standard(), "", "v1").unwrap();
        let names: Vec<&str> = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        for want in [
            "nodes",
            "nodes/status",
            "pods",
            "pods/binding",
            "pods/eviction",
            "services/status",
            "events",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
    }

    #[test]
    fn groups_are_listed_once() {
        let list = group_list(&Registry::standard());
        let names: Vec<&str> = list["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "coordination.k8s.io",
                "discovery.k8s.io",
                "events.k8s.io",
                "authentication.k8s.io",
                "rbac.authorization.k8s.io",
                "authorization.k8s.io",
                "apps",
                "batch",
                "policy",
                "certificates.k8s.io",
                "apiextensions.k8s.io",
                "apiregistration.k8s.io"
            ]
        );
        assert!(group(&Registry::standard(), "events.k8s.io").is_some());
        assert!(group(&Registry::standard(), "policy").is_some());
        assert!(group(&Registry::standard(), "storage.k8s.io").is_none());
    }
}
