//! The `scale` subresource of Deployments and ReplicaSets: an `autoscaling/v1` `Scale`
//! view of `spec.replicas`, read, replaced and patched (`kubectl scale`, HPA); and of custom
//! resources whose definition gives a `scale` subresource, at its `specReplicasPath`,
//! `statusReplicasPath` and `labelSelectorPath` (upstream's
//! `apiextensions-apiserver/pkg/registry/customresource/etcd.go ScaleREST`).

use serde_json::{Value, json};

use super::{
    ServerState,
    status::{ApiError, FieldError},
};
use crate::{
    crd,
    patch::{self, PatchType},
    registry::{ResourceDef, meta::meta_mut, workloads::selector_string},
    storage::{
        MAX_WRITE_ATTEMPTS, ObjectKey, WriteContext, get_list::get_object, update::update_object,
    },
};

/// The `Scale` of an object (upstream `scaleFromDeployment`): name, namespace, uid,
/// resourceVersion and creationTimestamp of the object, `spec.replicas`, `status.replicas`
/// and the selector as a string.
pub(crate) fn to_scale(obj: &Value) -> Value {
    let m = &obj["metadata"];
    go_omissions(json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
            "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"],
        },
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(0)},
        "status": {
            "replicas": obj["status"]["replicas"].as_i64().unwrap_or(0),
            "selector": selector_string(&obj["spec"]["selector"]),
        },
    }))
}

/// What Go leaves out of an `autoscaling/v1` Scale: `spec.replicas` and
/// `status.selector` are `omitempty` (0 and "" are not written).
fn go_omissions(mut scale: Value) -> Value {
    if scale["spec"]["replicas"] == 0
        && let Some(spec) = scale["spec"].as_object_mut()
    {
        spec.remove("replicas");
    }
    if scale["status"]["selector"] == ""
        && let Some(status) = scale["status"].as_object_mut()
    {
        status.remove("selector");
    }
    scale
}

/// The `Scale` of an object of `def`: [`to_scale`], or a custom resource's at its paths.
fn scale_of(def: &ResourceDef, obj: &Value) -> Value {
    let Some(paths) = crd::custom(def).and_then(|c| c.scale.clone()) else {
        return to_scale(obj);
    };
    let mut scale = to_scale(obj);
    let at = |path: &str| crd::json_path(obj, path).cloned().unwrap_or(Value::Null);
    scale["apiVersion"] = json!("autoscaling/v1");
    scale["spec"]["replicas"] = json!(at(&paths.spec_replicas).as_i64().unwrap_or(0));
    scale["status"]["replicas"] = json!(at(&paths.status_replicas).as_i64().unwrap_or(0));
    scale["status"]["selector"] = json!(
        paths
            .label_selector
            .as_deref()
            .and_then(|p| at(p).as_str().map(str::to_owned))
            .unwrap_or_default()
    );
    go_omissions(scale)
}

/// Sets `replicas` at the spec path of `def`'s scale (`.spec.replicas` for built-ins).
fn set_replicas(def: &ResourceDef, obj: &mut Value, replicas: i64) {
    let path = crd::custom(def)
        .and_then(|c| c.scale.clone())
        .map_or_else(|| ".spec.replicas".to_owned(), |p| p.spec_replicas);
    let mut cur = obj;
    let parts: Vec<&str> = path.trim_start_matches('.').split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            cur[*part] = json!(replicas);
        } else {
            if !cur[*part].is_object() {
                cur[*part] = json!({});
            }
            cur = &mut cur[*part];
        }
    }
}

/// GET of the scale subresource.
pub(crate) async fn get(state: &ServerState, key: ObjectKey<'_>) -> Result<Value, ApiError> {
    let (def, ns, name) = (key.def, key.namespace, key.name);
    Ok(scale_of(
        def,
        &get_object(&*state.store, def, ns, name).await?.1,
    ))
}

/// PUT of the scale subresource: `spec.replicas` of the `Scale` becomes the object's (with
/// the `Scale`'s resourceVersion as precondition when given).
pub(crate) async fn put(
    state: &ServerState,
    ctx: &WriteContext,
    key: ObjectKey<'_>,
    scale: Value,
) -> Result<Value, ApiError> {
    let (def, ns, name) = (key.def, key.namespace, key.name);
    let replicas = &scale["spec"]["replicas"];
    let n = match replicas.as_i64() {
        Some(n) if n >= 0 && n <= i64::from(i32::MAX) => n,
        Some(_) => {
            return Err(ApiError::invalid(
                "Scale",
                "autoscaling",
                name,
                vec![FieldError::invalid(
                    "spec.replicas",
                    replicas,
                    "must be greater than or equal to 0",
                )],
            ));
        }
        None if replicas.is_null() => 0,
        None => {
            return Err(ApiError::bad_request(format!(
                "spec.replicas must be an integer, got {replicas}"
            )));
        }
    };
    let mut obj = get_object(&*state.store, def, ns, name).await?.1;
    set_replicas(def, &mut obj, n);
    match scale["metadata"]["resourceVersion"].as_str() {
        Some(rv) if !rv.is_empty() => {
            meta_mut(&mut obj).insert("resourceVersion".into(), json!(rv));
        }
        _ => {
            meta_mut(&mut obj).remove("resourceVersion");
        }
    }
    // The object is the stored one with a new `spec.replicas`: no body to decode.
    let updated = update_object(&state.storage, ctx, key, None, obj).await?;
    Ok(scale_of(def, &updated))
}

/// PATCH of the scale subresource: the patch (JSON, merge or strategic merge) is applied
/// to the `Scale`, then written as a PUT.
pub(crate) async fn patch(
    state: &ServerState,
    ctx: &WriteContext,
    key: ObjectKey<'_>,
    content_type: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let patch_type = PatchType::from_content_type(content_type)
        .filter(|t| *t != PatchType::ApplyPatch)
        .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
    let patch =
        patch::decode_body(patch_type, body).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let read = get(state, key).await?;
        let mut scale = read.clone();
        match patch_type {
            PatchType::JsonPatch => {
                scale = patch::json_patch::json_patch(&scale, &patch)
                    .map_err(|e| ApiError::bad_request(e.to_string()))?;
            }
            _ => patch::merge_patch::merge_patch(&mut scale, &patch),
        }
        // The resourceVersion is a precondition only when the patch itself sets it; else the
        // patch applies to whatever is stored, read again on a conflict (upstream's patcher
        // runs its patch inside the store's `GuaranteedUpdate`, which re-reads and re-applies
        // until its write is not raced).
        let pinned = scale["metadata"]["resourceVersion"] != read["metadata"]["resourceVersion"];
        match put(state, ctx, key, scale).await {
            // As often as the object's own patch tries (a conflict every time: the 409).
            Err(e) if e.code == 409 && !pinned && attempts < MAX_WRITE_ATTEMPTS => {}
            answered => return answered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_view() {
        let d = json!({"metadata": {"name": "web", "namespace": "default", "uid": "u", "resourceVersion": "7"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}},
            "status": {"replicas": 2}});
        let s = to_scale(&d);
        assert_eq!(s["spec"]["replicas"], 3);
        assert_eq!(s["status"], json!({"replicas": 2, "selector": "app=web"}));
        assert_eq!(s["metadata"]["resourceVersion"], "7");
    }
}
