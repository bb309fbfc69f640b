//! Delete (upstream's `Store.Delete` and `Store.DeleteCollection`): preconditions,
//! graceful deletion, finalizers and the propagation policy.

use serde_json::{Value, json};

use super::{
    MAX_WRITE_ATTEMPTS, ObjectKey, Query, SYSTEM_NAMESPACES, Storage, WriteContext,
    admission::{AdmissionAttributes, Operation},
    create::released,
    encode, flag,
    get_list::{ListOptions, get_object, list_objects},
    qualified,
    status::{ApiError, success_status},
};
use crate::{
    registry::FieldError,
    registry::{
        ResourceDef,
        meta::{meta_mut, str_at},
    },
    store::StoreError,
};

/// `DeleteOptions`, from the body and the query.
#[derive(Debug, Default)]
pub(crate) struct DeleteOptions {
    /// `gracePeriodSeconds`.
    pub(crate) grace_period_seconds: Option<i64>,
    /// `propagationPolicy` (`orphanDependents` read as `Orphan`).
    pub(crate) propagation_policy: Option<String>,
    /// `preconditions.uid`.
    pub(crate) precondition_uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub(crate) precondition_rv: Option<String>,
    /// `dryRun: [All]`.
    pub(crate) dry_run: bool,
}

impl DeleteOptions {
    pub(crate) fn from_value(body: &Value, query: &Query) -> Result<Self, ApiError> {
        let mut o = DeleteOptions {
            grace_period_seconds: body["gracePeriodSeconds"].as_i64(),
            propagation_policy: body["propagationPolicy"].as_str().map(str::to_owned),
            precondition_uid: body["preconditions"]["uid"].as_str().map(str::to_owned),
            precondition_rv: body["preconditions"]["resourceVersion"]
                .as_str()
                .map(str::to_owned),
            dry_run: body["dryRun"]
                .as_array()
                .is_some_and(|d| d.iter().any(|v| v == "All")),
        };
        let mut orphan = body["orphanDependents"].as_bool();
        if let Some(g) = query.get("gracePeriodSeconds") {
            o.grace_period_seconds =
                Some(g.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}"))
                })?);
        }
        if let Some(p) = query.get("propagationPolicy") {
            o.propagation_policy = Some(p.clone());
        }
        if let Some(q) = query.get("orphanDependents") {
            orphan = Some(flag(query, "orphanDependents") && !q.is_empty());
        }
        if query.get("dryRun").is_some_and(|d| d == "All") {
            o.dry_run = true;
        }
        // `ValidateDeleteOptions`, which upstream's handler runs before it looks the object up.
        let body_dry_run = body["dryRun"].as_array().into_iter().flatten();
        let query_dry_run = query.get("dryRun").map(|d| Value::String(d.clone()));
        if let Some(other) = body_dry_run
            .cloned()
            .chain(query_dry_run)
            .find(|d| d != "All")
        {
            return Err(ApiError::invalid(
                "DeleteOptions",
                "meta.k8s.io",
                "",
                vec![FieldError::not_supported(
                    "dryRun",
                    &json!([other]),
                    &["All"],
                )],
            ));
        }
        if let (Some(_), Some(policy)) = (orphan, &o.propagation_policy) {
            return Err(ApiError::invalid(
                "DeleteOptions",
                "meta.k8s.io",
                "",
                vec![FieldError::invalid(
                    "propagationPolicy",
                    &json!(policy),
                    "orphanDependents and deletionPropagation cannot be both set",
                )],
            ));
        }
        // The deprecated `orphanDependents`: true orphans, false deletes the dependents.
        if let Some(orphan) = orphan {
            o.propagation_policy = Some(if orphan { "Orphan" } else { "Background" }.into());
        }
        if let Some(p) = &o.propagation_policy
            && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
        {
            return Err(ApiError::invalid(
                "DeleteOptions",
                "meta.k8s.io",
                "",
                vec![FieldError::not_supported(
                    "propagationPolicy",
                    &json!(p),
                    &["Foreground", "Background", "Orphan", "nil"],
                )],
            ));
        }
        if o.grace_period_seconds.is_some_and(|g| g < 0) {
            o.grace_period_seconds = Some(0);
        }
        Ok(o)
    }
}

/// The propagation policy of a deletion that names none (upstream's
/// `DefaultGarbageCollectionPolicy`): batch/v1 Jobs orphan their pods, for backward
/// compatibility (`pkg/registry/batch/job/strategy.go`); every other kind served deletes its
/// dependents in the background, which needs no finalizer.
pub(crate) fn default_propagation_policy(def: &ResourceDef) -> Option<&'static str> {
    (def.group == "batch" && def.version == "v1" && def.plural == "jobs").then_some("Orphan")
}

/// Kinds whose storage answers a deletion with the deleted object rather than a `Status`
/// (upstream's `ReturnDeletedObject: true`: pods, services, service accounts, namespaces, pod
/// templates, and the storage and quota kinds).
fn returns_deleted_object(def: &ResourceDef) -> bool {
    match def.group {
        "" => matches!(
            def.plural,
            "pods"
                | "services"
                | "serviceaccounts"
                | "namespaces"
                | "podtemplates"
                | "persistentvolumes"
                | "persistentvolumeclaims"
                | "resourcequotas"
        ),
        "storage.k8s.io" | "resource.k8s.io" => true,
        _ => false,
    }
}

/// Kinds the garbage collector does not serve (`rest.Unsupported`): an Event is deleted at
/// once whatever propagation policy the deletion names (`pkg/registry/core/event/strategy.go`).
fn garbage_collection_unsupported(def: &ResourceDef) -> bool {
    def.plural == "events" && matches!(def.group, "" | "events.k8s.io")
}

/// The warning upstream's Job storage gives a deletion that names no propagation policy
/// (`pkg/registry/batch/job/storage/storage.go deleteOptionWarnings`), before it looks the
/// Job up.
pub(crate) fn orphaning_warning(
    def: &ResourceDef,
    options: &DeleteOptions,
) -> Option<&'static str> {
    (options.propagation_policy.is_none() && default_propagation_policy(def) == Some("Orphan"))
        .then_some("child pods are preserved by default when jobs are deleted; set propagationPolicy=Background to remove them or set propagationPolicy=Orphan to suppress this warning")
}

/// A delete's precondition that does not hold: upstream's `rest.BeforeDelete` names the
/// object by its kind (`DaemonSet.apps "a"`, `Pod "p"`), not by its resource.
fn precondition_failed(def: &ResourceDef, name: &str, why: &str) -> ApiError {
    if def.group.is_empty() && def.plural == "namespaces" {
        // The namespace storage's own Delete checks its preconditions, naming the resource.
        return ApiError::conflict(&qualified(def, name), why);
    }
    let kind = if def.group.is_empty() {
        def.kind.to_owned()
    } else {
        format!("{}.{}", def.kind, def.group)
    };
    let mut error = ApiError::conflict(&qualified(def, name), why);
    error.message = format!("Operation cannot be fulfilled on {kind} \"{name}\": {why}");
    if let Some(details) = error.details.as_mut() {
        details["kind"] = json!(def.kind);
        // events.k8s.io Events are core Events inside kube-apiserver.
        if def.storage == "core/events"
            && let Some(d) = details.as_object_mut()
        {
            d.remove("group");
        }
    }
    error
}

/// Deletes an object with upstream's semantics: preconditions, graceful deletion for pods on
/// a node, finalizers (including `orphan` and `foregroundDeletion` from the propagation
/// policy), and immediate removal otherwise. Answers the deleted object (pods, and an
/// object kept for its finalizers or grace period) or a success `Status`.
pub(crate) async fn delete_object(
    state: &Storage,
    ctx: &WriteContext,
    key: ObjectKey<'_>,
    options: DeleteOptions,
) -> Result<Value, ApiError> {
    let ObjectKey {
        def,
        namespace: ns,
        name,
    } = key;
    let q = qualified(def, name);
    if def.plural == "namespaces" && SYSTEM_NAMESPACES.contains(&name) {
        return Err(ApiError::forbidden(&q, "this namespace may not be deleted"));
    }
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let (kv, current) = get_object(&*state.store, def, ns, name).await?;
        state
            .admit(&AdmissionAttributes {
                user: &ctx.user,
                operation: Operation::Delete,
                resource: def,
                subresource: None,
                namespace: ns,
                name,
                object: None,
                old_object: Some(&current),
            })
            .await?;
        let meta = &current["metadata"];
        if let Some(uid) = &options.precondition_uid
            && meta["uid"].as_str() != Some(uid)
        {
            return Err(precondition_failed(
                def,
                name,
                &format!(
                    "the UID in the precondition ({uid}) does not match the UID in record ({}). The object might have been deleted and then recreated",
                    meta["uid"].as_str().unwrap_or("")
                ),
            ));
        }
        if let Some(rv) = &options.precondition_rv
            && *rv != kv.mod_revision.to_string()
        {
            return Err(precondition_failed(
                def,
                name,
                &format!(
                    "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({}). The object might have been modified",
                    kv.mod_revision
                ),
            ));
        }
        let already_deleting = !meta["deletionTimestamp"].is_null();
        let mut finalizers: Vec<String> = meta["finalizers"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if !already_deleting && !garbage_collection_unsupported(def) {
            let policy = options
                .propagation_policy
                .as_deref()
                .or(default_propagation_policy(def));
            match policy {
                Some("Orphan") => {
                    finalizers.retain(|f| f != "foregroundDeletion");
                    if !finalizers.iter().any(|f| f == "orphan") {
                        finalizers.push("orphan".into());
                    }
                }
                Some("Foreground") => {
                    finalizers.retain(|f| f != "orphan");
                    if !finalizers.iter().any(|f| f == "foregroundDeletion") {
                        finalizers.push("foregroundDeletion".into());
                    }
                }
                Some("Background") => {
                    finalizers.retain(|f| f != "orphan" && f != "foregroundDeletion")
                }
                _ => {}
            }
        }
        // Graceful deletion: a pod on a node waits for its kubelet.
        let grace = if def.group.is_empty() && def.plural == "pods" {
            let terminal = matches!(
                current["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
            let scheduled = current["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty());
            if terminal || !scheduled {
                0
            } else {
                options
                    .grace_period_seconds
                    .or_else(|| current["spec"]["terminationGracePeriodSeconds"].as_i64())
                    .unwrap_or(30)
            }
        } else {
            0
        };
        let namespace_pending = def.plural == "namespaces"
            && current["spec"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty());
        let immediate = finalizers.is_empty() && grace == 0 && !namespace_pending;
        // A pod's deletion is graceful even when immediate (`rest.BeforeDelete` with the pod
        // strategy's grace of 0): the object it answers is marked deleted now, its generation
        // counted.
        let graceful_answer = |mut pod: Value| {
            if !already_deleting {
                let m = meta_mut(&mut pod);
                m.insert(
                    "deletionTimestamp".into(),
                    json!(crate::registry::meta::now_rfc3339()),
                );
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
                bump_generation(m);
            }
            pod
        };
        let is_pod = def.group.is_empty() && def.plural == "pods";
        if immediate && options.dry_run {
            // What the deletion would answer (upstream's dry run goes through the same path
            // and stops before the store).
            return Ok(if is_pod {
                graceful_answer(current)
            } else if returns_deleted_object(def) {
                current
            } else {
                success_status(&q, meta["uid"].as_str())
            });
        }
        if immediate {
            match state.delete_key(key, &current, kv.mod_revision).await {
                Ok((revision, _)) => {
                    released(state, def, &current).await;
                    let mut deleted = current.clone();
                    meta_mut(&mut deleted)
                        .insert("resourceVersion".into(), json!(revision.to_string()));
                    // Pods return the deleted object; everything else a Status.
                    return Ok(if is_pod {
                        graceful_answer(deleted)
                    } else if returns_deleted_object(def) {
                        deleted
                    } else {
                        success_status(&q, meta["uid"].as_str())
                    });
                }
                Err(StoreError::Conflict { .. }) => continue,
                Err(e) => return Err(ApiError::from_store(&q, e)),
            }
        }
        // Mark as deleting and keep the object.
        let mut marked = current.clone();
        let now = jiff::Timestamp::now().as_second();
        // A grace period near i64::MAX must not overflow: past jiff's range the deletion
        // time is the latest representable one.
        let deletion_at = jiff::Timestamp::from_second(now.saturating_add(grace))
            .unwrap_or(jiff::Timestamp::MAX)
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let m = meta_mut(&mut marked);
        let keep_earlier = already_deleting
            && m.get("deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .is_some_and(|g| g <= grace);
        if !keep_earlier {
            m.insert("deletionTimestamp".into(), json!(deletion_at));
            // The namespace storage's Delete sets the timestamp alone.
            if def.plural != "namespaces" || !def.group.is_empty() {
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
            }
        }
        if !already_deleting {
            bump_generation(m);
        }
        if finalizers.is_empty() {
            m.remove("finalizers");
        } else {
            m.insert("finalizers".into(), json!(finalizers));
        }
        m.remove("resourceVersion");
        if def.plural == "namespaces" {
            marked["status"]["phase"] = json!("Terminating");
        }
        if marked == {
            let mut c = current.clone();
            meta_mut(&mut c).remove("resourceVersion");
            c
        } {
            return Ok(current);
        }
        if options.dry_run {
            let rv = meta["resourceVersion"].clone();
            meta_mut(&mut marked).insert("resourceVersion".into(), rv);
            return Ok(marked);
        }
        let bytes = encode(state, def, &marked)?;
        match state
            .update_key(key, &current, &marked, bytes, kv.mod_revision)
            .await
        {
            Ok(revision) => {
                // A namespace now terminating is cleaned up by the namespace finalizer,
                // which observes this write.
                meta_mut(&mut marked).insert("resourceVersion".into(), json!(revision.to_string()));
                return Ok(marked);
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(ApiError::from_store(&q, e)),
        }
    }
    Err(ApiError::modified(&q))
}

/// The generation bump of an object whose deletion starts: its controllers must stop acting
/// on it, so `metadata.generation` moves on, if the object has one (> 0). Upstream does it
/// where the deletionTimestamp is first set: `k8s.io/apiserver/pkg/registry/rest/delete.go
/// BeforeDelete` for a graceful deletion, `pkg/registry/generic/registry/store.go
/// markAsDeleting` for one held by finalizers; never again once the object is deleting (a
/// shortened grace period does not bump it).
fn bump_generation(meta: &mut serde_json::Map<String, Value>) {
    if let Some(generation) = meta
        .get("generation")
        .and_then(Value::as_i64)
        .filter(|g| *g > 0)
    {
        meta.insert("generation".into(), json!(generation.saturating_add(1)));
    }
}

/// Deletes every object of `def` that `query`'s list options select.
pub(crate) async fn delete_collection(
    state: &Storage,
    ctx: &WriteContext,
    def: &'static ResourceDef,
    ns: Option<&str>,
    query: &Query,
    options: DeleteOptions,
) -> Result<(Vec<Value>, u64, Option<String>), ApiError> {
    let opts = ListOptions::parse(def, query)?;
    let listed = list_objects(&*state.store, def, ns, &opts).await?;
    for item in &listed.0 {
        let name = str_at(item, &["metadata", "name"]).unwrap_or("").to_owned();
        let item_ns = str_at(item, &["metadata", "namespace"]).map(str::to_owned);
        let opts = DeleteOptions {
            grace_period_seconds: options.grace_period_seconds,
            propagation_policy: options.propagation_policy.clone(),
            dry_run: options.dry_run,
            ..DeleteOptions::default()
        };
        match delete_object(
            state,
            ctx,
            ObjectKey::new(def, item_ns.as_deref(), &name),
            opts,
        )
        .await
        {
            Ok(_) => {}
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(listed)
}
