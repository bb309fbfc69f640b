//! Update (upstream's `Store.Update` through `GuaranteedUpdate`, with the strategies'
//! `PrepareForUpdate` and `ValidateUpdate`): of an object, its `status`, or a namespace's
//! finalizers; the write that removes the last finalizer deletes.

use serde_json::{Value, json};

use super::{
    MAX_WRITE_ATTEMPTS, ObjectKey, Storage, WriteContext,
    admission::{AdmissionAttributes, Operation},
    create::{allocate, commit, record_manager, released, rollback},
    encode,
    get_list::get_object,
    invalid, parse_rv, qualified,
    status::ApiError,
};
use crate::{
    registry::FieldError,
    registry::meta::{self, meta_mut, str_at},
    store::KeyValue,
};

/// Replaces an object (PUT), or its status (`/status`), or a namespace's finalizers.
/// The body was decoded and checked against its type by the caller.
/// Whether a PUT of a missing object creates it: upstream's strategies of Leases, Endpoints,
/// Services and Events say `AllowCreateOnUpdate` (`pkg/registry/{coordination/lease,
/// core/endpoint,core/service,core/event}/strategy.go`).
pub(crate) fn creates_on_update(def: &crate::registry::ResourceDef) -> bool {
    matches!(
        (def.group, def.plural),
        ("coordination.k8s.io", "leases")
            | ("", "endpoints" | "services")
            | ("" | "events.k8s.io", "events")
    )
}

/// A body naming another uid is a precondition that fails (upstream's update handler makes
/// the body's uid a precondition of the store's update), answered in the store's words.
fn check_uid(
    def: &crate::registry::ResourceDef,
    ns: Option<&str>,
    name: &str,
    new: &Value,
    current: &Value,
) -> Result<(), ApiError> {
    match new["metadata"]["uid"].as_str().filter(|u| !u.is_empty()) {
        Some(uid) if Some(uid) != current["metadata"]["uid"].as_str() => Err(ApiError::conflict(
            &qualified(def, name),
            &format!(
                "StorageError: invalid object, Code: 4, Key: {}, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                upstream_key(def, ns, name),
                current["metadata"]["uid"].as_str().unwrap_or("")
            ),
        )),
        _ => Ok(()),
    }
}

/// The object's key in kube-apiserver's etcd, which its storage errors quote: the resource
/// without its group (`/registry/deployments/ns/a`), Services under `services/specs`.
fn upstream_key(def: &crate::registry::ResourceDef, ns: Option<&str>, name: &str) -> String {
    let resource = match (def.group, def.plural) {
        ("", "services") => "services/specs",
        ("", "endpoints") => "services/endpoints",
        ("", "nodes") => "minions",
        (_, plural) => plural,
    };
    match ns {
        Some(ns) => format!("/registry/{resource}/{ns}/{name}"),
        None => format!("/registry/{resource}/{name}"),
    }
}

/// Whether a PUT may leave out `metadata.resourceVersion` (most kinds; not Leases and
/// PodDisruptionBudgets, whose strategies say `AllowUnconditionalUpdate` false).
fn allows_unconditional_update(def: &crate::registry::ResourceDef) -> bool {
    !matches!(
        (def.group, def.plural),
        ("coordination.k8s.io", "leases") | ("policy", "poddisruptionbudgets")
    )
}

pub(crate) async fn update_object(
    state: &Storage,
    ctx: &WriteContext,
    key: ObjectKey<'_>,
    sub: Option<&str>,
    new: Value,
) -> Result<Value, ApiError> {
    let ObjectKey {
        def,
        namespace: ns,
        name,
    } = key;
    let body_name = str_at(&new, &["metadata", "name"]).unwrap_or("");
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if def.namespaced
        && let Some(body_ns) = str_at(&new, &["metadata", "namespace"])
        && Some(body_ns) != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let precondition = match str_at(&new, &["metadata", "resourceVersion"]) {
        Some(rv) if !rv.is_empty() => Some(parse_rv(rv)?),
        _ => None,
    };

    // The first attempt starts from the store's recent copy, if it keeps one (etcd): as
    // upstream's GuaranteedUpdate from the watch cache's object, the write is compared on
    // the copy's revision, and whatever goes wrong from a copy that may be stale (a
    // precondition, a conflict, a validation against it) is tried again from a read.
    let mut suggested = recent_object(state, def, ns, name);
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let (kv, current, is_current) = match suggested.take() {
            Some((kv, current)) => (kv, current, false),
            None => {
                let (kv, current) = match get_object(&*state.store, def, ns, name).await {
                    Err(e) if e.code == 404 && sub.is_none() && creates_on_update(def) => {
                        // The strategy's `AllowCreateOnUpdate`: a PUT of a missing object
                        // creates it, whatever resourceVersion it names.
                        let mut new = new;
                        if let Some(meta) = new["metadata"].as_object_mut() {
                            meta.remove("resourceVersion");
                        }
                        return super::create::create_object(state, ctx, def, ns, new).await;
                    }
                    other => other?,
                };
                (kv, current, true)
            }
        };
        if precondition.is_none() && !allows_unconditional_update(def) {
            // The strategy's `AllowUnconditionalUpdate` is false: an update names the version
            // it read (`pkg/registry/{coordination/lease,policy/poddisruptionbudget}`).
            return Err(ApiError::invalid(
                def.plural,
                def.group,
                name,
                vec![FieldError::invalid(
                    "metadata.resourceVersion",
                    &json!(0),
                    "must be specified for an update",
                )],
            ));
        }
        // The body's uid is checked before its resourceVersion, as the store checks its
        // preconditions before it compares versions.
        check_uid(def, ns, name, &new, &current)?;
        if precondition.is_some_and(|rv| rv != kv.mod_revision) {
            if !is_current {
                continue;
            }
            return Err(ApiError::modified(&qualified(def, name)));
        }
        match commit_update(state, ctx, key, sub, &kv, &current, new.clone()).await {
            // Not a store failure (5xx), whose write may have been made: that is answered.
            Err(e) if !is_current && e.code < 500 => continue,
            Err(e) if e.reason == "Conflict" && precondition.is_none() => continue,
            other => return other,
        }
    }
    Err(ApiError::modified(&qualified(def, name)))
}

/// The store's recent copy of an object ([`crate::store::Store::recent`]), decoded; none
/// when it keeps none or the copy does not decode.
fn recent_object(
    state: &Storage,
    def: &'static crate::registry::ResourceDef,
    ns: Option<&str>,
    name: &str,
) -> Option<(KeyValue, Value)> {
    let kv = state.store.recent(&def.key(ns, name))?;
    let obj = super::decode_kv(def, &kv).ok()?;
    Some((kv, obj))
}

fn is_csr(def: &crate::registry::ResourceDef) -> bool {
    std::ptr::eq(
        def,
        &crate::registry::certificates::CERTIFICATE_SIGNING_REQUESTS,
    )
}

/// `preserveConditionInstances` of Approved and Denied: `merged`'s conditions of those
/// types are `current`'s.
fn keep_approval_conditions(merged: &mut Value, current: &Value) {
    use crate::registry::certificates::{APPROVED, DENIED};
    let approval = |c: &Value| c["type"] == APPROVED || c["type"] == DENIED;
    let mut conditions: Vec<Value> = merged["status"]["conditions"]
        .as_array()
        .map(|c| c.iter().filter(|c| !approval(c)).cloned().collect())
        .unwrap_or_default();
    let kept: Vec<Value> = current["status"]["conditions"]
        .as_array()
        .map(|c| c.iter().filter(|c| approval(c)).cloned().collect())
        .unwrap_or_default();
    if conditions.is_empty() && kept.is_empty() {
        return;
    }
    let mut all = kept;
    all.append(&mut conditions);
    merged["status"]["conditions"] = Value::Array(all);
}

/// An object's annotations, none and `{}` alike (as `equality.Semantic` compares maps).
fn annotations_of(obj: &Value) -> Option<&serde_json::Map<String, Value>> {
    obj["metadata"]["annotations"]
        .as_object()
        .filter(|m| !m.is_empty())
}

fn differs(a: &Value, b: &Value, key: &str) -> bool {
    a.get(key).unwrap_or(&Value::Null) != b.get(key).unwrap_or(&Value::Null)
}

/// The shared tail of update and patch: subresource rules, system fields, validation,
/// admission, finalizer-driven deletion, and the conditional write.
pub(crate) async fn commit_update(
    state: &Storage,
    ctx: &WriteContext,
    key: ObjectKey<'_>,
    sub: Option<&str>,
    kv: &KeyValue,
    current: &Value,
    mut new: Value,
) -> Result<Value, ApiError> {
    let ObjectKey {
        def,
        namespace: ns,
        name,
    } = key;
    let q = qualified(def, name);
    match sub {
        Some("status") => {
            // Upstream's status strategies (nodes, services, pods, namespaces) keep the old
            // spec and take the written status and metadata: the service controller adds its
            // finalizer through `services/<name>/status`. Pods also keep
            // their ownerReferences, which old kubelets corrupted through this path. System
            // fields are restored below, as for any write.
            let status = new.get("status").cloned();
            let metadata = new.get("metadata").cloned();
            let mut merged = current.clone();
            match status {
                Some(s) => merged["status"] = s,
                None => {
                    if let Some(m) = merged.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            if is_csr(def) {
                // `csrStatusStrategy.PrepareForUpdate`: Approved and Denied conditions are
                // the approval's; through /status they stay as they were.
                keep_approval_conditions(&mut merged, current);
            }
            if let Some(mut metadata) = metadata.filter(Value::is_object) {
                if def.kind == "Pod" {
                    match current["metadata"].get("ownerReferences") {
                        Some(refs) => metadata["ownerReferences"] = refs.clone(),
                        None => {
                            if let Some(m) = metadata.as_object_mut() {
                                m.remove("ownerReferences");
                            }
                        }
                    }
                }
                if def.group == "apps" && def.plural == "deployments" {
                    // `deploymentStatusStrategy.PrepareForUpdate`: labels stay as they were.
                    match current["metadata"].get("labels") {
                        Some(labels) => metadata["labels"] = labels.clone(),
                        None => {
                            if let Some(m) = metadata.as_object_mut() {
                                m.remove("labels");
                            }
                        }
                    }
                }
                merged["metadata"] = metadata;
            }
            new = merged;
        }
        Some(super::ephemeral::SUBRESOURCE) if def.kind == "Pod" => {
            let merged = super::ephemeral::merge(current, &new);
            let errors = super::ephemeral::validate_update(&merged, current);
            if !errors.is_empty() {
                return Err(invalid(def, name, errors));
            }
            new = merged;
        }
        Some("approval") => {
            // `csrApprovalStrategy.PrepareForUpdate`: only the conditions (and metadata)
            // change through /approval.
            let conditions = new["status"]["conditions"].clone();
            let metadata = new.get("metadata").cloned();
            let mut merged = current.clone();
            merged["status"]["conditions"] = conditions;
            if let Some(metadata) = metadata.filter(Value::is_object) {
                merged["metadata"] = metadata;
            }
            new = merged;
        }
        Some("finalize") => {
            let finalizers = new["spec"]["finalizers"].clone();
            let mut merged = current.clone();
            merged["spec"]["finalizers"] = finalizers;
            new = merged;
        }
        _ => {
            if is_csr(def) {
                // `csrStrategy.PrepareForUpdate`: a request's spec never changes.
                new["spec"] = current["spec"].clone();
            }
            if def.status {
                match current.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        if let Some(m) = new.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
        }
    }
    check_uid(def, ns, name, &new, current)?;
    // System metadata is immutable.
    let old_meta = current["metadata"].clone();
    let meta = meta_mut(&mut new);
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "name",
        "namespace",
        "generation",
    ] {
        match old_meta.get(field) {
            Some(v) => {
                meta.insert(field.into(), v.clone());
            }
            None => {
                meta.remove(field);
            }
        }
    }
    meta.remove("resourceVersion");
    // Upstream defaults every decoded body, whatever it writes (the object, its status or
    // another subresource), before comparing it with the stored object.
    (def.prepare_update)(&mut new);
    crate::registry::prepare_update_from_old(def, &mut new, current, sub);
    let spec_changed = if crate::crd::is_custom(def) {
        // A custom resource's generation counts every change but metadata and status.
        crate::crd::schema::spec_changed(current, &new)
    } else {
        differs(&new, current, "spec")
            // `deploymentStrategy.PrepareForUpdate`: annotations count too, as they are
            // copied to the Deployment's ReplicaSets.
            || (def.group == "apps"
                && def.plural == "deployments"
                && annotations_of(&new) != annotations_of(current))
    };
    // A pod's ephemeral containers are its spec too: upstream's
    // `podEphemeralContainersStrategy.PrepareForUpdate` bumps the generation as a pod
    // update does (`pkg/registry/core/pod/strategy.go updatePodGeneration`); `status` never.
    let counts_generation = match sub {
        None => true,
        Some(super::ephemeral::SUBRESOURCE) => def.kind == "Pod",
        Some(_) => false,
    };
    if def.generation && counts_generation && spec_changed {
        let generation = old_meta["generation"].as_i64().unwrap_or(0) + 1;
        meta_mut(&mut new).insert("generation".into(), json!(generation));
    }
    record_manager(def, &mut new, Some(current), ctx, sub);
    state
        .mutate(
            &AdmissionAttributes {
                user: &ctx.user,
                operation: Operation::Update,
                resource: def,
                subresource: sub,
                namespace: ns,
                name,
                object: None,
                old_object: Some(current),
            },
            &mut new,
        )
        .await?;
    let deleting = !old_meta["deletionTimestamp"].is_null();
    let mut errors = meta::validate_object_meta(&new);
    if deleting {
        let old_f: Vec<&Value> = old_meta["finalizers"]
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default();
        let added: Vec<&Value> = new["metadata"]["finalizers"]
            .as_array()
            .map(|a| a.iter().filter(|f| !old_f.contains(f)).collect())
            .unwrap_or_default();
        if !added.is_empty() {
            errors.push(FieldError::forbidden(
                "metadata.finalizers",
                &format!("no new finalizers can be added if the object is being deleted, found new finalizers {}", json!(added)),
            ));
        }
    }
    errors.extend((def.validate)(&new, Some(current)));
    errors.extend(super::custom_errors(def, &new, Some(current)).await?);
    if !errors.is_empty() {
        return Err(invalid(def, name, errors));
    }
    state
        .admit(&AdmissionAttributes {
            user: &ctx.user,
            operation: Operation::Update,
            resource: def,
            subresource: sub,
            namespace: ns,
            name,
            object: Some(&new),
            old_object: Some(current),
        })
        .await?;
    let allocation = if sub.is_none() {
        allocate(state, def, &mut new, Some(current), name).await?
    } else {
        None
    };
    let mut unchanged = current.clone();
    meta_mut(&mut unchanged).remove("resourceVersion");
    if new == unchanged {
        rollback(state, &allocation).await;
        return Ok(current.clone());
    }
    if ctx.dry_run() {
        rollback(state, &allocation).await;
        // The object as it would be stored, at the revision it was read (upstream's dry
        // run stops short of the store's write, which alone moves the resourceVersion).
        meta_mut(&mut new).insert("resourceVersion".into(), json!(kv.mod_revision.to_string()));
        return Ok(new);
    }
    let finalizers_empty = new["metadata"]["finalizers"]
        .as_array()
        .is_none_or(Vec::is_empty);
    let grace_done = new["metadata"]["deletionGracePeriodSeconds"]
        .as_i64()
        .unwrap_or(0)
        == 0;
    let spec_finalizers_empty = def.plural != "namespaces"
        || new["spec"]["finalizers"]
            .as_array()
            .is_none_or(Vec::is_empty);
    if deleting && finalizers_empty && grace_done && spec_finalizers_empty {
        // The last finalizer is gone: the object goes now (ShouldDeleteDuringUpdate). The
        // new object is never stored, so what this update allocated (a NodePort for a type
        // change, say) goes back at once; the stored object's allocations are released
        // below once the delete is done.
        rollback(state, &allocation).await;
        let (revision, _) = state
            .delete_key(key, current, kv.mod_revision)
            .await
            .map_err(|e| ApiError::from_store(&q, e))?;
        released(state, def, current).await;
        meta_mut(&mut new).insert("resourceVersion".into(), json!(revision.to_string()));
        return Ok(new);
    }
    let bytes = match encode(state, def, &new) {
        Ok(bytes) => bytes,
        Err(e) => {
            rollback(state, &allocation).await;
            return Err(e);
        }
    };
    match state
        .update_key(key, current, &new, bytes, kv.mod_revision)
        .await
    {
        Ok(revision) => {
            commit(state, &allocation).await;
            meta_mut(&mut new).insert("resourceVersion".into(), json!(revision.to_string()));
            Ok(new)
        }
        Err(e) => {
            rollback(state, &allocation).await;
            Err(ApiError::from_store(&q, e))
        }
    }
}
