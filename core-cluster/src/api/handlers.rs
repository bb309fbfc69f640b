//! The verbs, run generically over a [`ResourceDef`]: get, list, create, update, patch,
//! delete and deletecollection, plus the pod `binding` and `eviction` subresources.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    extract::Request,
    http::{HeaderMap, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use serde_json::{Value, json};

use super::{
    ServerState, Target, json_response,
    negotiate::{self, Representation},
    status::{ApiError, FieldError, Qualified, success_status},
};
use crate::{
    patch,
    registry::{
        ResourceDef,
        allocator::Allocation,
        meta::{self, meta_mut, str_at},
        selectors::{FieldSelector, LabelSelector},
        table, unknown_fields,
    },
    store::{KeyValue, StoreError},
};

/// Query parameters, last value wins.
pub(crate) type Query = HashMap<String, String>;

/// How many times an unconditional write retries after losing a race (GuaranteedUpdate).
const MAX_WRITE_ATTEMPTS: usize = 16;

/// The most `Warning` headers one response carries.
const MAX_WARNINGS: usize = 32;

/// How many names `generateName` tries before giving up (KEP-4420).
const GENERATE_NAME_ATTEMPTS: usize = 8;

fn qualified(def: &ResourceDef, name: &str) -> Qualified {
    Qualified::new(def.group, def.plural, name)
}

fn parse_query(request: &Request<Body>) -> Result<Query, ApiError> {
    let raw = request.uri().query().unwrap_or("");
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw)
        .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))?;
    Ok(pairs.into_iter().collect())
}

/// A boolean query parameter (see [`super::query_bool`]).
pub(crate) fn flag(query: &Query, key: &str) -> bool {
    super::query_bool(query.get(key).map(String::as_str))
}

/// Runs one request (without its warnings).
async fn handle_inner(
    state: &Arc<ServerState>,
    target: Target,
    request: Request<Body>,
) -> (String, Response) {
    let request = match super::tokens::route(state, &target, request).await {
        Ok(answered) => return answered,
        Err(request) => request,
    };
    let method = request.method().clone();
    // Routed before the body is looked at: an unknown subresource is 404 whatever its body.
    let def = target.def;
    let ns = target.namespace.as_deref();
    let name = target.name.as_deref();
    let sub = target.subresource.as_deref();
    let valid_sub = match sub {
        None => true,
        Some("status") => def.status,
        Some(s) => def.extra_subresources.contains(&s),
    };
    if !valid_sub {
        return (
            method.to_string(),
            ApiError::no_route(&format!("{}/{}", def.plural, sub.unwrap_or(""))).into_response(),
        );
    }
    let headers = request.headers().clone();
    let watch = super::watch_requested(request.uri());
    let query = match parse_query(&request) {
        Ok(q) => q,
        Err(e) => return (method.to_string(), e.into_response()),
    };
    let limit = state.config.max_request_bytes;
    let body = match axum::body::to_bytes(request.into_body(), limit).await {
        Ok(b) => b,
        Err(_) => {
            return (
                method.to_string(),
                ApiError::too_large(limit).into_response(),
            );
        }
    };
    // Bodies are JSON (apply patches may be YAML). Protobuf and CBOR get 415, which makes
    // client-go retry the request as JSON.
    if !body.is_empty() && method != Method::PATCH {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json");
        if !matches!(
            negotiate::media_type(content_type).as_str(),
            "application/json" | "" | "*/*"
        ) {
            return (
                method.to_string(),
                ApiError::unsupported_media_type(content_type).into_response(),
            );
        }
    }
    // Negotiate before acting: a write must not be committed and then answered 406.
    if let Err(e) = representation(&headers) {
        return (verb_name(&method, target.name.is_some()), e.into_response());
    }
    let result: Result<(String, Response), ApiError> = async {
        Ok(match (&method, name, sub) {
            (&Method::GET, None, None) if watch => {
                let repr = representation(&headers)?;
                ("WATCH".into(), super::watch::watch(state.clone(), def, ns.map(str::to_owned), &query, repr).await?)
            }
            (&Method::GET, None, None) => ("LIST".into(), list(state, def, ns, &query, &headers).await?),
            (&Method::GET, Some(name), None | Some("status")) => {
                let obj = get_object(state, def, ns, name).await?.1;
                ("GET".into(), render_one(def, &obj, &headers, StatusCode::OK)?)
            }
            (&Method::POST, None, None) => {
                let obj = create_object(state, def, ns, parse_body(&body)?, &query).await?;
                ("POST".into(), render_one(def, &obj, &headers, StatusCode::CREATED)?)
            }
            (&Method::POST, Some(name), Some("binding")) => {
                bind_pod(state, def, ns, name, parse_body(&body)?).await?;
                ("POST".into(), json_response(StatusCode::CREATED, &success_status(&qualified(def, name), None), "application/json"))
            }
            (&Method::POST, Some(name), Some("eviction")) => {
                let eviction = check_eviction(ns, name, parse_body(&body)?)?;
                let options = DeleteOptions::from_value(eviction.get("deleteOptions").unwrap_or(&Value::Null), &Query::new())?;
                delete_object(state, def, ns, name, options).await?;
                ("POST".into(), json_response(StatusCode::CREATED, &success_status(&qualified(def, name), None), "application/json"))
            }
            (&Method::PUT, Some(name), None | Some("status") | Some("finalize")) => {
                let obj = update_object(state, def, ns, name, sub, parse_body(&body)?, &query).await?;
                ("PUT".into(), render_one(def, &obj, &headers, StatusCode::OK)?)
            }
            (&Method::PATCH, Some(name), None | Some("status")) => {
                let content_type = headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let (code, obj) = patch_object(state, def, ns, name, sub, &content_type, &body, &query).await?;
                ("PATCH".into(), render_one(def, &obj, &headers, code)?)
            }
            (&Method::DELETE, Some(name), None) => {
                let body_value = if body.iter().all(u8::is_ascii_whitespace) { Value::Null } else { parse_body(&body)? };
                let options = DeleteOptions::from_value(&body_value, &query)?;
                let (code, obj) = delete_object(state, def, ns, name, options).await?;
                ("DELETE".into(), json_response(code, &obj, "application/json"))
            }
            (&Method::DELETE, None, None) if !def.deletecollection() => {
                return Err(ApiError::method_not_allowed("deletecollection", def.plural));
            }
            (&Method::DELETE, None, None) => {
                let body_value = if body.iter().all(u8::is_ascii_whitespace) { Value::Null } else { parse_body(&body)? };
                let options = DeleteOptions::from_value(&body_value, &query)?;
                delete_collection(state, def, ns, &query, options).await?;
                ("DELETECOLLECTION".into(), json_response(StatusCode::OK, &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}), "application/json"))
            }
            (&Method::GET | &Method::PUT | &Method::PATCH, Some(name), Some("scale")) => {
                let scale = match method {
                    Method::GET => super::scale::get(state, def, ns, name).await?,
                    Method::PUT => super::scale::put(state, def, ns, name, parse_body(&body)?, &query).await?,
                    _ => {
                        let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
                        super::scale::patch(state, def, ns, name, ct, &body, &query).await?
                    }
                };
                (method.to_string(), json_response(StatusCode::OK, &scale, "application/json"))
            }
            (m, _, _) => return Err(ApiError::method_not_allowed(&verb_name(m, name.is_some()), def.plural)),
        })
    }
    .await;
    match result {
        Ok(ok) => ok,
        Err(e) => (verb_name(&method, name.is_some()), e.into_response()),
    }
}

tokio::task_local! {
    /// The `Warning` headers of the request being served (`fieldValidation=Warn`).
    static WARNINGS: std::cell::RefCell<Vec<String>>;
}

/// Runs one request; returns the verb (for metrics) and the response, with the warnings
/// the request collected as `Warning: 299` headers, as kube-apiserver sends them.
pub(crate) async fn handle(
    state: &Arc<ServerState>,
    target: Target,
    request: Request<Body>,
) -> (String, Response) {
    let (warnings, (verb, mut response)) = WARNINGS
        .scope(Default::default(), async {
            let out = handle_inner(state, target, request).await;
            (WARNINGS.with(|w| w.take()), out)
        })
        .await;
    for warning in warnings {
        let text = format!("299 - {}", json!(warning));
        if let Ok(value) = axum::http::HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    (verb, response)
}

/// Records a warning for the response, if a request is being served.
fn warn(message: String) {
    let _ = WARNINGS.try_with(|w| w.borrow_mut().push(message));
}

/// The `resource` label of a request's metrics: the plural, with the subresource only if it
/// is one the resource serves (a made-up one is `<plural>/other`), so paths cannot grow the
/// label set.
pub(crate) fn metric_resource(target: &Target) -> String {
    let def = target.def;
    match target.subresource.as_deref() {
        None => def.plural.to_owned(),
        Some(sub) if (sub == "status" && def.status) || def.extra_subresources.contains(&sub) => {
            format!("{}/{sub}", def.plural)
        }
        Some(_) => format!("{}/other", def.plural),
    }
}

fn verb_name(method: &Method, named: bool) -> String {
    match (method.as_str(), named) {
        ("GET", false) => "LIST".into(),
        (m, _) => m.to_owned(),
    }
}

fn representation(headers: &HeaderMap) -> Result<Representation, ApiError> {
    negotiate::representation(headers).map_err(|accept| ApiError::not_acceptable(&accept))
}

fn render_one(
    def: &ResourceDef,
    obj: &Value,
    headers: &HeaderMap,
    code: StatusCode,
) -> Result<Response, ApiError> {
    Ok(match representation(headers)? {
        Representation::Object => json_response(code, obj, "application/json"),
        Representation::Table => {
            let rv = str_at(obj, &["metadata", "resourceVersion"]).unwrap_or("");
            json_response(
                code,
                &table::table(def, std::slice::from_ref(obj), rv, None, true),
                negotiate::TABLE_CONTENT_TYPE,
            )
        }
        Representation::PartialMetadata => json_response(
            code,
            &table::partial_metadata(obj),
            negotiate::PARTIAL_CONTENT_TYPE,
        ),
    })
}

/// Parses a JSON body (YAML bodies are accepted for apply patches in [`patch_object`]).
fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    Ok(value)
}

// ------------------------------------------------------------------ storage encoding

/// A stored object as served: converted to the resource's version, with its resourceVersion.
pub(crate) fn decode(def: &ResourceDef, value: &[u8], revision: u64) -> Result<Value, ApiError> {
    let stored: Value = serde_json::from_slice(value)
        .map_err(|e| ApiError::internal(format!("stored object is not JSON: {e}")))?;
    let mut obj = (def.from_storage)(stored);
    meta_mut(&mut obj).insert("resourceVersion".into(), json!(revision.to_string()));
    Ok(obj)
}

fn decode_kv(def: &ResourceDef, kv: &KeyValue) -> Result<Value, ApiError> {
    decode(def, &kv.value, kv.mod_revision)
}

/// The stored form of an object, checked to be readable back: not nested deeper than the
/// read path's decoder accepts (422) and not larger than `max_object_bytes` (413, as etcd's
/// request size limit upstream). Nothing is stored that a later read would fail on.
fn encode(state: &ServerState, def: &ResourceDef, obj: &Value) -> Result<Bytes, ApiError> {
    let name = str_at(obj, &["metadata", "name"]).unwrap_or("");
    if let Err(why) = patch::limits::check_depth(obj) {
        return Err(invalid(
            def,
            name,
            vec![FieldError::invalid("", &Value::Null, why)],
        ));
    }
    let mut stored = (def.to_storage)(obj.clone());
    meta_mut(&mut stored).remove("resourceVersion");
    let bytes = serde_json::to_vec(&stored)
        .map_err(|e| ApiError::internal(format!("encoding the object: {e}")))?;
    // The read path's own decoder has the last word on what is readable.
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
        return Err(invalid(
            def,
            name,
            vec![FieldError::invalid(
                "",
                &Value::Null,
                format!("the object could not be read back: {e}"),
            )],
        ));
    }
    let limit = state.config.max_object_bytes;
    if bytes.len() > limit {
        return Err(ApiError::entity_too_large(format!(
            "the object {name:?} would be {} bytes, more than the limit of {limit} bytes per stored object",
            bytes.len()
        )));
    }
    Ok(Bytes::from(bytes))
}

pub(crate) async fn get_object(
    state: &ServerState,
    def: &'static ResourceDef,
    ns: Option<&str>,
    name: &str,
) -> Result<(KeyValue, Value), ApiError> {
    let q = qualified(def, name);
    let kv = state
        .store
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
pub(crate) async fn quarantine_unreadable(state: &ServerState) -> Result<usize, ApiError> {
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

// ------------------------------------------------------------------ list

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

fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))
}

/// Lists the matching objects: items, the list's revision, and a continue token.
pub(crate) async fn list_objects(
    state: &ServerState,
    def: &'static ResourceDef,
    ns: Option<&str>,
    opts: &ListOptions,
) -> Result<(Vec<Value>, u64, Option<String>), ApiError> {
    let q = qualified(def, "");
    let current = state
        .store
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
        let page = state
            .store
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
    state: &ServerState,
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
    Ok(list_objects(state, def, ns, &opts).await?.0)
}

async fn list(
    state: &ServerState,
    def: &'static ResourceDef,
    ns: Option<&str>,
    query: &Query,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let repr = representation(headers)?;
    let opts = ListOptions::parse(def, query)?;
    let (items, revision, cont) = list_objects(state, def, ns, &opts).await?;
    let rv = revision.to_string();
    Ok(match repr {
        Representation::Table => json_response(
            StatusCode::OK,
            &table::table(def, &items, &rv, cont.as_deref(), true),
            negotiate::TABLE_CONTENT_TYPE,
        ),
        Representation::PartialMetadata => {
            let mut metadata = json!({"resourceVersion": rv});
            if let Some(c) = &cont {
                metadata["continue"] = json!(c);
            }
            let list = json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": metadata,
                "items": items.iter().map(table::partial_metadata).collect::<Vec<_>>(),
            });
            json_response(StatusCode::OK, &list, negotiate::PARTIAL_LIST_CONTENT_TYPE)
        }
        Representation::Object => {
            let mut metadata = json!({"resourceVersion": rv});
            if let Some(c) = &cont {
                metadata["continue"] = json!(c);
            }
            let list = json!({
                "kind": format!("{}List", def.kind),
                "apiVersion": def.api_version(),
                "metadata": metadata,
                "items": items,
            });
            json_response(StatusCode::OK, &list, "application/json")
        }
    })
}

// ------------------------------------------------------------------ create

#[derive(Clone, Copy, PartialEq, Eq)]
enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

fn field_validation(query: &Query) -> Result<FieldValidation, ApiError> {
    match query.get("fieldValidation").map(String::as_str) {
        None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
        Some("Strict") => Ok(FieldValidation::Strict),
        Some("Ignore") => Ok(FieldValidation::Ignore),
        Some(other) => Err(ApiError::bad_request(format!(
            "fieldValidation must be one of Ignore, Warn or Strict, got {other:?}"
        ))),
    }
}

/// Checks the nesting depth, defaults `apiVersion`/`kind` from the endpoint and checks them
/// ([`super::type_meta`]), decodes through the typed model, and applies `fieldValidation` to
/// the fields the model does not know: `Strict` rejects them
/// (400 "unknown field"), `Warn` (the default) drops them with a `Warning` header and
/// `Ignore` drops them silently, as kube-apiserver prunes unknown fields of built-in types.
fn check_body(def: &ResourceDef, obj: &mut Value, query: &Query) -> Result<(), ApiError> {
    patch::limits::check_depth(obj).map_err(ApiError::bad_request)?;
    super::type_meta::default_from_path(obj, &def.api_version(), def.kind)?;
    let normalized = (def.typed)(obj).map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            def.kind, def.version, def.kind
        ))
    })?;
    let validation = field_validation(query)?;
    let unknown = unknown_fields(obj, &normalized);
    if unknown.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect();
    match validation {
        FieldValidation::Strict => {
            return Err(ApiError::bad_request(format!(
                "strict decoding error: {}",
                list.join(", ")
            )));
        }
        FieldValidation::Warn => list.into_iter().take(MAX_WARNINGS).for_each(warn),
        FieldValidation::Ignore => {}
    }
    prune_unknown(obj, &normalized);
    Ok(())
}

/// Removes from `given` the members absent from `known` (its typed round-trip), keeping
/// explicit nulls, which the typed model drops but which carry no data.
fn prune_unknown(given: &mut Value, known: &Value) {
    let mut stack = vec![(given, known)];
    while let Some((g, k)) = stack.pop() {
        match (g, k) {
            (Value::Object(g), Value::Object(k)) => {
                g.retain(|key, value| value.is_null() || k.contains_key(key));
                stack.extend(g.iter_mut().filter_map(|(key, v)| Some((v, k.get(key)?))));
            }
            (Value::Array(g), Value::Array(k)) => stack.extend(g.iter_mut().zip(k)),
            _ => {}
        }
    }
}

fn invalid(def: &ResourceDef, name: &str, errors: Vec<FieldError>) -> ApiError {
    ApiError::invalid(def.kind, def.group, name, errors)
}

async fn check_namespace(
    state: &ServerState,
    def: &ResourceDef,
    ns: &str,
    name: &str,
) -> Result<(), ApiError> {
    let namespaces = state
        .registry
        .find("", "v1", "namespaces")
        .expect("namespaces are served");
    match get_object(state, namespaces, None, ns).await {
        Ok((_, namespace)) => {
            if !namespace["metadata"]["deletionTimestamp"].is_null() {
                return Err(ApiError::forbidden(
                    &qualified(def, name),
                    &format!(
                        "unable to create new content in namespace {ns} because it is being terminated"
                    ),
                ));
            }
            Ok(())
        }
        Err(e) if e.code == 404 => Err(ApiError::not_found(&Qualified::new("", "namespaces", ns))),
        Err(e) => Err(e),
    }
}

/// Creates an object (POST), as kube-apiserver's generic registry does.
pub(crate) async fn create_object(
    state: &ServerState,
    def: &'static ResourceDef,
    ns: Option<&str>,
    mut obj: Value,
    query: &Query,
) -> Result<Value, ApiError> {
    check_body(def, &mut obj, query)?;
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
    (def.prepare_create)(&mut obj);
    errors.extend(meta::validate_object_meta(&obj));
    errors.extend((def.validate)(&obj, None));
    if !errors.is_empty() {
        return Err(invalid(def, &probe_name, errors));
    }
    crate::auth::node::admit(state, def, crate::auth::node::Write::Create { new: &obj }).await?;
    crate::auth::escalation::admit(state, def, ns, &obj, None).await?;
    let allocation = allocate(state, def, &mut obj, None, &probe_name)?;
    let dry_run = query.get("dryRun").is_some_and(|d| d == "All");
    record_manager(def, &mut obj, None, query);
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
                rollback(state, &allocation);
                return Err(e);
            }
        };
        if dry_run {
            rollback(state, &allocation);
            return Ok(obj);
        }
        match state.store.create(&def.key(ns, &name), bytes).await {
            Ok(revision) => {
                meta_mut(&mut obj).insert("resourceVersion".into(), json!(revision.to_string()));
                observe(state, def, ns, &name, None, Some(&obj), revision).await;
                return Ok(obj);
            }
            Err(StoreError::AlreadyExists { .. })
                if given_name.is_empty() && attempt + 1 < GENERATE_NAME_ATTEMPTS =>
            {
                continue;
            }
            Err(StoreError::AlreadyExists { .. }) => {
                rollback(state, &allocation);
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
                rollback(state, &allocation);
                return Err(ApiError::from_store(&qualified(def, &name), other));
            }
        }
    }
    unreachable!("the loop returns on its last attempt")
}

/// Service admission: ClusterIP and NodePort allocation.
fn allocate(
    state: &ServerState,
    def: &ResourceDef,
    obj: &mut Value,
    old: Option<&Value>,
    name: &str,
) -> Result<Option<Allocation>, ApiError> {
    if !def.group.is_empty() || def.plural != "services" {
        return Ok(None);
    }
    state
        .allocator
        .lock()
        .allocate(obj, old)
        .map(Some)
        .map_err(|errors| invalid(def, name, errors))
}

fn rollback(state: &ServerState, allocation: &Option<Allocation>) {
    if let Some(a) = allocation {
        state.allocator.lock().rollback(a);
    }
}

fn commit(state: &ServerState, allocation: &Option<Allocation>) {
    if let Some(a) = allocation {
        state.allocator.lock().commit(a);
    }
}

/// Records the writer in `metadata.managedFields` (field manager from the query).
fn record_manager(def: &ResourceDef, obj: &mut Value, old: Option<&Value>, query: &Query) {
    let Some(manager) = query.get("fieldManager").filter(|m| !m.is_empty()) else {
        return;
    };
    let schema = patch::schema_for(def.group, def.kind);
    *obj = patch::record_update(old, obj, manager, schema, &meta::now_rfc3339());
}

// ------------------------------------------------------------------ update

/// Replaces an object (PUT), or its status (`/status`), or a namespace's finalizers.
pub(crate) async fn update_object(
    state: &ServerState,
    def: &'static ResourceDef,
    ns: Option<&str>,
    name: &str,
    sub: Option<&str>,
    mut new: Value,
    query: &Query,
) -> Result<Value, ApiError> {
    check_body(def, &mut new, query)?;
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
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let (kv, current) = get_object(state, def, ns, name).await?;
        if precondition.is_some_and(|rv| rv != kv.mod_revision) {
            return Err(ApiError::modified(&qualified(def, name)));
        }
        match commit_update(state, def, ns, name, sub, &kv, &current, new.clone(), query).await {
            Err(e) if e.reason == "Conflict" && precondition.is_none() => continue,
            other => return other,
        }
    }
    Err(ApiError::modified(&qualified(def, name)))
}

fn differs(a: &Value, b: &Value, key: &str) -> bool {
    a.get(key).unwrap_or(&Value::Null) != b.get(key).unwrap_or(&Value::Null)
}

/// The shared tail of update and patch: subresource rules, system fields, validation,
/// admission, finalizer-driven deletion, and the conditional write.
#[allow(clippy::too_many_arguments)]
async fn commit_update(
    state: &ServerState,
    def: &'static ResourceDef,
    ns: Option<&str>,
    name: &str,
    sub: Option<&str>,
    kv: &KeyValue,
    current: &Value,
    mut new: Value,
    query: &Query,
) -> Result<Value, ApiError> {
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
    if def.generation && sub.is_none() && differs(&new, current, "spec") {
        let generation = old_meta["generation"].as_i64().unwrap_or(0) + 1;
        meta_mut(&mut new).insert("generation".into(), json!(generation));
    }
    if sub.is_none() {
        (def.prepare_update)(&mut new);
    }
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
    if !errors.is_empty() {
        return Err(invalid(def, name, errors));
    }
    crate::auth::node::admit(
        state,
        def,
        crate::auth::node::Write::Update {
            sub,
            old: current,
            new: &new,
        },
    )
    .await?;
    crate::auth::escalation::admit(state, def, ns, &new, Some(current)).await?;
    let allocation = if sub.is_none() {
        allocate(state, def, &mut new, Some(current), name)?
    } else {
        None
    };
    record_manager(def, &mut new, Some(current), query);
    let mut unchanged = current.clone();
    meta_mut(&mut unchanged).remove("resourceVersion");
    if new == unchanged {
        rollback(state, &allocation);
        return Ok(current.clone());
    }
    if query.get("dryRun").is_some_and(|d| d == "All") {
        rollback(state, &allocation);
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
        rollback(state, &allocation);
        let (revision, _) = state
            .store
            .delete(&def.key(ns, name), Some(kv.mod_revision))
            .await
            .map_err(|e| ApiError::from_store(&q, e))?;
        released(state, def, current);
        observe(state, def, ns, name, Some(current), None, revision).await;
        meta_mut(&mut new).insert("resourceVersion".into(), json!(revision.to_string()));
        return Ok(new);
    }
    let bytes = match encode(state, def, &new) {
        Ok(bytes) => bytes,
        Err(e) => {
            rollback(state, &allocation);
            return Err(e);
        }
    };
    match state
        .store
        .update(&def.key(ns, name), bytes, Some(kv.mod_revision))
        .await
    {
        Ok(revision) => {
            commit(state, &allocation);
            observe(state, def, ns, name, Some(current), Some(&new), revision).await;
            meta_mut(&mut new).insert("resourceVersion".into(), json!(revision.to_string()));
            Ok(new)
        }
        Err(e) => {
            rollback(state, &allocation);
            Err(ApiError::from_store(&q, e))
        }
    }
}

/// Tells what follows the server's own writes (the Node authorizer's graph) that `def`
/// `ns/name` went from `old` (none: created) to `new` (none: deleted) at `revision`.
async fn observe(
    state: &ServerState,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    revision: u64,
) {
    state
        .authorizer
        .node
        .observe(state, def, ns, name, old, new, revision)
        .await;
}

/// Frees what a deleted object held (Service IPs and ports).
fn released(state: &ServerState, def: &ResourceDef, obj: &Value) {
    if def.group.is_empty() && def.plural == "services" {
        state.allocator.lock().release(obj);
    }
}

// ------------------------------------------------------------------ patch

#[allow(clippy::too_many_arguments)]
async fn patch_object(
    state: &ServerState,
    def: &'static ResourceDef,
    ns: Option<&str>,
    name: &str,
    sub: Option<&str>,
    content_type: &str,
    body: &Bytes,
    query: &Query,
) -> Result<(StatusCode, Value), ApiError> {
    let patch_type = patch::PatchType::from_content_type(content_type)
        .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
    let is_apply = patch_type == patch::PatchType::ApplyPatch;
    let manager = query.get("fieldManager").cloned().unwrap_or_default();
    let force = flag(query, "force");
    if !is_apply && query.contains_key("force") {
        return Err(ApiError::invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            vec![FieldError::invalid(
                "force",
                &json!(force),
                "may not be specified for non-apply patch",
            )],
        ));
    }
    if is_apply && manager.is_empty() {
        return Err(ApiError::invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            vec![FieldError::required(
                "fieldManager",
                "is required for apply patch",
            )],
        ));
    }
    if manager.chars().count() > 128 {
        return Err(ApiError::invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            vec![FieldError {
                reason: "FieldValueTooLong",
                field: "fieldManager".into(),
                message: "Too long: may not be more than 128 bytes".into(),
            }],
        ));
    }
    let patch_doc = {
        let body = body.clone();
        let cancel = CancelOnDrop::default();
        let cancelled = cancel.flag();
        off_the_io_threads(move || patch::decode_body_cancellable(patch_type, &body, &cancelled))
            .await?
            .map_err(|e| ApiError::bad_request(e.to_string()))?
    };
    if is_apply {
        check_applied_type(def, &patch_doc)?;
    }
    let patch_doc = Arc::new(patch_doc);
    let schema = patch::schema_for(def.group, def.kind);
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let current = match get_object(state, def, ns, name).await {
            Ok(found) => Some(found),
            Err(e) if e.code == 404 && is_apply && sub.is_none() => None,
            Err(e) => return Err(e),
        };
        let Some((kv, current)) = current else {
            let (doc, manager) = (patch_doc.clone(), manager.clone());
            let mut obj = off_the_io_threads(move || {
                patch::apply(None, &doc, &manager, force, schema, &meta::now_rfc3339())
            })
            .await?
            .map_err(|e| apply_error(def, name, e))?;
            check_request_namespace(def, ns, &mut obj)?;
            check_url_name(&obj, name)?;
            authorize_create(state, def, ns, name).await?;
            // The apply recorded its manager's ownership; an `Update` entry of the same
            // manager on top would make its next apply conflict with itself.
            let mut query = query.clone();
            query.remove("fieldManager");
            let created = create_object(state, def, ns, obj, &query).await?;
            return Ok((StatusCode::CREATED, created));
        };
        let (doc, manager, live) = (patch_doc.clone(), manager.clone(), current.clone());
        let patched = off_the_io_threads(move || match patch_type {
            patch::PatchType::ApplyPatch => patch::apply(
                Some(&live),
                &doc,
                &manager,
                force,
                schema,
                &meta::now_rfc3339(),
            )
            .map_err(|e| apply_error(def, name_of(&live), e)),
            other => patch::patch_object(&live, other, &doc, schema)
                .map_err(|e| patch_error(def, name_of(&live), e)),
        })
        .await??;
        let precondition = str_at(&patched, &["metadata", "resourceVersion"]).map(str::to_owned);
        let explicit = precondition
            .as_deref()
            .is_some_and(|rv| rv != kv.mod_revision.to_string());
        if explicit {
            return Err(ApiError::modified(&qualified(def, name)));
        }
        let mut patched = patched;
        check_request_namespace(def, ns, &mut patched)?;
        check_url_name(&patched, name)?;
        if let Some(o) = patched.as_object_mut() {
            o.insert("apiVersion".into(), json!(def.api_version()));
            o.insert("kind".into(), json!(def.kind));
        }
        check_body(def, &mut patched, query)?;
        let query = if is_apply {
            // Apply ownership was recorded by the apply itself.
            let mut q = query.clone();
            q.remove("fieldManager");
            q
        } else {
            query.clone()
        };
        match commit_update(state, def, ns, name, sub, &kv, &current, patched, &query).await {
            Err(e) if e.reason == "Conflict" && e.message.contains("has been modified") => continue,
            Err(e) => return Err(e),
            Ok(obj) => return Ok((StatusCode::OK, obj)),
        }
    }
    Err(ApiError::modified(&qualified(def, name)))
}

/// Upstream's `versionCheckManager` (the outermost field manager): an applied configuration
/// names the endpoint's own `apiVersion` and `kind`, or the apply is a 400
/// `invalid object type: <group>/<version>, Kind=<kind>` (Go's `GroupVersionKind` string).
fn check_applied_type(def: &ResourceDef, applied: &Value) -> Result<(), ApiError> {
    let Some(fields) = applied.as_object() else {
        // Not an object: the apply itself refuses it.
        return Ok(());
    };
    let text = |key: &str| fields.get(key).and_then(Value::as_str).unwrap_or("");
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    if api_version == def.api_version() && kind == def.kind {
        return Ok(());
    }
    // `schema.ParseGroupVersion`: "" and "v1" have no group, "g/v" one; anything else does
    // not parse, and the kind then reads as empty too.
    let parts: Vec<&str> = api_version.split('/').collect();
    let (group, version, kind) = match parts.as_slice() {
        [""] => ("", "", kind),
        [version] => ("", *version, kind),
        [group, version] => (*group, *version, kind),
        _ => ("", "", ""),
    };
    Err(ApiError::bad_request(format!(
        "invalid object type: {group}/{version}, Kind={kind}"
    )))
}

/// Upstream's `rest.EnsureObjectNamespaceMatchesRequestNamespace`, run on every patched
/// object: an object with no namespace takes the request's, a cluster-scoped one loses any,
/// and a different one is a 400.
fn check_request_namespace(
    def: &ResourceDef,
    ns: Option<&str>,
    obj: &mut Value,
) -> Result<(), ApiError> {
    let expected = if def.namespaced { ns.unwrap_or("") } else { "" };
    let meta = meta_mut(obj);
    let given = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
    if given == expected {
        return Ok(());
    }
    if given.is_empty() {
        meta.insert("namespace".into(), json!(expected));
        return Ok(());
    }
    if expected.is_empty() {
        meta.remove("namespace");
        return Ok(());
    }
    Err(ApiError::bad_request(
        "the namespace of the provided object does not match the namespace sent on the request",
    ))
}

/// Upstream's `checkName` (`handlers/rest.go`), run on every patched object: the object is
/// the one the URL names. A patch cannot rename an object, and an apply cannot create one
/// under another name than the URL's (which is what authorization, `resourceNames`
/// included, was decided on).
fn check_url_name(obj: &Value, name: &str) -> Result<(), ApiError> {
    let given = str_at(obj, &["metadata", "name"]).unwrap_or("");
    if given != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({given}) does not match the name on the URL ({name})"
        )));
    }
    Ok(())
}

/// An apply that creates its object needs `create` on it as well as `patch`, as upstream's
/// `PatchResource` wraps its create validation in `withAuthorization` (verb `create`, the
/// URL's name). The server's own writes (no request user) are not checked.
async fn authorize_create(
    state: &ServerState,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
) -> Result<(), ApiError> {
    let Some(user) = crate::auth::with_request_user(Clone::clone) else {
        return Ok(());
    };
    let mut attrs = crate::auth::authz::Attributes::resource(
        user,
        "create",
        def.group,
        def.plural,
        ns.unwrap_or(""),
        name,
    );
    attrs.api_version = def.version.to_owned();
    match state.authorizer.authorize(state, &attrs).await {
        crate::auth::authz::Decision::Allow => Ok(()),
        crate::auth::authz::Decision::Deny(reason)
        | crate::auth::authz::Decision::NoOpinion(reason) => {
            Err(crate::auth::authz::forbidden(&attrs, &reason))
        }
    }
}

/// Sets its flag when dropped: held by a request's handler while blocking work for it runs,
/// so that work can stop once the client is gone (the handler's future is then dropped).
#[derive(Default)]
struct CancelOnDrop(Arc<AtomicBool>);

impl CancelOnDrop {
    fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs CPU-heavy work (decoding and applying patches, which grow with the object) on the
/// blocking pool, so the async workers keep serving every other request (`/healthz`
/// included) meanwhile. A panic there is a 500 for this request alone.
async fn off_the_io_threads<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("the patch could not be computed: {e}")))
}

fn name_of(obj: &Value) -> &str {
    str_at(obj, &["metadata", "name"]).unwrap_or("")
}

fn patch_error(def: &ResourceDef, name: &str, e: patch::PatchError) -> ApiError {
    match e.http_status() {
        422 => ApiError::invalid(
            def.kind,
            def.group,
            name,
            vec![FieldError {
                reason: "FieldValueInvalid",
                field: "patch".into(),
                message: e.to_string(),
            }],
        ),
        413 => ApiError::entity_too_large(e.to_string()),
        _ => ApiError::bad_request(e.to_string()),
    }
}

fn apply_error(def: &ResourceDef, name: &str, e: patch::ApplyError) -> ApiError {
    match &e {
        patch::ApplyError::Conflict { causes } => {
            let mut err = ApiError::conflict(&qualified(def, name), "");
            err.message = e.to_string();
            if let Some(d) = err.details.as_mut() {
                d["causes"] = json!(causes
                    .iter()
                    .map(|(field, manager)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{manager}\""), "field": field}))
                    .collect::<Vec<_>>());
            }
            err
        }
        patch::ApplyError::Invalid(_) => ApiError::bad_request(e.to_string()),
    }
}

// ------------------------------------------------------------------ delete

/// `DeleteOptions`, from the body and the query.
#[derive(Debug, Default)]
pub(crate) struct DeleteOptions {
    grace_period_seconds: Option<i64>,
    propagation_policy: Option<String>,
    precondition_uid: Option<String>,
    precondition_rv: Option<String>,
    dry_run: bool,
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
        if body["orphanDependents"].as_bool() == Some(true) {
            o.propagation_policy.get_or_insert_with(|| "Orphan".into());
        }
        if let Some(g) = query.get("gracePeriodSeconds") {
            o.grace_period_seconds =
                Some(g.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}"))
                })?);
        }
        if let Some(p) = query.get("propagationPolicy") {
            o.propagation_policy = Some(p.clone());
        }
        if flag(query, "orphanDependents") {
            o.propagation_policy.get_or_insert_with(|| "Orphan".into());
        }
        if query.get("dryRun").is_some_and(|d| d == "All") {
            o.dry_run = true;
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
                    &["Background", "Foreground", "Orphan"],
                )],
            ));
        }
        if o.grace_period_seconds.is_some_and(|g| g < 0) {
            o.grace_period_seconds = Some(0);
        }
        Ok(o)
    }
}

/// Deletes an object with upstream's semantics: preconditions, graceful deletion for pods on
/// a node, finalizers (including `orphan` and `foregroundDeletion` from the propagation
/// policy), and immediate removal otherwise.
pub(crate) async fn delete_object(
    state: &ServerState,
    def: &'static ResourceDef,
    ns: Option<&str>,
    name: &str,
    options: DeleteOptions,
) -> Result<(StatusCode, Value), ApiError> {
    let q = qualified(def, name);
    if def.plural == "namespaces" && super::SYSTEM_NAMESPACES.contains(&name) {
        return Err(ApiError::forbidden(&q, "this namespace may not be deleted"));
    }
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let (kv, current) = get_object(state, def, ns, name).await?;
        crate::auth::node::admit(
            state,
            def,
            crate::auth::node::Write::Delete { old: &current },
        )
        .await?;
        let meta = &current["metadata"];
        if let Some(uid) = &options.precondition_uid
            && meta["uid"].as_str() != Some(uid)
        {
            return Err(ApiError::conflict(
                &q,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta["uid"].as_str().unwrap_or("")
                ),
            ));
        }
        if let Some(rv) = &options.precondition_rv
            && *rv != kv.mod_revision.to_string()
        {
            return Err(ApiError::conflict(
                &q,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
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
        if !already_deleting {
            match options.propagation_policy.as_deref() {
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
        if options.dry_run {
            return Ok((StatusCode::OK, current));
        }
        if finalizers.is_empty() && grace == 0 && !namespace_pending {
            match state
                .store
                .delete(&def.key(ns, name), Some(kv.mod_revision))
                .await
            {
                Ok((revision, _)) => {
                    released(state, def, &current);
                    observe(state, def, ns, name, Some(&current), None, revision).await;
                    let mut deleted = current.clone();
                    meta_mut(&mut deleted)
                        .insert("resourceVersion".into(), json!(revision.to_string()));
                    // Pods return the deleted object; everything else a Status.
                    return Ok(if def.plural == "pods" {
                        (StatusCode::OK, deleted)
                    } else {
                        (StatusCode::OK, success_status(&q, meta["uid"].as_str()))
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
            m.insert("deletionGracePeriodSeconds".into(), json!(grace));
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
            return Ok((StatusCode::OK, current));
        }
        match state
            .store
            .update(
                &def.key(ns, name),
                encode(state, def, &marked)?,
                Some(kv.mod_revision),
            )
            .await
        {
            Ok(revision) => {
                observe(
                    state,
                    def,
                    ns,
                    name,
                    Some(&current),
                    Some(&marked),
                    revision,
                )
                .await;
                meta_mut(&mut marked).insert("resourceVersion".into(), json!(revision.to_string()));
                if def.plural == "namespaces" && !already_deleting {
                    spawn_namespace_cleanup(state, name.to_owned());
                }
                return Ok((StatusCode::OK, marked));
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(ApiError::from_store(&q, e)),
        }
    }
    Err(ApiError::modified(&q))
}

async fn delete_collection(
    state: &ServerState,
    def: &'static ResourceDef,
    ns: Option<&str>,
    query: &Query,
    options: DeleteOptions,
) -> Result<(), ApiError> {
    let opts = ListOptions::parse(def, query)?;
    let (items, _, _) = list_objects(state, def, ns, &opts).await?;
    for item in items {
        let name = str_at(&item, &["metadata", "name"])
            .unwrap_or("")
            .to_owned();
        let item_ns = str_at(&item, &["metadata", "namespace"]).map(str::to_owned);
        let opts = DeleteOptions {
            grace_period_seconds: options.grace_period_seconds,
            propagation_policy: options.propagation_policy.clone(),
            dry_run: options.dry_run,
            ..DeleteOptions::default()
        };
        match delete_object(state, def, item_ns.as_deref(), &name, opts).await {
            Ok(_) => {}
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The namespace controller's work, in-process: delete everything in a terminating
/// namespace, then the namespace itself.
pub(super) fn spawn_namespace_cleanup(state: &ServerState, namespace: String) {
    let Some(server) = state.self_ref.upgrade() else {
        return;
    };
    tokio::spawn(async move {
        let state = server;
        loop {
            let mut remaining = 0usize;
            let mut seen = Vec::new();
            for def in state.registry.all() {
                if !def.namespaced || seen.contains(&def.storage) {
                    continue;
                }
                seen.push(def.storage);
                let Ok(items) = list_all(&state, def, Some(&namespace)).await else {
                    continue;
                };
                for item in items {
                    remaining += 1;
                    if item["metadata"]["deletionTimestamp"].is_null() {
                        let name = str_at(&item, &["metadata", "name"])
                            .unwrap_or("")
                            .to_owned();
                        let options = DeleteOptions {
                            grace_period_seconds: Some(0),
                            ..DeleteOptions::default()
                        };
                        let _ = delete_object(&state, def, Some(&namespace), &name, options).await;
                    }
                }
            }
            if remaining == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let namespaces = state
            .registry
            .find("", "v1", "namespaces")
            .expect("namespaces are served");
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let Ok((kv, current)) = get_object(&state, namespaces, None, &namespace).await else {
                return;
            };
            let mut finalized = current.clone();
            finalized["spec"]["finalizers"] = json!([]);
            match commit_update(
                &state,
                namespaces,
                None,
                &namespace,
                Some("finalize"),
                &kv,
                &current,
                finalized,
                &Query::new(),
            )
            .await
            {
                Err(e) if e.reason == "Conflict" => continue,
                _ => return,
            }
        }
    });
}

// ------------------------------------------------------------------ pods/eviction

/// The group-versions whose `Eviction` the eviction subresource takes (upstream accepts
/// `policy/v1beta1` bodies too).
const EVICTION_VERSIONS: [&str; 2] = ["policy/v1", "policy/v1beta1"];

/// An eviction body, checked as kube-apiserver's create handler and `EvictionREST.Create`
/// (`pkg/registry/core/pod/storage/eviction.go`) check it: an `Eviction` (its kind and
/// version defaulted from the endpoint, another kind refused as the decoder refuses it),
/// decodable (a `deleteOptions.gracePeriodSeconds` of `"x"` is not), in the URL's namespace,
/// and naming the URL's pod.
fn check_eviction(ns: Option<&str>, name: &str, mut body: Value) -> Result<Value, ApiError> {
    let version = match body.get("apiVersion").and_then(Value::as_str) {
        Some(v) if EVICTION_VERSIONS.contains(&v) => v.to_owned(),
        _ => EVICTION_VERSIONS[0].to_owned(),
    };
    super::type_meta::default_from_path(&mut body, &version, "Eviction")?;
    let short = version.rsplit('/').next().unwrap_or("v1");
    // Both versions have the same fields; the typed model checks them under its own.
    let mut typed = body.clone();
    typed["apiVersion"] = json!(EVICTION_VERSIONS[0]);
    if let Err(e) = serde_json::from_value::<k8s_openapi::api::policy::v1::Eviction>(typed) {
        return Err(ApiError::bad_request(format!(
            "Eviction in version \"{short}\" cannot be handled as a Eviction: {e}"
        )));
    }
    match str_at(&body, &["metadata", "namespace"]) {
        Some(given) if !given.is_empty() && Some(given) != ns => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        _ => {}
    }
    if str_at(&body, &["metadata", "name"]).unwrap_or("") != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    Ok(body)
}

// ------------------------------------------------------------------ pods/binding

async fn bind_pod(
    state: &ServerState,
    def: &'static ResourceDef,
    ns: Option<&str>,
    name: &str,
    binding: Value,
) -> Result<(), ApiError> {
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
        let (kv, current) = get_object(state, def, ns, name).await?;
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
            return Err(ApiError::conflict(
                &qualified(def, name),
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
        match state
            .store
            .update(
                &def.key(ns, name),
                encode(state, def, &bound)?,
                Some(kv.mod_revision),
            )
            .await
        {
            Ok(revision) => {
                observe(state, def, ns, name, Some(&current), Some(&bound), revision).await;
                return Ok(());
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(ApiError::from_store(&qualified(def, name), e)),
        }
    }
    Err(ApiError::modified(&qualified(def, name)))
}
