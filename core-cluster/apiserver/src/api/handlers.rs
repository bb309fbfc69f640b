//! The HTTP side of the verbs (upstream's `endpoints/handlers`): each verb's handler takes
//! the request's [`RequestScope`], parses what it needs (query, body, content type), calls
//! the generic store ([`crate::storage`]) and renders the answer. Get, list, watch, create,
//! update, patch, delete and deletecollection, plus the pod `binding` and `eviction` and
//! the `scale` subresources.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::{
    body::{Body, Bytes},
    extract::Request,
    http::{HeaderMap, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use super::{
    ServerState, Target, json_response,
    negotiate::{self, Representation},
    status::{ApiError, FieldError},
};
use crate::{
    auth::UserInfo,
    patch,
    registry::{
        ResourceDef,
        meta::{self, meta_mut, str_at},
        table, unknown_fields,
    },
    storage::{
        self, MAX_WRITE_ATTEMPTS, ObjectKey, Query, Storage, WriteContext,
        delete::{DeleteOptions, delete_object},
        flag,
        get_list::{ListOptions, get_object, list_objects},
        pods::bind_pod,
        qualified,
        update::commit_update,
    },
};

/// The most `Warning` headers one response carries.
const MAX_WARNINGS: usize = 32;

fn parse_query(request: &Request<Body>) -> Result<Query, ApiError> {
    let raw = request.uri().query().unwrap_or("");
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw)
        .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))?;
    Ok(pairs.into_iter().collect())
}

/// One request to a resource, parsed: what every verb's handler takes (upstream's
/// `handlers.RequestScope` with the request's own parts).
pub(crate) struct RequestScope {
    /// The server.
    pub(crate) state: Arc<ServerState>,
    /// The resource, namespace, name and subresource of the path.
    pub(crate) target: Target,
    /// The effective user (after impersonation).
    pub(crate) user: UserInfo,
    /// The query parameters.
    pub(crate) query: Query,
    /// The request's headers.
    pub(crate) headers: HeaderMap,
    /// The body, read whole (bounded by `max_request_bytes`).
    pub(crate) body: Bytes,
    /// What the Accept header asked for, negotiated against what the endpoint serves.
    pub(crate) repr: Representation,
}

impl RequestScope {
    fn def(&self) -> &'static ResourceDef {
        self.target.def
    }

    fn namespace(&self) -> Option<&str> {
        self.target.namespace.as_deref()
    }

    fn name(&self) -> &str {
        self.target.name.as_deref().unwrap_or("")
    }

    fn subresource(&self) -> Option<&str> {
        self.target.subresource.as_deref()
    }

    /// The named object of the path.
    fn key(&self) -> ObjectKey<'_> {
        ObjectKey::new(self.def(), self.namespace(), self.name())
    }

    /// The write's user and options.
    fn write_context(&self) -> WriteContext {
        let user_agent = self
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        WriteContext::of_request(self.user.clone(), self.query.clone(), user_agent)
    }

    fn storage(&self) -> &Storage {
        &self.state.storage
    }

    fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The body as a JSON object.
    fn json_body(&self) -> Result<Value, ApiError> {
        parse_body(&self.body)
    }

    /// `DeleteOptions` from the body (which may be empty) and the query.
    fn delete_options(&self) -> Result<DeleteOptions, ApiError> {
        let body = if self.body.iter().all(u8::is_ascii_whitespace) {
            Value::Null
        } else {
            parse_body(&self.body)?
        };
        DeleteOptions::from_value(&body, &self.query)
    }

    fn render(&self, obj: &Value, code: StatusCode) -> Result<Response, ApiError> {
        if self.repr == Representation::Table {
            let rv = str_at(obj, &["metadata", "resourceVersion"]).unwrap_or("");
            let mut t = table::table(self.def(), std::slice::from_ref(obj), rv, None, true);
            include_objects(&mut t, std::slice::from_ref(obj), &self.query)?;
            return Ok(json_response(code, &t, negotiate::TABLE_CONTENT_TYPE));
        }
        Ok(render_one(self.def(), obj, self.repr, code))
    }
}

/// The verbs of a resource request (upstream's `RequestInfo.Verb`, uppercase for metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    /// Any other method.
    Other,
}

impl Verb {
    fn of(method: &Method, named: bool, watch: bool) -> Self {
        match (method.as_str(), named) {
            ("GET", false) if watch => Verb::Watch,
            ("GET", false) => Verb::List,
            ("GET", true) => Verb::Get,
            ("POST", _) => Verb::Create,
            ("PUT", _) => Verb::Update,
            ("PATCH", _) => Verb::Patch,
            ("DELETE", true) => Verb::Delete,
            ("DELETE", false) => Verb::DeleteCollection,
            _ => Verb::Other,
        }
    }

    /// The metrics label of a refused request, and the verb of a 405's message: the HTTP
    /// method, or `LIST` for a GET of a collection.
    fn error_label(self, method: &Method) -> String {
        match self {
            Verb::List | Verb::Watch => "LIST".into(),
            _ => method.to_string(),
        }
    }

    /// The metrics label: the HTTP method, `LIST`, `WATCH` or `DELETECOLLECTION`.
    fn label(self, method: &Method) -> String {
        match self {
            Verb::List => "LIST".into(),
            Verb::Watch => "WATCH".into(),
            Verb::DeleteCollection => "DELETECOLLECTION".into(),
            _ => method.to_string(),
        }
    }
}

/// Reads what every verb needs from the request: the query, the headers, the body (after
/// the checks that come before it is looked at), and the user.
async fn scope_of(
    state: &Arc<ServerState>,
    target: Target,
    request: Request<Body>,
) -> Result<RequestScope, ApiError> {
    // Routed before the body is looked at: an unknown subresource is 404 whatever its body.
    let def = target.def;
    let valid_sub = match target.subresource.as_deref() {
        None => true,
        Some("status") => def.status,
        Some(s) => def.extra_subresources.contains(&s),
    };
    if !valid_sub {
        let sub = target.subresource.as_deref().unwrap_or("");
        return Err(ApiError::no_route(&format!("{}/{sub}", def.plural)));
    }
    // Negotiated before the body is read, and so before anything is written: a write must
    // not be committed and then answered 406 (upstream negotiates first in every handler).
    let repr = negotiate::representation(request.headers(), has_table(&target))?;
    let user = request
        .extensions()
        .get::<UserInfo>()
        .cloned()
        .unwrap_or_else(UserInfo::loopback);
    let is_patch = request.method() == Method::PATCH;
    let headers = request.headers().clone();
    let query = parse_query(&request)?;
    let limit = state.config.max_request_bytes;
    let body = axum::body::to_bytes(request.into_body(), limit)
        .await
        .map_err(|_| ApiError::too_large(limit))?;
    // Bodies are JSON (apply patches may be YAML). Protobuf and CBOR get 415, which makes
    // client-go retry the request as JSON.
    if !body.is_empty() && !is_patch {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json");
        if !matches!(
            negotiate::media_type(content_type).as_str(),
            "application/json" | "" | "*/*"
        ) {
            return Err(ApiError::unsupported_media_type(content_type));
        }
    }
    Ok(RequestScope {
        state: state.clone(),
        target,
        user,
        query,
        headers,
        body,
        repr,
    })
}

/// Whether the endpoint has a table convertor (upstream's `RequestScope.TableConvertor`,
/// set from the storage when it implements `rest.TableConvertor`): every resource's generic
/// store, and the `status` and `scale` subresources, which delegate to it. The other
/// subresources (`binding`, `eviction`, `ephemeralcontainers`, `approval`, `finalize`)
/// have none, nor do the reviews and TokenRequests, which are answered elsewhere.
pub(crate) fn has_table(target: &Target) -> bool {
    matches!(
        target.subresource.as_deref(),
        None | Some("status" | "scale")
    )
}

/// Runs one request (without its warnings).
async fn handle_inner(
    state: &Arc<ServerState>,
    target: Target,
    request: Request<Body>,
) -> (String, Response) {
    let deprecated = target.def.group.is_empty() && target.def.plural == "endpoints";
    let unknown_subresource = target.subresource.is_some();
    let request = match super::tokens::route(state, &target, request).await {
        Ok(answered) => return answered,
        Err(request) => request,
    };
    let method = request.method().clone();
    let watch = super::watch_requested(request.uri());
    let verb = Verb::of(&method, target.name.is_some(), watch);
    let scope = match scope_of(state, target, request).await {
        Ok(scope) => scope,
        Err(e) if e.code == 406 => return (verb.error_label(&method), e.into_response()),
        Err(e) => {
            // A create's route takes any body and refuses the media type itself.
            if deprecated && e.code == 415 && method != Method::PATCH {
                warn_deprecated_endpoints();
            }
            return (method.to_string(), e.into_response());
        }
    };
    let label = verb.error_label(&method);
    let answered = dispatch(&scope, verb).await;
    if deprecated {
        // kube-apiserver's deprecation warning on every request its route handler takes
        // (v1 Endpoints since 1.33); go-restful refuses the others (no route for the method
        // or subresource, a media type the route does not consume) before it.
        let code = match &answered {
            Ok(response) => response.status().as_u16(),
            Err(e) => e.code,
        };
        // A PATCH route consumes only the patch types; a create reads its body itself.
        let refused_by_router = code == 405
            || (code == 415 && method == Method::PATCH)
            || (code == 404 && unknown_subresource);
        if !refused_by_router {
            warn_deprecated_endpoints();
        }
    }
    match answered {
        Ok(response) => (verb.label(&method), response),
        Err(e) => (label, e.into_response()),
    }
}

/// The handler of a request's verb and subresource.
async fn dispatch(scope: &RequestScope, verb: Verb) -> Result<Response, ApiError> {
    let def = scope.def();
    let named = scope.target.name.is_some();
    match (verb, scope.subresource()) {
        (Verb::Watch, None) => watch(scope).await,
        (Verb::List, None) => list(scope).await,
        (Verb::Get, None | Some("status" | "ephemeralcontainers" | "approval")) => get(scope).await,
        (Verb::Create, None) if !named => create(scope).await,
        (Verb::Create, Some("binding")) => bind(scope).await,
        (Verb::Create, Some("eviction")) => evict(scope).await,
        (Verb::Update, None | Some("status" | "finalize" | "ephemeralcontainers" | "approval"))
            if named =>
        {
            update(scope).await
        }
        (Verb::Patch, None | Some("status" | "ephemeralcontainers" | "approval")) if named => {
            patch(scope).await
        }
        (Verb::Delete, None) => delete(scope).await,
        (Verb::DeleteCollection, None) if !def.deletecollection() => {
            Err(ApiError::method_not_served())
        }
        (Verb::DeleteCollection, None) => delete_collection(scope).await,
        (Verb::Get | Verb::Update | Verb::Patch, Some("scale")) => scale(scope, verb).await,
        _ => Err(ApiError::method_not_served()),
    }
}

/// GET of an object or its status.
async fn get(scope: &RequestScope) -> Result<Response, ApiError> {
    let key = scope.key();
    let obj = get_object(&*scope.state.store, key.def, key.namespace, key.name)
        .await?
        .1;
    scope.render(&obj, StatusCode::OK)
}

/// A watch of a resource (`?watch=true`).
async fn watch(scope: &RequestScope) -> Result<Response, ApiError> {
    let ns = scope.target.namespace.clone();
    super::watch::watch(
        scope.state.clone(),
        scope.def(),
        ns,
        &scope.query,
        scope.repr,
    )
    .await
}

/// Upstream's `ValidateCreateOptions`, `ValidateUpdateOptions` and `ValidatePatchOptions`
/// (`kind` names which), checked before the body is read: `fieldManager` (required by an
/// apply, at most 128 bytes), `force` (apply only), `dryRun` (`All` or nothing) and
/// `fieldValidation`.
fn check_write_options(kind: &str, query: &Query, apply: Option<bool>) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    let manager = query.get("fieldManager").map_or("", String::as_str);
    match apply {
        Some(true) if manager.is_empty() => errors.push(FieldError::required(
            "fieldManager",
            "is required for apply patch",
        )),
        Some(false) if query.contains_key("force") => errors.push(FieldError::forbidden(
            "force",
            "may not be specified for non-apply patch",
        )),
        _ => {}
    }
    if manager.len() > patch::FIELD_MANAGER_MAX_LENGTH {
        errors.push(FieldError {
            reason: "FieldValueTooLong",
            field: "fieldManager".into(),
            message: format!(
                "Too long: may not be more than {} bytes",
                patch::FIELD_MANAGER_MAX_LENGTH
            ),
        });
    }
    if let Some(dry_run) = query.get("dryRun").filter(|d| *d != "All") {
        // The options' `dryRun` is a list, and its error shows the list.
        errors.push(FieldError::not_supported(
            "dryRun",
            &json!([dry_run]),
            &["All"],
        ));
    }
    if let Some(mode) = query
        .get("fieldValidation")
        .filter(|m| !matches!(m.as_str(), "" | "Ignore" | "Strict" | "Warn"))
    {
        errors.push(FieldError::not_supported(
            "fieldValidation",
            &json!(mode),
            &["", "Ignore", "Strict", "Warn"],
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(kind, "meta.k8s.io", "", errors))
    }
}

/// POST of a new object.
async fn create(scope: &RequestScope) -> Result<Response, ApiError> {
    check_write_options("CreateOptions", &scope.query, None)?;
    let ctx = scope.write_context();
    let (def, ns) = (scope.def(), scope.namespace());
    let mut obj = scope.json_body()?;
    check_body(def, &mut obj, &ctx.query, Some(&scope.body))?;
    let obj = storage::create::create_object(scope.storage(), &ctx, def, ns, obj).await?;
    scope.render(&obj, StatusCode::CREATED)
}

/// PUT of an object, its status or a namespace's finalizers.
async fn update(scope: &RequestScope) -> Result<Response, ApiError> {
    check_write_options("UpdateOptions", &scope.query, None)?;
    let ctx = scope.write_context();
    let key = scope.key();
    let mut obj = scope.json_body()?;
    check_body(key.def, &mut obj, &ctx.query, Some(&scope.body))?;
    // A kind that creates on update answers 201 when the PUT created the object.
    let creates = scope.subresource().is_none()
        && storage::update::creates_on_update(key.def)
        && get_object(&*scope.state.store, key.def, key.namespace, key.name)
            .await
            .is_err_and(|e| e.code == 404);
    let obj = storage::update::update_object(scope.storage(), &ctx, key, scope.subresource(), obj)
        .await?;
    let code = if creates {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    scope.render(&obj, code)
}

/// PATCH of an object or its status.
async fn patch(scope: &RequestScope) -> Result<Response, ApiError> {
    let (code, obj) = patch_object(scope).await?;
    scope.render(&obj, code)
}

/// DELETE of an object.
async fn delete(scope: &RequestScope) -> Result<Response, ApiError> {
    let options = scope.delete_options()?;
    if let Some(w) = storage::delete::orphaning_warning(scope.def(), &options) {
        warn(w.to_owned());
    }
    let ctx = scope.write_context();
    let obj = delete_object(scope.storage(), &ctx, scope.key(), options).await?;
    Ok(json_response(StatusCode::OK, &obj, "application/json"))
}

/// DELETE of a collection.
async fn delete_collection(scope: &RequestScope) -> Result<Response, ApiError> {
    let options = scope.delete_options()?;
    if let Some(w) = storage::delete::orphaning_warning(scope.def(), &options) {
        warn(w.to_owned());
    }
    let ctx = scope.write_context();
    let deleted = storage::delete::delete_collection(
        scope.storage(),
        &ctx,
        scope.def(),
        scope.namespace(),
        &scope.query,
        options,
    )
    .await?;
    // Upstream's generic store answers a collection's deletion with the list it deleted
    // (`Store.DeleteCollection` returns what it listed), as a `<Kind>List`.
    let (items, revision, cont) = deleted;
    let body = list_body(scope.def(), items, &revision.to_string(), cont.as_deref());
    Ok(json_response(StatusCode::OK, &body, "application/json"))
}

/// The answer of a binding or an eviction: upstream's `metav1.Status{Status: Success, Code:
/// 201}`, which names no object.
fn created_status() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}

/// POST of a pod's `binding`.
async fn bind(scope: &RequestScope) -> Result<Response, ApiError> {
    bind_pod(scope.storage(), scope.key(), scope.json_body()?).await?;
    let status = created_status();
    Ok(json_response(
        StatusCode::CREATED,
        &status,
        "application/json",
    ))
}

/// POST of a pod's `eviction`: a delete with the eviction's options that honours the pod's
/// PodDisruptionBudget (see [`storage::eviction`]).
async fn evict(scope: &RequestScope) -> Result<Response, ApiError> {
    let eviction = check_eviction(scope.namespace(), scope.name(), scope.json_body()?)?;
    let options = eviction.get("deleteOptions").unwrap_or(&Value::Null);
    let options = DeleteOptions::from_value(options, &Query::new())?;
    let ctx = scope.write_context();
    storage::eviction::evict_pod(scope.storage(), &ctx, scope.key(), options).await?;
    let status = created_status();
    Ok(json_response(
        StatusCode::CREATED,
        &status,
        "application/json",
    ))
}

/// GET, PUT and PATCH of the `scale` subresource.
async fn scale(scope: &RequestScope, verb: Verb) -> Result<Response, ApiError> {
    let (state, key, ctx) = (&scope.state, scope.key(), scope.write_context());
    let scale = match verb {
        Verb::Get => super::scale::get(state, key).await?,
        Verb::Update => super::scale::put(state, &ctx, key, scope.json_body()?).await?,
        _ => super::scale::patch(state, &ctx, key, scope.content_type(), &scope.body).await?,
    };
    Ok(json_response(StatusCode::OK, &scale, "application/json"))
}

/// Decodes a create's body against its type (see [`check_body`]) and creates it.
pub(crate) async fn create_object(
    state: &ServerState,
    ctx: &WriteContext,
    def: &'static ResourceDef,
    ns: Option<&str>,
    mut obj: Value,
) -> Result<Value, ApiError> {
    check_body(def, &mut obj, &ctx.query, None)?;
    storage::create::create_object(&state.storage, ctx, def, ns, obj).await
}

/// Decodes an update's body against its type (see [`check_body`]) and writes it.
pub(crate) async fn update_object(
    state: &ServerState,
    ctx: &WriteContext,
    key: ObjectKey<'_>,
    sub: Option<&str>,
    mut obj: Value,
) -> Result<Value, ApiError> {
    check_body(key.def, &mut obj, &ctx.query, None)?;
    storage::update::update_object(&state.storage, ctx, key, sub, obj).await
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
            // A deprecated version of a custom resource: every request says so
            // (upstream's `deprecation.WarningMessage` via the CRD handler).
            if let Some(warning) =
                crate::crd::custom(target.def).and_then(|c| c.deprecation.clone())
            {
                warn(warning);
            }
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

/// kube-apiserver's deprecation warning of v1 Endpoints (since 1.33), added by the route's
/// wrapper before the handler runs: the first of the response's warnings.
fn warn_deprecated_endpoints() {
    let _ = WARNINGS.try_with(|w| {
        w.borrow_mut().insert(
            0,
            "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice"
                .to_owned(),
        );
    });
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

/// A Table's rows' `object` as `includeObject` asks (upstream's `TableOptions`): the
/// object's metadata (`Metadata`, the default, as the table was built), the whole object
/// (`Object`) or nothing (`None`).
fn include_objects(table: &mut Value, objects: &[Value], query: &Query) -> Result<(), ApiError> {
    let include = query.get("includeObject").map_or("", String::as_str);
    let Some(rows) = table["rows"].as_array_mut() else {
        return Ok(());
    };
    match include {
        "" | "Metadata" => {}
        "Object" => {
            for (row, object) in rows.iter_mut().zip(objects) {
                row["object"] = object.clone();
            }
        }
        "None" => {
            for row in rows.iter_mut().filter_map(Value::as_object_mut) {
                row.remove("object");
            }
        }
        other => {
            return Err(ApiError::invalid(
                "TableOptions",
                "meta.k8s.io",
                "",
                vec![FieldError::not_supported(
                    "includeObject",
                    &json!(other),
                    &["Metadata", "None", "Object"],
                )],
            ));
        }
    }
    Ok(())
}

/// One object in the negotiated representation.
fn render_one(def: &ResourceDef, obj: &Value, repr: Representation, code: StatusCode) -> Response {
    match repr {
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
    }
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

/// GET of a collection.
async fn list(scope: &RequestScope) -> Result<Response, ApiError> {
    let def = scope.def();
    let repr = scope.repr;
    let opts = ListOptions::parse(def, &scope.query)?;
    let (items, revision, cont) =
        list_objects(&*scope.state.store, def, scope.namespace(), &opts).await?;
    let rv = revision.to_string();
    Ok(match repr {
        Representation::Table => {
            let mut t = table::table(def, &items, &rv, cont.as_deref(), true);
            include_objects(&mut t, &items, &scope.query)?;
            json_response(StatusCode::OK, &t, negotiate::TABLE_CONTENT_TYPE)
        }
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
        Representation::Object => json_response(
            StatusCode::OK,
            &list_body(def, items, &rv, cont.as_deref()),
            "application/json",
        ),
    })
}

/// A list of `def`'s objects as its `<Kind>List` type.
fn list_body(def: &ResourceDef, mut items: Vec<Value>, rv: &str, cont: Option<&str>) -> Value {
    if !crate::crd::is_custom(def) {
        // A typed list's items carry no apiVersion or kind: kube-apiserver encodes a
        // built-in list through its Go type, whose items' TypeMeta is empty and
        // omitted. A custom resource's list is unstructured; its items keep theirs.
        for item in items.iter_mut().filter_map(Value::as_object_mut) {
            item.remove("apiVersion");
            item.remove("kind");
        }
    }
    let mut metadata = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        metadata["continue"] = json!(c);
    }
    json!({
        "kind": format!("{}List", def.kind),
        "apiVersion": def.api_version(),
        "metadata": metadata,
        "items": items,
    })
}

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
/// what strict decoding finds: the fields the model does not know and, in a request's own
/// body (`raw`, the JSON the object was parsed from), duplicate fields ([`super::strict`]).
/// `Strict` refuses them (400, upstream's `<Kind> in version "<v>" cannot be handled as a
/// <Kind>: strict decoding error: unknown field "…", duplicate field "…"`), `Warn` (the
/// default) warns of each and `Ignore` says nothing; unknown fields are then dropped, as
/// kube-apiserver prunes them from built-in types, and of duplicates the last is kept.
/// Without `raw` (a patched object, one the server writes itself) only unknown fields are
/// found.
fn check_body(
    def: &ResourceDef,
    obj: &mut Value,
    query: &Query,
    raw: Option<&[u8]>,
) -> Result<(), ApiError> {
    patch::limits::check_depth(obj).map_err(ApiError::bad_request)?;
    super::type_meta::default_from_path(obj, &def.api_version(), def.kind)?;
    let validation = field_validation(query)?;
    let strict = Strictness {
        def,
        validation,
        in_body: raw.is_some(),
    };
    if let Some(custom) = crate::crd::custom(def) {
        // A custom resource: decoded as unstructured JSON (every duplicate), then its
        // structural schema prunes and defaults (upstream's `pruning.PruneWithOptions` and
        // `structuraldefaulting.Default` on decode); the pruned fields are the unknown ones.
        let normalized = custom.normalize(obj);
        let mut findings = raw
            .filter(|_| validation != FieldValidation::Ignore)
            .map(super::strict::duplicate_fields)
            .unwrap_or_default();
        let unknown = unknown_fields(obj, &normalized);
        findings.extend(unknown.iter().map(String::as_str).map(unknown_field));
        strict.report(findings)?;
        *obj = normalized;
        return Ok(());
    }
    let normalized = (def.typed)(obj).map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            def.kind, def.version, def.kind
        ))
    })?;
    let findings = match raw {
        Some(raw) if validation != FieldValidation::Ignore => {
            super::strict::typed_findings(raw, obj, &normalized)
        }
        _ => unknown_fields(obj, &normalized)
            .iter()
            .map(String::as_str)
            .map(unknown_field)
            .collect(),
    };
    if findings.is_empty() {
        return Ok(());
    }
    strict.report(findings)?;
    prune_unknown(obj, &normalized);
    Ok(())
}

/// `unknown field "<path>"`.
fn unknown_field(path: &str) -> String {
    format!("unknown field {}", super::strict::quote(path))
}

/// How one write reports what strict decoding found.
struct Strictness<'a> {
    def: &'a ResourceDef,
    validation: FieldValidation,
    /// Whether the findings are of the request's own body (a create or an update): its
    /// refusal is worded as upstream's decoder error (`transformDecodeError`).
    in_body: bool,
}

impl Strictness<'_> {
    /// `fieldValidation` over the findings of a write: `Strict` refuses them (400), `Warn`
    /// warns of each (`addStrictDecodingWarnings`), `Ignore` says nothing.
    fn report(&self, findings: Vec<String>) -> Result<(), ApiError> {
        if findings.is_empty() {
            return Ok(());
        }
        match self.validation {
            FieldValidation::Strict => {
                let error = format!("strict decoding error: {}", findings.join(", "));
                let def = self.def;
                Err(ApiError::bad_request(if self.in_body {
                    format!(
                        "{} in version \"{}\" cannot be handled as a {}: {error}",
                        def.kind, def.version, def.kind
                    )
                } else {
                    error
                }))
            }
            FieldValidation::Warn => {
                findings.into_iter().take(MAX_WARNINGS).for_each(warn);
                Ok(())
            }
            FieldValidation::Ignore => Ok(()),
        }
    }
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

/// A patch (JSON, merge, strategic merge, apply), applied to the stored object in the
/// store's retry loop; an apply of a missing object creates it.
async fn patch_object(scope: &RequestScope) -> Result<(StatusCode, Value), ApiError> {
    let (def, ns, name, sub) = (
        scope.def(),
        scope.namespace(),
        scope.name(),
        scope.subresource(),
    );
    let (content_type, body, query) = (scope.content_type(), &scope.body, &scope.query);
    let state = &scope.state;
    let patch_type = patch::PatchType::from_content_type(content_type)
        .ok_or_else(|| ApiError::unsupported_media_type(content_type))?;
    if crate::crd::is_custom(def) && !crate::crd::PATCH_TYPES.contains(&patch_type.content_type()) {
        // A custom resource has no patch strategies to merge by (`crd::PATCH_TYPES`).
        return Err(ApiError::unsupported_media_type_of(crate::crd::PATCH_TYPES));
    }
    let is_apply = patch_type == patch::PatchType::ApplyPatch;
    let manager = query.get("fieldManager").cloned().unwrap_or_default();
    let force = flag(query, "force");
    check_write_options("PatchOptions", query, Some(is_apply))?;
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
    // Held (and moved into each patch computation) so that a custom resource's merge
    // shape outlives a definition deleted meanwhile.
    let merge = crate::crd::merge_schema(def);
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let current = match get_object(&*state.store, def, ns, name).await {
            Ok(found) => Some(found),
            Err(e) if e.code == 404 && is_apply && sub.is_none() => None,
            Err(e) if e.code == 404 && sub.is_none() && storage::update::creates_on_update(def) => {
                // A kind that creates on update creates on a patch too: the patch applied
                // to an empty object (upstream's patcher answers 200 for it).
                let empty = json!({"apiVersion": def.api_version(), "kind": def.kind,
                    "metadata": {"name": name}});
                let (doc, schema) = (patch_doc.clone(), merge.clone());
                let mut obj = off_the_io_threads(move || {
                    patch::patch_object(&empty, patch_type, &doc, &schema)
                })
                .await?
                .map_err(|e| patch_error(def, name, e))?;
                check_request_namespace(def, ns, &mut obj)?;
                check_url_name(&obj, name)?;
                authorize_create(scope).await?;
                let created = create_object(state, &scope.write_context(), def, ns, obj).await?;
                return Ok((StatusCode::OK, created));
            }
            Err(e) => return Err(e),
        };
        let Some((kv, current)) = current else {
            let (doc, manager, schema) = (patch_doc.clone(), manager.clone(), merge.clone());
            let mut obj = off_the_io_threads(move || {
                patch::apply(None, &doc, &manager, force, &schema, &meta::now_rfc3339())
            })
            .await?
            .map_err(|e| apply_error(def, name, e))?;
            check_request_namespace(def, ns, &mut obj)?;
            check_url_name(&obj, name)?;
            authorize_create(scope).await?;
            // The apply recorded its manager's ownership; an `Update` entry of the same
            // manager on top would make its next apply conflict with itself.
            let ctx = scope.write_context().untracked();
            let created = create_object(state, &ctx, def, ns, obj).await?;
            return Ok((StatusCode::CREATED, created));
        };
        let (doc, manager, live, schema) = (
            patch_doc.clone(),
            manager.clone(),
            current.clone(),
            merge.clone(),
        );
        let patched = off_the_io_threads(move || match patch_type {
            patch::PatchType::ApplyPatch => patch::apply(
                Some(&live),
                &doc,
                &manager,
                force,
                &schema,
                &meta::now_rfc3339(),
            )
            .map_err(|e| apply_error(def, name_of(&live), e)),
            other => patch::patch_object(&live, other, &doc, &schema)
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
        check_body(def, &mut patched, query, None)?;
        let mut ctx = scope.write_context();
        if is_apply {
            // Apply ownership was recorded by the apply itself.
            ctx = ctx.untracked();
        }
        let key = scope.key();
        match commit_update(&state.storage, &ctx, key, sub, &kv, &current, patched).await {
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
/// URL's name).
async fn authorize_create(scope: &RequestScope) -> Result<(), ApiError> {
    let (def, ns, name) = (scope.def(), scope.namespace(), scope.name());
    let mut attrs = crate::auth::authz::Attributes::resource(
        scope.user.clone(),
        "create",
        def.group,
        def.plural,
        ns.unwrap_or(""),
        name,
    );
    attrs.api_version = def.version.to_owned();
    match scope.state.authorizer.authorize(&attrs).await {
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
            // Upstream's `NewApplyConflict`: the details carry the causes alone.
            let mut err = ApiError::conflict(&qualified(def, name), "");
            err.message = e.to_string();
            err.details = Some(json!({"causes": causes
                .iter()
                .map(|(field, manager)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{manager}\""), "field": field}))
                .collect::<Vec<_>>()}));
            err
        }
        patch::ApplyError::Invalid(_) => ApiError::bad_request(e.to_string()),
    }
}

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
