//! A pod's `binding` subresource (upstream's `BindingREST`): sets its node once.

use serde_json::{Value, json};

use super::{
    MAX_WRITE_ATTEMPTS, ObjectKey, Storage, encode, get_list::get_object, qualified,
    status::ApiError,
};
use crate::{
    registry::FieldError,
    registry::meta::{self, meta_mut},
    store::StoreError,
};

/// Binds the pod `key` to the node `binding.target.name`, as the scheduler does: a 409 if
/// it is bound already or being deleted. The admission chain is not run on bindings (the
/// node rules do not grant `pods/binding`).
pub(crate) async fn bind_pod(
    state: &Storage,
    key: ObjectKey<'_>,
    binding: Value,
) -> Result<(), ApiError> {
    let ObjectKey {
        def,
        namespace: ns,
        name,
    } = key;
    let node = binding["target"]["name"].as_str().unwrap_or("").to_owned();
    if node.is_empty() {
        return Err(ApiError::invalid(
            "Binding",
            "",
            name,
            vec![FieldError::required("target.name", "")],
        ));
    }
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let (kv, current) = get_object(&*state.store, def, ns, name).await?;
        if !current["metadata"]["deletionTimestamp"].is_null() {
            return Err(ApiError::conflict(
                &qualified(def, name),
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        if let Some(existing) = current["spec"]["nodeName"]
            .as_str()
            .filter(|n| !n.is_empty())
        {
            // The binding storage's conflict names the subresource (`pods/binding`).
            return Err(ApiError::conflict(
                &crate::storage::status::Qualified::new(def.group, "pods/binding", name),
                &format!("pod {name} is already assigned to node \"{existing}\""),
            ));
        }
        let mut bound = current.clone();
        bound["spec"]["nodeName"] = json!(node);
        let mut scheduled = json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": meta::now_rfc3339()});
        scheduled["lastProbeTime"] = Value::Null;
        let conditions = bound["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut conditions: Vec<Value> = conditions
            .into_iter()
            .filter(|c| c["type"] != "PodScheduled")
            .collect();
        conditions.push(scheduled);
        bound["status"]["conditions"] = json!(conditions);
        meta_mut(&mut bound).remove("resourceVersion");
        let bytes = encode(state, def, &bound)?;
        match state
            .update_key(key, &current, &bound, bytes, kv.mod_revision)
            .await
        {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(ApiError::from_store(&qualified(def, name), e)),
        }
    }
    Err(ApiError::modified(&qualified(def, name)))
}
