//! A pod spec's defaulting and validation (upstream's `SetDefaults_PodSpec` and
//! `ValidatePodSpec`, in the parts served here): one place for pods and for the pod
//! templates of workloads.

use serde_json::{Value, json};

use super::quantity::quantity_of;
use crate::registry::FieldError;

/// The tolerations upstream's DefaultTolerationSeconds admission
/// (`plugin/pkg/admission/defaulttolerationseconds`) adds to a pod spec that does not
/// tolerate the NoExecute taints `node.kubernetes.io/not-ready` and
/// `node.kubernetes.io/unreachable` already: `Exists` tolerations of these seconds
/// (`--default-not-ready-toleration-seconds`, `--default-unreachable-toleration-seconds`,
/// 300 each by default).
pub fn add_default_tolerations(spec: &mut Value, not_ready_seconds: i64, unreachable_seconds: i64) {
    if !spec["tolerations"].is_array() {
        spec["tolerations"] = json!([]);
    }
    let tolerations = spec["tolerations"].as_array_mut().expect("array");
    for (key, seconds) in [
        ("node.kubernetes.io/not-ready", not_ready_seconds),
        ("node.kubernetes.io/unreachable", unreachable_seconds),
    ] {
        // Upstream: a toleration of this key, or of every key (an empty key), with the
        // NoExecute or every effect (an empty effect) already covers it.
        let tolerated = tolerations.iter().any(|t| {
            let effect = t["effect"].as_str().unwrap_or("");
            let k = t["key"].as_str().unwrap_or("");
            (k == key || k.is_empty()) && (effect.is_empty() || effect == "NoExecute")
        });
        if !tolerated {
            tolerations.push(json!({
                "key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds
            }));
        }
    }
}

/// Whether a string field is unset as Go sees it: absent, null or empty.
fn unset_str(v: Option<&Value>) -> bool {
    v.is_none_or(|v| v.is_null() || v.as_str() == Some(""))
}

/// Whether a number field is unset as Go sees a non-pointer one: absent, null or zero.
fn unset_number(v: Option<&Value>) -> bool {
    v.is_none_or(|v| v.is_null() || v.as_i64() == Some(0))
}

/// Sets the string `field` of `obj` when it is unset (absent, null or `""`): upstream's
/// `if obj.Field == "" { obj.Field = value }`.
pub(super) fn default_str(obj: &mut Value, field: &str, value: &str) {
    if let Some(map) = obj.as_object_mut()
        && unset_str(map.get(field))
    {
        map.insert(field.to_owned(), json!(value));
    }
}

/// Sets the pointer `field` of `obj` when it is absent or null: upstream's
/// `if obj.Field == nil { obj.Field = &value }`.
pub(super) fn default_ptr(obj: &mut Value, field: &str, value: Value) {
    if let Some(map) = obj.as_object_mut()
        && map.get(field).is_none_or(Value::is_null)
    {
        map.insert(field.to_owned(), value);
    }
}

/// Sets the non-pointer number `field` of `obj` when it is absent, null or 0.
fn default_number(obj: &mut Value, field: &str, value: i64) {
    if let Some(map) = obj.as_object_mut()
        && unset_number(map.get(field))
    {
        map.insert(field.to_owned(), json!(value));
    }
}

/// The object at `obj[field]`, if it is one.
pub(super) fn child<'a>(obj: &'a mut Value, field: &str) -> Option<&'a mut Value> {
    obj.get_mut(field).filter(|v| v.is_object())
}

/// The objects of the array at `obj[field]`.
fn each_mut<'a>(obj: &'a mut Value, field: &str) -> impl Iterator<Item = &'a mut Value> + use<'a> {
    obj.get_mut(field)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter(|v| v.is_object())
}

/// Upstream's pull policy for an image with none (`SetDefaults_Container`, through
/// `parsers.ParseImageName`): `Always` for the `latest` tag or for neither tag nor digest
/// (which means `latest`), `IfNotPresent` otherwise, and for a reference that does not parse.
fn default_pull_policy(image: &str) -> &'static str {
    if image.trim().is_empty() {
        return "IfNotPresent";
    }
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.split_once(':').map(|(_, tag)| tag) {
        Some("latest") => "Always",
        Some(_) => "IfNotPresent",
        None if digest.is_some() => "IfNotPresent",
        None => "Always",
    }
}

/// Upstream `SetDefaults_HTTPGetAction`.
fn default_http_get(action: &mut Value) {
    default_str(action, "path", "/");
    default_str(action, "scheme", "HTTP");
}

/// Upstream `SetDefaults_Probe` and the generated defaults of its handlers.
fn default_probe(probe: &mut Value) {
    default_number(probe, "timeoutSeconds", 1);
    default_number(probe, "periodSeconds", 10);
    default_number(probe, "successThreshold", 1);
    default_number(probe, "failureThreshold", 3);
    if let Some(action) = child(probe, "httpGet") {
        default_http_get(action);
    }
    if let Some(grpc) = child(probe, "grpc") {
        default_ptr(grpc, "service", json!(""));
    }
}

/// Upstream `SetDefaults_ObjectFieldSelector`.
fn default_field_ref(holder: &mut Value) {
    if let Some(field_ref) = child(holder, "fieldRef") {
        default_str(field_ref, "apiVersion", "v1");
    }
}

/// Upstream `SetDefaults_Container` (also for init and ephemeral containers) and the
/// generated defaults under a container: port protocols, downward API field references,
/// probes and lifecycle hooks.
fn default_container(c: &mut Value) {
    // `Container.Resources` is a non-pointer struct (`json:"resources,omitempty"`), which
    // Go writes as `{}` when unset (`k8s.io/api/core/v1/types.go`).
    default_ptr(c, "resources", json!({}));
    if unset_str(c.get("imagePullPolicy")) {
        let policy = default_pull_policy(c.get("image").and_then(Value::as_str).unwrap_or(""));
        default_str(c, "imagePullPolicy", policy);
    }
    default_str(c, "terminationMessagePath", "/dev/termination-log");
    default_str(c, "terminationMessagePolicy", "File");
    for port in each_mut(c, "ports") {
        default_str(port, "protocol", "TCP");
    }
    for env in each_mut(c, "env") {
        if let Some(from) = child(env, "valueFrom") {
            default_field_ref(from);
            if let Some(file_key) = child(from, "fileKeyRef") {
                default_ptr(file_key, "optional", json!(false));
            }
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(probe) = child(c, probe) {
            default_probe(probe);
        }
    }
    if let Some(lifecycle) = child(c, "lifecycle") {
        for hook in ["postStart", "preStop"] {
            if let Some(action) = child(lifecycle, hook).and_then(|h| child(h, "httpGet")) {
                default_http_get(action);
            }
        }
    }
}

/// The mode upstream gives secret, config map, downward API and projected volumes
/// (`0644`).
const DEFAULT_VOLUME_MODE: i64 = 0o644;

/// Upstream `SetDefaults_Volume` and the generated defaults of each volume source.
fn default_volume(v: &mut Value) {
    let Some(map) = v.as_object_mut() else {
        return;
    };
    // `AllPtrFieldsNil(&obj.VolumeSource)`: a volume of no source is an emptyDir.
    if !map.iter().any(|(k, value)| k != "name" && !value.is_null()) {
        map.insert("emptyDir".to_owned(), json!({}));
    }
    if let Some(image) = child(v, "image")
        && unset_str(image.get("pullPolicy"))
    {
        let policy =
            default_pull_policy(image.get("reference").and_then(Value::as_str).unwrap_or(""));
        default_str(image, "pullPolicy", policy);
    }
    if let Some(host_path) = child(v, "hostPath") {
        default_ptr(host_path, "type", json!(""));
    }
    for source in ["secret", "configMap"] {
        if let Some(source) = child(v, source) {
            default_ptr(source, "defaultMode", json!(DEFAULT_VOLUME_MODE));
        }
    }
    if let Some(iscsi) = child(v, "iscsi") {
        default_str(iscsi, "iscsiInterface", "default");
    }
    if let Some(rbd) = child(v, "rbd") {
        default_str(rbd, "pool", "rbd");
        default_str(rbd, "user", "admin");
        default_str(rbd, "keyring", "/etc/ceph/keyring");
    }
    if let Some(downward) = child(v, "downwardAPI") {
        default_ptr(downward, "defaultMode", json!(DEFAULT_VOLUME_MODE));
        for item in each_mut(downward, "items") {
            default_field_ref(item);
        }
    }
    if let Some(azure) = child(v, "azureDisk") {
        default_ptr(azure, "cachingMode", json!("ReadWrite"));
        default_ptr(azure, "fsType", json!("ext4"));
        default_ptr(azure, "readOnly", json!(false));
        default_ptr(azure, "kind", json!("Shared"));
    }
    if let Some(projected) = child(v, "projected") {
        default_ptr(projected, "defaultMode", json!(DEFAULT_VOLUME_MODE));
        for source in each_mut(projected, "sources") {
            if let Some(downward) = child(source, "downwardAPI") {
                for item in each_mut(downward, "items") {
                    default_field_ref(item);
                }
            }
            if let Some(token) = child(source, "serviceAccountToken") {
                default_ptr(token, "expirationSeconds", json!(3600));
            }
        }
    }
    if let Some(scale_io) = child(v, "scaleIO") {
        default_str(scale_io, "storageMode", "ThinProvisioned");
        default_str(scale_io, "fsType", "xfs");
    }
    if let Some(claim) = v.pointer_mut("/ephemeral/volumeClaimTemplate")
        && claim.is_object()
    {
        // `PersistentVolumeClaimTemplate`'s `ObjectMeta` and `Spec`, and the claim spec's
        // `Resources`, are non-pointer structs, written as `{}` when unset.
        default_ptr(claim, "metadata", json!({}));
        if let Some(claim_spec) = super::zero::object_at(claim, "spec") {
            default_ptr(claim_spec, "volumeMode", json!("Filesystem"));
            default_ptr(claim_spec, "resources", json!({}));
        }
    }
}

/// The defaults upstream gives a pod spec on every decode, of a pod or of a workload's pod
/// template: `SetDefaults_PodSpec` and the generated defaults under it (volumes, and
/// containers, init and ephemeral containers alike). Only unset fields are set.
pub(super) fn default_pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    service_account_alias(spec);
    default_str(spec, "dnsPolicy", "ClusterFirst");
    default_str(spec, "restartPolicy", "Always");
    default_ptr(spec, "securityContext", json!({}));
    default_ptr(spec, "terminationGracePeriodSeconds", json!(30));
    default_str(spec, "schedulerName", "default-scheduler");
    for volume in each_mut(spec, "volumes") {
        default_volume(volume);
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in each_mut(spec, list) {
            default_container(c);
        }
    }
}

/// Upstream's conversions of a pod spec (`Convert_v1_PodSpec_To_core_PodSpec` and back,
/// `pkg/apis/core/v1/conversion.go`), on every decode and answer: the deprecated
/// `serviceAccount` stands for `serviceAccountName` when that is unset, and is written back
/// as its alias, the same name.
fn service_account_alias(spec: &mut Value) {
    let name = [spec.get("serviceAccountName"), spec.get("serviceAccount")]
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find(|n| !n.is_empty())
        .map(str::to_owned);
    if let (Some(name), Some(map)) = (name, spec.as_object_mut()) {
        map.insert("serviceAccountName".into(), json!(name));
        map.insert("serviceAccount".into(), json!(name));
    }
}

/// A pod's volumes with upstream's defaults, to compare volumes stored before a default
/// existed with volumes written since.
pub(super) fn defaulted_volumes(volumes: &Value) -> Value {
    let mut volumes = volumes.clone();
    if let Some(list) = volumes.as_array_mut() {
        list.iter_mut().for_each(default_volume);
    }
    volumes
}

/// The defaults upstream gives a Pod (not a pod template) on every decode: `SetDefaults_Pod`
/// (requests from limits, pod-level requests, `enableServiceLinks`, host ports under host
/// networking) then [`default_pod_spec`]; and the status fields Go always writes
/// ([`pod_status_fields`]).
pub(super) fn default_pod(pod: &mut Value) {
    pod_status_fields(pod);
    let Some(spec) = child(pod, "spec") else {
        return;
    };
    for list in ["containers", "initContainers"] {
        for c in each_mut(spec, list) {
            if let Some(resources) = child(c, "resources") {
                requests_from_limits(resources);
            }
        }
    }
    default_pod_level_resources(spec);
    default_ptr(spec, "enableServiceLinks", json!(true));
    if spec.get("hostNetwork").and_then(Value::as_bool) == Some(true) {
        for list in ["containers", "initContainers"] {
            for c in each_mut(spec, list) {
                for port in each_mut(c, "ports") {
                    if unset_number(port.get("hostPort")) {
                        let container_port = port.get("containerPort").cloned().unwrap_or(json!(0));
                        port["hostPort"] = container_port;
                    }
                }
            }
        }
    }
    default_pod_spec(spec);
}

/// What Go writes of a pod's status whatever is set (`k8s.io/api/core/v1/types.go`): the
/// status itself (`PodStatus`, a non-pointer struct); each condition's `lastProbeTime` and
/// `lastTransitionTime` (`metav1.Time`, `null` when unset); and each container status's
/// `name`, `state` and `lastState` (structs, `{}`), `ready`, `restartCount`, `image` and
/// `imageID` (no `omitempty`).
fn pod_status_fields(pod: &mut Value) {
    use super::zero::{always, condition_times, object_at};
    let Some(status) = object_at(pod, "status") else {
        return;
    };
    for list in [
        "initContainerStatuses",
        "containerStatuses",
        "ephemeralContainerStatuses",
    ] {
        for c in each_mut(status, list) {
            always(c, &["state", "lastState"], &json!({}));
            always(c, &["name", "image", "imageID"], &json!(""));
            always(c, &["ready"], &json!(false));
            always(c, &["restartCount"], &json!(0));
        }
    }
    condition_times(pod, &["lastProbeTime", "lastTransitionTime"]);
}

/// A container's requests default to its limits, resource by resource.
fn requests_from_limits(resources: &mut Value) {
    let Some(limits) = resources.get("limits").and_then(Value::as_object).cloned() else {
        return;
    };
    for (name, limit) in limits.into_iter().filter(|(_, l)| !l.is_null()) {
        if !resources["requests"].is_object() {
            resources["requests"] = json!({});
        }
        default_ptr(&mut resources["requests"], &name, limit);
    }
}

/// A sum or maximum of quantities, with the text of the first quantity in it: the result
/// reads as that text while it still equals it (a request copied from one container reads
/// as that container's).
#[derive(Debug, Clone)]
struct Amount {
    nanos: i128,
    text: String,
    text_nanos: i128,
}

impl Amount {
    fn of(v: &Value) -> Option<Amount> {
        let nanos = quantity_of(v)?.nanos();
        Some(Amount {
            nanos,
            text: v.as_str().unwrap_or("").to_owned(),
            text_nanos: nanos,
        })
    }

    fn add(&mut self, other: &Amount) {
        self.nanos = self.nanos.saturating_add(other.nanos);
    }

    fn render(&self) -> Value {
        if self.nanos == self.text_nanos {
            json!(self.text)
        } else {
            json!(format_nanos(self.nanos))
        }
    }
}

/// A quantity of `nanos` nanos as upstream's canonical decimal form writes the
/// simple cases: whole units, then milli, micro or nano units.
fn format_nanos(nanos: i128) -> String {
    for (per, suffix) in [(1_000_000_000, ""), (1_000_000, "m"), (1_000, "u")] {
        if nanos % per == 0 {
            return format!("{}{suffix}", nanos / per);
        }
    }
    format!("{nanos}n")
}

type Amounts = std::collections::BTreeMap<String, Amount>;

fn add_amounts(into: &mut Amounts, list: &Value) {
    for (name, value) in list.as_object().into_iter().flatten() {
        let Some(amount) = Amount::of(value) else {
            continue;
        };
        match into.get_mut(name) {
            Some(sum) => sum.add(&amount),
            None => {
                into.insert(name.clone(), amount);
            }
        }
    }
}

fn max_amounts(into: &mut Amounts, other: &Amounts) {
    for (name, amount) in other {
        match into.get_mut(name) {
            Some(current) if current.nanos >= amount.nanos => {}
            _ => {
                into.insert(name.clone(), amount.clone());
            }
        }
    }
}

/// Upstream `resourcehelper.AggregateContainerRequests`/`AggregateContainerLimits` from the
/// spec (`kind` is `requests` or `limits`): the containers' sum, sidecars (restartable init
/// containers) added, and at least what any init container needs while it runs beside the
/// sidecars started before it.
fn aggregate_containers(spec: &Value, kind: &str) -> Amounts {
    let mut total = Amounts::new();
    for c in spec["containers"].as_array().into_iter().flatten() {
        add_amounts(&mut total, &c["resources"][kind]);
    }
    let mut sidecars = Amounts::new();
    let mut init_peak = Amounts::new();
    for c in spec["initContainers"].as_array().into_iter().flatten() {
        let own = &c["resources"][kind];
        let running = if c["restartPolicy"] == "Always" {
            add_amounts(&mut total, own);
            add_amounts(&mut sidecars, own);
            sidecars.clone()
        } else {
            let mut running = Amounts::new();
            add_amounts(&mut running, own);
            for (name, amount) in &sidecars {
                match running.get_mut(name) {
                    Some(sum) => sum.add(amount),
                    None => {
                        running.insert(name.clone(), amount.clone());
                    }
                }
            }
            running
        };
        max_amounts(&mut init_peak, &running);
    }
    max_amounts(&mut total, &init_peak);
    total
}

/// Upstream `IsSupportedPodLevelResource`: cpu, memory and huge pages.
fn pod_level_resource(name: &str) -> bool {
    matches!(name, "cpu" | "memory") || name.starts_with("hugepages-")
}

/// Upstream `defaultHugePagePodLimits` and `defaultPodRequests` (`SetDefaults_Pod` with
/// pod-level resources, on by default since 1.34): with pod-level resources, huge-page
/// limits default to the containers' and requests to the containers' (cpu, memory) or
/// else to the pod's limits.
fn default_pod_level_resources(spec: &mut Value) {
    let Some(resources) = spec.get("resources").filter(|r| r.is_object()) else {
        return;
    };
    let count = |kind: &str| resources[kind].as_object().map_or(0, |m| m.len());
    if count("limits") == 0 && count("requests") == 0 {
        return;
    }
    let mut limits = resources["limits"].as_object().cloned().unwrap_or_default();
    let requests_given = resources["requests"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (name, amount) in aggregate_containers(spec, "limits") {
        if name.starts_with("hugepages-")
            && !requests_given.contains_key(&name)
            && !limits.contains_key(&name)
        {
            limits.insert(name, amount.render());
        }
    }
    if limits.is_empty() {
        return;
    }
    let mut requests = requests_given;
    for (name, amount) in aggregate_containers(spec, "requests") {
        if matches!(name.as_str(), "cpu" | "memory") && !requests.contains_key(&name) {
            requests.insert(name, amount.render());
        }
    }
    for (name, limit) in &limits {
        if pod_level_resource(name) && !requests.contains_key(name) {
            requests.insert(name.clone(), limit.clone());
        }
    }
    let resources = &mut spec["resources"];
    resources["limits"] = Value::Object(limits);
    if !requests.is_empty() {
        resources["requests"] = Value::Object(requests);
    }
}

/// Upstream `ComputePodQOS` (`pkg/apis/core/helper/qos/qos.go`) over a defaulted pod spec:
/// `BestEffort` when no container (nor the pod, with pod-level resources) requests or
/// limits cpu or memory; `Guaranteed` when each container (init containers too), or the
/// pod with pod-level resources, limits both cpu and memory and the summed requests equal
/// the summed limits; `Burstable` otherwise. Zero quantities count as unset.
pub(super) fn pod_qos_class(spec: &Value) -> &'static str {
    fn add_positive(
        into: &mut std::collections::BTreeMap<String, i128>,
        list: &Value,
    ) -> Vec<String> {
        let mut found = Vec::new();
        for (name, value) in list.as_object().into_iter().flatten() {
            if !matches!(name.as_str(), "cpu" | "memory") {
                continue;
            }
            let Some(q) = quantity_of(value).filter(|q| q.nanos() > 0) else {
                continue;
            };
            let sum = into.entry(name.clone()).or_insert(0);
            *sum = sum.saturating_add(q.nanos());
            found.push(name.clone());
        }
        found
    }
    let both = |found: &[String]| {
        ["cpu", "memory"]
            .iter()
            .all(|r| found.iter().any(|f| f == r))
    };
    let mut requests = std::collections::BTreeMap::new();
    let mut limits = std::collections::BTreeMap::new();
    let mut guaranteed = true;
    if spec["resources"].is_object() {
        add_positive(&mut requests, &spec["resources"]["requests"]);
        if spec["resources"]["limits"]
            .as_object()
            .is_some_and(|l| !l.is_empty())
        {
            let found = add_positive(&mut limits, &spec["resources"]["limits"]);
            guaranteed &= both(&found);
        }
    } else {
        let containers = spec["containers"].as_array().into_iter().flatten();
        let init = spec["initContainers"].as_array().into_iter().flatten();
        for c in containers.chain(init) {
            add_positive(&mut requests, &c["resources"]["requests"]);
            let found = add_positive(&mut limits, &c["resources"]["limits"]);
            guaranteed &= both(&found);
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    guaranteed &= requests.iter().all(|(name, q)| limits.get(name) == Some(q));
    if guaranteed && requests.len() == limits.len() {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// Upstream `ValidateResourceRequirements` (with `ValidateResourceQuantityValue` →
/// `ValidateNonnegativeQuantity`) for the `resources` of the container at `path`: no
/// negative request or limit, and no request above its limit.
fn validate_resource_requirements(c: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let requirements = &c["resources"];
    let limits = requirements["limits"].as_object();
    for (kind, map) in [
        ("limits", limits),
        ("requests", requirements["requests"].as_object()),
    ] {
        for (name, value) in map.into_iter().flatten() {
            let Some(q) = quantity_of(value) else {
                continue;
            };
            if q.is_negative() {
                errors.push(FieldError::invalid(
                    format!("{path}.{kind}[{name}]"),
                    value,
                    "must be greater than or equal to 0",
                ));
            }
            let limit = limits.and_then(|l| l.get(name));
            if kind == "requests"
                && let Some(limit) = limit
                && quantity_of(limit).is_some_and(|l| q > l)
            {
                errors.push(FieldError::invalid(
                    format!("{path}.requests"),
                    value,
                    format!(
                        "must be less than or equal to {name} limit of {}",
                        limit.as_str().unwrap_or("")
                    ),
                ));
            }
        }
    }
}

/// The longest sysctl name (upstream `SysctlMaxLength`).
const SYSCTL_MAX_LENGTH: usize = 253;

/// Upstream `IsValidSysctlName`: at most 253 characters of segments
/// `[a-z0-9]([-_a-z0-9]*[a-z0-9])?` joined by `.` or `/`.
fn is_valid_sysctl_name(name: &str) -> bool {
    name.len() <= SYSCTL_MAX_LENGTH
        && name.split(['.', '/']).all(|segment| {
            let b = segment.as_bytes();
            let edge = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            !b.is_empty()
                && edge(b[0])
                && edge(b[b.len() - 1])
                && b.iter().all(|&c| edge(c) || c == b'-' || c == b'_')
        })
}

/// The kernel namespace of a sysctl, as upstream's `sysctl.GetNamespace`: `Some("Net")`,
/// `Some("IPC")` or `None` when it is not known to be namespaced. A name whose first
/// separator is `/` is read with `/` and `.` swapped (`NormalizeName`), and a pattern is
/// cut at its first `*`.
fn sysctl_namespace(name: &str) -> Option<&'static str> {
    let normalized: String = match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_owned(),
    };
    let name = normalized.split('*').next().unwrap_or("");
    const IPC_NAMES: [&str; 10] = [
        "kernel.sem",
        "kernel.shmall",
        "kernel.shmmax",
        "kernel.shmmni",
        "kernel.shm_rmid_forced",
        "kernel.shm",
        "kernel.msgmax",
        "kernel.msgmnb",
        "kernel.msgmni",
        "kernel.msg",
    ];
    if IPC_NAMES.contains(&name) {
        Some("IPC")
    } else if name.starts_with("net.") {
        Some("Net")
    } else if name.starts_with("fs.mqueue.") {
        Some("IPC")
    } else {
        None
    }
}

/// Upstream `ValidateHostSysctl`: a namespaced sysctl may not be set on a pod sharing that
/// namespace with the host.
fn host_sysctl_error(name: &str, spec: &Value) -> Option<&'static str> {
    let shares = |field: &str| spec[field].as_bool() == Some(true);
    match sysctl_namespace(name) {
        Some("Net") if shares("hostNetwork") => {
            Some("may not be specified when 'hostNetwork' is true")
        }
        Some("IPC") if shares("hostIPC") => Some("may not be specified when 'hostIPC' is true"),
        _ => None,
    }
}

/// Upstream `validateSysctls` for `securityContext.sysctls` of the spec at `prefix`: names
/// required, well formed and not repeated, and none of a namespace the pod shares with the
/// host, unless the old spec already had one such (upstream's
/// `AllowNamespacedSysctlsForHostNetAndHostIPC`, set from the old pod spec on updates).
fn validate_sysctls(
    spec: &Value,
    old_spec: Option<&Value>,
    prefix: &str,
    errors: &mut Vec<FieldError>,
) {
    let Some(sysctls) = spec["securityContext"]["sysctls"].as_array() else {
        return;
    };
    let allow_host_namespaced = old_spec.is_some_and(|old| {
        old["securityContext"]["sysctls"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| host_sysctl_error(s["name"].as_str().unwrap_or(""), old).is_some())
    });
    let mut names = std::collections::HashSet::new();
    for (i, sysctl) in sysctls.iter().enumerate() {
        let name = sysctl["name"].as_str().unwrap_or("");
        let path = format!("{prefix}.securityContext.sysctls[{i}].name");
        if name.is_empty() {
            errors.push(FieldError::required(path.clone(), ""));
        } else if !is_valid_sysctl_name(name) {
            errors.push(FieldError::invalid(
                path.clone(),
                &json!(name),
                format!(
                    "must have at most {SYSCTL_MAX_LENGTH} characters and match regex ^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$"
                ),
            ));
        } else if names.contains(name) {
            errors.push(FieldError::duplicate(path.clone(), &json!(name)));
        }
        if !allow_host_namespaced && let Some(detail) = host_sysctl_error(name, spec) {
            errors.push(FieldError::invalid(path, &json!(name), detail));
        }
        names.insert(name);
    }
}

/// The rules of a pod spec at `prefix` (`spec`, `spec.template.spec`) served here:
/// containers, resources, overhead and sysctls. `old_spec` is the spec being updated.
pub(super) fn validate_pod_spec(
    spec: &Value,
    old_spec: Option<&Value>,
    prefix: &str,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_sysctls(spec, old_spec, prefix, &mut errors);
    for list in ["containers", "initContainers"] {
        for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
            let path = format!("{prefix}.{list}[{i}].resources");
            validate_resource_requirements(c, &path, &mut errors);
        }
    }
    // Upstream `validateOverhead`.
    for (name, value) in spec["overhead"].as_object().into_iter().flatten() {
        if quantity_of(value).is_some_and(|q| q.is_negative()) {
            errors.push(FieldError::invalid(
                format!("{prefix}.overhead[{name}]"),
                value,
                "must be greater than or equal to 0",
            ));
        }
    }
    match spec["containers"].as_array() {
        Some(cs) if !cs.is_empty() => {
            for (i, c) in cs.iter().enumerate() {
                if c["name"].as_str().unwrap_or("").is_empty() {
                    errors.push(FieldError::required(
                        format!("{prefix}.containers[{i}].name"),
                        "",
                    ));
                }
                if c["image"].as_str().unwrap_or("").is_empty() {
                    errors.push(FieldError::required(
                        format!("{prefix}.containers[{i}].image"),
                        "",
                    ));
                }
            }
        }
        _ => errors.push(FieldError::required(format!("{prefix}.containers"), "")),
    }
    errors
}
