//! Create (upstream's `Store.Create` with the strategies' `PrepareForCreate` and
//! `Validate`), and what creates and updates share: Service allocation, `managedFields`.

use serde_json::{Value, json};

use super::{
    GENERATE_NAME_ATTEMPTS, ObjectKey, Storage, WriteContext,
    admission::{AdmissionAttributes, Operation},
    encode,
    get_list::get_object,
    invalid, qualified,
    status::{ApiError, Qualified},
};
use crate::{
    patch,
    registry::FieldError,
    registry::{
        ResourceDef,
        allocator::Allocation,
        meta::{self, meta_mut},
    },
    store::StoreError,
};

pub(crate) async fn check_namespace(
    state: &Storage,
    def: &ResourceDef,
    ns: &str,
    name: &str,
) -> Result<(), ApiError> {
    let namespaces = state
        .registry
        .find("", "v1", "namespaces")
        .expect("namespaces are served");
    match get_object(&*state.store, namespaces, None, ns).await {
        Ok((_, namespace)) => {
            if !namespace["metadata"]["deletionTimestamp"].is_null() {
                // The NamespaceLifecycle admission plugin's refusal, with the cause
                // controllers look for (`errors.HasStatusCause(err,
                // v1.NamespaceTerminatingCause)`) to stop retrying.
                let mut error = ApiError::forbidden(
                    &qualified(def, name),
                    &format!(
                        "unable to create new content in namespace {ns} because it is being terminated"
                    ),
                );
                if let Some(details) = error.details.as_mut() {
                    details["causes"] = json!([{
                        "reason": "NamespaceTerminating",
                        "message": format!("namespace {ns} is being terminated"),
                        "field": "metadata.namespace",
                    }]);
                }
                return Err(error);
            }
            Ok(())
        }
        Err(e) if e.code == 404 => Err(ApiError::not_found(&Qualified::new("", "namespaces", ns))),
        Err(e) => Err(e),
    }
}

/// `customresource_handler.go serveResource`: no custom resource is created while its
/// definition is terminating (its objects are being deleted), with upstream's 405
/// `create not allowed while custom resource definition is terminating`. The definition is
/// read from the store, so the refusal starts with the deletion's commit.
async fn refuse_while_definition_terminates(
    state: &Storage,
    def: &ResourceDef,
) -> Result<(), ApiError> {
    let Some(custom) = crate::crd::custom(def) else {
        return Ok(());
    };
    let crds = &crate::crd::CUSTOM_RESOURCE_DEFINITIONS;
    match get_object(&*state.store, crds, None, &custom.crd_name).await {
        Ok((_, crd)) if !crd["metadata"]["deletionTimestamp"].is_null() => {
            Err(ApiError::method_not_supported(
                def.group,
                def.plural,
                "create not allowed while custom resource definition is terminating",
            ))
        }
        _ => Ok(()),
    }
}

/// Creates an object (POST), as kube-apiserver's generic registry does. The body was
/// decoded and checked against its type by the caller.
pub(crate) async fn create_object(
    state: &Storage,
    ctx: &WriteContext,
    def: &'static ResourceDef,
    ns: Option<&str>,
    mut obj: Value,
) -> Result<Value, ApiError> {
    refuse_while_definition_terminates(state, def).await?;
    let meta = meta_mut(&mut obj);
    if def.namespaced {
        let ns = ns.ok_or_else(|| {
            ApiError::bad_request("the namespace of the object must be set on the request")
        })?;
        match meta.get("namespace").and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                meta.insert("namespace".into(), json!(ns));
            }
        }
    } else {
        meta.remove("namespace");
    }
    let given_name = meta
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let generate = meta
        .get("generateName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    if given_name.is_empty() && generate.is_empty() {
        return Err(invalid(
            def,
            "",
            vec![FieldError::required(
                "metadata.name",
                "name or generateName is required",
            )],
        ));
    }
    let probe_name = if given_name.is_empty() {
        meta::generate_name(&generate)
    } else {
        given_name.clone()
    };
    let mut errors: Vec<FieldError> = meta::validate_name(&probe_name, def.name_rule)
        .into_iter()
        .map(|e| {
            FieldError::invalid(
                if given_name.is_empty() {
                    "metadata.generateName"
                } else {
                    "metadata.name"
                },
                &json!(if given_name.is_empty() {
                    &generate
                } else {
                    &given_name
                }),
                e,
            )
        })
        .collect();
    if !errors.is_empty() {
        return Err(invalid(def, &given_name, errors));
    }
    if def.namespaced {
        check_namespace(state, def, ns.unwrap_or(""), &probe_name).await?;
    }
    // System fields: never taken from the client.
    let meta = meta_mut(&mut obj);
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "selfLink",
        "generation",
    ] {
        meta.remove(field);
    }
    meta.insert("uid".into(), json!(meta::new_uid()));
    meta.insert("creationTimestamp".into(), json!(meta::now_rfc3339()));
    if def.generation {
        meta_mut(&mut obj).insert("generation".into(), json!(1));
    }
    if def.status
        && crate::crd::is_custom(def)
        && let Some(o) = obj.as_object_mut()
    {
        // `customresource/strategy.go PrepareForCreate`: with a status subresource, the
        // status is written through it alone.
        o.remove("status");
    }
    // Upstream's `BeforeCreate` names the object from its `generateName` before the
    // strategy runs, so what the strategy derives from the name (a Job's `job-name` label,
    // a namespace's `kubernetes.io/metadata.name`) sees it.
    meta_mut(&mut obj).insert("name".into(), json!(probe_name));
    (def.prepare_create)(&mut obj);
    record_manager(def, &mut obj, None, ctx, None);
    state
        .mutate(
            &AdmissionAttributes {
                user: &ctx.user,
                operation: Operation::Create,
                resource: def,
                subresource: None,
                namespace: ns,
                name: &probe_name,
                object: None,
                old_object: None,
            },
            &mut obj,
        )
        .await?;
    errors.extend(meta::validate_object_meta(&obj));
    errors.extend((def.validate)(&obj, None));
    errors.extend(super::custom_errors(def, &obj, None).await?);
    if !errors.is_empty() {
        return Err(invalid(def, &probe_name, errors));
    }
    state
        .admit(&AdmissionAttributes {
            user: &ctx.user,
            operation: Operation::Create,
            resource: def,
            subresource: None,
            namespace: ns,
            name: &probe_name,
            object: Some(&obj),
            old_object: None,
        })
        .await?;
    let allocation = allocate(state, def, &mut obj, None, &probe_name).await?;
    let dry_run = ctx.dry_run();
    for attempt in 0..GENERATE_NAME_ATTEMPTS {
        let name = if given_name.is_empty() {
            if attempt == 0 {
                probe_name.clone()
            } else {
                meta::generate_name(&generate)
            }
        } else {
            given_name.clone()
        };
        meta_mut(&mut obj).insert("name".into(), json!(name));
        let bytes = match encode(state, def, &obj) {
            Ok(bytes) => bytes,
            Err(e) => {
                rollback(state, &allocation).await;
                return Err(e);
            }
        };
        if dry_run {
            rollback(state, &allocation).await;
            return Ok(obj);
        }
        match state
            .create_key(ObjectKey::new(def, ns, &name), &obj, bytes)
            .await
        {
            Ok(revision) => {
                meta_mut(&mut obj).insert("resourceVersion".into(), json!(revision.to_string()));
                return Ok(obj);
            }
            Err(StoreError::AlreadyExists { .. })
                if given_name.is_empty() && attempt + 1 < GENERATE_NAME_ATTEMPTS =>
            {
                continue;
            }
            Err(StoreError::AlreadyExists { .. }) => {
                rollback(state, &allocation).await;
                let mut e = ApiError::already_exists(&qualified(def, &name));
                if given_name.is_empty() {
                    e.message.push_str(
                        ", the server was not able to generate a unique name for the object",
                    );
                    if let Some(d) = e.details.as_mut() {
                        d["retryAfterSeconds"] = json!(1);
                    }
                }
                return Err(e);
            }
            Err(other) => {
                rollback(state, &allocation).await;
                return Err(ApiError::from_store(&qualified(def, &name), other));
            }
        }
    }
    unreachable!("the loop returns on its last attempt")
}

/// Service admission: ClusterIP and NodePort allocation, recorded in the store's ranges.
pub(crate) async fn allocate(
    state: &Storage,
    def: &ResourceDef,
    obj: &mut Value,
    old: Option<&Value>,
    name: &str,
) -> Result<Option<Allocation>, ApiError> {
    if !def.group.is_empty() || def.plural != "services" {
        return Ok(None);
    }
    state
        .ranges
        .allocate(obj, old)
        .await
        .map(Some)
        .map_err(|e| e.into_api(def, name))
}

/// The Service was not written: gives back what its allocation took.
pub(crate) async fn rollback(state: &Storage, allocation: &Option<Allocation>) {
    if let Some(a) = allocation {
        state.ranges.rollback(a).await;
    }
}

/// The Service was written: gives back what its old state held and the new does not.
pub(crate) async fn commit(state: &Storage, allocation: &Option<Allocation>) {
    if let Some(a) = allocation {
        state.ranges.commit(a).await;
    }
}

/// Records the write's manager in `metadata.managedFields`, as upstream's handlers do
/// before admission: on the decoded, defaulted object, through `subresource`, never
/// attributing what the strategy resets (`status` when the object itself is written and its
/// kind has a status subresource).
pub(crate) fn record_manager(
    def: &ResourceDef,
    obj: &mut Value,
    old: Option<&Value>,
    ctx: &WriteContext,
    subresource: Option<&str>,
) {
    let Some(manager) = ctx.manager.as_deref() else {
        return;
    };
    let mut reset: Vec<&str> = Vec::new();
    if subresource.is_none() {
        if def.status {
            reset.push("status");
        }
        reset.extend_from_slice(set_after_field_manager(def));
    }
    let updater = patch::Updater {
        manager,
        subresource,
        reset: &reset,
    };
    let merge = crate::crd::merge_schema(def);
    *obj = patch::record_update(old, obj, updater, &merge, &meta::now_rfc3339());
}

/// Fields our `prepare_create` sets that upstream sets after its field manager has run
/// (in `PrepareForCreate` or admission), so no writer owns them there: a namespace's
/// `spec.finalizers` (namespace strategy) and a pod's priority (the Priority admission
/// plugin).
fn set_after_field_manager(def: &ResourceDef) -> &'static [&'static str] {
    match (def.group, def.kind) {
        ("", "Namespace") => &["spec.finalizers"],
        ("", "Pod") => &["spec.priority", "spec.preemptionPolicy"],
        _ => &[],
    }
}

/// Frees what a deleted object held (Service IPs and ports).
pub(crate) async fn released(state: &Storage, def: &ResourceDef, obj: &Value) {
    if def.group.is_empty() && def.plural == "services" {
        state
            .ranges
            .release(&crate::registry::allocator::service_items(obj))
            .await;
    }
}
