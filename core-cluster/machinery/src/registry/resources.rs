//! The served resources. Adding one is a `ResourceDef` literal: identity, the k8s-openapi
//! type, columns and (where the resource has rules) defaulting and validation, listed in
//! [`super::ALL`]. The pod spec's rules are in `pod_spec.rs`.

use k8s_openapi::api::{
    authentication::v1::{SelfSubjectReview, TokenReview},
    coordination::v1::Lease,
    core::v1::{
        ConfigMap, Endpoints, Event, Namespace, Node, Pod, Secret, Service, ServiceAccount,
    },
    discovery::v1::EndpointSlice,
    events::v1::Event as EventsV1Event,
};
use serde_json::{Value, json};

use super::{
    Column, NameRule, ResourceDef,
    events::{
        core_event_fields, events_v1_fields, identity, semantic_eq, to_core, to_events_v1,
        validate_core_event, validate_events_v1_event,
    },
    meta::{config_map_key_errors, is_qualified_name, str_at},
    no_defaults,
    pod_spec::{
        default_pod, default_ptr, default_str, defaulted_volumes, pod_qos_class, validate_pod_spec,
    },
    quantity::check_pod_spec_quantities,
    table::{AGE, NAME, age, key_values_cell, none_if_empty, s},
    typed,
    zero::{always, condition_times, object_at},
};
use crate::registry::FieldError;

/// Resources that are never stored: a create is answered at once and nothing else is
/// served (the `authentication.k8s.io` and `authorization.k8s.io` reviews), as `storage`
/// entries. Discovery lists `create` alone for them, as kube-apiserver does.
pub static CREATE_ONLY: &[&str] = &[
    "authentication.k8s.io/tokenreviews",
    "authentication.k8s.io/selfsubjectreviews",
    "authorization.k8s.io/subjectaccessreviews",
    "authorization.k8s.io/localsubjectaccessreviews",
    "authorization.k8s.io/selfsubjectaccessreviews",
    "authorization.k8s.io/selfsubjectrulesreviews",
];

fn no_fields(_: &Value, _: &str) -> Option<String> {
    None
}

fn no_rules(_: &Value, _: Option<&Value>) -> Vec<FieldError> {
    Vec::new()
}

// ---------------------------------------------------------------- namespaces

/// The label upstream gives every namespace, its name (`v1.LabelMetadataName`).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Upstream's defaults of a Namespace on every decode (`SetDefaults_Namespace`,
/// `SetDefaults_NamespaceStatus`; the namespace strategy's `Canonicalize` sets the label
/// again once a generated name is known): the `kubernetes.io/metadata.name` label is the
/// name (whatever the write said), the phase `Active` when unset; and what Go always
/// writes: `spec` and `status` (non-pointer structs) and the conditions' `lastTransitionTime`.
fn default_namespace(o: &mut Value) {
    if !o.is_object() {
        return;
    }
    let name = s(o, &["metadata", "name"]);
    if !name.is_empty()
        && let Some(metadata) = o.get_mut("metadata").filter(|m| m.is_object())
        && let Some(labels) = object_at(metadata, "labels")
    {
        labels[NAMESPACE_NAME_LABEL] = json!(name);
    }
    object_at(o, "spec");
    if let Some(status) = object_at(o, "status") {
        default_str(status, "phase", "Active");
    }
    condition_times(o, &["lastTransitionTime"]);
}

/// A new Namespace: the decode defaults, then upstream's `PrepareForCreate`: the status is
/// `Active`, and the `kubernetes` finalizer is added to those given.
fn prepare_namespace(o: &mut Value) {
    default_namespace(o);
    o["status"] = json!({"phase": "Active"});
    if let Some(spec) = object_at(o, "spec") {
        let finalizers = spec
            .get_mut("finalizers")
            .filter(|f| f.is_array())
            .and_then(Value::as_array_mut);
        match finalizers {
            Some(list) => {
                if !list.iter().any(|f| f == "kubernetes") {
                    list.push(json!("kubernetes"));
                }
            }
            None => spec["finalizers"] = json!(["kubernetes"]),
        }
    }
}

/// core/v1 namespaces.
pub static NAMESPACES: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    kind: "Namespace",
    plural: "namespaces",
    singular: "namespace",
    short_names: &["ns"],
    categories: &[],
    namespaced: false,
    status: true,
    generation: false,
    extra_subresources: &["finalize"],
    storage: "core/namespaces",
    name_rule: NameRule::Label,
    typed: typed::<Namespace>,
    columns: &[
        NAME,
        Column {
            name: "Status",
            type_: "string",
            format: "",
            description: "The status of the namespace",
            priority: 0,
            cell: |o, _| json!(s(o, &["status", "phase"])),
        },
        AGE,
    ],
    field: |o, p| (p == "status.phase").then(|| s(o, &["status", "phase"])),
    field_paths: &["status.phase"],
    prepare_update: default_namespace,
    prepare_create: prepare_namespace,
    validate: no_rules,
    to_storage: identity,
    from_storage: identity,
};

// ---------------------------------------------------------------- nodes

fn node_ready(o: &Value) -> String {
    let ready = o["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .map(|c| c["status"].as_str().unwrap_or("Unknown").to_owned());
    let mut status = match ready.as_deref() {
        Some("True") => "Ready".to_owned(),
        Some("False") => "NotReady".to_owned(),
        _ => "Unknown".to_owned(),
    };
    if o["spec"]["unschedulable"].as_bool() == Some(true) {
        status.push_str(",SchedulingDisabled");
    }
    status
}

fn node_roles(o: &Value) -> String {
    let mut roles: Vec<&str> = o["metadata"]["labels"]
        .as_object()
        .map(|l| {
            l.iter()
                .filter_map(|(k, v)| {
                    k.strip_prefix("node-role.kubernetes.io/")
                        .filter(|r| !r.is_empty())
                        .or_else(|| (k == "kubernetes.io/role").then(|| v.as_str().unwrap_or("")))
                })
                .collect()
        })
        .unwrap_or_default();
    roles.sort_unstable();
    if roles.is_empty() {
        "<none>".to_owned()
    } else {
        roles.join(",")
    }
}

fn node_address(o: &Value, type_: &str) -> Value {
    let found = o["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == type_))
        .and_then(|a| a["address"].as_str())
        .unwrap_or("");
    none_if_empty(found.to_owned())
}

/// `printNode`'s OS image, kernel and runtime cells: `<unknown>` when the kubelet has not
/// reported them.
fn node_info(field: &'static str) -> impl Fn(&Value) -> Value {
    move |o| {
        let value = s(o, &["status", "nodeInfo", field]);
        json!(if value.is_empty() {
            "<unknown>".to_owned()
        } else {
            value
        })
    }
}

fn validate_node(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &new["spec"];
    if let Some(old) = old {
        let old_pid = old["spec"]["providerID"].as_str().unwrap_or("");
        if !old_pid.is_empty() && spec["providerID"].as_str().unwrap_or("") != old_pid {
            errors.push(FieldError::forbidden(
                "spec.providerID",
                "node updates may not change providerID except from \"\" to valid",
            ));
        }
        let old_cidrs = &old["spec"]["podCIDRs"];
        if old_cidrs.as_array().is_some_and(|a| !a.is_empty()) && spec["podCIDRs"] != *old_cidrs {
            errors.push(FieldError::forbidden(
                "spec.podCIDRs",
                "node updates may not change podCIDR except from \"\" to valid",
            ));
        }
    }
    if let Some(cidrs) = spec["podCIDRs"].as_array() {
        let mut families = Vec::new();
        for (i, c) in cidrs.iter().enumerate() {
            match c.as_str().and_then(|c| c.parse::<ipnet::IpNet>().ok()) {
                Some(net) => families.push(net.addr().is_ipv6()),
                None => errors.push(FieldError::invalid(
                    format!("spec.podCIDRs[{i}]"),
                    c,
                    "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
                )),
            }
        }
        if cidrs.len() > 2 || (families.len() == 2 && families[0] == families[1]) {
            errors.push(FieldError::invalid(
                "spec.podCIDRs",
                &spec["podCIDRs"],
                "may specify no more than one CIDR for each IP family",
            ));
        }
        if let Some(first) = cidrs.first()
            && spec["podCIDR"].as_str().is_some_and(|p| !p.is_empty())
            && spec["podCIDR"] != *first
        {
            errors.push(FieldError::invalid(
                "spec.podCIDRs",
                &spec["podCIDRs"],
                "the first CIDR must equal spec.podCIDR",
            ));
        }
    }
    validate_taints(&spec["taints"], "spec.taints", &mut errors);
    errors
}

fn validate_taints(taints: &Value, field: &str, errors: &mut Vec<FieldError>) {
    let Some(taints) = taints.as_array() else {
        return;
    };
    let mut seen = Vec::new();
    for (i, t) in taints.iter().enumerate() {
        let key = t["key"].as_str().unwrap_or("");
        if !is_qualified_name(key) {
            errors.push(FieldError::invalid(
                format!("{field}[{i}].key"),
                &t["key"],
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            ));
        }
        let effect = t["effect"].as_str().unwrap_or("");
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            errors.push(FieldError::not_supported(
                format!("{field}[{i}].effect"),
                &t["effect"],
                &["NoSchedule", "PreferNoSchedule", "NoExecute"],
            ));
        }
        if seen.contains(&(key, effect)) {
            errors.push(FieldError::duplicate(
                format!("{field}[{i}]"),
                &json!(format!("{key}:{effect}")),
            ));
        }
        seen.push((key, effect));
    }
}

/// The fields of `NodeSystemInfo` without `omitempty`, which Go writes as `""` when unset.
const NODE_INFO_FIELDS: &[&str] = &[
    "machineID",
    "systemUUID",
    "bootID",
    "kernelVersion",
    "osImage",
    "containerRuntimeVersion",
    "kubeletVersion",
    "kubeProxyVersion",
    "operatingSystem",
    "architecture",
];

/// Upstream's defaults of a Node on every decode (`SetObjectDefaults_Node`:
/// `SetDefaults_NodeStatus` copies the capacity into an unset allocatable) and what Go
/// always writes: `spec` and `status`, the status's `daemonEndpoints` (with the kubelet's
/// `Port`) and `nodeInfo` (non-pointer structs, their fields without `omitempty`), and the
/// conditions' `lastHeartbeatTime` and `lastTransitionTime`.
fn default_node(o: &mut Value) {
    if !o.is_object() {
        return;
    }
    object_at(o, "spec");
    if let Some(status) = object_at(o, "status") {
        if status.get("allocatable").is_none_or(Value::is_null)
            && let Some(capacity) = status.get("capacity").filter(|c| c.is_object()).cloned()
        {
            status["allocatable"] = capacity;
        }
        if let Some(endpoint) =
            object_at(status, "daemonEndpoints").and_then(|d| object_at(d, "kubeletEndpoint"))
        {
            always(endpoint, &["Port"], &json!(0));
        }
        if let Some(info) = object_at(status, "nodeInfo") {
            always(info, NODE_INFO_FIELDS, &json!(""));
        }
    }
    condition_times(o, &["lastHeartbeatTime", "lastTransitionTime"]);
}

/// core/v1 nodes.
pub static NODES: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    kind: "Node",
    plural: "nodes",
    singular: "node",
    short_names: &["no"],
    categories: &[],
    namespaced: false,
    status: true,
    generation: false,
    extra_subresources: &[],
    storage: "core/nodes",
    name_rule: NameRule::Subdomain,
    typed: typed::<Node>,
    columns: &[
        NAME,
        Column {
            name: "Status",
            type_: "string",
            format: "",
            description: "The status of the node",
            priority: 0,
            cell: |o, _| json!(node_ready(o)),
        },
        Column {
            name: "Roles",
            type_: "string",
            format: "",
            description: "The roles of the node",
            priority: 0,
            cell: |o, _| json!(node_roles(o)),
        },
        AGE,
        Column {
            name: "Version",
            type_: "string",
            format: "",
            description: "Kubelet Version reported by the node.",
            priority: 0,
            cell: |o, _| json!(s(o, &["status", "nodeInfo", "kubeletVersion"])),
        },
        Column {
            name: "Internal-IP",
            type_: "string",
            format: "",
            description: "List of addresses reachable to the node.",
            priority: 1,
            cell: |o, _| node_address(o, "InternalIP"),
        },
        Column {
            name: "External-IP",
            type_: "string",
            format: "",
            description: "List of addresses reachable to the node.",
            priority: 1,
            cell: |o, _| node_address(o, "ExternalIP"),
        },
        Column {
            name: "OS-Image",
            type_: "string",
            format: "",
            description: "OS Image reported by the node from /etc/os-release.",
            priority: 1,
            cell: |o, _| node_info("osImage")(o),
        },
        Column {
            name: "Kernel-Version",
            type_: "string",
            format: "",
            description: "Kernel Version reported by the node.",
            priority: 1,
            cell: |o, _| node_info("kernelVersion")(o),
        },
        Column {
            name: "Container-Runtime",
            type_: "string",
            format: "",
            description: "Container Runtime Version reported by the node.",
            priority: 1,
            cell: |o, _| node_info("containerRuntimeVersion")(o),
        },
    ],
    field: |o, p| {
        (p == "spec.unschedulable").then(|| {
            o["spec"]["unschedulable"]
                .as_bool()
                .unwrap_or(false)
                .to_string()
        })
    },
    field_paths: &["spec.unschedulable"],
    prepare_update: default_node,
    prepare_create: default_node,
    validate: validate_node,
    to_storage: identity,
    from_storage: identity,
};

// ---------------------------------------------------------------- pods

/// Upstream's `PrepareForCreate` of pods after the decode defaults ([`default_pod`]): the
/// admission defaults of pods (not of templates), and the status: `Pending` with the QoS
/// class of the defaulted spec (`qos.GetPodQOS`).
fn prepare_pod(o: &mut Value) {
    default_pod(o);
    let spec = &mut o["spec"];
    if spec.is_object() {
        for (field, value) in [
            ("preemptionPolicy", json!("PreemptLowerPriority")),
            ("priority", json!(0)),
        ] {
            default_ptr(spec, field, value);
        }
        // The NoExecute tolerations come from the API server's DefaultTolerationSeconds
        // admission plugin, with its flags' seconds.
    }
    o["status"] = json!({
        "phase": "Pending",
        "qosClass": pod_qos_class(&o["spec"]),
    });
}

/// Upstream decodes quantities with the object (`resource.Quantity.UnmarshalJSON`): a pod
/// whose requests, limits or overhead hold something else is a 400 before validation.
fn typed_pod(o: &Value) -> Result<Value, String> {
    check_pod_spec_quantities(&o["spec"]).map_err(|e| e.to_string())?;
    typed::<Pod>(o)
}

/// Upstream `ValidatePodUpdate`'s refusal of a change to the pod's spec.
const POD_SPEC_IMMUTABLE: &str = "pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

fn validate_pod(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = validate_pod_spec(&new["spec"], old.map(|o| &o["spec"]), "spec");
    if let Some(old) = old {
        let old_node = old["spec"]["nodeName"].as_str().unwrap_or("");
        if !old_node.is_empty() && new["spec"]["nodeName"].as_str().unwrap_or("") != old_node {
            errors.push(FieldError::forbidden("spec.nodeName", POD_SPEC_IMMUTABLE));
        }
        // `ValidatePodUpdate`: the pod's identity and what it mounts (the service
        // account's token volume among them) are fixed once it exists.
        for field in [
            "serviceAccountName",
            "serviceAccount",
            "automountServiceAccountToken",
            "volumes",
        ] {
            let (mut was, mut is) = (old["spec"][field].clone(), new["spec"][field].clone());
            if field == "volumes" {
                // A pod stored before a volume default existed compares as defaulted.
                (was, is) = (defaulted_volumes(&was), defaulted_volumes(&is));
            }
            if was != is {
                errors.push(FieldError::forbidden("spec", POD_SPEC_IMMUTABLE));
                break;
            }
        }
    }
    errors
}

fn pod_ready(o: &Value, _: i64) -> Value {
    let total = o["spec"]["containers"].as_array().map_or(0, Vec::len);
    let ready = o["status"]["containerStatuses"]
        .as_array()
        .map_or(0, |cs| cs.iter().filter(|c| c["ready"] == true).count());
    json!(format!("{ready}/{total}"))
}

fn pod_status(o: &Value, _: i64) -> Value {
    if !o["metadata"]["deletionTimestamp"].is_null() {
        return json!("Terminating");
    }
    let reason = s(o, &["status", "reason"]);
    if !reason.is_empty() {
        return json!(reason);
    }
    json!(s(o, &["status", "phase"]))
}

/// `printPod`'s Restarts cell: the count as a string.
fn pod_restarts(o: &Value, _: i64) -> Value {
    let restarts = o["status"]["containerStatuses"].as_array().map_or(0, |cs| {
        cs.iter()
            .map(|c| c["restartCount"].as_i64().unwrap_or(0))
            .sum::<i64>()
    });
    json!(restarts.to_string())
}

/// core/v1 pods.
pub static PODS: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    kind: "Pod",
    plural: "pods",
    singular: "pod",
    short_names: &["po"],
    categories: &["all"],
    namespaced: true,
    status: true,
    generation: true,
    extra_subresources: &["binding", "eviction", "ephemeralcontainers"],
    storage: "core/pods",
    name_rule: NameRule::Subdomain,
    typed: typed_pod,
    columns: &[
        NAME,
        Column {
            name: "Ready",
            type_: "string",
            format: "",
            description: "The aggregate readiness state of this pod for accepting traffic.",
            priority: 0,
            cell: pod_ready,
        },
        Column {
            name: "Status",
            type_: "string",
            format: "",
            description: "The aggregate status of the containers in this pod.",
            priority: 0,
            cell: pod_status,
        },
        Column {
            name: "Restarts",
            type_: "string",
            format: "",
            description: "The number of times the containers in this pod have been restarted.",
            priority: 0,
            cell: pod_restarts,
        },
        AGE,
        Column {
            name: "IP",
            type_: "string",
            format: "",
            description: "IP address allocated to the pod.",
            priority: 1,
            cell: |o, _| none_if_empty(s(o, &["status", "podIP"])),
        },
        Column {
            name: "Node",
            type_: "string",
            format: "",
            description: "Name of the Node this pod is assigned to.",
            priority: 1,
            cell: |o, _| none_if_empty(s(o, &["spec", "nodeName"])),
        },
        Column {
            name: "Nominated Node",
            type_: "string",
            format: "",
            description: "Name of the Node this pod is nominated to.",
            priority: 1,
            cell: |o, _| none_if_empty(s(o, &["status", "nominatedNodeName"])),
        },
        Column {
            name: "Readiness Gates",
            type_: "string",
            format: "",
            description: "Readiness gates.",
            priority: 1,
            cell: |_, _| json!("<none>"),
        },
    ],
    field: |o, p| match p {
        "spec.nodeName" => Some(s(o, &["spec", "nodeName"])),
        "spec.restartPolicy" => Some(s(o, &["spec", "restartPolicy"])),
        "spec.schedulerName" => Some(s(o, &["spec", "schedulerName"])),
        "spec.serviceAccountName" => Some(s(o, &["spec", "serviceAccountName"])),
        "spec.hostNetwork" => Some(
            o["spec"]["hostNetwork"]
                .as_bool()
                .unwrap_or(false)
                .to_string(),
        ),
        "status.phase" => Some(s(o, &["status", "phase"])),
        "status.podIP" => Some(s(o, &["status", "podIP"])),
        "status.nominatedNodeName" => Some(s(o, &["status", "nominatedNodeName"])),
        _ => None,
    },
    field_paths: &[
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ],
    prepare_update: default_pod,
    prepare_create: prepare_pod,
    validate: validate_pod,
    to_storage: identity,
    from_storage: identity,
};

// ---------------------------------------------------------------- services

/// Upstream `SetDefaults_Service` (`pkg/apis/core/v1/defaults.go`), which runs on every
/// decode of a Service, its status writes included: type, session affinity (and its
/// config), port protocols and target ports, traffic policies, node ports of load
/// balancers, and `ipMode: VIP` on a load balancer's ingress points that have an IP.
fn default_service(o: &mut Value) {
    // `ServiceStatus` and its `LoadBalancer` are non-pointer structs, which Go writes as
    // `{}` when unset; so is a `metav1.Condition`'s unset `lastTransitionTime`, as `null`.
    if o.is_object()
        && let Some(status) = object_at(o, "status")
    {
        object_at(status, "loadBalancer");
    }
    condition_times(o, &["lastTransitionTime"]);
    let Some(spec) = o.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    default_str(spec, "sessionAffinity", "None");
    match spec["sessionAffinity"].as_str() {
        Some("None") => {
            if let Some(spec) = spec.as_object_mut() {
                spec.remove("sessionAffinityConfig");
            }
        }
        Some("ClientIP")
            if spec
                .pointer("/sessionAffinityConfig/clientIP/timeoutSeconds")
                .is_none_or(Value::is_null) =>
        {
            // `DefaultClientIPServiceAffinitySeconds`: three hours.
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 10800}});
        }
        _ => {}
    }
    default_str(spec, "type", "ClusterIP");
    if let Some(ports) = spec["ports"].as_array_mut() {
        for p in ports.iter_mut().filter(|p| p.is_object()) {
            default_str(p, "protocol", "TCP");
            // An unset targetPort, or the zero IntOrString (0 or "", which Go's protobuf
            // clients send for an unset one), is the port.
            if p["targetPort"].is_null() || p["targetPort"] == 0 || p["targetPort"] == "" {
                p["targetPort"] = p["port"].clone();
            }
        }
    }
    let type_ = spec["type"].as_str().unwrap_or("").to_owned();
    // `service.ExternallyAccessible`.
    let external = matches!(type_.as_str(), "NodePort" | "LoadBalancer")
        || (type_ == "ClusterIP"
            && spec["externalIPs"]
                .as_array()
                .is_some_and(|a| !a.is_empty()));
    if external {
        default_str(spec, "externalTrafficPolicy", "Cluster");
    }
    if matches!(type_.as_str(), "NodePort" | "LoadBalancer" | "ClusterIP") {
        default_ptr(spec, "internalTrafficPolicy", json!("Cluster"));
    }
    if type_ == "LoadBalancer" {
        default_ptr(spec, "allocateLoadBalancerNodePorts", json!(true));
        if let Some(ingress) = o
            .pointer_mut("/status/loadBalancer/ingress")
            .and_then(Value::as_array_mut)
        {
            for point in ingress.iter_mut().filter(|i| i.is_object()) {
                if point["ip"].as_str().is_some_and(|ip| !ip.is_empty()) {
                    default_ptr(point, "ipMode", json!("VIP"));
                }
            }
        }
    }
}

/// A new Service: the decode defaults, and an empty status (upstream's `PrepareForCreate`).
fn prepare_service(o: &mut Value) {
    default_service(o);
    o["status"] = json!({"loadBalancer": {}});
}

fn validate_service(new: &Value, _old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &new["spec"];
    let type_ = spec["type"].as_str().unwrap_or("ClusterIP");
    if !matches!(
        type_,
        "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
    ) {
        errors.push(FieldError::not_supported(
            "spec.type",
            &spec["type"],
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        ));
    }
    let ports = spec["ports"].as_array().cloned().unwrap_or_default();
    let headless = spec["clusterIP"] == "None";
    if ports.is_empty() && type_ != "ExternalName" && !headless {
        errors.push(FieldError::required("spec.ports", ""));
    }
    let mut seen = Vec::new();
    let mut names = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        let port = p["port"].as_i64().unwrap_or(0);
        if !(1..=65535).contains(&port) {
            errors.push(FieldError::invalid(
                format!("spec.ports[{i}].port"),
                &p["port"],
                "must be between 1 and 65535, inclusive",
            ));
        }
        let protocol = p["protocol"].as_str().unwrap_or("TCP");
        if !matches!(protocol, "TCP" | "UDP" | "SCTP") {
            errors.push(FieldError::not_supported(
                format!("spec.ports[{i}].protocol"),
                &p["protocol"],
                &["SCTP", "TCP", "UDP"],
            ));
        }
        if seen.contains(&(port, protocol)) {
            errors.push(FieldError::duplicate(
                format!("spec.ports[{i}]"),
                &json!({"port": port, "protocol": protocol}),
            ));
        }
        seen.push((port, protocol));
        let name = p["name"].as_str().unwrap_or("");
        if ports.len() > 1 && name.is_empty() {
            errors.push(FieldError::required(format!("spec.ports[{i}].name"), ""));
        } else if !name.is_empty() && names.contains(&name) {
            errors.push(FieldError::duplicate(
                format!("spec.ports[{i}].name"),
                &json!(name),
            ));
        }
        names.push(name);
    }
    if type_ == "ExternalName" && spec["externalName"].as_str().unwrap_or("").is_empty() {
        errors.push(FieldError::required("spec.externalName", ""));
    }
    errors
}

/// Round-trips a Service through its type, its status conditions (`metav1.Condition`)
/// decoded as upstream's decoder does: a condition without `lastTransitionTime` is a zero
/// time, which `ValidateServiceStatusUpdate` does not check (see
/// [`super::typed_with_conditions`]).
fn typed_service(o: &Value) -> Result<Value, String> {
    super::typed_with_conditions::<Service>(o, &["/status/conditions"])
}

fn service_external_ip(o: &Value, _: i64) -> Value {
    let mut ips: Vec<String> = o["status"]["loadBalancer"]["ingress"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["ip"].as_str().or_else(|| i["hostname"].as_str()))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    if let Some(external) = o["spec"]["externalIPs"].as_array() {
        ips.extend(
            external
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned)),
        );
    }
    match (ips.is_empty(), o["spec"]["type"].as_str()) {
        (false, _) => json!(ips.join(",")),
        (true, Some("LoadBalancer")) => json!("<pending>"),
        (true, Some("ExternalName")) => json!(s(o, &["spec", "externalName"])),
        _ => json!("<none>"),
    }
}

fn service_ports(o: &Value, _: i64) -> Value {
    let ports: Vec<String> = o["spec"]["ports"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    let port = p["port"].as_i64().unwrap_or(0);
                    let proto = p["protocol"].as_str().unwrap_or("TCP");
                    match p["nodePort"].as_i64() {
                        Some(np) => format!("{port}:{np}/{proto}"),
                        None => format!("{port}/{proto}"),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    none_if_empty(ports.join(","))
}

fn service_selector(o: &Value, _: i64) -> Value {
    key_values_cell(&o["spec"]["selector"])
}

/// core/v1 services.
pub static SERVICES: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    kind: "Service",
    plural: "services",
    singular: "service",
    short_names: &["svc"],
    categories: &["all"],
    namespaced: true,
    status: true,
    generation: false,
    extra_subresources: &[],
    storage: "core/services",
    name_rule: NameRule::Label,
    typed: typed_service,
    columns: &[
        NAME,
        Column {
            name: "Type",
            type_: "string",
            format: "",
            description: "The type of the service.",
            priority: 0,
            cell: |o, _| json!(s(o, &["spec", "type"])),
        },
        Column {
            name: "Cluster-IP",
            type_: "string",
            format: "",
            description: "The cluster IP of the service.",
            priority: 0,
            cell: |o, _| none_if_empty(s(o, &["spec", "clusterIP"])),
        },
        Column {
            name: "External-IP",
            type_: "string",
            format: "",
            description: "The external IP of the service.",
            priority: 0,
            cell: service_external_ip,
        },
        Column {
            name: "Port(s)",
            type_: "string",
            format: "",
            description: "The ports of the service.",
            priority: 0,
            cell: service_ports,
        },
        AGE,
        Column {
            name: "Selector",
            type_: "string",
            format: "",
            description: "The selector of the service.",
            priority: 1,
            cell: service_selector,
        },
    ],
    field: |o, p| match p {
        "spec.clusterIP" => Some(s(o, &["spec", "clusterIP"])),
        "spec.type" => Some(s(o, &["spec", "type"])),
        _ => None,
    },
    field_paths: &["spec.clusterIP", "spec.type"],
    prepare_update: default_service,
    prepare_create: prepare_service,
    validate: validate_service,
    to_storage: identity,
    from_storage: identity,
};

// ---------------------------------------------------------------- endpoints

/// Upstream `SetDefaults_Endpoints`, on every decode: a port's protocol is `TCP` when
/// unset.
fn default_endpoints(o: &mut Value) {
    let Some(subsets) = o.get_mut("subsets").and_then(Value::as_array_mut) else {
        return;
    };
    for subset in subsets.iter_mut() {
        let Some(ports) = subset.get_mut("ports").and_then(Value::as_array_mut) else {
            continue;
        };
        for port in ports.iter_mut() {
            default_str(port, "protocol", "TCP");
        }
    }
}

/// core/v1 endpoints.
pub static ENDPOINTS: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    kind: "Endpoints",
    plural: "endpoints",
    singular: "endpoints",
    short_names: &["ep"],
    categories: &[],
    namespaced: true,
    status: false,
    generation: false,
    extra_subresources: &[],
    storage: "core/endpoints",
    name_rule: NameRule::Subdomain,
    typed: typed::<Endpoints>,
    columns: &[
        NAME,
        Column {
            name: "Endpoints",
            type_: "string",
            format: "",
            description: "Endpoints of the service.",
            priority: 0,
            cell: |o, _| {
                let mut all = Vec::new();
                for subset in o["subsets"].as_array().into_iter().flatten() {
                    for a in subset["addresses"].as_array().into_iter().flatten() {
                        for p in subset["ports"].as_array().into_iter().flatten() {
                            all.push(format!("{}:{}", a["ip"].as_str().unwrap_or(""), p["port"]));
                        }
                    }
                }
                let more = all.len().saturating_sub(3);
                all.truncate(3);
                let mut text = all.join(",");
                if more > 0 {
                    text.push_str(&format!(" + {more} more..."));
                }
                none_if_empty(text)
            },
        },
        AGE,
    ],
    field: no_fields,
    field_paths: &[],
    prepare_update: default_endpoints,
    prepare_create: default_endpoints,
    validate: no_rules,
    to_storage: identity,
    from_storage: identity,
};

// ---------------------------------------------------------------- events

fn event_last_seen(o: &Value, now: i64) -> Value {
    for path in [
        &["series", "lastObservedTime"][..],
        &["lastTimestamp"],
        &["deprecatedLastTimestamp"],
        &["eventTime"],
    ] {
        if str_at(o, path).is_some() {
            return json!(age(o, path, now));
        }
    }
    json!(age(o, &["metadata", "creationTimestamp"], now))
}

/// `printEvent`'s Source: the source's component (else the reporting controller), then
/// `, ` and its host (else the reporting instance) when there is one.
fn event_source_cell(o: &Value) -> String {
    let first = |a: String, b: String| if a.is_empty() { b } else { a };
    let component = first(
        s(o, &["source", "component"]),
        s(o, &["reportingComponent"]),
    );
    let instance = first(s(o, &["source", "host"]), s(o, &["reportingInstance"]));
    if instance.is_empty() {
        component
    } else {
        format!("{component}, {instance}")
    }
}

/// `printEvent`'s First Seen: the first timestamp, else the event time.
fn event_first_seen(o: &Value, now: i64) -> Value {
    if str_at(o, &["firstTimestamp"]).is_some() {
        json!(age(o, &["firstTimestamp"], now))
    } else if str_at(o, &["eventTime"]).is_some() {
        json!(age(o, &["eventTime"], now))
    } else {
        json!("<unknown>")
    }
}

/// `printEvent`'s Count: the series' count, else the count, and 1 for a singleton (the
/// newer API sets none).
fn event_count(o: &Value) -> i64 {
    if let Some(count) = o["series"]["count"].as_i64() {
        return count;
    }
    match o["count"].as_i64() {
        Some(c) if c != 0 => c,
        _ => 1,
    }
}

fn event_object_cell(r: &Value) -> Value {
    json!(format!(
        "{}/{}",
        r["kind"].as_str().unwrap_or("").to_lowercase(),
        r["name"].as_str().unwrap_or("")
    ))
}

/// A field-selector value of an event (upstream `ToSelectableFields` in
/// `pkg/registry/core/event/strategy.go`, with events.k8s.io/v1's names mapped to it by
/// `AddFieldLabelConversionsForEvent`): the reference's fields under `reference`
/// (`involvedObject` or `regarding`), `reason`, `type`, the reporting controller (as
/// `reportingComponent` in core/v1, `reportingController` in events.k8s.io/v1) and, in
/// core/v1, `source`: `source.component`, else the reporting controller.
fn event_field(reference: &str, o: &Value, p: &str) -> Option<String> {
    if let Some(sub) = p
        .strip_prefix(reference)
        .and_then(|rest| rest.strip_prefix('.'))
    {
        return matches!(
            sub,
            "kind" | "namespace" | "name" | "uid" | "apiVersion" | "resourceVersion" | "fieldPath"
        )
        .then(|| o[reference][sub].as_str().unwrap_or("").to_owned());
    }
    match p {
        "reason" | "type" | "reportingComponent" | "reportingController" => {
            Some(o[p].as_str().unwrap_or("").to_owned())
        }
        "source" => {
            let component = s(o, &["source", "component"]);
            Some(if component.is_empty() {
                s(o, &["reportingComponent"])
            } else {
                component
            })
        }
        _ => None,
    }
}

const EVENT_COLUMNS: [Column; 2] = [
    Column {
        name: "Last Seen",
        type_: "string",
        format: "",
        description: "Time since the event was last seen.",
        priority: 0,
        cell: event_last_seen,
    },
    Column {
        name: "Type",
        type_: "string",
        format: "",
        description: "Type of this event.",
        priority: 0,
        cell: |o, _| json!(s(o, &["type"])),
    },
];

/// core/v1 events (stored form of both event APIs).
pub static EVENTS: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    kind: "Event",
    plural: "events",
    singular: "event",
    short_names: &["ev"],
    categories: &[],
    namespaced: true,
    status: false,
    generation: false,
    extra_subresources: &[],
    storage: "core/events",
    name_rule: NameRule::Subdomain,
    typed: typed::<Event>,
    columns: &[
        EVENT_COLUMNS[0],
        EVENT_COLUMNS[1],
        Column {
            name: "Reason",
            type_: "string",
            format: "",
            description: "Reason",
            priority: 0,
            cell: |o, _| json!(s(o, &["reason"])),
        },
        Column {
            name: "Object",
            type_: "string",
            format: "",
            description: "The object this event is about.",
            priority: 0,
            cell: |o, _| event_object_cell(&o["involvedObject"]),
        },
        // The wide columns kube-apiserver's table convertor always includes (`printEvent`
        // with `Wide`), at priority 1.
        Column {
            name: "Subobject",
            type_: "string",
            format: "",
            description: "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2].",
            priority: 1,
            cell: |o, _| json!(s(o, &["involvedObject", "fieldPath"])),
        },
        Column {
            name: "Source",
            type_: "string",
            format: "",
            description: "The component reporting this event. Should be a short machine understandable string.",
            priority: 1,
            cell: |o, _| json!(event_source_cell(o)),
        },
        Column {
            name: "Message",
            type_: "string",
            format: "",
            description: "Message",
            priority: 0,
            cell: |o, _| json!(s(o, &["message"]).trim()),
        },
        Column {
            name: "First Seen",
            type_: "string",
            format: "",
            description: "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)",
            priority: 1,
            cell: event_first_seen,
        },
        Column {
            name: "Count",
            type_: "string",
            format: "",
            description: "The number of times this event has occurred.",
            priority: 1,
            cell: |o, _| json!(event_count(o)),
        },
        Column {
            name: "Name",
            type_: "string",
            format: "name",
            description: crate::registry::table::NAME.description,
            priority: 1,
            cell: |o, _| json!(s(o, &["metadata", "name"])),
        },
    ],
    field: |o, p| event_field("involvedObject", o, p),
    field_paths: &[
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "type",
        "reportingComponent",
        "source",
    ],
    prepare_update: core_event_fields,
    prepare_create: core_event_fields,
    validate: validate_core_event,
    to_storage: identity,
    from_storage: identity,
};

/// events.k8s.io/v1 events, stored with core events.
pub static EVENTS_V1: ResourceDef = ResourceDef {
    group: "events.k8s.io",
    version: "v1",
    kind: "Event",
    plural: "events",
    singular: "event",
    short_names: &["ev"],
    categories: &[],
    namespaced: true,
    status: false,
    generation: false,
    extra_subresources: &[],
    storage: "core/events",
    name_rule: NameRule::Subdomain,
    typed: typed::<EventsV1Event>,
    columns: &[
        EVENT_COLUMNS[0],
        EVENT_COLUMNS[1],
        Column {
            name: "Reason",
            type_: "string",
            format: "",
            description: "Reason",
            priority: 0,
            cell: |o, _| json!(s(o, &["reason"])),
        },
        Column {
            name: "Object",
            type_: "string",
            format: "",
            description: "The object this event is about.",
            priority: 0,
            cell: |o, _| event_object_cell(&o["regarding"]),
        },
        Column {
            name: "Message",
            type_: "string",
            format: "",
            description: "Message",
            priority: 0,
            cell: |o, _| json!(s(o, &["note"])),
        },
    ],
    field: |o, p| event_field("regarding", o, p),
    field_paths: &[
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "regarding.resourceVersion",
        "regarding.fieldPath",
        "reason",
        "type",
        "reportingController",
    ],
    prepare_update: events_v1_fields,
    prepare_create: events_v1_fields,
    validate: validate_events_v1_event,
    to_storage: to_core,
    from_storage: to_events_v1,
};

// ---------------------------------------------------------------- the rest

/// Upstream's service account strategy (`cleanSecretReferences`, on create and update): a
/// listed secret is referred to by its name alone.
fn clean_secret_references(o: &mut Value) {
    let Some(secrets) = o.get_mut("secrets").and_then(Value::as_array_mut) else {
        return;
    };
    for secret in secrets.iter_mut().filter(|s| s.is_object()) {
        let name = secret.get("name").cloned();
        *secret = match name {
            Some(name) if !name.is_null() && name != "" => json!({"name": name}),
            _ => json!({}),
        };
    }
}

/// core/v1 serviceaccounts.
pub static SERVICE_ACCOUNTS: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    kind: "ServiceAccount",
    plural: "serviceaccounts",
    singular: "serviceaccount",
    short_names: &["sa"],
    categories: &[],
    namespaced: true,
    status: false,
    generation: false,
    extra_subresources: &["token"],
    storage: "core/serviceaccounts",
    name_rule: NameRule::Subdomain,
    typed: typed::<ServiceAccount>,
    // 1.35's `printServiceAccount`: Name and Age (the Secrets count went with the
    // auto-generated token secrets).
    columns: &[NAME, AGE],
    field: no_fields,
    field_paths: &[],
    prepare_update: clean_secret_references,
    prepare_create: clean_secret_references,
    validate: no_rules,
    to_storage: identity,
    from_storage: identity,
};

/// Upstream `core.MaxSecretSize`: the most a ConfigMap's or Secret's data may hold.
const MAX_DATA_SIZE: usize = 1024 * 1024;

/// Upstream's refusal of a change to an immutable ConfigMap or Secret.
const IMMUTABLE_WHEN_SET: &str = "field is immutable when `immutable` is set";

/// The bytes a base64 value (of a Secret's `data` or a ConfigMap's `binaryData`) holds.
fn decoded(value: &Value) -> Option<Vec<u8>> {
    use base64::{Engine, engine::general_purpose::STANDARD};
    STANDARD.decode(value.as_str()?).ok()
}

/// Whether two maps of a ConfigMap or Secret hold the same entries, as upstream's
/// `reflect.DeepEqual` of the decoded maps sees them: an absent map is an empty one (Go
/// writes neither), and base64 values compare by the bytes they hold.
fn same_entries(a: &Value, b: &Value, base64: bool) -> bool {
    let empty = serde_json::Map::new();
    let (a, b) = (
        a.as_object().unwrap_or(&empty),
        b.as_object().unwrap_or(&empty),
    );
    a.len() == b.len()
        && a.iter().all(|(k, v)| {
            b.get(k).is_some_and(|w| {
                v == w || (base64 && decoded(v).is_some_and(|x| decoded(w) == Some(x)))
            })
        })
}

/// Upstream's rule of an immutable ConfigMap or Secret (`ValidateConfigMapUpdate`,
/// `ValidateSecretUpdate`): once `immutable` is true it stays so, and the maps in `fields`
/// do not change.
fn immutable_errors(new: &Value, old: &Value, fields: &[(&str, bool)]) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if old["immutable"] != true {
        return errors;
    }
    if new["immutable"] != true {
        errors.push(FieldError::forbidden("immutable", IMMUTABLE_WHEN_SET));
    }
    for (field, base64) in fields {
        if !same_entries(&new[*field], &old[*field], *base64) {
            errors.push(FieldError::forbidden(*field, IMMUTABLE_WHEN_SET));
        }
    }
    errors
}

/// The invalid keys of the map at `o[field]` (upstream `IsConfigMapKey`).
fn key_errors(o: &Value, field: &str, errors: &mut Vec<FieldError>) {
    for key in o[field].as_object().into_iter().flat_map(|m| m.keys()) {
        for message in config_map_key_errors(key) {
            errors.push(FieldError::invalid(
                format!("{field}[{key}]"),
                &json!(key),
                message,
            ));
        }
    }
}

/// Upstream `ValidateConfigMap` and `ValidateConfigMapUpdate`: valid keys, none in both
/// `data` and `binaryData`, at most 1 MiB in all, and nothing changed once immutable.
fn validate_config_map(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = match old {
        Some(old) => immutable_errors(new, old, &[("data", false), ("binaryData", true)]),
        None => Vec::new(),
    };
    key_errors(new, "data", &mut errors);
    let binary = new["binaryData"].as_object();
    let mut total = 0;
    for (key, value) in new["data"].as_object().into_iter().flatten() {
        if binary.is_some_and(|b| b.contains_key(key)) {
            errors.push(FieldError::invalid(
                format!("data[{key}]"),
                &json!(key),
                "duplicate of key present in binaryData",
            ));
        }
        total += value.as_str().map_or(0, str::len);
    }
    key_errors(new, "binaryData", &mut errors);
    for value in binary.into_iter().flat_map(|b| b.values()) {
        total += decoded(value).map_or(0, |d| d.len());
    }
    if total > MAX_DATA_SIZE {
        // Upstream names the whole object with `field.NewPath("")`, which reads `[]`.
        errors.push(FieldError::too_long("[]", MAX_DATA_SIZE));
    }
    errors
}

/// Upstream `ValidateSecret`'s rules of each secret type: the keys (or annotation) each
/// needs, and well-formed JSON for the docker configurations.
fn secret_type_errors(secret: &Value, errors: &mut Vec<FieldError>) {
    let data = &secret["data"];
    let has = |key: &str| data.get(key).is_some_and(|v| !v.is_null());
    let required = |key: &str| FieldError::required(format!("data[{key}]"), "");
    let json_errors = |key: &str, errors: &mut Vec<FieldError>| {
        if !has(key) {
            errors.push(required(key));
            return;
        }
        let bytes = decoded(&data[key]).unwrap_or_default();
        if let Err(e) = serde_json::from_slice::<serde_json::Map<String, Value>>(&bytes) {
            errors.push(FieldError::invalid(
                format!("data[{key}]"),
                &json!("<secret contents redacted>"),
                e.to_string(),
            ));
        }
    };
    match secret["type"].as_str().unwrap_or("") {
        "kubernetes.io/service-account-token" => {
            let annotation = "kubernetes.io/service-account.name";
            if str_at(secret, &["metadata", "annotations", annotation]).is_none_or(str::is_empty) {
                errors.push(FieldError::required(
                    format!("metadata.annotations[{annotation}]"),
                    "",
                ));
            }
        }
        "kubernetes.io/dockercfg" => json_errors(".dockercfg", errors),
        "kubernetes.io/dockerconfigjson" => json_errors(".dockerconfigjson", errors),
        "kubernetes.io/basic-auth" if !has("username") && !has("password") => {
            errors.push(required("username"));
            errors.push(required("password"));
        }
        "kubernetes.io/ssh-auth"
            if decoded(&data["ssh-privatekey"]).is_none_or(|d| d.is_empty()) =>
        {
            errors.push(required("ssh-privatekey"));
        }
        "kubernetes.io/tls" => {
            for key in ["tls.crt", "tls.key"] {
                if !has(key) {
                    errors.push(required(key));
                }
            }
        }
        _ => {}
    }
}

/// Upstream `ValidateSecret` and `ValidateSecretUpdate`: valid keys, at most 1 MiB of
/// data, each type's keys, a type that does not change, and nothing changed once
/// immutable (`stringData` is already merged into `data`).
fn validate_secret(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Some(old) = old {
        // A type never written is the default one (upstream defaults the stored object too).
        let type_of = |o: &Value| -> String {
            o["type"]
                .as_str()
                .filter(|t| !t.is_empty())
                .unwrap_or("Opaque")
                .to_owned()
        };
        if type_of(new) != type_of(old) {
            errors.push(FieldError::invalid(
                "type",
                &new["type"],
                "field is immutable",
            ));
        }
        errors.extend(immutable_errors(new, old, &[("data", true)]));
    }
    key_errors(new, "data", &mut errors);
    let total: usize = new["data"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
        .map(|v| decoded(v).map_or(0, |d| d.len()))
        .sum();
    if total > MAX_DATA_SIZE {
        errors.push(FieldError::too_long("data", MAX_DATA_SIZE));
    }
    secret_type_errors(new, &mut errors);
    errors
}

/// Upstream `SetDefaults_Secret`, on every decode: the type is `Opaque` unless given; and
/// `stringData` is merged into `data` (the conversion to the internal type).
fn default_secret(o: &mut Value) {
    default_str(o, "type", "Opaque");
    merge_string_data(o);
}

fn data_count(o: &Value) -> usize {
    o["data"].as_object().map_or(0, |m| m.len())
        + o["binaryData"].as_object().map_or(0, |m| m.len())
}

/// core/v1 configmaps.
pub static CONFIG_MAPS: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    kind: "ConfigMap",
    plural: "configmaps",
    singular: "configmap",
    short_names: &["cm"],
    categories: &[],
    namespaced: true,
    status: false,
    generation: false,
    extra_subresources: &[],
    storage: "core/configmaps",
    name_rule: NameRule::Subdomain,
    typed: typed::<ConfigMap>,
    columns: &[
        NAME,
        Column {
            name: "Data",
            type_: "string",
            format: "",
            description: "Number of entries",
            priority: 0,
            cell: |o, _| json!(data_count(o)),
        },
        AGE,
    ],
    field: no_fields,
    field_paths: &[],
    prepare_update: no_defaults,
    prepare_create: no_defaults,
    validate: validate_config_map,
    to_storage: identity,
    from_storage: identity,
};

/// core/v1 secrets.
pub static SECRETS: ResourceDef = ResourceDef {
    group: "",
    version: "v1",
    kind: "Secret",
    plural: "secrets",
    singular: "secret",
    short_names: &[],
    categories: &[],
    namespaced: true,
    status: false,
    generation: false,
    extra_subresources: &[],
    storage: "core/secrets",
    name_rule: NameRule::Subdomain,
    typed: typed::<Secret>,
    columns: &[
        NAME,
        Column {
            name: "Type",
            type_: "string",
            format: "",
            description: "The type of the secret",
            priority: 0,
            cell: |o, _| json!(s(o, &["type"])),
        },
        Column {
            name: "Data",
            type_: "string",
            format: "",
            description: "Number of entries",
            priority: 0,
            cell: |o, _| json!(data_count(o)),
        },
        AGE,
    ],
    field: |o, p| (p == "type").then(|| s(o, &["type"])),
    field_paths: &["type"],
    prepare_update: default_secret,
    prepare_create: default_secret,
    validate: validate_secret,
    to_storage: identity,
    // Secrets a server before this rule stored with their `stringData`.
    from_storage: |mut o| {
        merge_string_data(&mut o);
        o
    },
};

/// Upstream's `Convert_v1_Secret_To_core_Secret`: every `stringData` entry is written into
/// `data`, base64-encoded, over any `data` entry of the same key, and `stringData` itself
/// is dropped, so it is never stored nor returned (`kubectl create secret` manifests and Helm
/// charts write `stringData`; consumers read `data`). A null entry is the empty string, as
/// Go decodes it into a `map[string]string`.
pub fn merge_string_data(secret: &mut Value) {
    use base64::{Engine, engine::general_purpose::STANDARD};
    let Some(fields) = secret.as_object_mut() else {
        return;
    };
    let Some(Value::Object(entries)) = fields.remove("stringData") else {
        return;
    };
    if entries.is_empty() {
        return;
    }
    let data = fields
        .entry("data")
        .or_insert_with(|| Value::Object(Default::default()));
    if !data.is_object() {
        *data = Value::Object(Default::default());
    }
    let Some(data) = data.as_object_mut() else {
        return;
    };
    for (key, value) in entries {
        let text = value.as_str().unwrap_or("");
        data.insert(key, json!(STANDARD.encode(text)));
    }
}

/// What Go always writes of a Lease: its `spec` (`LeaseSpec`, a non-pointer struct), `{}`
/// when unset.
fn lease_spec(o: &mut Value) {
    if o.is_object() {
        object_at(o, "spec");
    }
}

/// coordination.k8s.io/v1 leases.
pub static LEASES: ResourceDef = ResourceDef {
    group: "coordination.k8s.io",
    version: "v1",
    kind: "Lease",
    plural: "leases",
    singular: "lease",
    short_names: &[],
    categories: &[],
    namespaced: true,
    status: false,
    generation: false,
    extra_subresources: &[],
    storage: "coordination.k8s.io/leases",
    name_rule: NameRule::Subdomain,
    typed: typed::<Lease>,
    columns: &[
        NAME,
        Column {
            name: "Holder",
            type_: "string",
            format: "",
            description: "The holder of the lease",
            priority: 0,
            cell: |o, _| json!(s(o, &["spec", "holderIdentity"])),
        },
        AGE,
    ],
    field: no_fields,
    field_paths: &[],
    prepare_update: lease_spec,
    prepare_create: lease_spec,
    validate: |o, _| {
        let mut errors = Vec::new();
        if let Some(d) = o["spec"]["leaseDurationSeconds"].as_i64()
            && d <= 0
        {
            errors.push(FieldError::invalid(
                "spec.leaseDurationSeconds",
                &json!(d),
                "must be greater than 0",
            ));
        }
        errors
    },
    to_storage: identity,
    from_storage: identity,
};

/// Upstream's defaults of an EndpointSlice on every decode (`SetDefaults_EndpointPort`,
/// `pkg/apis/discovery/v1/defaults.go`: a port's unset name is `""`, its unset protocol
/// `TCP`) and what Go always writes: `endpoints` and `ports` (no `omitempty`, `null` when
/// unset), each endpoint's `addresses` and `conditions` (a non-pointer struct, `{}`).
fn default_endpoint_slice(o: &mut Value) {
    if !o.is_object() {
        return;
    }
    always(o, &["endpoints", "ports"], &Value::Null);
    if let Some(ports) = o.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports.iter_mut() {
            default_ptr(port, "name", json!(""));
            default_ptr(port, "protocol", json!("TCP"));
        }
    }
    if let Some(endpoints) = o.get_mut("endpoints").and_then(Value::as_array_mut) {
        for endpoint in endpoints.iter_mut().filter(|e| e.is_object()) {
            always(endpoint, &["addresses"], &Value::Null);
            object_at(endpoint, "conditions");
        }
    }
}

/// Upstream's `endpointSliceStrategy.PrepareForUpdate`: the generation counts one more when
/// anything but the metadata changed, or the labels did (see
/// [`super::prepare_update_from_old`]).
pub(super) fn update_endpoint_slice(new: &mut Value, old: &Value) {
    let content = |o: &Value| -> Value {
        let mut c = o.clone();
        if let Some(m) = c.as_object_mut() {
            for field in ["metadata", "apiVersion", "kind"] {
                m.remove(field);
            }
        }
        c
    };
    let labels = |o: &Value| o["metadata"]["labels"].clone();
    if !semantic_eq(&content(new), &content(old)) || !semantic_eq(&labels(new), &labels(old)) {
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        if let Some(metadata) = new.get_mut("metadata").and_then(Value::as_object_mut) {
            metadata.insert("generation".into(), json!(generation));
        }
    }
}

/// discovery.k8s.io/v1 endpointslices.
pub static ENDPOINT_SLICES: ResourceDef = ResourceDef {
    group: "discovery.k8s.io",
    version: "v1",
    kind: "EndpointSlice",
    plural: "endpointslices",
    singular: "endpointslice",
    short_names: &[],
    categories: &[],
    namespaced: true,
    status: false,
    // `PrepareForCreate`: a new slice is generation 1; updates count in
    // [`update_endpoint_slice`].
    generation: true,
    extra_subresources: &[],
    storage: "discovery.k8s.io/endpointslices",
    name_rule: NameRule::Subdomain,
    typed: typed::<EndpointSlice>,
    columns: &[
        NAME,
        Column {
            name: "AddressType",
            type_: "string",
            format: "",
            description: "Type of address",
            priority: 0,
            cell: |o, _| json!(s(o, &["addressType"])),
        },
        Column {
            name: "Ports",
            type_: "string",
            format: "",
            description: "Ports",
            priority: 0,
            cell: |o, _| {
                none_if_empty(
                    o["ports"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .map(|p| p["port"].to_string())
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default(),
                )
            },
        },
        Column {
            name: "Endpoints",
            type_: "string",
            format: "",
            description: "Endpoints",
            priority: 0,
            cell: |o, _| {
                none_if_empty(
                    o["endpoints"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|e| e["addresses"][0].as_str())
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default(),
                )
            },
        },
        AGE,
    ],
    field: no_fields,
    field_paths: &[],
    prepare_update: default_endpoint_slice,
    prepare_create: default_endpoint_slice,
    validate: |o, _| {
        let mut errors = Vec::new();
        match o["addressType"].as_str() {
            Some("IPv4" | "IPv6" | "FQDN") => {}
            _ => errors.push(FieldError::not_supported(
                "addressType",
                &o["addressType"],
                &["FQDN", "IPv4", "IPv6"],
            )),
        }
        errors.extend(endpoint_slice_address_errors(o));
        errors
    },
    to_storage: identity,
    from_storage: identity,
};

/// `validateEndpoints`: each address of an IPv4 or IPv6 slice is an IP of that family
/// (`pkg/apis/discovery/validation/validation.go`, `IsValidIPv4Address`/`IsValidIPv6Address`).
fn endpoint_slice_address_errors(o: &Value) -> Vec<FieldError> {
    let family = o["addressType"].as_str().unwrap_or("");
    let mut errors = Vec::new();
    for (i, endpoint) in o["endpoints"].as_array().into_iter().flatten().enumerate() {
        for (j, address) in endpoint["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let text = address.as_str().unwrap_or("");
            let field = format!("endpoints[{i}].addresses[{j}]");
            let message = match (family, text.parse::<std::net::IpAddr>()) {
                ("IPv4", Ok(std::net::IpAddr::V4(_))) | ("IPv6", Ok(std::net::IpAddr::V6(_))) => {
                    continue;
                }
                ("IPv4", Ok(_)) => "must be a valid IPv4 address",
                ("IPv6", Ok(_)) => "must be a valid IPv6 address",
                ("IPv4" | "IPv6", Err(_)) => {
                    "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
                }
                _ => continue,
            };
            errors.push(FieldError::invalid(field, address, message));
        }
    }
    errors
}

/// authentication.k8s.io/v1 tokenreviews: create only, never stored (`api::tokens`).
pub static TOKEN_REVIEWS: ResourceDef = ResourceDef {
    group: "authentication.k8s.io",
    version: "v1",
    kind: "TokenReview",
    plural: "tokenreviews",
    singular: "tokenreview",
    short_names: &[],
    categories: &[],
    namespaced: false,
    status: false,
    generation: false,
    extra_subresources: &[],
    storage: "authentication.k8s.io/tokenreviews",
    name_rule: NameRule::Subdomain,
    typed: typed::<TokenReview>,
    columns: &[NAME, AGE],
    field: no_fields,
    field_paths: &[],
    prepare_update: no_defaults,
    prepare_create: no_defaults,
    validate: no_rules,
    to_storage: identity,
    from_storage: identity,
};

/// authentication.k8s.io/v1 selfsubjectreviews (`kubectl auth whoami`): create only, never
/// stored; answered with the requester's own identity (the API server's `auth::review`).
pub static SELF_SUBJECT_REVIEWS: ResourceDef = ResourceDef {
    group: "authentication.k8s.io",
    version: "v1",
    kind: "SelfSubjectReview",
    plural: "selfsubjectreviews",
    singular: "selfsubjectreview",
    short_names: &[],
    categories: &[],
    namespaced: false,
    status: false,
    generation: false,
    extra_subresources: &[],
    storage: "authentication.k8s.io/selfsubjectreviews",
    name_rule: NameRule::Subdomain,
    typed: typed::<SelfSubjectReview>,
    columns: &[NAME, AGE],
    field: no_fields,
    field_paths: &[],
    prepare_update: no_defaults,
    prepare_create: no_defaults,
    validate: no_rules,
    to_storage: identity,
    from_storage: identity,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_status_column() {
        let node = json!({"spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(node_ready(&node), "Ready,SchedulingDisabled");
        assert_eq!(node_ready(&json!({})), "Unknown");
        let roles = json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": "", "node-role.kubernetes.io/worker": ""}}});
        assert_eq!(node_roles(&roles), "control-plane,worker");
    }

    /// Pod defaulting followed by the DefaultTolerationSeconds plugin at its defaults.
    fn prepare_pod_admitted(pod: &mut Value) {
        prepare_pod(pod);
        super::super::add_default_tolerations(&mut pod["spec"], 300, 300);
    }

    #[test]
    fn pods_get_default_tolerations_once() {
        let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "nginx"}],
            "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10}]}});
        prepare_pod_admitted(&mut pod);
        let tolerations = pod["spec"]["tolerations"].as_array().unwrap();
        assert_eq!(tolerations.len(), 2);
        assert_eq!(
            tolerations[0]["tolerationSeconds"], 10,
            "an existing toleration is kept"
        );
        assert_eq!(tolerations[1]["key"], "node.kubernetes.io/not-ready");
        assert_eq!(tolerations[1]["tolerationSeconds"], 300);
        assert_eq!(pod["status"]["phase"], "Pending");
        assert_eq!(pod["spec"]["containers"][0]["imagePullPolicy"], "Always");
    }

    /// Upstream DefaultTolerationSeconds: a toleration with an empty key (every taint) and
    /// an empty or NoExecute effect already covers both taints; a NoSchedule one does not.
    #[test]
    fn pods_tolerating_every_taint_get_no_default_tolerations() {
        for toleration in [
            json!({"operator": "Exists"}),
            json!({"key": "", "operator": "Exists", "effect": "NoExecute"}),
        ] {
            let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "nginx"}],
                "tolerations": [toleration.clone()]}});
            prepare_pod_admitted(&mut pod);
            assert_eq!(pod["spec"]["tolerations"], json!([toleration]));
        }
        let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "nginx"}],
            "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]}});
        prepare_pod_admitted(&mut pod);
        assert_eq!(pod["spec"]["tolerations"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn node_immutable_fields() {
        let old = json!({"spec": {"providerID": "fake://1", "podCIDRs": ["10.0.0.0/24"]}});
        let new = json!({"spec": {"providerID": "fake://2", "podCIDRs": ["10.0.1.0/24"]}});
        let errors = validate_node(&new, Some(&old));
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.providerID", "spec.podCIDRs"]);
        let first_set = json!({"spec": {"providerID": "fake://1"}});
        assert!(validate_node(&first_set, Some(&json!({"spec": {}}))).is_empty());
        let bad = json!({"spec": {"podCIDRs": ["10.0.0.0/24", "10.1.0.0/24"], "taints": [{"key": "a", "effect": "Bogus"}]}});
        assert_eq!(validate_node(&bad, None).len(), 2);
    }

    #[test]
    fn string_data_is_merged_into_data_and_dropped() {
        let mut secret = json!({"data": {"a": "b2xk", "keep": "eA=="},
                                "stringData": {"a": "new", "b": "v", "n": null}});
        merge_string_data(&mut secret);
        assert_eq!(
            secret,
            json!({"data": {"a": "bmV3", "keep": "eA==", "b": "dg==", "n": ""}})
        );
        let mut only = json!({"stringData": {"k": "v"}});
        merge_string_data(&mut only);
        assert_eq!(only, json!({"data": {"k": "dg=="}}));
        let mut empty = json!({"stringData": {}, "data": null});
        merge_string_data(&mut empty);
        assert_eq!(empty, json!({"data": null}));
    }

    /// Upstream `SetDefaults_Namespace` (on every decode of a named namespace) and the
    /// namespace strategy's `Canonicalize`: the `kubernetes.io/metadata.name` label is the
    /// name, whatever the write said; `SetDefaults_NamespaceStatus`: an unset phase is
    /// `Active`; `PrepareForCreate` adds the `kubernetes` finalizer to those given.
    #[test]
    fn namespaces_are_labelled_with_their_name() {
        let mut created = json!({"metadata": {"name": "team-a", "labels": {"x": "y"}},
            "spec": {"finalizers": ["example.com/f"]}});
        prepare_namespace(&mut created);
        assert_eq!(
            created,
            json!({"metadata": {"name": "team-a",
                    "labels": {"x": "y", NAMESPACE_NAME_LABEL: "team-a"}},
                "spec": {"finalizers": ["example.com/f", "kubernetes"]},
                "status": {"phase": "Active"}})
        );
        let mut updated = json!({"metadata": {"name": "team-a",
            "labels": {NAMESPACE_NAME_LABEL: "other"}}, "status": {}});
        default_namespace(&mut updated);
        assert_eq!(
            updated["metadata"]["labels"],
            json!({NAMESPACE_NAME_LABEL: "team-a"})
        );
        assert_eq!(updated["spec"], json!({}));
        assert_eq!(updated["status"], json!({"phase": "Active"}));
        let mut unnamed = json!({"metadata": {"generateName": "t-"}});
        default_namespace(&mut unnamed);
        assert_eq!(unnamed["metadata"].get("labels"), None);
    }

    /// Upstream `SetDefaults_NodeStatus` (an unset allocatable is the capacity) and what Go
    /// always writes of a Node (`k8s.io/api/core/v1/types.go`): `daemonEndpoints` with the
    /// kubelet's `Port`, every `nodeInfo` string, the conditions' times.
    #[test]
    fn nodes_carry_the_status_go_always_writes() {
        let mut node = json!({"metadata": {"name": "n"}, "status": {
            "capacity": {"cpu": "2"}, "nodeInfo": {"kubeletVersion": "v1.35.4"},
            "conditions": [{"type": "Ready", "status": "True"}]}});
        default_node(&mut node);
        let status = &node["status"];
        assert_eq!(status["allocatable"], json!({"cpu": "2"}));
        assert_eq!(
            status["daemonEndpoints"],
            json!({"kubeletEndpoint": {"Port": 0}})
        );
        assert_eq!(status["nodeInfo"]["kubeletVersion"], "v1.35.4");
        assert_eq!(status["nodeInfo"]["machineID"], "");
        assert_eq!(status["nodeInfo"].as_object().unwrap().len(), 10);
        assert_eq!(
            status["conditions"][0],
            json!({"type": "Ready", "status": "True", "lastHeartbeatTime": null, "lastTransitionTime": null})
        );
        assert_eq!(node["spec"], json!({}));
        let mut bare = json!({"metadata": {"name": "n"}});
        default_node(&mut bare);
        assert_eq!(bare["status"].get("allocatable"), None);
        assert_eq!(
            bare["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
            0
        );
    }

    /// `k8s.io/api/core/v1` `Container.Resources` is a non-pointer struct: Go writes a
    /// pod's containers' (init and ephemeral ones too) `resources` as `{}`; its status
    /// writes carry the conditions' times and the container statuses' fields without
    /// `omitempty`.
    #[test]
    fn pods_carry_what_go_always_writes() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "c", "image": "nginx"}],
            "initContainers": [{"name": "i", "image": "busybox"}],
            "ephemeralContainers": [{"name": "e", "image": "busybox"}],
            "volumes": [{"name": "v", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}});
        prepare_pod(&mut pod);
        for list in ["containers", "initContainers", "ephemeralContainers"] {
            assert_eq!(pod["spec"][list][0]["resources"], json!({}), "{list}");
        }
        assert_eq!(
            pod["spec"]["volumes"][0]["ephemeral"]["volumeClaimTemplate"],
            json!({"metadata": {}, "spec": {"resources": {}, "volumeMode": "Filesystem"}})
        );
        let mut status_write = json!({"metadata": {"name": "p"}, "spec": {"containers": []},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "ready": true}]}});
        default_pod(&mut status_write);
        assert_eq!(
            status_write["status"]["conditions"][0],
            json!({"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": null})
        );
        assert_eq!(
            status_write["status"]["containerStatuses"][0],
            json!({"name": "c", "ready": true, "restartCount": 0, "image": "", "imageID": "",
                "state": {}, "lastState": {}})
        );
    }

    /// Upstream's pod spec conversions (`pkg/apis/core/v1/conversion.go`): the deprecated
    /// `serviceAccount` stands for an unset `serviceAccountName`, and is always written as
    /// its alias; the new field wins when both are set.
    #[test]
    fn service_account_is_the_alias_of_service_account_name() {
        let spec = |fields: Value| {
            let mut pod = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
            for (k, v) in fields.as_object().unwrap() {
                pod["spec"][k] = v.clone();
            }
            default_pod(&mut pod);
            (
                pod["spec"]["serviceAccountName"].clone(),
                pod["spec"]["serviceAccount"].clone(),
            )
        };
        assert_eq!(
            spec(json!({"serviceAccount": "old"})),
            (json!("old"), json!("old"))
        );
        assert_eq!(
            spec(json!({"serviceAccountName": "new"})),
            (json!("new"), json!("new"))
        );
        assert_eq!(
            spec(json!({"serviceAccountName": "new", "serviceAccount": "old"})),
            (json!("new"), json!("new"))
        );
        assert_eq!(spec(json!({})), (Value::Null, Value::Null));
    }

    /// `ServiceStatus.LoadBalancer` is a non-pointer struct: a status write without it
    /// reads `loadBalancer: {}`.
    #[test]
    fn service_status_writes_keep_the_load_balancer() {
        let mut svc = json!({"spec": {"ports": [{"port": 80}]}, "status": {}});
        default_service(&mut svc);
        assert_eq!(svc["status"], json!({"loadBalancer": {}}));
    }

    /// Upstream `SetDefaults_Endpoints`: a subset port's unset protocol is `TCP`.
    #[test]
    fn endpoints_ports_default_to_tcp() {
        let mut ep = json!({"subsets": [{"addresses": [{"ip": "10.0.0.1"}],
            "ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}]});
        default_endpoints(&mut ep);
        assert_eq!(
            ep["subsets"][0]["ports"],
            json!([{"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}])
        );
    }

    /// Upstream `SetDefaults_EndpointPort` (`pkg/apis/discovery/v1/defaults.go`): an unset
    /// name is `""`, an unset protocol `TCP`; Go always writes `endpoints`, `ports` and
    /// each endpoint's `addresses` and `conditions`.
    #[test]
    fn endpoint_slices_carry_port_defaults_and_conditions() {
        let mut slice = json!({"addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"], "conditions": {"ready": true}}],
            "ports": [{"port": 80}]});
        default_endpoint_slice(&mut slice);
        assert_eq!(slice["endpoints"][0]["conditions"], json!({}));
        assert_eq!(slice["endpoints"][1]["conditions"], json!({"ready": true}));
        assert_eq!(
            slice["ports"],
            json!([{"port": 80, "name": "", "protocol": "TCP"}])
        );
        let mut empty = json!({"addressType": "IPv4"});
        default_endpoint_slice(&mut empty);
        assert_eq!(
            empty,
            json!({"addressType": "IPv4", "endpoints": null, "ports": null})
        );
    }

    /// Upstream `endpointSliceStrategy`: a new slice is generation 1, and an update counts
    /// one more when anything but the metadata changed, or the labels did.
    #[test]
    fn endpoint_slice_generation_counts_content_and_label_changes() {
        assert!(ENDPOINT_SLICES.generation);
        let old = json!({"metadata": {"name": "s", "generation": 4, "labels": {"a": "1"}},
            "addressType": "IPv4", "endpoints": null, "ports": null});
        let mut annotated = old.clone();
        annotated["metadata"]["annotations"] = json!({"x": "y"});
        update_endpoint_slice(&mut annotated, &old);
        assert_eq!(annotated["metadata"]["generation"], 4);
        let mut relabelled = old.clone();
        relabelled["metadata"]["labels"]["a"] = json!("2");
        update_endpoint_slice(&mut relabelled, &old);
        assert_eq!(relabelled["metadata"]["generation"], 5);
        let mut changed = old.clone();
        changed["endpoints"] = json!([{"addresses": ["10.0.0.1"], "conditions": {}}]);
        update_endpoint_slice(&mut changed, &old);
        assert_eq!(changed["metadata"]["generation"], 5);
    }

    /// Upstream `cleanSecretReferences` (`pkg/registry/core/serviceaccount/strategy.go`):
    /// a service account's secrets are kept by name alone.
    #[test]
    fn service_account_secrets_are_kept_by_name() {
        let mut sa =
            json!({"secrets": [{"name": "s1", "namespace": "x", "kind": "Secret"}, {"uid": "u"}]});
        clean_secret_references(&mut sa);
        assert_eq!(sa["secrets"], json!([{"name": "s1"}, {}]));
    }

    /// `Lease.Spec` is a non-pointer struct, written as `{}` when unset.
    #[test]
    fn leases_always_have_a_spec() {
        let mut lease = json!({"metadata": {"name": "l"}});
        lease_spec(&mut lease);
        assert_eq!(lease["spec"], json!({}));
    }

    #[test]
    fn service_port_column() {
        let svc = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}});
        assert_eq!(service_ports(&svc, 0), json!("80:30080/TCP,53/UDP"));
        assert_eq!(service_external_ip(&svc, 0), json!("<pending>"));
    }
}
