//! The workload resources: apps/v1 Deployments, ReplicaSets and DaemonSets, batch/v1 Jobs.
//! Defaults and validation follow upstream's `pkg/apis/apps` and `pkg/apis/batch`
//! (`SetDefaults_*`, `Validate*Spec`); columns are kubectl's.

use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment, ReplicaSet},
    batch::v1::Job,
};
use serde_json::{Value, json};

use super::{
    Column, NameRule, ResourceDef,
    events::{identity, semantic_eq},
    pod_spec::{child, default_pod_spec, default_ptr, default_str, validate_pod_spec},
    quantity::check_pod_spec_quantities,
    table::{AGE, NAME, age, key_values_cell, none_if_empty, s},
    typed,
    zero::{condition_times, object_at, omit_zero_counts, status_counts},
};
use crate::registry::FieldError;

/// A label selector as `kubectl` prints it: `app=web,tier in (a,b)`.
pub fn selector_string(selector: &Value) -> String {
    let mut parts: Vec<String> = selector["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    for e in selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = e["key"].as_str().unwrap_or("");
        let values: Vec<&str> = e["values"]
            .as_array()
            .map(|v| v.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        parts.push(match e["operator"].as_str().unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other}"),
        });
    }
    parts.join(",")
}

/// Whether a label selector (`matchLabels`, `matchExpressions`) selects `labels`. An empty
/// selector selects everything.
pub fn selector_matches(selector: &Value, labels: &Value) -> bool {
    let label = |k: &str| labels.get(k).and_then(Value::as_str);
    let labels_ok = selector["matchLabels"]
        .as_object()
        .is_none_or(|m| m.iter().all(|(k, v)| label(k) == v.as_str()));
    let exprs_ok = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e["key"].as_str().unwrap_or("");
            let in_values = |v: &str| {
                e["values"]
                    .as_array()
                    .is_some_and(|vs| vs.iter().any(|x| x.as_str() == Some(v)))
            };
            match e["operator"].as_str().unwrap_or("") {
                "In" => label(key).is_some_and(in_values),
                "NotIn" => !label(key).is_some_and(in_values),
                "Exists" => label(key).is_some(),
                "DoesNotExist" => label(key).is_none(),
                _ => false,
            }
        });
    labels_ok && exprs_ok
}

fn count(o: &Value, path: &[&str]) -> i64 {
    let mut v = o;
    for p in path {
        v = &v[*p];
    }
    v.as_i64().unwrap_or(0)
}

fn containers_cell(o: &Value, field: &str) -> Value {
    let names: Vec<&str> = o["spec"]["template"]["spec"]["containers"]
        .as_array()
        .map(|cs| cs.iter().filter_map(|c| c[field].as_str()).collect())
        .unwrap_or_default();
    none_if_empty(names.join(","))
}

const CONTAINERS: Column = Column {
    name: "Containers",
    type_: "string",
    format: "",
    description: "Names of each container in the template.",
    priority: 1,
    cell: |o, _| containers_cell(o, "name"),
};
const IMAGES: Column = Column {
    name: "Images",
    type_: "string",
    format: "",
    description: "Images referenced by each container in the template.",
    priority: 1,
    cell: |o, _| containers_cell(o, "image"),
};
const SELECTOR: Column = Column {
    name: "Selector",
    type_: "string",
    format: "",
    description: "Label selector for pods.",
    priority: 1,
    cell: |o, _| none_if_empty(selector_string(&o["spec"]["selector"])),
};

const fn int_column(
    name: &'static str,
    description: &'static str,
    cell: fn(&Value, i64) -> Value,
) -> Column {
    Column {
        name,
        type_: "integer",
        format: "",
        description,
        priority: 0,
        cell,
    }
}

/// A pod template with the defaults the API server gives templates on every write, so that
/// controllers compare templates written before a default existed with those written since
/// alike.
pub fn defaulted_template(template: &Value) -> Value {
    let mut t = template.clone();
    if let Some(spec) = child(&mut t, "spec") {
        default_pod_spec(spec);
    }
    t
}

/// Round-trips a workload through `K`, refusing first (400, as upstream's decoder) a
/// template whose resource quantities do not parse.
fn typed_template<K: serde::de::DeserializeOwned + serde::Serialize>(
    o: &Value,
) -> Result<Value, String> {
    check_pod_spec_quantities(&o["spec"]["template"]["spec"]).map_err(|e| e.to_string())?;
    typed::<K>(o)
}

/// The defaults every workload's pod template gets on every decode (upstream's generated
/// defaulters call `SetDefaults_PodSpec` and those under it on templates too; not
/// `SetDefaults_Pod`). The template's `metadata` (`ObjectMeta`, a non-pointer struct) is
/// written as `{}` when unset.
fn default_template(o: &mut Value) {
    if let Some(template) = o.pointer_mut("/spec/template")
        && template.is_object()
    {
        default_ptr(template, "metadata", json!({}));
    }
    if let Some(spec) = o.pointer_mut("/spec/template/spec")
        && spec.is_object()
    {
        default_pod_spec(spec);
    }
}

/// The object's `spec`, if it is an object.
fn spec_mut(o: &mut Value) -> Option<&mut Value> {
    child(o, "spec")
}

/// What upstream's `PrepareForCreate` of every workload does after the decode defaults: the
/// status starts empty (the zero status, with the counts Go writes unset: `counts`).
fn reset_status(o: &mut Value, counts: &[&str]) {
    o["status"] = json!({});
    status_counts(o, counts);
}

/// The counts of a ReplicaSet's status without `omitempty` (`ReplicaSetStatus`).
const REPLICA_SET_COUNTS: &[&str] = &["replicas"];

/// The counts of a DaemonSet's status without `omitempty` (`DaemonSetStatus`).
const DAEMON_SET_COUNTS: &[&str] = &[
    "currentNumberScheduled",
    "numberMisscheduled",
    "desiredNumberScheduled",
    "numberReady",
];

/// The non-pointer counts tagged `omitempty` of each workload's status
/// (`k8s.io/api/apps/v1`, `batch/v1` `types.go`), which Go leaves out when 0.
const DEPLOYMENT_OMITTED_ZEROS: &[&str] = &[
    "observedGeneration",
    "replicas",
    "updatedReplicas",
    "readyReplicas",
    "availableReplicas",
    "unavailableReplicas",
];
const REPLICA_SET_OMITTED_ZEROS: &[&str] = &[
    "fullyLabeledReplicas",
    "readyReplicas",
    "availableReplicas",
    "observedGeneration",
];
const DAEMON_SET_OMITTED_ZEROS: &[&str] = &[
    "observedGeneration",
    "updatedNumberScheduled",
    "numberAvailable",
    "numberUnavailable",
];
const JOB_OMITTED_ZEROS: &[&str] = &["active", "succeeded", "failed"];

/// An int-or-percent (`25%` or `1`) is well formed and not negative.
fn valid_int_or_percent(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.as_i64().is_some_and(|n| n >= 0),
        Value::String(s) => s
            .strip_suffix('%')
            .and_then(|p| p.parse::<u32>().ok())
            .is_some(),
        _ => false,
    }
}

fn non_negative(o: &Value, path: &[&str], field: &str, errors: &mut Vec<FieldError>) {
    let mut v = o;
    for p in path {
        v = &v[*p];
    }
    if let Some(n) = v.as_i64()
        && n < 0
    {
        errors.push(FieldError::invalid(
            field,
            v,
            "must be greater than or equal to 0",
        ));
    }
}

/// Upstream's `ValidatePodTemplateSpecForReplicaSet` and selector rules: a required,
/// non-empty selector that selects the template's labels, the template's containers, a
/// selector that does not change (apps/v1), and the allowed restart policies.
fn validate_selector_and_template(
    new: &Value,
    old: Option<&Value>,
    restart_policies: &[&str],
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &new["spec"];
    let selector = &spec["selector"];
    let empty = selector["matchLabels"]
        .as_object()
        .is_none_or(|m| m.is_empty())
        && selector["matchExpressions"]
            .as_array()
            .is_none_or(|m| m.is_empty());
    if selector.is_null() {
        errors.push(FieldError::required("spec.selector", ""));
    } else if empty {
        errors.push(FieldError::invalid(
            "spec.selector",
            selector,
            "empty selector is invalid for deployment",
        ));
    } else if !selector_matches(selector, &spec["template"]["metadata"]["labels"]) {
        errors.push(FieldError::invalid(
            "spec.template.metadata.labels",
            &spec["template"]["metadata"]["labels"],
            "`selector` does not match template `labels`",
        ));
    }
    errors.extend(validate_pod_spec(
        &spec["template"]["spec"],
        old.map(|o| &o["spec"]["template"]["spec"]),
        "spec.template.spec",
    ));
    let policy = spec["template"]["spec"]["restartPolicy"]
        .as_str()
        .unwrap_or("");
    let job = !restart_policies.contains(&"Always");
    if job && matches!(policy, "Always" | "") {
        // `ValidateJobSpec`: the pod default (Always) or none is a missing choice.
        errors.push(FieldError::required(
            "spec.template.spec.restartPolicy",
            "valid values: \"OnFailure\", \"Never\"",
        ));
    } else if !restart_policies.contains(&policy) {
        errors.push(FieldError::not_supported(
            "spec.template.spec.restartPolicy",
            &json!(policy),
            restart_policies,
        ));
    }
    if let Some(old) = old
        && old["spec"]["selector"] != *selector
    {
        errors.push(FieldError::invalid(
            "spec.selector",
            selector,
            "field is immutable",
        ));
    }
    errors
}

// ---------------------------------------------------------------- deployments

/// Upstream `SetDefaults_Deployment` and the template's defaults, on every decode: 1
/// replica, a RollingUpdate strategy of 25 % surge and 25 % unavailable, 10 revisions of
/// history, a progress deadline of 600 s.
fn default_deployment(o: &mut Value) {
    default_template(o);
    // The status is a non-pointer struct (`{}` when unset); `DeploymentCondition`'s times
    // are `metav1.Time` structs, `null` when unset.
    status_counts(o, &[]);
    omit_zero_counts(o, DEPLOYMENT_OMITTED_ZEROS);
    condition_times(o, &["lastUpdateTime", "lastTransitionTime"]);
    let Some(spec) = spec_mut(o) else {
        return;
    };
    default_ptr(spec, "replicas", json!(1));
    // `strategy` is a struct, not a pointer: an absent one is the zero strategy.
    default_ptr(spec, "strategy", json!({}));
    if let Some(strategy) = child(spec, "strategy") {
        default_str(strategy, "type", "RollingUpdate");
        if strategy["type"] == "RollingUpdate" {
            default_ptr(strategy, "rollingUpdate", json!({}));
            if let Some(rolling) = child(strategy, "rollingUpdate") {
                default_ptr(rolling, "maxUnavailable", json!("25%"));
                default_ptr(rolling, "maxSurge", json!("25%"));
            }
        }
    }
    default_ptr(spec, "revisionHistoryLimit", json!(10));
    default_ptr(spec, "progressDeadlineSeconds", json!(600));
}

fn prepare_deployment(o: &mut Value) {
    default_deployment(o);
    reset_status(o, &[]);
}

fn validate_deployment(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = validate_selector_and_template(new, old, &["Always"]);
    let spec = &new["spec"];
    non_negative(spec, &["replicas"], "spec.replicas", &mut errors);
    match spec["strategy"]["type"].as_str().unwrap_or("RollingUpdate") {
        "RollingUpdate" => {
            let ru = &spec["strategy"]["rollingUpdate"];
            for f in ["maxSurge", "maxUnavailable"] {
                if !ru[f].is_null() && !valid_int_or_percent(&ru[f]) {
                    errors.push(FieldError::invalid(
                        format!("spec.strategy.rollingUpdate.{f}"),
                        &ru[f],
                        "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
                    ));
                }
            }
            let zero = |v: &Value| v.is_null() || *v == json!(0) || *v == json!("0%");
            if zero(&ru["maxSurge"]) && zero(&ru["maxUnavailable"]) {
                errors.push(FieldError::invalid(
                    "spec.strategy.rollingUpdate.maxUnavailable",
                    &ru["maxUnavailable"],
                    "may not be 0 when `maxSurge` is 0",
                ));
            }
        }
        "Recreate" => {
            if !spec["strategy"]["rollingUpdate"].is_null() {
                errors.push(FieldError::forbidden(
                    "spec.strategy.rollingUpdate",
                    "may not be specified when strategy `type` is 'Recreate'",
                ));
            }
        }
        _ => errors.push(FieldError::not_supported(
            "spec.strategy.type",
            &spec["strategy"]["type"],
            &["Recreate", "RollingUpdate"],
        )),
    }
    errors
}

/// apps/v1 deployments.
pub static DEPLOYMENTS: ResourceDef = ResourceDef {
    group: "apps",
    version: "v1",
    kind: "Deployment",
    plural: "deployments",
    singular: "deployment",
    short_names: &["deploy"],
    categories: &["all"],
    namespaced: true,
    status: true,
    generation: true,
    extra_subresources: &["scale"],
    storage: "apps/deployments",
    name_rule: NameRule::Subdomain,
    typed: typed_template::<Deployment>,
    columns: &[
        NAME,
        Column {
            name: "Ready",
            type_: "string",
            format: "",
            description: "Number of the pod with ready state",
            priority: 0,
            cell: |o, _| {
                json!(format!(
                    "{}/{}",
                    count(o, &["status", "readyReplicas"]),
                    count(o, &["spec", "replicas"])
                ))
            },
        },
        // `printDeployment` writes these counts as integers under columns typed "string".
        Column {
            type_: "string",
            ..int_column(
                "Up-to-date",
                "Total number of non-terminated pods targeted by this deployment that have the desired template spec.",
                |o, _| json!(count(o, &["status", "updatedReplicas"])),
            )
        },
        Column {
            type_: "string",
            ..int_column(
                "Available",
                "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.",
                |o, _| json!(count(o, &["status", "availableReplicas"])),
            )
        },
        AGE,
        CONTAINERS,
        IMAGES,
        SELECTOR,
    ],
    field: |_, _| None,
    field_paths: &[],
    prepare_update: default_deployment,
    prepare_create: prepare_deployment,
    validate: validate_deployment,
    to_storage: identity,
    from_storage: identity,
};

// ---------------------------------------------------------------- replicasets

/// Upstream `SetDefaults_ReplicaSet` and the template's defaults, on every decode.
fn default_replica_set(o: &mut Value) {
    default_template(o);
    status_counts(o, REPLICA_SET_COUNTS);
    omit_zero_counts(o, REPLICA_SET_OMITTED_ZEROS);
    condition_times(o, &["lastTransitionTime"]);
    if let Some(spec) = spec_mut(o) {
        default_ptr(spec, "replicas", json!(1));
    }
}

fn prepare_replica_set(o: &mut Value) {
    default_replica_set(o);
    reset_status(o, REPLICA_SET_COUNTS);
}

fn validate_replica_set(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = validate_selector_and_template(new, old, &["Always"]);
    non_negative(&new["spec"], &["replicas"], "spec.replicas", &mut errors);
    non_negative(
        &new["spec"],
        &["minReadySeconds"],
        "spec.minReadySeconds",
        &mut errors,
    );
    errors
}

/// apps/v1 replicasets.
pub static REPLICA_SETS: ResourceDef = ResourceDef {
    group: "apps",
    version: "v1",
    kind: "ReplicaSet",
    plural: "replicasets",
    singular: "replicaset",
    short_names: &["rs"],
    categories: &["all"],
    namespaced: true,
    status: true,
    generation: true,
    extra_subresources: &["scale"],
    storage: "apps/replicasets",
    name_rule: NameRule::Subdomain,
    typed: typed_template::<ReplicaSet>,
    columns: &[
        NAME,
        int_column("Desired", "Number of desired pods.", |o, _| {
            json!(count(o, &["spec", "replicas"]))
        }),
        int_column("Current", "Number of actual pods.", |o, _| {
            json!(count(o, &["status", "replicas"]))
        }),
        int_column("Ready", "Number of ready pods.", |o, _| {
            json!(count(o, &["status", "readyReplicas"]))
        }),
        AGE,
        CONTAINERS,
        IMAGES,
        SELECTOR,
    ],
    field: |o, p| (p == "status.replicas").then(|| count(o, &["status", "replicas"]).to_string()),
    field_paths: &["status.replicas"],
    prepare_update: default_replica_set,
    prepare_create: prepare_replica_set,
    validate: validate_replica_set,
    to_storage: identity,
    from_storage: identity,
};

// ---------------------------------------------------------------- daemonsets

/// Upstream `SetDefaults_DaemonSet` and the template's defaults, on every decode: a
/// RollingUpdate strategy of 1 unavailable and no surge, 10 revisions of history.
fn default_daemon_set(o: &mut Value) {
    default_template(o);
    status_counts(o, DAEMON_SET_COUNTS);
    omit_zero_counts(o, DAEMON_SET_OMITTED_ZEROS);
    condition_times(o, &["lastTransitionTime"]);
    let Some(spec) = spec_mut(o) else {
        return;
    };
    // `updateStrategy` is a struct, not a pointer.
    default_ptr(spec, "updateStrategy", json!({}));
    if let Some(strategy) = child(spec, "updateStrategy") {
        default_str(strategy, "type", "RollingUpdate");
        if strategy["type"] == "RollingUpdate" {
            default_ptr(strategy, "rollingUpdate", json!({}));
            if let Some(rolling) = child(strategy, "rollingUpdate") {
                default_ptr(rolling, "maxUnavailable", json!(1));
                default_ptr(rolling, "maxSurge", json!(0));
            }
        }
    }
    default_ptr(spec, "revisionHistoryLimit", json!(10));
}

/// The annotation carrying a DaemonSet's template generation in apps/v1
/// (`appsv1.DeprecatedTemplateGeneration`): upstream's internal `Spec.TemplateGeneration`,
/// which the conversion to v1 writes into it and the conversion from v1 reads (and drops)
/// from it.
pub const TEMPLATE_GENERATION: &str = "deprecated.daemonset.template.generation";

/// A DaemonSet's template generation as upstream's conversion reads it
/// (`Convert_v1_DaemonSet_To_apps_DaemonSet`): the annotation as a base-10 int64; 0 when
/// there is none. `Err` for an annotation that does not parse, which upstream's decoder
/// refuses.
fn template_generation(o: &Value) -> Result<i64, String> {
    match o["metadata"]["annotations"][TEMPLATE_GENERATION].as_str() {
        None => Ok(0),
        Some(text) => text.parse::<i64>().map_err(|e| {
            let why = match e.kind() {
                std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                    "value out of range"
                }
                _ => "invalid syntax",
            };
            format!("strconv.ParseInt: parsing {}: {why}", json!(text))
        }),
    }
}

/// Writes `generation` as the template-generation annotation, as upstream's conversion to
/// v1 does on every answer (`Convert_apps_DaemonSet_To_v1_DaemonSet`).
fn set_template_generation(o: &mut Value, generation: i64) {
    let Some(metadata) = o.get_mut("metadata").filter(|m| m.is_object()) else {
        return;
    };
    if let Some(annotations) = object_at(metadata, "annotations") {
        annotations[TEMPLATE_GENERATION] = json!(generation.to_string());
    }
}

/// A new DaemonSet: the decode defaults, then upstream's `PrepareForCreate`: the status
/// starts empty and the template generation is the one given, at least 1.
fn prepare_daemon_set(o: &mut Value) {
    default_daemon_set(o);
    reset_status(o, DAEMON_SET_COUNTS);
    let given = template_generation(o).unwrap_or(0);
    set_template_generation(o, given.max(1));
}

/// An update of a DaemonSet (or of its status) against the stored `old`: upstream's
/// `PrepareForUpdate` keeps the old template generation whatever the write says, and counts
/// one more when the template changed (`daemonSetStrategy.PrepareForUpdate`; the status
/// strategy keeps the old spec, the template generation with it).
pub(super) fn update_daemon_set(new: &mut Value, old: &Value) {
    let mut generation = template_generation(old).unwrap_or(0);
    if !semantic_eq(
        &defaulted_template(&new["spec"]["template"]),
        &defaulted_template(&old["spec"]["template"]),
    ) {
        generation += 1;
    }
    set_template_generation(new, generation);
}

/// Round-trips a DaemonSet through its type, refusing first (400, as upstream's decoder) a
/// template-generation annotation that is not an integer.
fn typed_daemon_set(o: &Value) -> Result<Value, String> {
    template_generation(o)?;
    typed_template::<DaemonSet>(o)
}

fn validate_daemon_set(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = validate_selector_and_template(new, old, &["Always"]);
    match new["spec"]["updateStrategy"]["type"]
        .as_str()
        .unwrap_or("RollingUpdate")
    {
        "RollingUpdate" | "OnDelete" => {}
        _ => errors.push(FieldError::not_supported(
            "spec.updateStrategy.type",
            &new["spec"]["updateStrategy"]["type"],
            &["OnDelete", "RollingUpdate"],
        )),
    }
    errors
}

fn node_selector_cell(o: &Value) -> Value {
    key_values_cell(&o["spec"]["template"]["spec"]["nodeSelector"])
}

/// apps/v1 daemonsets.
pub static DAEMON_SETS: ResourceDef = ResourceDef {
    group: "apps",
    version: "v1",
    kind: "DaemonSet",
    plural: "daemonsets",
    singular: "daemonset",
    short_names: &["ds"],
    categories: &["all"],
    namespaced: true,
    status: true,
    generation: true,
    extra_subresources: &[],
    storage: "apps/daemonsets",
    name_rule: NameRule::Subdomain,
    typed: typed_daemon_set,
    columns: &[
        NAME,
        int_column(
            "Desired",
            "The total number of nodes that should be running the daemon pod.",
            |o, _| json!(count(o, &["status", "desiredNumberScheduled"])),
        ),
        int_column(
            "Current",
            "The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.",
            |o, _| json!(count(o, &["status", "currentNumberScheduled"])),
        ),
        int_column(
            "Ready",
            "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.",
            |o, _| json!(count(o, &["status", "numberReady"])),
        ),
        int_column(
            "Up-to-date",
            "The total number of nodes that are running updated daemon pod",
            |o, _| json!(count(o, &["status", "updatedNumberScheduled"])),
        ),
        int_column(
            "Available",
            "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available.",
            |o, _| json!(count(o, &["status", "numberAvailable"])),
        ),
        Column {
            name: "Node Selector",
            type_: "string",
            format: "",
            description: "NodeSelector is a selector which must be true for the pod to fit on a node.",
            priority: 0,
            cell: |o, _| node_selector_cell(o),
        },
        AGE,
        CONTAINERS,
        IMAGES,
        SELECTOR,
    ],
    field: |_, _| None,
    field_paths: &[],
    prepare_update: default_daemon_set,
    prepare_create: prepare_daemon_set,
    validate: validate_daemon_set,
    to_storage: identity,
    from_storage: identity,
};

// ---------------------------------------------------------------- jobs

/// The label carrying the Job's uid on its selector and pods.
pub const JOB_CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
/// The label carrying the Job's name on its pods.
pub const JOB_NAME: &str = "batch.kubernetes.io/job-name";

/// Upstream `SetDefaults_Job` and the template's defaults, on every decode: completions
/// and parallelism 1 when neither is set (else parallelism 1), a backoff limit of 6 (the
/// largest int32 with a per-index limit), the template's labels on a Job with none,
/// `NonIndexed`, not suspended, pods replaced once terminated or failed (failed only, with a
/// pod failure policy), no manual selector; a pod failure policy's condition patterns
/// match status `True`.
fn default_job(o: &mut Value) {
    default_template(o);
    // The status is a non-pointer struct (`{}` when unset); `JobCondition`'s times are
    // `metav1.Time` structs, `null` when unset.
    status_counts(o, &[]);
    omit_zero_counts(o, JOB_OMITTED_ZEROS);
    condition_times(o, &["lastProbeTime", "lastTransitionTime"]);
    let template_labels = o
        .pointer("/spec/template/metadata/labels")
        .filter(|l| l.is_object())
        .cloned();
    let Some(spec) = spec_mut(o) else {
        return;
    };
    if spec["completions"].is_null() && spec["parallelism"].is_null() {
        spec["completions"] = json!(1);
    }
    default_ptr(spec, "parallelism", json!(1));
    let backoff = if spec["backoffLimitPerIndex"].is_null() {
        6
    } else {
        i64::from(i32::MAX)
    };
    default_ptr(spec, "backoffLimit", json!(backoff));
    default_ptr(spec, "completionMode", json!("NonIndexed"));
    default_ptr(spec, "suspend", json!(false));
    let replacement = if spec["podFailurePolicy"].is_null() {
        "TerminatingOrFailed"
    } else {
        "Failed"
    };
    default_ptr(spec, "podReplacementPolicy", json!(replacement));
    default_ptr(spec, "manualSelector", json!(false));
    if let Some(rules) = spec
        .pointer_mut("/podFailurePolicy/rules")
        .and_then(Value::as_array_mut)
    {
        for rule in rules {
            let patterns = rule
                .get_mut("onPodConditions")
                .and_then(Value::as_array_mut);
            for pattern in patterns.into_iter().flatten() {
                default_str(pattern, "status", "True");
            }
        }
    }
    if let Some(labels) = template_labels
        && o["metadata"]["labels"]
            .as_object()
            .is_none_or(|l| l.is_empty())
        && o.get("metadata").is_some_and(Value::is_object)
    {
        o["metadata"]["labels"] = labels;
    }
}

/// A new Job: the decode defaults, then upstream's `PrepareForCreate`
/// (`pkg/registry/batch/job/strategy.go`, `generateSelector`): unless `manualSelector`, the
/// template gets the name and uid labels (and their legacy unprefixed forms) it does not
/// have already, and the selector the uid label unless it has one (a conflicting one is
/// left for validation); the status starts empty.
fn prepare_job(o: &mut Value) {
    default_job(o);
    reset_status(o, &[]);
    let uid = s(o, &["metadata", "uid"]);
    let name = s(o, &["metadata", "name"]);
    let Some(spec) = spec_mut(o) else {
        return;
    };
    if spec["manualSelector"] == true {
        return;
    }
    if let Some(labels) = child(spec, "template")
        .and_then(|t| object_at(t, "metadata"))
        .and_then(|m| object_at(m, "labels"))
    {
        for (k, v) in [
            ("job-name", &name),
            (JOB_NAME, &name),
            ("controller-uid", &uid),
            (JOB_CONTROLLER_UID, &uid),
        ] {
            default_ptr(labels, k, json!(v));
        }
    }
    if let Some(match_labels) =
        object_at(spec, "selector").and_then(|sel| object_at(sel, "matchLabels"))
    {
        default_ptr(match_labels, JOB_CONTROLLER_UID, json!(uid));
    }
}

fn validate_job(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = validate_selector_and_template(new, old, &["OnFailure", "Never"]);
    let spec = &new["spec"];
    for f in [
        "parallelism",
        "completions",
        "backoffLimit",
        "activeDeadlineSeconds",
    ] {
        non_negative(spec, &[f], &format!("spec.{f}"), &mut errors);
    }
    if let Some(old) = old
        && old["spec"]["completions"] != spec["completions"]
    {
        errors.push(FieldError::invalid(
            "spec.completions",
            &spec["completions"],
            "field is immutable",
        ));
    }
    // A template stored before a default existed compares as defaulted.
    if let Some(old) = old
        && defaulted_template(&old["spec"]["template"]) != defaulted_template(&spec["template"])
    {
        errors.push(FieldError::invalid(
            "spec.template",
            &spec["template"],
            "field is immutable",
        ));
    }
    errors
}

fn job_condition(o: &Value, kind: &str) -> bool {
    o["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == kind && c["status"] == "True")
    })
}

/// kubectl's Job STATUS column (v1.33 printers): Complete, Failed, FailureTarget,
/// SuccessCriteriaMet, Suspended, else Running.
fn job_status(o: &Value) -> &'static str {
    if job_condition(o, "Failed") {
        "Failed"
    } else if job_condition(o, "Complete") {
        "Complete"
    } else if job_condition(o, "FailureTarget") {
        "FailureTarget"
    } else if job_condition(o, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else if job_condition(o, "Suspended") {
        "Suspended"
    } else {
        "Running"
    }
}

fn job_duration(o: &Value, now: i64) -> Value {
    let start = o["status"]["startTime"]
        .as_str()
        .and_then(super::meta::parse_time);
    let Some(start) = start else {
        return json!("");
    };
    let end = o["status"]["completionTime"]
        .as_str()
        .and_then(super::meta::parse_time)
        .unwrap_or(now);
    let synthetic = json!({"t": jiff::Timestamp::from_second(now - (end - start)).map(|t| t.to_string()).unwrap_or_default()});
    json!(age(&synthetic, &["t"], now))
}

/// batch/v1 jobs.
pub static JOBS: ResourceDef = ResourceDef {
    group: "batch",
    version: "v1",
    kind: "Job",
    plural: "jobs",
    singular: "job",
    short_names: &[],
    categories: &["all"],
    namespaced: true,
    status: true,
    generation: true,
    extra_subresources: &[],
    storage: "batch/jobs",
    name_rule: NameRule::Subdomain,
    typed: typed_template::<Job>,
    columns: &[
        NAME,
        Column {
            name: "Status",
            type_: "string",
            format: "",
            description: "Status of the job.",
            priority: 0,
            cell: |o, _| json!(job_status(o)),
        },
        Column {
            name: "Completions",
            type_: "string",
            format: "",
            description: "The desired number of successfully finished pods the job should be run with.",
            priority: 0,
            cell: |o, _| {
                let succeeded = count(o, &["status", "succeeded"]);
                json!(match o["spec"]["completions"].as_i64() {
                    Some(c) => format!("{succeeded}/{c}"),
                    None => format!("{succeeded}/1 of {}", count(o, &["spec", "parallelism"])),
                })
            },
        },
        Column {
            name: "Duration",
            type_: "string",
            format: "",
            description: "Time required to complete the job.",
            priority: 0,
            cell: job_duration,
        },
        AGE,
        CONTAINERS,
        IMAGES,
        SELECTOR,
    ],
    field: |o, p| {
        (p == "status.successful").then(|| count(o, &["status", "succeeded"]).to_string())
    },
    field_paths: &["status.successful"],
    prepare_update: default_job,
    prepare_create: prepare_job,
    validate: validate_job,
    to_storage: identity,
    from_storage: identity,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(spec: Value) -> Value {
        json!({"metadata": {"name": "web", "uid": "u1"}, "spec": spec})
    }

    fn template(labels: Value) -> Value {
        json!({"metadata": {"labels": labels}, "spec": {"containers": [{"name": "nginx", "image": "nginx"}]}})
    }

    /// Upstream `SetDefaults_Deployment`: 1 replica, RollingUpdate 25 %/25 %, history 10,
    /// progress deadline 600 s; and the template gets the pod defaults.
    #[test]
    fn deployment_defaults() {
        let mut d = deployment(
            json!({"selector": {"matchLabels": {"app": "web"}}, "template": template(json!({"app": "web"}))}),
        );
        prepare_deployment(&mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(
            d["spec"]["strategy"]["rollingUpdate"],
            json!({"maxSurge": "25%", "maxUnavailable": "25%"})
        );
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
        assert!(validate_deployment(&d, None).is_empty());
        // kubectl create deployment writes `strategy: {}`.
        let mut k = deployment(
            json!({"strategy": {}, "selector": {"matchLabels": {"app": "web"}}, "template": template(json!({"app": "web"}))}),
        );
        prepare_deployment(&mut k);
        assert_eq!(k["spec"]["strategy"]["type"], "RollingUpdate");
        assert!(validate_deployment(&k, None).is_empty());
    }

    /// Upstream `ValidateDeploymentSpec`: the selector must select the template's labels,
    /// is immutable in apps/v1, replicas are not negative, maxSurge and maxUnavailable are
    /// not both 0.
    #[test]
    fn deployment_validation() {
        let mut d = deployment(
            json!({"replicas": -1, "selector": {"matchLabels": {"app": "web"}},
            "template": template(json!({"app": "other"})),
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}}}),
        );
        prepare_deployment(&mut d);
        let fields: Vec<String> = validate_deployment(&d, None)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "spec.template.metadata.labels",
                "spec.replicas",
                "spec.strategy.rollingUpdate.maxUnavailable"
            ]
        );
        let mut old = deployment(
            json!({"selector": {"matchLabels": {"app": "old"}}, "template": template(json!({"app": "old"}))}),
        );
        prepare_deployment(&mut old);
        let mut new = old.clone();
        new["spec"]["selector"] = json!({"matchLabels": {"app": "new"}});
        new["spec"]["template"]["metadata"]["labels"] = json!({"app": "new"});
        let errors = validate_deployment(&new, Some(&old));
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "spec.selector");
    }

    /// Upstream `generateSelector` and `SetDefaults_Job`; `ValidateJobSpec` allows only
    /// OnFailure and Never.
    #[test]
    fn job_defaults_selector_and_restart_policy() {
        let mut j = json!({"metadata": {"name": "pi", "uid": "u-1"}, "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "pi", "image": "perl"}]}}}});
        prepare_job(&mut j);
        assert_eq!(
            j["spec"]["selector"],
            json!({"matchLabels": {JOB_CONTROLLER_UID: "u-1"}})
        );
        assert_eq!(j["spec"]["template"]["metadata"]["labels"][JOB_NAME], "pi");
        assert_eq!(
            (
                j["spec"]["completions"].as_i64(),
                j["spec"]["parallelism"].as_i64(),
                j["spec"]["backoffLimit"].as_i64()
            ),
            (Some(1), Some(1), Some(6))
        );
        assert!(validate_job(&j, None).is_empty());
        j["spec"]["template"]["spec"]["restartPolicy"] = json!("Always");
        let errors = validate_job(&j, None);
        assert_eq!(errors[0].field, "spec.template.spec.restartPolicy");
    }

    /// `k8s.io/api` `PodTemplateSpec.ObjectMeta` and `Container.Resources` are non-pointer
    /// structs: Go writes a workload's template `metadata` and each container's `resources`
    /// (init and ephemeral ones too) as `{}` when unset, on every write.
    #[test]
    fn templates_carry_metadata_and_container_resources() {
        for default in [
            default_deployment as fn(&mut Value),
            default_replica_set,
            default_daemon_set,
            default_job,
        ] {
            let mut o = json!({"metadata": {"name": "w"}, "spec": {"template": {"spec": {
                "containers": [{"name": "c", "image": "i"}],
                "initContainers": [{"name": "i", "image": "i", "resources": {"limits": {"cpu": "1"}}}]}}}});
            default(&mut o);
            let template = &o["spec"]["template"];
            assert_eq!(template["metadata"], json!({}));
            assert_eq!(template["spec"]["containers"][0]["resources"], json!({}));
            assert_eq!(
                template["spec"]["initContainers"][0]["resources"],
                json!({"limits": {"cpu": "1"}})
            );
        }
    }

    /// Upstream `PrepareForCreate` of each workload starts from the zero status, which Go
    /// writes with the counts that have no `omitempty` (`ReplicaSetStatus.Replicas`; the
    /// DaemonSet's current, misscheduled, desired and ready numbers); a status write
    /// without them reads the same, a count tagged `omitempty` is left out when 0, and a
    /// condition's unset times are `null`.
    #[test]
    fn workload_statuses_carry_the_counts_go_always_writes() {
        let created = |prepare: fn(&mut Value)| {
            let mut o = json!({"metadata": {"name": "w"}, "spec": {"template": {"spec": {"containers": []}}},
                "status": {"replicas": 9}});
            prepare(&mut o);
            o["status"].clone()
        };
        assert_eq!(created(prepare_replica_set), json!({"replicas": 0}));
        assert_eq!(
            created(prepare_daemon_set),
            json!({"currentNumberScheduled": 0, "numberMisscheduled": 0,
                "desiredNumberScheduled": 0, "numberReady": 0})
        );
        assert_eq!(created(prepare_deployment), json!({}));
        assert_eq!(created(prepare_job), json!({}));
        let mut status_write = json!({"status": {"numberReady": 2,
            "conditions": [{"type": "X", "status": "True"}]}});
        default_daemon_set(&mut status_write);
        assert_eq!(status_write["status"]["numberReady"], 2);
        assert_eq!(status_write["status"]["desiredNumberScheduled"], 0);
        assert_eq!(
            status_write["status"]["conditions"][0]["lastTransitionTime"],
            Value::Null
        );
        let mut deployment_status = json!({"status": {"conditions": [{"type": "Available"}]}});
        default_deployment(&mut deployment_status);
        assert_eq!(
            deployment_status["status"]["conditions"][0],
            json!({"type": "Available", "lastUpdateTime": null, "lastTransitionTime": null})
        );
        let mut counted =
            json!({"status": {"replicas": 0, "readyReplicas": 0, "availableReplicas": 1}});
        default_deployment(&mut counted);
        assert_eq!(counted["status"], json!({"availableReplicas": 1}));
        let mut job_status =
            json!({"status": {"active": 0, "failed": 0, "conditions": [{"type": "Complete"}]}});
        default_job(&mut job_status);
        assert_eq!(job_status["status"].get("active"), None);
        assert_eq!(
            job_status["status"]["conditions"][0],
            json!({"type": "Complete", "lastProbeTime": null, "lastTransitionTime": null})
        );
    }

    fn daemon_set(annotations: Value, image: &str) -> Value {
        json!({"metadata": {"name": "ds", "annotations": annotations},
            "spec": {"selector": {"matchLabels": {"app": "ds"}},
                "template": {"metadata": {"labels": {"app": "ds"}},
                    "spec": {"containers": [{"name": "c", "image": image}]}}}})
    }

    /// Upstream `daemonSetStrategy.PrepareForCreate` (a template generation below 1 is 1)
    /// and the apps/v1 conversions (`pkg/apis/apps/v1/conversion.go`), which read the
    /// generation from the `deprecated.daemonset.template.generation` annotation and write
    /// it back on every answer.
    #[test]
    fn daemon_sets_are_created_with_their_template_generation() {
        let mut plain =
            json!({"metadata": {"name": "ds"}, "spec": {"template": {"spec": {"containers": []}}}});
        prepare_daemon_set(&mut plain);
        assert_eq!(
            plain["metadata"]["annotations"],
            json!({TEMPLATE_GENERATION: "1"})
        );
        let mut given = daemon_set(json!({TEMPLATE_GENERATION: "+7", "a": "b"}), "nginx");
        prepare_daemon_set(&mut given);
        assert_eq!(
            given["metadata"]["annotations"],
            json!({TEMPLATE_GENERATION: "7", "a": "b"})
        );
        let mut zero = daemon_set(json!({TEMPLATE_GENERATION: "0"}), "nginx");
        prepare_daemon_set(&mut zero);
        assert_eq!(zero["metadata"]["annotations"][TEMPLATE_GENERATION], "1");
    }

    /// Upstream `daemonSetStrategy.PrepareForUpdate`: the template generation is the stored
    /// one whatever the write says, one more when the template changed (a template stored
    /// before a default existed compares as defaulted).
    #[test]
    fn daemon_set_updates_count_template_changes() {
        let mut old = daemon_set(json!({}), "nginx");
        prepare_daemon_set(&mut old);
        old["metadata"]["annotations"][TEMPLATE_GENERATION] = json!("3");
        let mut same = daemon_set(json!({TEMPLATE_GENERATION: "9"}), "nginx");
        same["spec"]["minReadySeconds"] = json!(5);
        default_daemon_set(&mut same);
        update_daemon_set(&mut same, &old);
        assert_eq!(same["metadata"]["annotations"][TEMPLATE_GENERATION], "3");
        let mut dropped = daemon_set(Value::Null, "nginx");
        dropped["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        default_daemon_set(&mut dropped);
        update_daemon_set(&mut dropped, &old);
        assert_eq!(
            dropped["metadata"]["annotations"],
            json!({TEMPLATE_GENERATION: "3"})
        );
        let mut changed = daemon_set(json!({TEMPLATE_GENERATION: "3"}), "nginx:2");
        default_daemon_set(&mut changed);
        update_daemon_set(&mut changed, &old);
        assert_eq!(changed["metadata"]["annotations"][TEMPLATE_GENERATION], "4");
    }

    /// Upstream `Convert_v1_DaemonSet_To_apps_DaemonSet` parses the annotation with
    /// `strconv.ParseInt`; a value that does not parse fails the decode (a 400).
    #[test]
    fn daemon_set_template_generation_must_be_an_integer() {
        let bad = daemon_set(json!({TEMPLATE_GENERATION: "x1"}), "nginx");
        assert_eq!(
            typed_daemon_set(&bad).unwrap_err(),
            "strconv.ParseInt: parsing \"x1\": invalid syntax"
        );
        let huge = daemon_set(
            json!({TEMPLATE_GENERATION: "99999999999999999999"}),
            "nginx",
        );
        assert_eq!(
            typed_daemon_set(&huge).unwrap_err(),
            "strconv.ParseInt: parsing \"99999999999999999999\": value out of range"
        );
        assert!(typed_daemon_set(&daemon_set(json!({TEMPLATE_GENERATION: "2"}), "nginx")).is_ok());
    }

    /// Upstream `generateSelector` (`pkg/registry/batch/job/strategy.go`): the name and uid
    /// labels are added to the template only where it has none of its own, and the uid
    /// label to the selector's `matchLabels` only where missing; the rest of a given
    /// selector stays (validation judges it).
    #[test]
    fn job_selector_generation_keeps_what_is_given() {
        let mut j = json!({"metadata": {"name": "pi", "uid": "u-1"}, "spec": {
            "selector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
            "template": {"metadata": {"labels": {"job-name": "mine", "tier": "a"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "pi", "image": "perl"}]}}}});
        prepare_job(&mut j);
        assert_eq!(
            j["spec"]["template"]["metadata"]["labels"],
            json!({"job-name": "mine", "tier": "a", JOB_NAME: "pi",
                "controller-uid": "u-1", JOB_CONTROLLER_UID: "u-1"})
        );
        assert_eq!(
            j["spec"]["selector"],
            json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}],
                "matchLabels": {JOB_CONTROLLER_UID: "u-1"}})
        );
        let mut manual = json!({"metadata": {"name": "pi", "uid": "u-1"}, "spec": {
            "manualSelector": true, "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}}}});
        prepare_job(&mut manual);
        assert_eq!(
            manual["spec"]["selector"],
            json!({"matchLabels": {"a": "b"}})
        );
        assert_eq!(
            manual["spec"]["template"]["metadata"]["labels"],
            json!({"a": "b"})
        );
    }

    #[test]
    fn selectors() {
        let sel = json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]});
        assert!(selector_matches(&sel, &json!({"app": "web", "tier": "b"})));
        assert!(!selector_matches(&sel, &json!({"app": "web"})));
        assert_eq!(selector_string(&sel), "app=web,tier in (a,b)");
    }
}
