//! The `paths` of a group-version document: the operations upstream's API server installs
//! for a resource, with their parameters, bodies, responses and vendor extensions.

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::core::v1::Binding;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Patch, Status};
use serde_json::{Map, Value, json};

use super::{
    Components, GVK_EXTENSION, OpenApiResource, SCHEMA_REF_PREFIX, fallback_schema_name, gvk_value,
    schema_of,
};

/// Content types of a single object in a response.
const OBJECT_CONTENT_TYPES: &[&str] = &[
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];

/// Content types of a list response, which may also be a watch stream.
const LIST_CONTENT_TYPES: &[&str] = &[
    "application/json",
    "application/json;stream=watch",
    "application/vnd.kubernetes.protobuf",
    "application/vnd.kubernetes.protobuf;stream=watch",
    "application/yaml",
];

/// Content types a PATCH request body may have.
const PATCH_CONTENT_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];

/// How the operations of one resource are named.
struct Names<'a> {
    /// `core_v1`, `coordination_v1`, `rbacAuthorization_v1`.
    tag: String,
    /// `CoreV1`, `CoordinationV1`, `RbacAuthorizationV1`.
    group_version: String,
    /// `Namespaced` for namespaced resources, empty otherwise.
    scope: &'static str,
    kind: &'a str,
}

impl Names<'_> {
    /// `<verb><GroupVersion><Namespaced?><Kind><suffix>`, like `patchCoreV1NamespacedPodStatus`.
    fn id(&self, verb: &str, suffix: &str) -> String {
        format!(
            "{verb}{}{}{}{suffix}",
            self.group_version, self.scope, self.kind
        )
    }
}

/// The group part of operation ids and tags: `.k8s.io` dropped, remaining words joined in
/// camel case (`rbac.authorization.k8s.io` → `rbacAuthorization`), `core` for the core group.
fn group_words(group: &str) -> Vec<String> {
    if group.is_empty() {
        return vec!["core".to_owned()];
    }
    let group = group.strip_suffix(".k8s.io").unwrap_or(group);
    group
        .split(['.', '-'])
        .filter(|word| !word.is_empty())
        .map(str::to_owned)
        .collect()
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn names<'a>(resource: &'a OpenApiResource) -> Names<'a> {
    let words = group_words(resource.group);
    let camel: String = words.iter().map(|word| capitalize(word)).collect();
    let mut lower_camel = camel.clone();
    if let Some(first) = lower_camel.get(..1) {
        let first = first.to_lowercase();
        lower_camel.replace_range(..1, &first);
    }
    Names {
        tag: format!("{lower_camel}_{}", resource.version),
        group_version: format!("{camel}{}", capitalize(resource.version)),
        scope: if resource.namespaced {
            "Namespaced"
        } else {
            ""
        },
        kind: resource.kind,
    }
}

/// A `$ref` schema to a definition.
fn reference(name: &str) -> Value {
    json!({ "$ref": format!("{SCHEMA_REF_PREFIX}{name}") })
}

fn path_parameter(name: &str, description: &str) -> Value {
    json!({
        "name": name,
        "in": "path",
        "description": description,
        "required": true,
        "schema": { "type": "string", "uniqueItems": true },
    })
}

fn query_parameter(name: &str, kind: &str, description: &str) -> Value {
    json!({
        "name": name,
        "in": "query",
        "description": description,
        "schema": { "type": kind, "uniqueItems": true },
    })
}

/// The query parameters by name, described in our own words after upstream's meaning.
fn query(name: &str) -> Value {
    match name {
        "pretty" => query_parameter(
            name,
            "string",
            "If 'true', then the output is pretty printed. Defaults to 'false' unless the user-agent indicates a browser or command-line HTTP tool (curl and wget).",
        ),
        "dryRun" => query_parameter(
            name,
            "string",
            "When present, indicates that modifications should not be persisted. An invalid or unrecognized dryRun directive will result in an error response and no further processing of the request. Valid values are: - All: all dry run stages will be processed",
        ),
        "fieldManager" => query_parameter(
            name,
            "string",
            "fieldManager is a name associated with the actor or entity that is making these changes. The value must be less than or 128 characters long, and only contain printable characters, as defined by https://golang.org/pkg/unicode/#IsPrint. It is required for apply requests (application/apply-patch) and optional for the other patch types.",
        ),
        "fieldValidation" => query_parameter(
            name,
            "string",
            "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore: drops unknown fields and keeps the last of duplicate fields silently. - Warn: drops unknown fields and returns a warning for each unknown or duplicate field. - Strict: fails the request with BadRequest when any field is unknown or duplicated. The default is Strict.",
        ),
        "force" => query_parameter(
            name,
            "boolean",
            "Force is going to \"force\" Apply requests. It means user will re-acquire conflicting fields owned by other people. Force flag must be unset for non-apply patch requests.",
        ),
        "allowWatchBookmarks" => query_parameter(
            name,
            "boolean",
            "allowWatchBookmarks requests watch events with type \"BOOKMARK\". Servers that do not implement bookmarks may ignore this flag and bookmarks are sent at the server's discretion.",
        ),
        "continue" => query_parameter(
            name,
            "string",
            "The continue option should be set when retrieving more results from the server. Its value is the opaque token returned in metadata.continue of the previous page, with the same query parameters.",
        ),
        "fieldSelector" => query_parameter(
            name,
            "string",
            "A selector to restrict the list of returned objects by their fields. Defaults to everything.",
        ),
        "labelSelector" => query_parameter(
            name,
            "string",
            "A selector to restrict the list of returned objects by their labels. Defaults to everything.",
        ),
        "limit" => query_parameter(
            name,
            "integer",
            "limit is a maximum number of responses to return for a list call. If more items exist, the server will set the `continue` field on the list metadata to a value that can be used with the same initial query to retrieve the next set of results.",
        ),
        "resourceVersion" => query_parameter(
            name,
            "string",
            "resourceVersion sets a constraint on what resource versions a request may be served from. See https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions for details. Defaults to unset",
        ),
        "resourceVersionMatch" => query_parameter(
            name,
            "string",
            "resourceVersionMatch determines how resourceVersion is applied to list calls. It is highly recommended that resourceVersionMatch be set for list calls where resourceVersion is set. Defaults to unset",
        ),
        "sendInitialEvents" => query_parameter(
            name,
            "boolean",
            "`sendInitialEvents=true` may be set together with `watch=true`. In that case, the watch stream will begin with synthetic events to produce the current state of objects in the collection, followed by a bookmark event.",
        ),
        "timeoutSeconds" => query_parameter(
            name,
            "integer",
            "Timeout for the list/watch call. This limits the duration of the call, regardless of any activity or inactivity.",
        ),
        "watch" => query_parameter(
            name,
            "boolean",
            "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications.",
        ),
        "gracePeriodSeconds" => query_parameter(
            name,
            "integer",
            "The duration in seconds before the object should be deleted. Value must be non-negative integer. The value zero indicates delete immediately. If this value is nil, the default grace period for the specified type will be used.",
        ),
        "ignoreStoreReadErrorWithClusterBreakingPotential" => query_parameter(
            name,
            "boolean",
            "if set to true, it will trigger an unsafe deletion of the resource in case the normal deletion flow fails with a corrupt object error.",
        ),
        "orphanDependents" => query_parameter(
            name,
            "boolean",
            "Deprecated: please use the PropagationPolicy, this field will be deprecated in 1.7. Should the dependent objects be orphaned.",
        ),
        "propagationPolicy" => query_parameter(
            name,
            "string",
            "Whether and how garbage collection will be performed. Either this field or OrphanDependents may be set, but not both. Acceptable values are: 'Orphan', 'Background', 'Foreground'.",
        ),
        // Every caller passes one of the names above; an unknown one still yields a valid
        // (undescribed) string parameter rather than a panic.
        _ => query_parameter(name, "string", ""),
    }
}

fn queries(list: &[&str]) -> Vec<Value> {
    list.iter().map(|name| query(name)).collect()
}

const LIST_QUERIES: &[&str] = &[
    "allowWatchBookmarks",
    "continue",
    "fieldSelector",
    "labelSelector",
    "limit",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
    "watch",
];
const WRITE_QUERIES: &[&str] = &["dryRun", "fieldManager", "fieldValidation"];
const PATCH_QUERIES: &[&str] = &["dryRun", "fieldManager", "fieldValidation", "force"];
const GET_QUERIES: &[&str] = &[];
const DELETE_QUERIES: &[&str] = &[
    "dryRun",
    "gracePeriodSeconds",
    "ignoreStoreReadErrorWithClusterBreakingPotential",
    "orphanDependents",
    "propagationPolicy",
];
const DELETE_COLLECTION_QUERIES: &[&str] = &[
    "continue",
    "dryRun",
    "fieldSelector",
    "gracePeriodSeconds",
    "ignoreStoreReadErrorWithClusterBreakingPotential",
    "labelSelector",
    "limit",
    "orphanDependents",
    "propagationPolicy",
    "resourceVersion",
    "resourceVersionMatch",
    "sendInitialEvents",
    "timeoutSeconds",
];

fn content(schema: &Value, content_types: &[&str]) -> Value {
    let mut content = Map::new();
    for content_type in content_types {
        content.insert(
            (*content_type).to_owned(),
            json!({ "schema": schema.clone() }),
        );
    }
    Value::Object(content)
}

fn request_body(schema: &Value, content_types: &[&str]) -> Value {
    json!({ "content": content(schema, content_types), "required": true })
}

/// Responses with the given success codes, all returning `schema`, plus 401.
fn responses(codes: &[(&str, &str)], schema: &Value, content_types: &[&str]) -> Value {
    let mut responses = Map::new();
    for (code, description) in codes {
        responses.insert(
            (*code).to_owned(),
            json!({ "description": description, "content": content(schema, content_types) }),
        );
    }
    responses.insert("401".to_owned(), json!({ "description": "Unauthorized" }));
    Value::Object(responses)
}

/// One operation object.
struct Operation<'a> {
    names: &'a Names<'a>,
    action: &'static str,
    id: String,
    description: String,
    gvk: &'a Value,
    queries: &'a [&'a str],
    body: Option<Value>,
    responses: Value,
}

impl Operation<'_> {
    fn into_value(self) -> Value {
        let mut operation = Map::new();
        operation.insert("tags".to_owned(), json!([self.names.tag]));
        operation.insert("description".to_owned(), json!(self.description));
        operation.insert("operationId".to_owned(), json!(self.id));
        if !self.queries.is_empty() {
            operation.insert("parameters".to_owned(), Value::Array(queries(self.queries)));
        }
        if let Some(body) = self.body {
            operation.insert("requestBody".to_owned(), body);
        }
        operation.insert("responses".to_owned(), self.responses);
        operation.insert("x-kubernetes-action".to_owned(), json!(self.action));
        operation.insert(GVK_EXTENSION.to_owned(), self.gvk.clone());
        Value::Object(operation)
    }
}

/// A path item: its operations by method, and the parameters common to them.
fn path_item(parameters: &[Value], operations: Vec<(&str, Value)>) -> Value {
    let mut item = Map::new();
    for (method, operation) in operations {
        item.insert(method.to_owned(), operation);
    }
    let mut parameters = parameters.to_vec();
    parameters.push(query("pretty"));
    item.insert("parameters".to_owned(), Value::Array(parameters));
    Value::Object(item)
}

const READ_RESPONSES: &[(&str, &str)] = &[("200", "OK")];
const CREATE_RESPONSES: &[(&str, &str)] = &[("200", "OK"), ("201", "Created"), ("202", "Accepted")];
const UPDATE_RESPONSES: &[(&str, &str)] = &[("200", "OK"), ("201", "Created")];
const DELETE_RESPONSES: &[(&str, &str)] = &[("200", "OK"), ("202", "Accepted")];

/// get, put and patch of one object (the object itself or a subresource like `status`).
fn read_update_patch(
    names: &Names<'_>,
    gvk: &Value,
    schema: &Value,
    patch: &Value,
    what: &str,
    suffix: &str,
) -> Vec<(&'static str, Value)> {
    let kind = names.kind;
    vec![
        (
            "get",
            Operation {
                names,
                action: "get",
                id: names.id("read", suffix),
                description: format!("read {what}the specified {kind}"),
                gvk,
                queries: GET_QUERIES,
                body: None,
                responses: responses(READ_RESPONSES, schema, OBJECT_CONTENT_TYPES),
            }
            .into_value(),
        ),
        (
            "put",
            Operation {
                names,
                action: "put",
                id: names.id("replace", suffix),
                description: format!("replace {what}the specified {kind}"),
                gvk,
                queries: WRITE_QUERIES,
                body: Some(request_body(schema, &["*/*"])),
                responses: responses(UPDATE_RESPONSES, schema, OBJECT_CONTENT_TYPES),
            }
            .into_value(),
        ),
        (
            "patch",
            Operation {
                names,
                action: "patch",
                id: names.id("patch", suffix),
                description: format!("partially update {what}the specified {kind}"),
                gvk,
                queries: PATCH_QUERIES,
                body: Some(request_body(patch, PATCH_CONTENT_TYPES)),
                responses: responses(UPDATE_RESPONSES, schema, OBJECT_CONTENT_TYPES),
            }
            .into_value(),
        ),
    ]
}

/// Adds the paths of `resource` (and the schemas they reference) to a document.
pub(super) fn add_resource_paths(
    paths: &mut Map<String, Value>,
    components: &mut Components,
    resource: &OpenApiResource,
) {
    let OpenApiResource {
        group,
        version,
        kind,
        schema,
        ..
    } = *resource;
    let gvk = gvk_value(group, version, kind);
    let name = components.add_kind(
        schema,
        fallback_schema_name(group, version, kind),
        gvk.clone(),
    );
    add_paths_of_kind(paths, components, resource, &name);
}

/// Adds the paths of `resource`, whose kind's schema is already among the components as
/// `name` (its [`OpenApiResource::schema`] is not called), and its list's schema.
pub(super) fn add_paths_of_kind(
    paths: &mut Map<String, Value>,
    components: &mut Components,
    resource: &OpenApiResource,
    name: &str,
) {
    let OpenApiResource {
        group,
        version,
        kind,
        plural,
        namespaced,
        subresources,
        schema: _,
    } = *resource;
    let names = names(resource);
    let gvk = gvk_value(group, version, kind);
    let name = name.to_owned();
    let list_name = components.add_list(&name, group, version, kind);
    let object = reference(&name);
    let list = reference(&list_name);
    let status = components.reference::<Status>();
    let delete_options = components.reference::<DeleteOptions>();
    let patch = components.reference::<Patch>();

    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let name_parameter = path_parameter("name", &format!("name of the {kind}"));
    let namespace_parameter = path_parameter(
        "namespace",
        "object name and auth scope, such as for teams and projects",
    );
    let (collection, scope_parameters) = if namespaced {
        (
            format!("{prefix}/namespaces/{{namespace}}/{plural}"),
            vec![namespace_parameter],
        )
    } else {
        (format!("{prefix}/{plural}"), Vec::new())
    };
    let item = format!("{collection}/{{name}}");
    let mut item_parameters = vec![name_parameter];
    item_parameters.extend(scope_parameters.iter().cloned());

    // The collection: list, create, delete collection.
    let list_operation = |id: String| {
        Operation {
            names: &names,
            action: "list",
            id,
            description: format!("list or watch objects of kind {kind}"),
            gvk: &gvk,
            queries: LIST_QUERIES,
            body: None,
            responses: responses(READ_RESPONSES, &list, LIST_CONTENT_TYPES),
        }
        .into_value()
    };
    let mut collection_operations = vec![
        ("get", list_operation(names.id("list", ""))),
        (
            "post",
            Operation {
                names: &names,
                action: "post",
                id: names.id("create", ""),
                description: format!("create a {kind}"),
                gvk: &gvk,
                queries: WRITE_QUERIES,
                body: Some(request_body(&object, &["*/*"])),
                responses: responses(CREATE_RESPONSES, &object, OBJECT_CONTENT_TYPES),
            }
            .into_value(),
        ),
    ];
    if crate::registry::serves_deletecollection(group, plural) {
        collection_operations.push((
            "delete",
            Operation {
                names: &names,
                action: "deletecollection",
                id: format!(
                    "delete{}Collection{}{kind}",
                    names.group_version, names.scope
                ),
                description: format!("delete collection of {kind}"),
                gvk: &gvk,
                queries: DELETE_COLLECTION_QUERIES,
                body: Some(request_body(&delete_options, &["*/*"])),
                responses: responses(READ_RESPONSES, &status, OBJECT_CONTENT_TYPES),
            }
            .into_value(),
        ));
    }
    paths.insert(
        collection,
        path_item(&scope_parameters, collection_operations),
    );

    // Namespaced kinds are also listed across all namespaces.
    if namespaced {
        let id = format!("list{}{kind}ForAllNamespaces", names.group_version);
        paths.insert(
            format!("{prefix}/{plural}"),
            path_item(&[], vec![("get", list_operation(id))]),
        );
    }

    // The object: get, put, patch, delete.
    let mut item_operations = read_update_patch(&names, &gvk, &object, &patch, "", "");
    item_operations.push((
        "delete",
        Operation {
            names: &names,
            action: "delete",
            id: names.id("delete", ""),
            description: format!("delete a {kind}"),
            gvk: &gvk,
            queries: DELETE_QUERIES,
            body: Some(request_body(&delete_options, &["*/*"])),
            responses: responses(DELETE_RESPONSES, &status, OBJECT_CONTENT_TYPES),
        }
        .into_value(),
    ));
    paths.insert(item.clone(), path_item(&item_parameters, item_operations));

    for &subresource in subresources {
        let suffix = capitalize(subresource);
        let path = format!("{item}/{subresource}");
        let operations = match subresource {
            "status" | "approval" | "ephemeralcontainers" | "resize" => read_update_patch(
                &names,
                &gvk,
                &object,
                &patch,
                &format!("{subresource} of "),
                &suffix,
            ),
            "scale" => {
                let scale_gvk = gvk_value("autoscaling", "v1", "Scale");
                let scale = components.add_kind(
                    schema_of::<Scale>,
                    fallback_schema_name("autoscaling", "v1", "Scale"),
                    scale_gvk.clone(),
                );
                read_update_patch(
                    &names,
                    &scale_gvk,
                    &reference(&scale),
                    &patch,
                    "scale of ",
                    &suffix,
                )
            }
            "binding" | "eviction" | "token" => {
                let (request_gvk, request) = if subresource == "token" {
                    let gvk = gvk_value("authentication.k8s.io", "v1", "TokenRequest");
                    let name = components.add_kind(
                        schema_of::<TokenRequest>,
                        fallback_schema_name("authentication.k8s.io", "v1", "TokenRequest"),
                        gvk.clone(),
                    );
                    (gvk, reference(&name))
                } else if subresource == "binding" {
                    let gvk = gvk_value("", "v1", "Binding");
                    let name = components.add_kind(
                        schema_of::<Binding>,
                        fallback_schema_name("", "v1", "Binding"),
                        gvk.clone(),
                    );
                    (gvk, reference(&name))
                } else {
                    let gvk = gvk_value("policy", "v1", "Eviction");
                    let name = components.add_kind(
                        schema_of::<Eviction>,
                        fallback_schema_name("policy", "v1", "Eviction"),
                        gvk.clone(),
                    );
                    (gvk, reference(&name))
                };
                vec![(
                    "post",
                    Operation {
                        names: &names,
                        action: "post",
                        id: names.id("create", &suffix),
                        description: format!("create {subresource} of a {kind}"),
                        gvk: &request_gvk,
                        queries: WRITE_QUERIES,
                        body: Some(request_body(&request, &["*/*"])),
                        responses: responses(CREATE_RESPONSES, &request, OBJECT_CONTENT_TYPES),
                    }
                    .into_value(),
                )]
            }
            // Streaming and proxy subresources (log, exec, proxy, …) are not described.
            _ => continue,
        };
        paths.insert(path, path_item(&item_parameters, operations));
    }
}
