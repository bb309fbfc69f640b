//! Answers of the API server that follow kube-apiserver 1.35 where they once differed, each
//! checked through the real HTTP API (TLS on loopback, a kube-rs client as the admin):
//! ConfigMap and Secret validation, pod QoS classes, defaulting of updates, sysctls, core/v1
//! Event validation and field selectors, Service status defaults, content negotiation of
//! reviews, discovery roots with a trailing slash, strict decoding of duplicate fields, and
//! the generation bump of a graceful deletion.

use axum::http::HeaderMap;
use ccm_testkit::TestServer;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Pod, Secret};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};

/// What upstream's immutable ConfigMaps and Secrets answer a change with.
const IMMUTABLE: &str = "Forbidden: field is immutable when `immutable` is set";

async fn start() -> (TestServer, Client) {
    let server = TestServer::start(ccm_testkit::memory_server().await)
        .await
        .unwrap();
    let client = server.admin_client().await.unwrap();
    (server, client)
}

/// One answer: status, headers and the JSON body (`Null` if not JSON).
struct Answer {
    code: u16,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }

    /// The `Warning` headers.
    fn warnings(&self) -> Vec<String> {
        self.headers
            .get_all("warning")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    }

    /// The `(field, message)` of each cause of an error.
    fn causes(&self) -> Vec<(String, String)> {
        self.body["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["field"].as_str().unwrap_or("").to_owned(),
                    c["message"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }
}

/// Sends `body` (raw bytes, as given) with `method` to `path`, with the extra `headers`.
async fn send_raw(
    client: &Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Answer {
    let mut request = axum::http::Request::builder().method(method).uri(path);
    let typed = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"));
    if !body.is_empty() && !typed {
        request = request.header("content-type", "application/json");
    }
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(body).unwrap();
    let response = client.send(request.map(Into::into)).await.unwrap();
    let code = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        code,
        headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// Sends the JSON `body` with `method` to `path`.
async fn send(client: &Client, method: &str, path: &str, body: &Value) -> Answer {
    send_raw(client, method, path, &[], body.to_string().into_bytes()).await
}

async fn get(client: &Client, path: &str) -> Value {
    let answer = send_raw(client, "GET", path, &[], Vec::new()).await;
    assert_eq!(answer.code, 200, "{}", answer.body);
    answer.body
}

/// The (code, message) of a kube-rs call that must fail with an API error.
fn refusal<T: std::fmt::Debug>(result: kube::Result<T>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(s)) => (s.code, s.message.clone()),
        other => panic!("not an API error: {other:?}"),
    }
}

fn from<K: serde::de::DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v).unwrap()
}

const PODS: &str = "/api/v1/namespaces/default/pods";

/// A pod of one container `app` (image `nginx:1.25`) with `spec` merged over it.
fn pod_body(name: &str, spec: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.25"}]},
    });
    for (k, v) in spec.as_object().unwrap() {
        pod["spec"][k] = v.clone();
    }
    pod
}

// ---------------------------------------------------------------- 1. immutable data

/// `pkg/apis/core/validation/validation.go ValidateConfigMapUpdate` and
/// `ValidateSecretUpdate`: once `immutable` is true, a change of `data` (or `binaryData`)
/// is forbidden, and so is `immutable` going back to false or unset; metadata still
/// changes, and a Secret's `stringData` that decodes to the same `data` is no change.
#[tokio::test]
async fn immutable_config_maps_and_secrets_refuse_changes() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let created = cms
        .create(
            &pp,
            &from(json!({"metadata": {"name": "frozen"}, "immutable": true,
                         "data": {"k": "v"}, "binaryData": {"b": "AAE="}})),
        )
        .await
        .unwrap();
    assert_eq!(created.immutable, Some(true));

    let mut changed = created.clone();
    changed
        .data
        .as_mut()
        .unwrap()
        .insert("k".into(), "w".into());
    assert_eq!(
        refusal(cms.replace("frozen", &pp, &changed).await),
        (
            422,
            format!("ConfigMap \"frozen\" is invalid: data: {IMMUTABLE}")
        )
    );
    let mut changed = created.clone();
    changed.binary_data = None;
    assert_eq!(
        refusal(cms.replace("frozen", &pp, &changed).await),
        (
            422,
            format!("ConfigMap \"frozen\" is invalid: binaryData: {IMMUTABLE}")
        )
    );
    for immutable in [Some(false), None] {
        let mut thawed = created.clone();
        thawed.immutable = immutable;
        assert_eq!(
            refusal(cms.replace("frozen", &pp, &thawed).await),
            (
                422,
                format!("ConfigMap \"frozen\" is invalid: immutable: {IMMUTABLE}")
            ),
            "{immutable:?}"
        );
    }
    let mut both = created.clone();
    both.immutable = Some(false);
    both.data = None;
    assert_eq!(
        refusal(cms.replace("frozen", &pp, &both).await),
        (
            422,
            format!("ConfigMap \"frozen\" is invalid: [immutable: {IMMUTABLE}, data: {IMMUTABLE}]")
        )
    );
    // Metadata is not frozen.
    let mut labelled = created.clone();
    labelled.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
    let labelled = cms.replace("frozen", &pp, &labelled).await.unwrap();
    assert_eq!(labelled.data, created.data);
    assert_eq!(labelled.immutable, Some(true));

    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let created = secrets
        .create(
            &pp,
            &from(json!({"metadata": {"name": "frozen"}, "immutable": true,
                         "data": {"pw": "czNjcmV0"}})),
        )
        .await
        .unwrap();
    assert_eq!(created.type_.as_deref(), Some("Opaque"));
    let mut changed = created.clone();
    changed.data = None;
    changed.string_data = Some([("pw".to_owned(), "other".to_owned())].into());
    assert_eq!(
        refusal(secrets.replace("frozen", &pp, &changed).await),
        (
            422,
            format!("Secret \"frozen\" is invalid: data: {IMMUTABLE}")
        )
    );
    let mut thawed = created.clone();
    thawed.immutable = Some(false);
    assert_eq!(
        refusal(secrets.replace("frozen", &pp, &thawed).await),
        (
            422,
            format!("Secret \"frozen\" is invalid: immutable: {IMMUTABLE}")
        )
    );
    // `stringData` of the same bytes is the same `data`.
    let mut same = created.clone();
    same.data = None;
    same.string_data = Some([("pw".to_owned(), "s3cret".to_owned())].into());
    let same = secrets.replace("frozen", &pp, &same).await.unwrap();
    assert_eq!(same.data, created.data);
    assert_eq!(same.string_data, None);
}

// ---------------------------------------------------------------- 2. config map keys

/// `pkg/apis/core/validation/validation.go ValidateConfigMap` with apimachinery's
/// `IsConfigMapKey`: keys of `data` and `binaryData` are `[-._a-zA-Z0-9]+`, not `.`, `..`
/// or starting with `..`, each refusal at `data[<key>]`.
#[tokio::test]
async fn config_map_keys_must_be_config_map_keys() {
    let (_server, client) = start().await;
    const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";
    let regex = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";

    let answer = send(
        &client,
        "POST",
        CONFIGMAPS,
        &json!({"metadata": {"name": "bad"}, "data": {"bad key!": "v"}}),
    )
    .await;
    assert_eq!(answer.code, 422, "{}", answer.body);
    assert_eq!(answer.body["reason"], "Invalid");
    assert_eq!(
        answer.message(),
        format!(
            "ConfigMap \"bad\" is invalid: data[bad key!]: Invalid value: \"bad key!\": {regex}"
        )
    );
    assert_eq!(
        answer.causes(),
        [(
            "data[bad key!]".to_owned(),
            format!("Invalid value: \"bad key!\": {regex}")
        )]
    );

    for (key, message) in [
        ("..hidden", "must not start with '..'"),
        ("..", "must not be '..'"),
        (".", "must not be '.'"),
    ] {
        let answer = send(
            &client,
            "POST",
            CONFIGMAPS,
            &json!({"metadata": {"name": "dots"}, "binaryData": {key: "AAE="}}),
        )
        .await;
        assert_eq!(answer.code, 422, "{}", answer.body);
        assert_eq!(
            answer.message(),
            format!(
                "ConfigMap \"dots\" is invalid: binaryData[{key}]: Invalid value: \"{key}\": {message}"
            ),
        );
    }

    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    assert!(cms.get_opt("bad").await.unwrap().is_none());
    let good = cms
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "good"},
                         "data": {"key.name_1-A": "v", ".dotfile": "w"}})),
        )
        .await
        .unwrap();
    assert_eq!(good.data.unwrap().len(), 2);
}

// ---------------------------------------------------------------- 3. QoS class

/// `pkg/apis/core/helper/qos/qos.go ComputePodQOS` (the status `PrepareForCreate` writes,
/// after `SetDefaults_Pod` copies limits into unset requests): Guaranteed when every
/// container, init containers too, limits cpu and memory and the requests equal the
/// limits (as quantities); BestEffort with no cpu or memory anywhere; Burstable otherwise.
#[tokio::test]
async fn pod_qos_class_is_computed_on_create() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    let container = |name: &str, resources: Value| json!({"name": name, "image": "busybox:1.36", "resources": resources});
    let cases = [
        (
            "limits-only",
            json!({"containers": [container("a", json!({"limits": {"cpu": "100m", "memory": "64Mi"}}))]}),
            "Guaranteed",
        ),
        (
            "equal-quantities",
            json!({"containers": [
                container("a", json!({"requests": {"cpu": "1", "memory": "1Gi"},
                                      "limits": {"cpu": "1000m", "memory": "1073741824"}})),
                container("b", json!({"limits": {"cpu": "2", "memory": "1Mi"}})),
            ]}),
            "Guaranteed",
        ),
        (
            "requests-below-limits",
            json!({"containers": [container("a", json!({"requests": {"cpu": "50m", "memory": "64Mi"},
                                                         "limits": {"cpu": "100m", "memory": "64Mi"}}))]}),
            "Burstable",
        ),
        (
            "cpu-limit-only",
            json!({"containers": [container("a", json!({"limits": {"cpu": "100m"}}))]}),
            "Burstable",
        ),
        (
            "one-container-unlimited",
            json!({"containers": [
                container("a", json!({"limits": {"cpu": "100m", "memory": "64Mi"}})),
                container("b", json!({})),
            ]}),
            "Burstable",
        ),
        (
            "init-container-unlimited",
            json!({"containers": [container("a", json!({"limits": {"cpu": "100m", "memory": "64Mi"}}))],
                   "initContainers": [container("i", json!({"requests": {"memory": "1Mi"}}))]}),
            "Burstable",
        ),
        (
            "nothing",
            json!({"containers": [container("a", json!({}))]}),
            "BestEffort",
        ),
        (
            "other-resources-only",
            json!({"containers": [container("a", json!({"requests": {"ephemeral-storage": "1Gi"},
                                                         "limits": {"ephemeral-storage": "1Gi"}}))]}),
            "BestEffort",
        ),
        (
            "zero-quantities",
            json!({"containers": [container("a", json!({"requests": {"cpu": "0", "memory": "0"}}))]}),
            "BestEffort",
        ),
    ];
    for (name, spec, class) in cases {
        let created = pods
            .create(&pp, &from(pod_body(name, spec)))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let status = created.status.unwrap();
        assert_eq!(status.qos_class.as_deref(), Some(class), "{name}");
        assert_eq!(status.phase.as_deref(), Some("Pending"), "{name}");
        let stored = pods.get(name).await.unwrap();
        assert_eq!(stored.status.unwrap().qos_class.as_deref(), Some(class));
    }
    // The requests a limit defaulted are stored.
    let stored = pods.get("limits-only").await.unwrap();
    let requests = stored.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .requests
        .unwrap();
    assert_eq!(requests["cpu"].0, "100m");
    assert_eq!(requests["memory"].0, "64Mi");
}

// ---------------------------------------------------------------- 4. update defaulting

/// Upstream defaults every decoded body (`pkg/apis/core/v1/defaults.go SetDefaults_Pod`,
/// `SetDefaults_PodSpec`, `SetDefaults_Container`, run by the codec on the update's body as
/// on a create's): a PUT whose body leaves out defaulted fields stores them defaulted
/// again, and so is not a forbidden change of the pod spec.
#[tokio::test]
async fn pod_update_defaults_omitted_fields() {
    let (_server, client) = start().await;
    let created = send(&client, "POST", PODS, &pod_body("upd", json!({}))).await;
    assert_eq!(created.code, 201, "{}", created.body);
    let c = &created.body["spec"]["containers"][0];
    assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
    assert_eq!(c["terminationMessagePolicy"], "File");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");

    let mut body = created.body.clone();
    let spec = body["spec"].as_object_mut().unwrap();
    for field in [
        "dnsPolicy",
        "restartPolicy",
        "schedulerName",
        "terminationGracePeriodSeconds",
        "securityContext",
        "enableServiceLinks",
    ] {
        assert!(spec.remove(field).is_some(), "{field} was defaulted");
    }
    let container = spec["containers"][0].as_object_mut().unwrap();
    for field in [
        "terminationMessagePath",
        "terminationMessagePolicy",
        "imagePullPolicy",
    ] {
        container.remove(field);
    }
    container.insert("image".into(), json!("nginx:1.26"));
    let updated = send(&client, "PUT", &format!("{PODS}/upd"), &body).await;
    assert_eq!(updated.code, 200, "{}", updated.body);

    let stored = get(&client, &format!("{PODS}/upd")).await;
    for pod in [&updated.body, &stored] {
        let spec = &pod["spec"];
        assert_eq!(spec["dnsPolicy"], "ClusterFirst", "{pod}");
        assert_eq!(spec["restartPolicy"], "Always");
        assert_eq!(spec["schedulerName"], "default-scheduler");
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        assert_eq!(spec["securityContext"], json!({}));
        assert_eq!(spec["enableServiceLinks"], true);
        let c = &spec["containers"][0];
        assert_eq!(c["image"], "nginx:1.26");
        assert_eq!(c["terminationMessagePath"], "/dev/termination-log");
        assert_eq!(c["terminationMessagePolicy"], "File");
        assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    }
    assert_ne!(
        stored["metadata"]["resourceVersion"],
        created.body["metadata"]["resourceVersion"]
    );
}

// ---------------------------------------------------------------- 5. sysctls

/// `pkg/apis/core/validation/validation.go validateSysctls` and `ValidateHostSysctl`: a
/// sysctl needs a name, a well-formed one (`IsValidSysctlName`), once only, and none of a
/// kernel namespace the pod shares with the host (`net.*` with `hostNetwork`, the IPC
/// sysctls with `hostIPC`).
#[tokio::test]
async fn invalid_sysctls_are_refused() {
    let (_server, client) = start().await;
    let regex = r"must have at most 253 characters and match regex ^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$";
    let path = "spec.securityContext.sysctls[0].name";
    let too_long = format!("net.{}", "a".repeat(250));
    let cases = [
        (
            json!({"securityContext": {"sysctls": [{"name": "Kernel.msgmax", "value": "1"}]}}),
            format!("{path}: Invalid value: \"Kernel.msgmax\": {regex}"),
        ),
        (
            json!({"securityContext": {"sysctls": [{"name": "net..ipv4", "value": "1"}]}}),
            format!("{path}: Invalid value: \"net..ipv4\": {regex}"),
        ),
        (
            json!({"securityContext": {"sysctls": [{"name": too_long.clone(), "value": "1"}]}}),
            format!("{path}: Invalid value: \"{too_long}\": {regex}"),
        ),
        (
            json!({"securityContext": {"sysctls": [{"name": "", "value": "1"}]}}),
            format!("{path}: Required value"),
        ),
        (
            json!({"securityContext": {"sysctls": [
                {"name": "kernel.shm_rmid_forced", "value": "1"},
                {"name": "kernel.shm_rmid_forced", "value": "0"}]}}),
            "spec.securityContext.sysctls[1].name: Duplicate value: \"kernel.shm_rmid_forced\""
                .to_owned(),
        ),
        (
            json!({"hostNetwork": true,
                   "securityContext": {"sysctls": [{"name": "net.ipv4.ip_forward", "value": "1"}]}}),
            format!(
                "{path}: Invalid value: \"net.ipv4.ip_forward\": may not be specified when 'hostNetwork' is true"
            ),
        ),
        (
            json!({"hostIPC": true,
                   "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
            format!(
                "{path}: Invalid value: \"kernel.msgmax\": may not be specified when 'hostIPC' is true"
            ),
        ),
        (
            json!({"hostIPC": true,
                   "securityContext": {"sysctls": [{"name": "fs.mqueue.msg_max", "value": "1"}]}}),
            format!(
                "{path}: Invalid value: \"fs.mqueue.msg_max\": may not be specified when 'hostIPC' is true"
            ),
        ),
    ];
    for (i, (spec, error)) in cases.into_iter().enumerate() {
        let name = format!("sysctl-{i}");
        let answer = send(&client, "POST", PODS, &pod_body(&name, spec)).await;
        assert_eq!(answer.code, 422, "{}", answer.body);
        assert_eq!(
            answer.message(),
            format!("Pod \"{name}\" is invalid: {error}")
        );
    }
    // Well-formed sysctls of namespaces the pod does not share with the host, and the
    // slash-separated form, are taken.
    for (i, spec) in [
        json!({"securityContext": {"sysctls": [
            {"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"},
            {"name": "kernel.shm_rmid_forced", "value": "1"},
            {"name": "net/ipv4/conf/eth0.100/forwarding", "value": "1"}]}}),
        json!({"hostNetwork": true,
               "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
        json!({"hostIPC": true,
               "securityContext": {"sysctls": [{"name": "net.ipv4.ip_forward", "value": "1"}]}}),
    ]
    .into_iter()
    .enumerate()
    {
        let answer = send(&client, "POST", PODS, &pod_body(&format!("ok-{i}"), spec)).await;
        assert_eq!(answer.code, 201, "{}", answer.body);
    }
}

// ---------------------------------------------------------------- 6. events

/// `pkg/apis/core/validation/events.go legacyValidateEvent`, all a core/v1 write is held
/// to: an event without `eventTime` needs its involved object's namespace to be its own
/// (or empty, in `default`); one with an `eventTime` needs a reporting controller (a
/// qualified name, `reportingComponent` in core/v1), a reporting instance, an action and a
/// reason, and an involved object's namespace outside `default` and `kube-system`.
#[tokio::test]
async fn core_events_are_validated_by_the_legacy_rules() {
    let (_server, client) = start().await;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "ns1"}})),
        )
        .await
        .unwrap();
    let event = |ns: &str, name: &str, involved_ns: Option<&str>| {
        let mut e = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {"kind": "Pod", "name": "p", "apiVersion": "v1"},
            "reason": "Started", "message": "m", "type": "Normal",
            "source": {"component": "kubelet"},
        });
        if let Some(n) = involved_ns {
            e["involvedObject"]["namespace"] = json!(n);
        }
        e
    };
    let events_in = |ns: &str| format!("/api/v1/namespaces/{ns}/events");

    let mismatch = |name: &str, involved: &str| {
        format!(
            "Event \"{name}\" is invalid: involvedObject.namespace: Invalid value: \"{involved}\": does not match event.namespace"
        )
    };
    for (ns, name, involved) in [
        ("default", "other-ns", Some("ns1")),
        ("ns1", "no-ns", None),
        ("ns1", "wrong-ns", Some("default")),
    ] {
        let answer = send(&client, "POST", &events_in(ns), &event(ns, name, involved)).await;
        assert_eq!(answer.code, 422, "{}", answer.body);
        assert_eq!(answer.message(), mismatch(name, involved.unwrap_or("")));
    }
    for (ns, name, involved) in [
        ("default", "same-ns", Some("default")),
        ("default", "empty-in-default", None),
        ("ns1", "in-ns1", Some("ns1")),
    ] {
        let answer = send(&client, "POST", &events_in(ns), &event(ns, name, involved)).await;
        assert_eq!(answer.code, 201, "{name}: {}", answer.body);
    }

    // A new-style event through core/v1.
    let mut new_style = event("ns1", "new-style", None);
    new_style["eventTime"] = json!("2025-01-01T00:00:00.000000Z");
    new_style["reason"] = json!("");
    let answer = send(&client, "POST", &events_in("ns1"), &new_style).await;
    assert_eq!(answer.code, 422, "{}", answer.body);
    let fields: Vec<String> = answer.causes().into_iter().map(|(f, _)| f).collect();
    assert_eq!(
        fields,
        [
            "involvedObject.namespace",
            "reportingComponent",
            "reportingComponent",
            "reportingComponent",
            "reportingInstance",
            "action",
            "reason",
        ]
    );
    assert_eq!(
        answer.causes()[1],
        ("reportingComponent".to_owned(), "Required value".to_owned())
    );
    assert_eq!(
        answer.causes()[2],
        (
            "reportingComponent".to_owned(),
            "Invalid value: \"\": name part must be non-empty".to_owned()
        )
    );
    new_style["involvedObject"]["namespace"] = json!("ns1");
    new_style["reason"] = json!("Started");
    new_style["reportingComponent"] = json!("example.com/controller");
    new_style["reportingInstance"] = json!("controller-0");
    new_style["action"] = json!("Start");
    let answer = send(&client, "POST", &events_in("ns1"), &new_style).await;
    assert_eq!(answer.code, 201, "{}", answer.body);
    new_style["reportingComponent"] = json!("bad controller");
    new_style["metadata"]["name"] = json!("bad-controller");
    let answer = send(&client, "POST", &events_in("ns1"), &new_style).await;
    assert_eq!(answer.code, 422, "{}", answer.body);
    assert_eq!(
        answer.message(),
        "Event \"bad-controller\" is invalid: reportingComponent: Invalid value: \"bad controller\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    );
}

/// `pkg/registry/core/event/strategy.go ToSelectableFields`: the `source` field of an
/// event is its `source.component`, else (an event written by a new-style recorder) its
/// reporting controller.
#[tokio::test]
async fn event_source_selector_falls_back_to_the_reporting_controller() {
    let (_server, client) = start().await;
    let events: Api<Event> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    let event = |name: &str, component: Option<&str>, reporting: &str| {
        let mut e = json!({
            "metadata": {"name": name},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
            "reason": "Started", "type": "Normal",
            "reportingComponent": reporting,
        });
        if let Some(c) = component {
            e["source"] = json!({"component": c});
        }
        from::<Event>(e)
    };
    events
        .create(&pp, &event("reported", None, "my-controller"))
        .await
        .unwrap();
    events
        .create(&pp, &event("empty-source", Some(""), "my-controller"))
        .await
        .unwrap();
    events
        .create(&pp, &event("by-kubelet", Some("kubelet"), "my-controller"))
        .await
        .unwrap();
    events
        .create(&pp, &event("other", None, "other-controller"))
        .await
        .unwrap();
    let names = |list: kube::core::ObjectList<Event>| -> Vec<String> {
        let mut names: Vec<String> = list
            .items
            .into_iter()
            .map(|e| e.metadata.name.unwrap())
            .collect();
        names.sort();
        names
    };
    let selected = |selector: &'static str| {
        let events = events.clone();
        async move {
            names(
                events
                    .list(&ListParams::default().fields(selector))
                    .await
                    .unwrap(),
            )
        }
    };
    assert_eq!(
        selected("source=my-controller").await,
        ["empty-source", "reported"]
    );
    assert_eq!(selected("source=kubelet").await, ["by-kubelet"]);
    assert_eq!(
        selected("reportingComponent=my-controller").await,
        ["by-kubelet", "empty-source", "reported"]
    );
    assert_eq!(
        selected("source!=my-controller").await,
        ["by-kubelet", "other"]
    );
}

// ---------------------------------------------------------------- 7. services

/// `pkg/apis/core/v1/defaults.go SetDefaults_Service`, run on a status write's body too:
/// a load balancer's ingress point with an `ip` and no `ipMode` gets `ipMode: VIP` (one
/// with only a hostname gets none, a given mode is kept); and
/// `pkg/apis/core/validation/validation.go ValidateServiceStatusUpdate` does not check the
/// status conditions, so a condition without `lastTransitionTime` (a zero time to Go's
/// decoder) is taken.
#[tokio::test]
async fn service_status_defaults_ip_mode_and_takes_conditions_without_transition_time() {
    let (_server, client) = start().await;
    const SERVICES: &str = "/api/v1/namespaces/default/services";
    let created = send(
        &client,
        "POST",
        SERVICES,
        &json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lb"},
                "spec": {"type": "LoadBalancer", "selector": {"app": "lb"},
                         "ports": [{"port": 80}]}}),
    )
    .await;
    assert_eq!(created.code, 201, "{}", created.body);
    assert_eq!(created.body["spec"]["allocateLoadBalancerNodePorts"], true);

    let mut body = created.body.clone();
    body["status"] = json!({
        "loadBalancer": {"ingress": [
            {"ip": "203.0.113.7"},
            {"hostname": "lb.example.com"},
            {"ip": "203.0.113.8", "ipMode": "Proxy"},
        ]},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Provisioned",
                        "message": "", "observedGeneration": 1}],
    });
    let status_path = format!("{SERVICES}/lb/status");
    let updated = send(&client, "PUT", &status_path, &body).await;
    assert_eq!(updated.code, 200, "{}", updated.body);
    let stored = get(&client, &format!("{SERVICES}/lb")).await;
    for service in [&updated.body, &stored] {
        let ingress = &service["status"]["loadBalancer"]["ingress"];
        assert_eq!(
            *ingress,
            json!([
                {"ip": "203.0.113.7", "ipMode": "VIP"},
                {"hostname": "lb.example.com"},
                {"ip": "203.0.113.8", "ipMode": "Proxy"},
            ]),
            "{service}"
        );
        let condition = &service["status"]["conditions"][0];
        assert_eq!(condition["type"], "Ready");
        assert_eq!(condition["reason"], "Provisioned");
        // `metav1.Condition.LastTransitionTime` is a `metav1.Time` without `omitempty`: Go
        // writes the unset time as null.
        assert_eq!(condition["lastTransitionTime"], Value::Null, "{condition}");
        assert!(condition.get("lastTransitionTime").is_some(), "{condition}");
    }
    // A merge patch of the status is defaulted alike.
    let patched = send_raw(
        &client,
        "PATCH",
        &status_path,
        &[("content-type", "application/merge-patch+json")],
        json!({"status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(patched.code, 200, "{}", patched.body);
    assert_eq!(
        patched.body["status"]["loadBalancer"]["ingress"],
        json!([{"ip": "198.51.100.1", "ipMode": "VIP"}])
    );
}

// ---------------------------------------------------------------- 8. apiserver

/// `k8s.io/apiserver/pkg/endpoints/handlers/rest.go AllowsMediaTypeTransform` and
/// `negotiation.NewNotAcceptableError`: an access review's storage has no table convertor,
/// so an Accept header that takes only a Table is a 406 (before anything is done), and one
/// that also takes JSON gets the review.
#[tokio::test]
async fn table_only_accept_on_an_access_review_is_not_acceptable() {
    let (_server, client) = start().await;
    const SSAR: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "default"}},
    })
    .to_string()
    .into_bytes();
    let answer = send_raw(&client, "POST", SSAR, &[("accept", TABLE)], review.clone()).await;
    assert_eq!(answer.code, 406, "{}", answer.body);
    assert_eq!(answer.body["kind"], "Status");
    assert_eq!(answer.body["reason"], "NotAcceptable");
    assert_eq!(
        answer.message(),
        "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf"
    );
    let accept = format!("{TABLE}, application/json");
    let answer = send_raw(&client, "POST", SSAR, &[("accept", &accept)], review).await;
    assert_eq!(answer.code, 201, "{}", answer.body);
    assert_eq!(answer.body["kind"], "SelfSubjectAccessReview");
    assert_eq!(answer.body["status"]["allowed"], true);
    // A resource's own endpoint has a table convertor.
    let answer = send_raw(&client, "GET", PODS, &[("accept", TABLE)], Vec::new()).await;
    assert_eq!(answer.code, 200, "{}", answer.body);
    assert_eq!(answer.body["kind"], "Table");
}

/// go-restful serves `/api/` as `/api` (the `APIVersions`), and kube-aggregator
/// (`pkg/apiserver/apiserver.go`) serves `/apis/` with the plain `APIGroupList` handler,
/// never aggregated discovery.
#[tokio::test]
async fn discovery_roots_answer_with_a_trailing_slash() {
    let (_server, client) = start().await;
    const AGGREGATED: &str =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    let api = send_raw(
        &client,
        "GET",
        "/api/",
        &[("accept", "application/json")],
        Vec::new(),
    )
    .await;
    assert_eq!(api.code, 200, "{}", api.body);
    assert_eq!(api.body["kind"], "APIVersions");
    assert_eq!(api.body["versions"], json!(["v1"]));
    assert_eq!(api.body, get(&client, "/api").await);

    for accept in ["application/json", AGGREGATED] {
        let apis = send_raw(&client, "GET", "/apis/", &[("accept", accept)], Vec::new()).await;
        assert_eq!(apis.code, 200, "{}", apis.body);
        assert_eq!(apis.body["kind"], "APIGroupList", "{accept}");
        assert_eq!(apis.headers["content-type"], "application/json");
        let groups: Vec<&str> = apis.body["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["name"].as_str().unwrap())
            .collect();
        assert!(groups.contains(&"apps"), "{groups:?}");
        assert!(!groups.contains(&""), "{groups:?}");
    }
    let aggregated = send_raw(
        &client,
        "GET",
        "/apis",
        &[("accept", AGGREGATED)],
        Vec::new(),
    )
    .await;
    assert_eq!(aggregated.body["kind"], "APIGroupDiscoveryList");
}

/// `k8s.io/apiserver/pkg/endpoints/handlers/create.go` with the strict serializer
/// (`sigs.k8s.io/json` `DisallowDuplicateFields`) and `transformDecodeError`: with
/// `fieldValidation=Strict` a duplicate field of a Pod body is a 400
/// `Pod in version "v1" cannot be handled as a Pod: strict decoding error: …`, the unknown
/// and duplicate fields in the order met; with the default (`Warn`) the pod is created,
/// the last duplicate kept, and each finding is a `Warning` header
/// (`addStrictDecodingWarnings`).
#[tokio::test]
async fn duplicate_fields_are_strict_decoding_errors() {
    let (_server, client) = start().await;
    let body = |name: &str| {
        format!(
            r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "{name}"}},
              "spec": {{"bogus": 1, "restartPolicy": "Always", "restartPolicy": "Never",
                "containers": [{{"name": "app", "image": "nginx:1.25", "image": "nginx:1.26"}}]}}}}"#
        )
        .into_bytes()
    };
    let strict = send_raw(
        &client,
        "POST",
        &format!("{PODS}?fieldValidation=Strict"),
        &[],
        body("strict"),
    )
    .await;
    assert_eq!(strict.code, 400, "{}", strict.body);
    assert_eq!(strict.body["reason"], "BadRequest");
    assert_eq!(
        strict.message(),
        r#"Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "spec.bogus", duplicate field "spec.restartPolicy", duplicate field "spec.containers[0].image""#
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    assert!(pods.get_opt("strict").await.unwrap().is_none());

    // Only a duplicate.
    let only =
        br#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "only", "name": "only"},
        "spec": {"containers": [{"name": "app", "image": "nginx:1.25"}]}}"#;
    let strict = send_raw(
        &client,
        "POST",
        &format!("{PODS}?fieldValidation=Strict"),
        &[],
        only.to_vec(),
    )
    .await;
    assert_eq!(strict.code, 400, "{}", strict.body);
    assert_eq!(
        strict.message(),
        r#"Pod in version "v1" cannot be handled as a Pod: strict decoding error: duplicate field "metadata.name""#
    );

    let warned = send_raw(&client, "POST", PODS, &[], body("warned")).await;
    assert_eq!(warned.code, 201, "{}", warned.body);
    assert_eq!(
        warned.warnings(),
        [
            r#"299 - "unknown field \"spec.bogus\"""#,
            r#"299 - "duplicate field \"spec.restartPolicy\"""#,
            r#"299 - "duplicate field \"spec.containers[0].image\"""#,
        ]
    );
    let stored = pods.get("warned").await.unwrap().spec.unwrap();
    assert_eq!(stored.restart_policy.as_deref(), Some("Never"));
    assert_eq!(stored.containers[0].image.as_deref(), Some("nginx:1.26"));

    let ignored = send_raw(
        &client,
        "POST",
        &format!("{PODS}?fieldValidation=Ignore"),
        &[],
        body("ignored"),
    )
    .await;
    assert_eq!(ignored.code, 201, "{}", ignored.body);
    assert!(ignored.warnings().is_empty(), "{:?}", ignored.warnings());
}

// ---------------------------------------------------------------- 9. graceful deletion

/// `k8s.io/apiserver/pkg/registry/rest/delete.go BeforeDelete`: the first graceful
/// deletion (a scheduled pod, grace period > 0) sets the deletionTimestamp and bumps
/// `metadata.generation`; a later one that shortens the grace period does not bump it
/// again. `pkg/registry/generic/registry/store.go markAsDeleting` bumps it as well for an
/// object kept by its finalizers.
#[tokio::test]
async fn graceful_pod_delete_bumps_generation_once() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let pp = PostParams::default();
    let created = pods
        .create(
            &pp,
            &from(pod_body("graceful", json!({"nodeName": "node-a"}))),
        )
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));

    let grace = |seconds| DeleteParams {
        grace_period_seconds: Some(seconds),
        ..DeleteParams::default()
    };
    let deleting = pods
        .delete("graceful", &grace(30))
        .await
        .unwrap()
        .left()
        .expect("a graceful deletion answers the pod");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(30));
    assert_eq!(deleting.metadata.generation, Some(2));
    let stored = pods.get("graceful").await.unwrap();
    assert_eq!(stored.metadata.generation, Some(2));

    let shortened = pods
        .delete("graceful", &grace(10))
        .await
        .unwrap()
        .left()
        .expect("still deleting");
    assert_eq!(shortened.metadata.deletion_grace_period_seconds, Some(10));
    assert_eq!(shortened.metadata.generation, Some(2));
    assert_eq!(
        pods.get("graceful").await.unwrap().metadata.generation,
        Some(2)
    );

    // Not scheduled, so not graceful, but held by a finalizer.
    let mut held = pod_body("held", json!({}));
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    pods.create(&pp, &from(held)).await.unwrap();
    let marked = pods
        .delete("held", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("kept by its finalizer");
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(0));
    assert_eq!(marked.metadata.generation, Some(2));

    // Not scheduled and nothing holds it: gone at once. The deletion is still graceful to
    // `rest.BeforeDelete` (the pod strategy's `CheckGracefulDelete` answers a grace of 0),
    // so the answer is marked deleted with its generation counted, as kube-apiserver's is.
    pods.create(&pp, &from(pod_body("gone", json!({}))))
        .await
        .unwrap();
    let gone = pods
        .delete("gone", &grace(30))
        .await
        .unwrap()
        .left()
        .expect("pods answer the deleted pod");
    assert_eq!(gone.metadata.generation, Some(2));
    assert_eq!(gone.metadata.deletion_grace_period_seconds, Some(0));
    assert!(gone.metadata.deletion_timestamp.is_some());
    assert!(pods.get_opt("gone").await.unwrap().is_none());
}

/// A patch of a `scale` subresource that sets no resourceVersion is applied to whatever is
/// stored, however often a controller writes the object meanwhile (upstream's patcher runs
/// inside the store's `GuaranteedUpdate`, which re-reads and re-applies on a conflict; the
/// conformance spec "Replicaset should have a working scale subresource" patches the scale
/// while the ReplicaSet controller writes its status). One that sets a stale
/// resourceVersion is a 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_patches_without_a_resource_version_survive_concurrent_writes() {
    use k8s_openapi::api::apps::v1::ReplicaSet;
    use kube::api::{Patch, PatchParams};
    let (_server, client) = start().await;
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "rs"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "rs"}},
                 "template": {"metadata": {"labels": {"app": "rs"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))
    .unwrap();
    sets.create(&PostParams::default(), &rs).await.unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn({
        let (sets, stop) = (sets.clone(), stop.clone());
        async move {
            let mut writes = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let status = json!({"status": {"replicas": writes % 3, "observedGeneration": 1}});
                sets.patch_status("rs", &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .unwrap();
                writes += 1;
            }
            writes
        }
    });
    for replicas in 0..40 {
        let body = json!({"spec": {"replicas": replicas}});
        let scale = sets
            .patch_scale("rs", &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap_or_else(|e| panic!("scale patch {replicas}: {e}"));
        // `ScaleSpec.replicas` is `omitempty`: Go writes no 0.
        let expected = (replicas != 0).then_some(replicas);
        assert_eq!(scale.spec.and_then(|s| s.replicas), expected);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(writer.await.unwrap() > 0, "the status writer ran alongside");

    let stale = json!({"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 7}});
    let e = sets
        .patch_scale("rs", &PatchParams::default(), &Patch::Merge(&stale))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 409),
        "a stale resourceVersion is a precondition: {e}"
    );
}

/// Every response carries an `Audit-Id` (upstream's `WithAuditInit`,
/// `k8s.io/apiserver/pkg/endpoints/filters/audit_init.go`): the request's own `Audit-ID`
/// echoed when it gives one, else a new UUID for each request, on errors too.
#[tokio::test]
async fn every_response_carries_an_audit_id() {
    let (_server, client) = start().await;
    let audit_id = |a: &Answer| {
        a.headers
            .get("audit-id")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let given = send_raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        &[("Audit-ID", "trace-me-42")],
        Vec::new(),
    )
    .await;
    assert_eq!(given.code, 200);
    assert_eq!(audit_id(&given).as_deref(), Some("trace-me-42"));
    let mut seen = std::collections::BTreeSet::new();
    for path in ["/version", "/api/v1/namespaces/default/configmaps/missing"] {
        let answer = send_raw(&client, "GET", path, &[], Vec::new()).await;
        let id = audit_id(&answer).unwrap_or_else(|| panic!("{path}: no Audit-Id"));
        let uuid_shaped = id.len() == 36
            && id.char_indices().all(|(i, c)| {
                if matches!(i, 8 | 13 | 18 | 23) {
                    c == '-'
                } else {
                    c.is_ascii_hexdigit()
                }
            });
        assert!(uuid_shaped, "{path}: {id}");
        seen.insert(id);
    }
    assert_eq!(seen.len(), 2, "a new id per request");
}

/// A built-in list's items carry no `apiVersion` or `kind`: kube-apiserver encodes the list
/// through its Go type (`ConfigMapList`), whose items' empty TypeMeta is omitted; the list
/// itself names them.
#[tokio::test]
async fn built_in_list_items_carry_no_type_meta() {
    let (_server, client) = start().await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "listed"}})).unwrap();
    maps.create(&PostParams::default(), &cm).await.unwrap();
    let list = send_raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        &[],
        Vec::new(),
    )
    .await;
    assert_eq!(list.code, 200);
    assert_eq!(list.body["kind"], "ConfigMapList");
    assert_eq!(list.body["apiVersion"], "v1");
    let item = list.body["items"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["metadata"]["name"] == "listed"))
        .unwrap_or_else(|| panic!("{}", list.body));
    assert!(item.get("apiVersion").is_none(), "{item}");
    assert!(item.get("kind").is_none(), "{item}");
    // And kube-rs reads such a list as it reads kube-apiserver's.
    let names: Vec<_> = maps
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert!(names.contains(&"listed".to_owned()), "{names:?}");
}

/// `fieldmanager.FieldManager.Update` behind every handler (`managerOrUserAgent`): a plain
/// create or update without `fieldManager` is recorded under the User-Agent's prefix, with
/// the API version written.
#[tokio::test]
async fn plain_writes_are_recorded_under_the_user_agent() {
    let (_server, client) = start().await;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "tracked", "labels": {"app": "web"}}, "data": {"k": "v"}});
    let body = cm.to_string().into_bytes();
    let created = send_raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        &[("user-agent", "kubectl/v1.35.4 (linux/amd64) kubernetes/abc")],
        body,
    )
    .await;
    assert_eq!(created.code, 201, "{}", created.body);
    let entries = created.body["metadata"]["managedFields"]
        .as_array()
        .unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["manager"], "kubectl");
    assert_eq!(entries[0]["operation"], "Update");
    assert_eq!(entries[0]["apiVersion"], "v1");
    assert_eq!(
        entries[0]["fieldsV1"],
        json!({"f:data": {".": {}, "f:k": {}}, "f:metadata": {"f:labels": {".": {}, "f:app": {}}}})
    );
    // Another writer's patch: recorded under its own name.
    let patched = send_raw(
        &client,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/tracked",
        &[
            ("content-type", "application/merge-patch+json"),
            ("user-agent", "editor/1.0"),
        ],
        json!({"data": {"k": "w"}}).to_string().into_bytes(),
    )
    .await;
    assert_eq!(patched.code, 200, "{}", patched.body);
    let managers: Vec<&str> = patched.body["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["manager"].as_str().unwrap())
        .collect();
    assert!(managers.contains(&"editor"), "{managers:?}");
}

/// `rest.BeforeDelete`: a precondition that does not hold names the object by its kind, and
/// `ValidateDeleteOptions` (run by the handler before the object is looked up) refuses
/// `orphanDependents` together with `propagationPolicy`, and a `dryRun` other than `All`.
#[tokio::test]
async fn delete_options_are_checked_as_upstream_checks_them() {
    let (_server, client) = start().await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = from(json!({"metadata": {"name": "pre"}}));
    maps.create(&PostParams::default(), &cm).await.unwrap();
    let path = "/api/v1/namespaces/default/configmaps/pre";
    let stale = send(
        &client,
        "DELETE",
        path,
        &json!({"preconditions": {"resourceVersion": "1"}}),
    )
    .await;
    assert_eq!(stale.code, 409, "{}", stale.body);
    assert!(
        stale.message().starts_with(
            "Operation cannot be fulfilled on ConfigMap \"pre\": the ResourceVersion in the precondition (1) does not match the ResourceVersion in record ("
        ),
        "{}",
        stale.message()
    );
    let both = send(
        &client,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/missing",
        &json!({"orphanDependents": true, "propagationPolicy": "Background"}),
    )
    .await;
    assert_eq!(both.code, 422, "before the 404: {}", both.body);
    assert_eq!(
        both.message(),
        "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Invalid value: \"Background\": orphanDependents and deletionPropagation cannot be both set"
    );
    let bad_dry_run = send(
        &client,
        "DELETE",
        &format!("{path}?dryRun=Some"),
        &json!({}),
    )
    .await;
    assert_eq!(bad_dry_run.code, 422, "{}", bad_dry_run.body);
    let bad_create = send(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps?dryRun=Some",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dr"}}),
    )
    .await;
    assert_eq!(bad_create.code, 422, "{}", bad_create.body);
    assert_eq!(
        bad_create.message(),
        "CreateOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: [\"Some\"]: supported values: \"All\""
    );
    // A dry-run deletion answers what the deletion would (a Status) and deletes nothing.
    let dry = send(&client, "DELETE", &format!("{path}?dryRun=All"), &json!({})).await;
    assert_eq!(dry.code, 200, "{}", dry.body);
    assert_eq!(dry.body["kind"], "Status");
    assert_eq!(dry.body["status"], "Success");
    assert!(maps.get_opt("pre").await.unwrap().is_some());
}

/// `pkg/registry/batch/job/strategy.go DefaultGarbageCollectionPolicy`: a batch/v1 Job
/// deleted without a propagation policy orphans its pods (the `orphan` finalizer), with
/// the Job storage's warning; the collection's deletion answers the list it deleted.
#[tokio::test]
async fn jobs_orphan_their_pods_by_default_with_a_warning() {
    let (_server, client) = start().await;
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "j", "finalizers": ["example.com/hold"]},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}]}}}});
    let jobs = "/apis/batch/v1/namespaces/default/jobs";
    let created = send(&client, "POST", jobs, &job).await;
    assert_eq!(created.code, 201, "{}", created.body);
    let deleted = send(&client, "DELETE", &format!("{jobs}/j"), &json!({})).await;
    assert_eq!(deleted.code, 200, "{}", deleted.body);
    assert_eq!(deleted.body["kind"], "Job", "{}", deleted.body);
    let finalizers = deleted.body["metadata"]["finalizers"].clone();
    assert!(
        finalizers.as_array().unwrap().contains(&json!("orphan")),
        "{finalizers}"
    );
    assert!(
        deleted.warnings().iter().any(|w| w.contains(
            "child pods are preserved by default when jobs are deleted; set propagationPolicy=Background"
        )),
        "{:?}",
        deleted.warnings()
    );
    // The collection: the list of what it deleted, as `ConfigMapList`.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for name in ["c1", "c2"] {
        let cm: ConfigMap = from(json!({"metadata": {"name": name, "labels": {"set": "dc"}}}));
        maps.create(&PostParams::default(), &cm).await.unwrap();
    }
    let collection = send(
        &client,
        "DELETE",
        "/api/v1/namespaces/default/configmaps?labelSelector=set%3Ddc",
        &json!({}),
    )
    .await;
    assert_eq!(collection.code, 200, "{}", collection.body);
    assert_eq!(collection.body["kind"], "ConfigMapList");
    assert_eq!(collection.body["items"].as_array().unwrap().len(), 2);
}

/// kube-apiserver's YAML serializer: `Accept: application/yaml` gets YAML; a path outside
/// every served group version gets the mux's plain `404 page not found`.
#[tokio::test]
async fn yaml_answers_and_plain_not_found() {
    let (_server, client) = start().await;
    let request = axum::http::Request::builder()
        .uri("/api/v1/namespaces/default")
        .header("accept", "application/yaml")
        .body(Vec::new())
        .unwrap();
    let response = client.send(request.map(Into::into)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/yaml");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert!(text.contains("kind: Namespace\n"), "{text}");
    let request = axum::http::Request::builder()
        .uri("/nothing/here")
        .body(Vec::new())
        .unwrap();
    let response = client.send(request.map(Into::into)).await.unwrap();
    assert_eq!(response.status(), 404);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"404 page not found\n");
}

/// The NamespaceLifecycle admission plugin: creating in a terminating namespace is
/// forbidden with the `NamespaceTerminating` cause controllers look for.
#[tokio::test]
async fn creating_in_a_terminating_namespace_names_the_cause() {
    let (_server, client) = start().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = from(json!({"metadata": {"name": "term"}}));
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "term");
    let held: ConfigMap =
        from(json!({"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}));
    maps.create(&PostParams::default(), &held).await.unwrap();
    namespaces
        .delete("term", &DeleteParams::default())
        .await
        .unwrap();
    let refused = send(
        &client,
        "POST",
        "/api/v1/namespaces/term/configmaps",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}}),
    )
    .await;
    assert_eq!(refused.code, 403, "{}", refused.body);
    assert_eq!(
        refused.body["details"]["causes"][0]["reason"], "NamespaceTerminating",
        "{}",
        refused.body
    );
    // Let the namespace go.
    let released = send_raw(
        &client,
        "PATCH",
        "/api/v1/namespaces/term/configmaps/held",
        &[("content-type", "application/merge-patch+json")],
        json!({"metadata": {"finalizers": null}})
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(released.code, 200, "{}", released.body);
}
