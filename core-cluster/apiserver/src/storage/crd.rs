//! The custom resource definition controllers, in-process (upstream's
//! `apiextensions-apiserver/pkg/controller`): `status/naming_controller.go` (the names of
//! each definition checked against the others of its group: `NamesAccepted`,
//! `status.acceptedNames`), `establish/establishing_controller.go` (`Established` once the
//! resource is served) and `finalizer/crd_finalizer.go` (a deleted definition's objects are
//! deleted, then its `customresourcecleanup` finalizer removed).
//!
//! A write observer ([`CrdController`]) starts a reconcile of every definition after each
//! committed definition write, as the upstream controllers are started by their watch; one
//! reconcile runs at a time, and the server runs one at startup. A definition is served
//! (its [`ResourceDef`]s put in the [`Registry`](crate::registry::Registry)) before its
//! `Established` condition is written, so a client that waits for the condition finds the
//! resource.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Weak},
    time::Duration,
};

use futures::{StreamExt, future::BoxFuture};
use serde_json::{Value, json};

use super::{
    MAX_WRITE_ATTEMPTS, ObjectKey, Storage, WriteContext,
    delete::{DeleteOptions, delete_object},
    get_list::{get_object, list_all},
    observe::{ObjectChange, WriteObserver},
    update::commit_update,
};
use crate::{
    crd::{CLEANUP_FINALIZER, CUSTOM_RESOURCE_DEFINITIONS, served_defs},
    registry::{ResourceDef, meta::str_at},
};

/// Reconciles the definitions after each of their writes (see the [module docs](self)).
pub(crate) struct CrdController {
    /// The storage the reconcile writes through (weak: the storage holds its observers).
    pub(crate) storage: Weak<Storage>,
    /// One reconcile at a time.
    pub(crate) running: Arc<tokio::sync::Mutex<()>>,
}

/// The definitions whose objects are being deleted now (one cleanup each).
type Cleaning = Arc<parking_lot::Mutex<HashSet<String>>>;

static CLEANING: std::sync::LazyLock<Cleaning> = std::sync::LazyLock::new(Cleaning::default);

/// The definitions each storage has reported as not served, with why (reported once).
static REPORTED: std::sync::LazyLock<Cleaning> = std::sync::LazyLock::new(Cleaning::default);

/// Whether `storage` has not yet said that the definition `name` is not served for `why`.
fn first_report(storage: &Arc<Storage>, name: &str, why: &str) -> bool {
    REPORTED
        .lock()
        .insert(format!("{:p}/{name}/{why}", Arc::as_ptr(storage)))
}

impl CrdController {
    fn spawn(&self) {
        let (storage, running) = (self.storage.clone(), self.running.clone());
        tokio::spawn(async move {
            let _one = running.lock().await;
            if let Some(storage) = storage.upgrade() {
                reconcile(&storage).await;
            }
        });
    }
}

impl WriteObserver for CrdController {
    fn observes(&self, def: &ResourceDef) -> bool {
        std::ptr::eq(def, &CUSTOM_RESOURCE_DEFINITIONS)
    }

    fn changed<'a>(&'a self, _change: &'a ObjectChange<'a>) -> BoxFuture<'a, ()> {
        self.spawn();
        Box::pin(async {})
    }

    fn lost<'a>(&'a self, _def: &'a ResourceDef) -> BoxFuture<'a, ()> {
        self.spawn();
        Box::pin(async {})
    }
}

/// The names a definition asks for, defaulted as upstream (`singular` from the kind,
/// `listKind` as `<kind>List`).
fn requested_names(crd: &Value) -> Value {
    let mut names = crd["spec"]["names"].clone();
    let kind = names["kind"].as_str().unwrap_or("").to_owned();
    if names["singular"].as_str().is_none_or(str::is_empty) {
        names["singular"] = json!(kind.to_lowercase());
    }
    if names["listKind"].as_str().is_none_or(str::is_empty) {
        names["listKind"] = json!(format!("{kind}List"));
    }
    names
}

/// `naming_controller.go calculateNamesAndConditions`: the first conflict of `names` with
/// the names already taken in the group, as `(reason, message)`.
fn conflict(names: &Value, taken: &[Value]) -> Option<(&'static str, String)> {
    let used = |field: &str, value: &str| {
        taken.iter().any(|t| {
            ["plural", "singular", "kind", "listKind", "shortNames"]
                .iter()
                .any(|f| match &t[*f] {
                    Value::Array(list) => {
                        (field == "shortNames" || *f == "shortNames")
                            && list.iter().any(|s| s == value)
                    }
                    Value::String(s) => {
                        let same_family = matches!(
                            (field, *f),
                            ("plural" | "singular" | "shortNames", "plural" | "singular")
                                | ("kind" | "listKind", "kind" | "listKind")
                        );
                        same_family && s == value
                    }
                    _ => false,
                })
        })
    };
    for field in ["plural", "singular"] {
        let v = names[field].as_str().unwrap_or("");
        if used(field, v) {
            return Some(("NameConflict", format!("{v:?} is already in use")));
        }
    }
    for s in names["shortNames"].as_array().into_iter().flatten() {
        let v = s.as_str().unwrap_or("");
        if used("shortNames", v) {
            return Some(("NameConflict", format!("{v:?} is already in use")));
        }
    }
    for (field, reason) in [("kind", "KindConflict"), ("listKind", "ListKindConflict")] {
        let v = names[field].as_str().unwrap_or("");
        if used(field, v) {
            return Some((reason, format!("{v:?} is already in use")));
        }
    }
    None
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message})
}

/// `conditions` with `wanted` merged in, each keeping its `lastTransitionTime` unless its
/// status changed.
fn merge_conditions(old: &Value, wanted: &[Value]) -> Value {
    let now = crate::registry::meta::now_rfc3339();
    let mut out: Vec<Value> = old
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| !wanted.iter().any(|w| w["type"] == c["type"]))
        .collect();
    for w in wanted {
        let mut c = w.clone();
        let previous = old
            .as_array()
            .and_then(|a| a.iter().find(|o| o["type"] == w["type"]));
        c["lastTransitionTime"] = match previous {
            Some(p) if p["status"] == w["status"] => p["lastTransitionTime"].clone(),
            _ => json!(now),
        };
        out.push(c);
    }
    Value::Array(out)
}

/// One pass over every definition (see the [module docs](self)).
pub(crate) async fn reconcile(storage: &Arc<Storage>) {
    let def = &CUSTOM_RESOURCE_DEFINITIONS;
    let Ok(mut crds) = list_all(&*storage.store, def, None).await else {
        return;
    };
    // The oldest definition keeps a contested name, as upstream's controller (which sees
    // them in creation order) leaves it.
    crds.sort_by(|a, b| {
        let key = |o: &Value| {
            (
                str_at(o, &["metadata", "creationTimestamp"])
                    .unwrap_or("")
                    .to_owned(),
                str_at(o, &["metadata", "name"]).unwrap_or("").to_owned(),
            )
        };
        key(a).cmp(&key(b))
    });
    // Each definition's names are checked against the names the others of its group hold
    // (their `status.acceptedNames`, as updated in this pass), as upstream's controller.
    let mut accepted: HashMap<String, (String, Value)> = crds
        .iter()
        .filter(|c| {
            c["status"]["acceptedNames"]["kind"]
                .as_str()
                .is_some_and(|k| !k.is_empty())
        })
        .map(|c| {
            (
                str_at(c, &["metadata", "name"]).unwrap_or("").to_owned(),
                (
                    c["spec"]["group"].as_str().unwrap_or("").to_owned(),
                    c["status"]["acceptedNames"].clone(),
                ),
            )
        })
        .collect();
    let mut present = Vec::new();
    for crd in &crds {
        let name = str_at(crd, &["metadata", "name"]).unwrap_or("").to_owned();
        present.push(name.clone());
        let group = crd["spec"]["group"].as_str().unwrap_or("").to_owned();
        let names = requested_names(crd);
        let terminating = !crd["metadata"]["deletionTimestamp"].is_null();
        let taken: Vec<Value> = accepted
            .iter()
            .filter(|(n, (g, _))| **n != name && *g == group)
            .map(|(_, (_, names))| names.clone())
            .collect();
        let clash = conflict(&names, &taken);
        let mut wanted = Vec::new();
        let mut status = crd["status"].clone();
        match &clash {
            None => {
                accepted.insert(name.clone(), (group, names.clone()));
                status["acceptedNames"] = names.clone();
                wanted.push(condition(
                    "NamesAccepted",
                    "True",
                    "NoConflicts",
                    "no conflicts found",
                ));
                match served_defs(crd) {
                    Ok(served) => {
                        storage.registry.set_custom(&name, served);
                        wanted.push(condition(
                            "Established",
                            "True",
                            "InitialNamesAccepted",
                            "the initial names have been accepted",
                        ));
                    }
                    Err(why) => {
                        // A stored definition that cannot be served (written past
                        // validation, or before a newer check): the server starts without
                        // it and says so, once per content.
                        if first_report(storage, &name, &why) {
                            tracing::warn!(
                                definition = %name,
                                reason = %why,
                                "a stored CustomResourceDefinition is not served"
                            );
                        }
                        storage.registry.remove_custom(&name);
                        wanted.push(condition(
                            "Established",
                            "False",
                            "NotServed",
                            &format!("the definition is not served: {why}"),
                        ));
                    }
                }
            }
            Some((reason, message)) => {
                wanted.push(condition("NamesAccepted", "False", reason, message));
                if storage.registry.custom(&name).is_empty() {
                    wanted.push(condition(
                        "Established",
                        "False",
                        "NotAccepted",
                        "not all names are accepted",
                    ));
                }
            }
        }
        if let Some(approval) = crate::crd::groups::approval_condition(crd) {
            wanted.push(approval);
        }
        if terminating {
            wanted.push(condition(
                "Terminating",
                "True",
                "InstanceDeletionInProgress",
                "CustomResource deletion is in progress",
            ));
        }
        status["conditions"] = merge_conditions(&crd["status"]["conditions"], &wanted);
        if status != crd["status"] {
            write_status(storage, &name, status).await;
        }
        let key = format!("{:p}/{name}", Arc::as_ptr(storage));
        if terminating && CLEANING.lock().insert(key.clone()) {
            let storage = storage.clone();
            tokio::spawn(async move {
                clean_up(&storage, &name).await;
                CLEANING.lock().remove(&key);
            });
        }
    }
    for name in storage.registry.custom_names() {
        if !present.contains(&name) {
            storage.registry.remove_custom(&name);
        }
    }
    super::apiservice::sync(storage).await;
}

async fn write_status(storage: &Storage, name: &str, status: Value) {
    let def = &CUSTOM_RESOURCE_DEFINITIONS;
    let ctx = WriteContext::server();
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let Ok((kv, current)) = get_object(&*storage.store, def, None, name).await else {
            return;
        };
        let mut new = current.clone();
        new["status"] = status.clone();
        let key = ObjectKey::new(def, None, name);
        match commit_update(storage, &ctx, key, Some("status"), &kv, &current, new).await {
            Err(e) if e.reason == "Conflict" => continue,
            Err(e) => {
                tracing::warn!(crd = name, error = %e, "writing a definition's status failed");
                return;
            }
            Ok(_) => return,
        }
    }
}

/// How many of a terminating definition's objects are deleted at once: the store commits
/// concurrent writes together, so a definition with thousands of objects is cleaned up in
/// batches rather than one commit at a time.
const CLEANUP_CONCURRENCY: usize = 64;

/// `crd_finalizer.go`: deletes every object of the terminating definition `name`, then
/// removes its cleanup finalizer (which deletes the definition). Only the definition's own
/// objects: a definition that is not served (one in a built-in group, stored before such
/// definitions were refused) has none, and its cleanup deletes nothing.
async fn clean_up(storage: &Arc<Storage>, name: &str) {
    let def = &CUSTOM_RESOURCE_DEFINITIONS;
    let ctx = WriteContext::server();
    let Ok((_, crd)) = get_object(&*storage.store, def, None, name).await else {
        return;
    };
    let has_finalizer = crd["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == CLEANUP_FINALIZER));
    if !has_finalizer {
        return;
    }
    // Held through the cleanup, so its versions stay served while their objects go.
    let served = served_defs(&crd).ok();
    if let Some(served) = served.as_ref().and_then(|s| s.defs().first().copied()) {
        let mut pause = Duration::from_millis(50);
        loop {
            let Ok(items) = list_all(&*storage.store, served, None).await else {
                return;
            };
            if items.is_empty() {
                break;
            }
            let deleting: Vec<ObjectKey<'_>> = items
                .iter()
                .filter(|item| item["metadata"]["deletionTimestamp"].is_null())
                .map(|item| {
                    ObjectKey::new(
                        served,
                        str_at(item, &["metadata", "namespace"]),
                        str_at(item, &["metadata", "name"]).unwrap_or(""),
                    )
                })
                .collect();
            let progress = !deleting.is_empty();
            futures::stream::iter(deleting)
                .for_each_concurrent(CLEANUP_CONCURRENCY, |key| {
                    let ctx = &ctx;
                    async move {
                        let options = DeleteOptions {
                            grace_period_seconds: Some(0),
                            ..DeleteOptions::default()
                        };
                        let _ = delete_object(storage, ctx, key, options).await;
                    }
                })
                .await;
            if !progress {
                // Only objects held by their own finalizers are left: wait for them, less
                // often the longer they take.
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
    }
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let Ok((kv, current)) = get_object(&*storage.store, def, None, name).await else {
            return;
        };
        let mut new = current.clone();
        if let Some(list) = new["metadata"]["finalizers"].as_array_mut() {
            list.retain(|f| f != CLEANUP_FINALIZER);
        }
        let key = ObjectKey::new(def, None, name);
        match commit_update(storage, &ctx, key, None, &kv, &current, new).await {
            Err(e) if e.reason == "Conflict" => continue,
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `naming_controller.go`: a plural, short name or kind another definition of the
    /// group holds is refused with `"<name>" is already in use`.
    #[test]
    fn a_name_another_definition_holds_is_a_conflict() {
        let taken = vec![
            json!({"plural": "widgets", "singular": "widget", "kind": "Widget",
                                "listKind": "WidgetList", "shortNames": ["wd"]}),
        ];
        let mine = |plural: &str, kind: &str, short: &str| {
            json!({"plural": plural, "singular": plural.trim_end_matches('s'), "kind": kind,
                   "listKind": format!("{kind}List"), "shortNames": [short]})
        };
        assert_eq!(
            conflict(&mine("widgets", "Other", "o"), &taken),
            Some(("NameConflict", "\"widgets\" is already in use".to_owned()))
        );
        assert_eq!(
            conflict(&mine("others", "Other", "wd"), &taken),
            Some(("NameConflict", "\"wd\" is already in use".to_owned()))
        );
        assert_eq!(
            conflict(&mine("others", "Widget", "o"), &taken),
            Some(("KindConflict", "\"Widget\" is already in use".to_owned()))
        );
        assert_eq!(conflict(&mine("others", "Other", "o"), &taken), None);
    }
}
