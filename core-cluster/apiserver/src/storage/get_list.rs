//! Reads: get of one object and list with options and continue tokens (upstream's
//! `Store.Get` and `Store.List`), and the startup quarantine of unreadable objects.

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use serde_json::Value;

use super::{Query, Storage, decode_kv, parse_rv, qualified, status::ApiError};
use crate::{
    registry::FieldError,
    registry::{
        ResourceDef,
        selectors::{FieldSelector, LabelSelector},
    },
    store::{KeyValue, Store, StoreError},
};

/// One stored object with its key-value.
pub(crate) async fn get_object(
    store: &dyn Store,
    def: &'static ResourceDef,
    ns: Option<&str>,
    name: &str,
) -> Result<(KeyValue, Value), ApiError> {
    let q = qualified(def, name);
    let kv = store
        .get(&def.key(ns, name))
        .await
        .map_err(|e| ApiError::from_store(&q, e))?
        .ok_or_else(|| ApiError::not_found(&q))?;
    let obj = decode_kv(def, &kv)?;
    Ok((kv, obj))
}

/// Where [`quarantine_unreadable`] moves a stored object the server cannot read.
pub(crate) const QUARANTINE_PREFIX: &str = "/quarantine";

/// Moves every stored object that the read path cannot decode (written by an older,
/// unchecked server: nested past the decoder's limit, say) out of the registry, to
/// `/quarantine/<its key>`, with an error log line naming both keys. One bad object then
/// no longer fails startup, nor every LIST of its resource. Returns how many were moved.
pub(crate) async fn quarantine_unreadable(state: &Storage) -> Result<usize, ApiError> {
    let mut seen = Vec::new();
    let mut moved = 0;
    for def in state.registry.all() {
        if seen.contains(&def.storage) {
            continue;
        }
        seen.push(def.storage);
        let q = qualified(def, "");
        let prefix = def.key_prefix(None);
        let mut start: Option<String> = None;
        loop {
            let page = state
                .store
                .list(&prefix, start.as_deref(), Some(500), None)
                .await
                .map_err(|e| ApiError::from_store(&q, e))?;
            for kv in &page.items {
                let Err(e) = decode_kv(def, kv) else {
                    continue;
                };
                let destination = format!("{QUARANTINE_PREFIX}{}", kv.key);
                tracing::error!(
                    key = %kv.key,
                    quarantined_as = %destination,
                    error = %e.message,
                    "a stored object cannot be read back: moved out of the registry so the API server can serve its resource; inspect or delete it in the store"
                );
                match state.store.create(&destination, kv.value.clone()).await {
                    Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
                    Err(e) => return Err(ApiError::from_store(&q, e)),
                }
                match state.store.delete(&kv.key, Some(kv.mod_revision)).await {
                    Ok(_) | Err(StoreError::NotFound { .. }) => moved += 1,
                    Err(e) => return Err(ApiError::from_store(&q, e)),
                }
            }
            start = page.items.last().map(|kv| kv.key.clone());
            if !page.more {
                break;
            }
        }
    }
    Ok(moved)
}

/// A continue token: the revision of the first page and the last key returned.
#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    rv: u64,
    start: String,
}

fn encode_continue(rv: u64, start: &str) -> String {
    URL_SAFE_NO_PAD.encode(
        serde_json::to_vec(&ContinueToken {
            rv,
            start: start.to_owned(),
        })
        .unwrap_or_default(),
    )
}

fn decode_continue(token: &str) -> Result<ContinueToken, ApiError> {
    URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(|| {
            ApiError::bad_request(
                "continue key is not valid: illegal base64 data or unknown format",
            )
        })
}

/// Parsed list options.
pub(crate) struct ListOptions {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    pub(crate) limit: Option<usize>,
    pub(crate) continue_token: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) resource_version_match: Option<String>,
}

impl ListOptions {
    pub(crate) fn parse(def: &ResourceDef, query: &Query) -> Result<Self, ApiError> {
        let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
            .map_err(|e| ApiError::bad_request(format!("unable to parse labelSelector: {e}")))?;
        let fields = FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        if let Some(bad) = fields.paths().find(|p| !def.supports_field(p)) {
            return Err(ApiError::bad_request(format!(
                "field label not supported: {bad}"
            )));
        }
        let limit = match query.get("limit") {
            None => None,
            Some(l) => Some(
                l.parse::<usize>()
                    .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
            )
            .filter(|l| *l > 0),
        };
        if !super::flag(query, "watch") {
            validate_list_options(query)?;
        }
        Ok(ListOptions {
            labels,
            fields,
            limit,
            continue_token: query.get("continue").filter(|c| !c.is_empty()).cloned(),
            resource_version: query
                .get("resourceVersion")
                .filter(|v| !v.is_empty())
                .cloned(),
            resource_version_match: query
                .get("resourceVersionMatch")
                .filter(|v| !v.is_empty())
                .cloned(),
        })
    }

    pub(crate) fn matches(&self, def: &ResourceDef, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(|p| def.field_value(obj, p))
    }
}

/// Upstream's `ValidateListOptions` for a list (a watch has its own rules):
/// `resourceVersionMatch` needs a `resourceVersion` and no `continue`, `Exact` is not for
/// `0`, and `sendInitialEvents` is for watches only.
fn validate_list_options(query: &Query) -> Result<(), ApiError> {
    let given = |key: &str| query.get(key).filter(|v| !v.is_empty());
    let mut errors = Vec::new();
    if let Some(rv_match) = given("resourceVersionMatch") {
        if given("resourceVersion").is_none() {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if given("continue").is_some() {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        match rv_match.as_str() {
            "Exact" if given("resourceVersion").map(String::as_str) == Some("0") => {
                errors.push(FieldError::forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
            "Exact" | "NotOlderThan" => {}
            other => errors.push(FieldError::not_supported(
                "resourceVersionMatch",
                &serde_json::json!(other),
                &["Exact", "NotOlderThan", ""],
            )),
        }
    }
    if query.contains_key("sendInitialEvents") {
        errors.push(FieldError::forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid("ListOptions", "meta.k8s.io", "", errors))
    }
}

/// Lists the matching objects: items, the list's revision, and a continue token.
pub(crate) async fn list_objects(
    store: &dyn Store,
    def: &'static ResourceDef,
    ns: Option<&str>,
    opts: &ListOptions,
) -> Result<(Vec<Value>, u64, Option<String>), ApiError> {
    let q = qualified(def, "");
    let current = store
        .current_revision()
        .await
        .map_err(|e| ApiError::from_store(&q, e))?;
    let (mut at, mut cursor) = match &opts.continue_token {
        Some(token) => {
            let t = decode_continue(token)?;
            (Some(t.rv), Some(t.start))
        }
        None => (None, None),
    };
    if at.is_none()
        && let Some(rv) = &opts.resource_version
        && rv != "0"
    {
        let rv = parse_rv(rv)?;
        if rv > current {
            return Err(ApiError::too_large_resource_version(rv, current));
        }
        if opts.resource_version_match.as_deref() == Some("Exact") {
            at = Some(rv);
        }
    }
    let prefix = def.key_prefix(ns);
    let mut items = Vec::new();
    let mut revision = at;
    let mut continue_from = None;
    'pages: loop {
        let want = opts.limit.map(|l| (l - items.len()).max(64));
        let page = store
            .list(&prefix, cursor.as_deref(), want, revision)
            .await
            .map_err(|e| match e {
                StoreError::Expired { .. } if opts.continue_token.is_some() => ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ),
                other => ApiError::from_store(&q, other),
            })?;
        revision = Some(page.revision);
        let count = page.items.len();
        for (i, kv) in page.items.iter().enumerate() {
            cursor = Some(kv.key.clone());
            let obj = decode_kv(def, kv)?;
            if opts.matches(def, &obj) {
                items.push(obj);
                if opts.limit.is_some_and(|l| items.len() >= l) {
                    if i + 1 < count || page.more {
                        continue_from = cursor.clone();
                    }
                    break 'pages;
                }
            }
        }
        if !page.more {
            break;
        }
    }
    let revision = revision.unwrap_or(current);
    Ok((
        items,
        revision,
        continue_from.map(|c| encode_continue(revision, &c)),
    ))
}

/// Every object of a resource (in one namespace or all), unfiltered.
pub(crate) async fn list_all(
    store: &dyn Store,
    def: &'static ResourceDef,
    ns: Option<&str>,
) -> Result<Vec<Value>, ApiError> {
    let opts = ListOptions {
        labels: LabelSelector::default(),
        fields: FieldSelector::default(),
        limit: None,
        continue_token: None,
        resource_version: None,
        resource_version_match: None,
    };
    Ok(list_objects(store, def, ns, &opts).await?.0)
}
