//! CustomResourceDefinitions (`apiextensions.k8s.io/v1`) and their custom resources, as
//! upstream's `staging/src/k8s.io/apiextensions-apiserver` serves them: through kube-rs
//! in-process, and through kubectl v1.32 over TLS.

use ccm_testkit::{TestServer, eventually, kubectl::kubectl, memory_server};
use kube::{
    Api, Client,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
        PostParams,
    },
    discovery::Discovery,
};
use serde_json::{Value, json};

fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget",
                      "shortNames": ["wd"], "categories": ["gadgetry"]},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "selectableFields": [{"jsonPath": ".spec.color"}],
                "subresources": {"status": {},
                                 "scale": {"specReplicasPath": ".spec.size",
                                           "statusReplicasPath": ".status.size"}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "required": ["size"], "properties": {
                            "size": {"type": "integer", "minimum": 1, "maximum": 10},
                            "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                        }},
                        "status": {"type": "object", "properties": {
                            "size": {"type": "integer"},
                            "ready": {"type": "boolean"},
                        }},
                    },
                }},
            }],
        },
    })
}

fn crd_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "customresourcedefinitions"),
    )
}

fn widgets(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "widgets"),
    )
}

fn condition(crd: &DynamicObject, type_: &str) -> Option<String> {
    crd.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
        .map(str::to_owned)
}

async fn create_established(client: &Client, crd: Value) {
    let api = crd_api(client);
    let obj: DynamicObject = serde_json::from_value(crd).unwrap();
    let name = obj.metadata.name.clone().unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    eventually(30, "the definition is Established", || {
        let api = api.clone();
        let name = name.clone();
        async move {
            let crd = api.get(&name).await.ok()?;
            (condition(&crd, "Established").as_deref() == Some("True")).then_some(())
        }
    })
    .await;
}

/// `establish/establishing_controller.go` and `status/naming_controller.go`: a created
/// definition gets `NamesAccepted` and `Established`, its names as `acceptedNames`, and
/// its resource appears in discovery (legacy and aggregated, as kube-rs reads them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definition_is_established_and_discovered() {
    let client = Client::new(memory_server().await.router(), "default");
    create_established(&client, widget_crd()).await;
    let crd = crd_api(&client).get("widgets.example.com").await.unwrap();
    assert_eq!(condition(&crd, "NamesAccepted").as_deref(), Some("True"));
    assert_eq!(crd.data["status"]["acceptedNames"]["kind"], "Widget");
    assert_eq!(
        crd.data["status"]["acceptedNames"]["listKind"],
        "WidgetList"
    );
    assert_eq!(
        crd.metadata.finalizers.as_deref(),
        Some(&["customresourcecleanup.apiextensions.k8s.io".to_owned()][..])
    );
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let group = discovery
        .groups()
        .find(|g| g.name() == "example.com")
        .expect("example.com is discovered");
    let (resource, caps) = group.recommended_kind("Widget").expect("Widget is served");
    assert_eq!(resource.plural, "widgets");
    assert!(matches!(caps.scope, kube::discovery::Scope::Namespaced));
    assert!(caps.subresources.iter().any(|(r, _)| r.plural == "status"));
    assert!(caps.subresources.iter().any(|(r, _)| r.plural == "scale"));
}

/// The custom resource strategy (`apiextensions-apiserver/pkg/registry/customresource`):
/// create, get, list, patch (merge and apply), status written apart from spec, generation
/// bumped on spec changes only, unknown fields pruned, defaults set, the schema enforced
/// with upstream's messages, `selectableFields`, the scale subresource, and delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_are_pruned_defaulted_validated_and_versioned_by_spec() {
    let client = Client::new(memory_server().await.router(), "default");
    create_established(&client, widget_crd()).await;
    let api = widgets(&client, "default");
    let w: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "a"},
        "spec": {"size": 3, "bogus": true},
        "status": {"ready": true},
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(
        created.data["spec"],
        json!({"size": 3, "color": "red"}),
        "pruned and defaulted"
    );
    assert_eq!(created.metadata.generation, Some(1));

    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "b"},
        "spec": {"size": 11, "color": "pink"},
    }))
    .unwrap();
    let err = api.create(&PostParams::default(), &bad).await.unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains(
            "spec.color: Unsupported value: \"pink\": supported values: \"red\", \"blue\""
        ) && status.message.contains(
            "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10"
        ),
        "{}",
        status.message
    );

    // The status subresource: the main resource ignores status, /status ignores spec.
    let patched = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 4}, "status": {"ready": false}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["spec"]["size"], 4);
    assert!(
        patched.data["status"].get("ready").is_none(),
        "{}",
        patched.data
    );
    assert_eq!(patched.metadata.generation, Some(2));
    let status = api
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 9}, "status": {"ready": true, "size": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(status.data["status"]["ready"], true);
    assert_eq!(status.data["spec"]["size"], 4);
    assert_eq!(
        status.metadata.generation,
        Some(2),
        "a status write keeps the generation"
    );

    // Server-side apply.
    let applied = api
        .patch(
            "a",
            &PatchParams::apply("test").force(),
            &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget",
                                 "metadata": {"name": "a"}, "spec": {"size": 5, "color": "blue"}})),
        )
        .await
        .unwrap();
    assert_eq!(applied.data["spec"], json!({"size": 5, "color": "blue"}));
    assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 1);
    // selectableFields (KEP-4358): a declared path selects, an undeclared one is a 400.
    let blue = api
        .list(&ListParams::default().fields("spec.color=blue"))
        .await
        .unwrap();
    assert_eq!(blue.items.len(), 1);
    let red = api
        .list(&ListParams::default().fields("spec.color=red"))
        .await
        .unwrap();
    assert!(red.items.is_empty());
    let err = api
        .list(&ListParams::default().fields("spec.size=5"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 400),
        "{err}"
    );

    // The scale subresource at the definition's paths (`customresource/etcd.go ScaleREST`).
    let scale = api.get_scale("a").await.unwrap();
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(5));
    api.patch_scale(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 7}})),
    )
    .await
    .unwrap();
    assert_eq!(api.get("a").await.unwrap().data["spec"]["size"], 7);
    api.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(api.get_opt("a").await.unwrap().is_none());
}

/// `finalizer/crd_finalizer.go`: deleting a definition deletes its objects first, then
/// the definition, and its resource is no longer served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_definition_deletes_its_objects_first() {
    let client = Client::new(memory_server().await.router(), "default");
    create_established(&client, widget_crd()).await;
    let api = widgets(&client, "default");
    for name in ["a", "b"] {
        let w: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": name}, "spec": {"size": 1},
        }))
        .unwrap();
        api.create(&PostParams::default(), &w).await.unwrap();
    }
    crd_api(&client)
        .delete("widgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    eventually(30, "the definition is gone", || {
        let crds = crd_api(&client);
        async move {
            crds.get_opt("widgets.example.com")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    // The definition's removal reaches the serving registry through its watch, a moment
    // after the store (kube-apiserver's CRD handler follows its informer alike).
    eventually(30, "the resource is no longer served", || {
        let api = api.clone();
        async move {
            matches!(
                api.list(&Default::default()).await,
                Err(kube::Error::Api(ref s)) if s.code == 404
            )
            .then_some(())
        }
    })
    .await;
    // Defined again, it starts empty: the objects were deleted, not hidden.
    create_established(&client, widget_crd()).await;
    assert!(
        api.list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

/// `customresource_handler.go serveResource`: while a definition is terminating (here
/// held by a finalizer of its own after its objects were deleted), a create of its custom
/// resource is refused with 405 `create not allowed while custom resource definition is
/// terminating`, while reads still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_custom_resource_is_created_while_its_definition_terminates() {
    let client = Client::new(memory_server().await.router(), "default");
    let mut crd = widget_crd();
    crd["metadata"]["finalizers"] = json!(["example.com/hold"]);
    create_established(&client, crd).await;
    let api = widgets(&client, "default");
    let widget = |name: &str| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": name}, "spec": {"size": 1},
        }))
        .unwrap()
    };
    api.create(&PostParams::default(), &widget("before"))
        .await
        .unwrap();
    crd_api(&client)
        .delete("widgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    let err = api
        .create(&PostParams::default(), &widget("after"))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 405);
    assert_eq!(status.reason, "MethodNotAllowed");
    assert_eq!(
        status.message,
        "create not allowed while custom resource definition is terminating"
    );
    // The cleanup still deletes the objects, and the resource is still served meanwhile.
    eventually(30, "the objects are deleted", || {
        let api = api.clone();
        async move {
            api.list(&Default::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        }
    })
    .await;
    assert!(api.get_opt("after").await.unwrap().is_none());
}

/// `x-kubernetes-list-type` for server-side apply (upstream's structural schema →
/// `managedfields` type converter): two managers applying different elements of a
/// `map` list (keyed by `x-kubernetes-list-map-keys`) and of a `set` list both keep
/// theirs, with no conflict, while an `atomic` list another manager owns conflicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_merges_list_type_map_and_set_by_their_elements() {
    let client = Client::new(memory_server().await.router(), "default");
    let mut crd = widget_crd();
    let spec_props = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"];
    spec_props["ports"] = json!({"type": "array", "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
        "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "port": {"type": "integer"}}}});
    spec_props["tags"] = json!({"type": "array", "x-kubernetes-list-type": "set",
        "items": {"type": "string"}});
    spec_props["owners"] = json!({"type": "array", "x-kubernetes-list-type": "atomic",
        "items": {"type": "string"}});
    create_established(&client, crd).await;
    let api = widgets(&client, "default");
    let apply = |manager: &'static str, spec: Value| {
        let api = api.clone();
        async move {
            api.patch(
                "w",
                &PatchParams::apply(manager),
                &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget",
                                     "metadata": {"name": "w"}, "spec": spec})),
            )
            .await
        }
    };
    apply(
        "a",
        json!({"size": 1, "ports": [{"name": "http", "port": 80}], "tags": ["x"], "owners": ["ann"]}),
    )
    .await
    .unwrap();
    let merged = apply(
        "b",
        json!({"ports": [{"name": "metrics", "port": 9090}], "tags": ["y"]}),
    )
    .await
    .unwrap();
    assert_eq!(
        merged.data["spec"]["ports"],
        json!([{"name": "http", "port": 80}, {"name": "metrics", "port": 9090}])
    );
    assert_eq!(merged.data["spec"]["tags"], json!(["x", "y"]));
    let err = apply("b", json!({"owners": ["bob"]})).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409),
        "{err}"
    );
}

/// structured-merge-diff's associative lists with several keys
/// (`typed/helpers.go keyedAssociativeListItemToPathElement`): a `map` list keyed by
/// `port` and `protocol` keeps one port's TCP and UDP entries apart when two managers
/// apply them, each owning its own (`k:{"port":53,"protocol":"UDP"}`), and a change to
/// one by its manager leaves the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_keys_a_map_list_by_all_its_keys() {
    let client = Client::new(memory_server().await.router(), "default");
    let mut crd = widget_crd();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["ports"] = json!({"type": "array", "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["port", "protocol"],
        "items": {"type": "object", "required": ["port", "protocol"], "properties": {
            "port": {"type": "integer"}, "protocol": {"type": "string"},
            "name": {"type": "string"}}}});
    create_established(&client, crd).await;
    let api = widgets(&client, "default");
    let apply = |manager: &'static str, spec: Value| {
        let api = api.clone();
        async move {
            api.patch(
                "w",
                &PatchParams::apply(manager),
                &Patch::Apply(json!({"apiVersion": "example.com/v1", "kind": "Widget",
                                     "metadata": {"name": "w"}, "spec": spec})),
            )
            .await
            .unwrap()
        }
    };
    apply(
        "tcp",
        json!({"size": 1, "ports": [{"port": 53, "protocol": "TCP", "name": "dns-tcp"}]}),
    )
    .await;
    let both = apply(
        "udp",
        json!({"ports": [{"port": 53, "protocol": "UDP", "name": "dns-udp"}]}),
    )
    .await;
    assert_eq!(
        both.data["spec"]["ports"],
        json!([{"port": 53, "protocol": "TCP", "name": "dns-tcp"},
               {"port": 53, "protocol": "UDP", "name": "dns-udp"}])
    );
    let udp = both
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .find(|e| e.manager.as_deref() == Some("udp"))
        .and_then(|e| e.fields_v1.as_ref())
        .map(|f| f.0.clone())
        .expect("the udp manager's fields");
    assert!(
        udp["f:spec"]["f:ports"]
            .get(r#"k:{"port":53,"protocol":"UDP"}"#)
            .is_some(),
        "{udp}"
    );
    let renamed = apply(
        "udp",
        json!({"ports": [{"port": 53, "protocol": "UDP", "name": "dns"}]}),
    )
    .await;
    assert_eq!(
        renamed.data["spec"]["ports"],
        json!([{"port": 53, "protocol": "TCP", "name": "dns-tcp"},
               {"port": 53, "protocol": "UDP", "name": "dns"}])
    );
}

/// `status/naming_controller.go`: a second definition of the group asking for a plural
/// the first holds gets `NamesAccepted=False` with `"<plural>" is already in use`, and is
/// not served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_in_use_is_not_accepted() {
    let client = Client::new(memory_server().await.router(), "default");
    create_established(&client, widget_crd()).await;
    let mut other = widget_crd();
    other["metadata"]["name"] = json!("gizmos.example.com");
    other["spec"]["names"] = json!({"plural": "gizmos", "kind": "Gizmo", "shortNames": ["wd"]});
    let obj: DynamicObject = serde_json::from_value(other).unwrap();
    crd_api(&client)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
    let crd = eventually(30, "the conflict is reported", || {
        let api = crd_api(&client);
        async move {
            let crd = api.get("gizmos.example.com").await.ok()?;
            (condition(&crd, "NamesAccepted").as_deref() == Some("False")).then_some(crd)
        }
    })
    .await;
    let accepted = crd.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "NamesAccepted")
        .unwrap()
        .clone();
    assert_eq!(accepted["reason"], "NameConflict");
    assert_eq!(accepted["message"], "\"wd\" is already in use");
    assert_eq!(condition(&crd, "Established").as_deref(), Some("False"));
}

/// `validation.ValidateCustomResourceDefinition` and `structural/validation.go`: a schema
/// field without a type is refused with upstream's message, and so is a webhook conversion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_structural_schema_is_refused() {
    let client = Client::new(memory_server().await.router(), "default");
    let mut crd = widget_crd();
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("type");
    let obj: DynamicObject = serde_json::from_value(crd).unwrap();
    let err = crd_api(&client)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"),
        "{}",
        status.message
    );
}

const CRD_YAML: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd], categories: [gadgetry]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}, scale: {specReplicasPath: .spec.size, statusReplicasPath: .status.size}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer, maximum: 10, description: How many widgets there are.}
"#;

const WIDGET_YAML: &str = r#"
apiVersion: example.com/v1
kind: Widget
metadata: {name: w1, namespace: default}
spec: {size: 3}
"#;

/// kubectl v1.32 against a definition: `apply`, `wait --for condition=established`,
/// `explain` from the definition's OpenAPI v3 document, then the custom resource by plural, short name and category, with its printer column
/// (`tableconvertor`), `kubectl scale` through the scale subresource, a schema violation
/// refused with upstream's message, and a strategic merge patch refused as upstream does for
/// custom resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_a_definition_and_gets_its_objects_by_every_name() {
    ccm_testkit::kubectl::require_kubectl("it applies a CRD and gets custom resources");
    let server = TestServer::start(memory_server().await).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("admin");
    std::fs::write(&config, server.admin_kubeconfig()).unwrap();
    let run = |args: Vec<String>| {
        let (dir, config) = (dir.path().to_owned(), config.clone());
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            kubectl(&dir, &config, &args).await
        }
    };
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let crd_file = file("crd.yaml", CRD_YAML);
    let out = run(vec!["apply".into(), "-f".into(), crd_file]).await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    let out = run([
        "wait",
        "--for",
        "condition=established",
        "--timeout=60s",
        "crd/widgets.example.com",
    ]
    .map(String::from)
    .to_vec())
    .await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    // `kubectl explain` reads the definition's schema from `/openapi/v3/apis/example.com/v1`
    // (`controller/openapi/builder/builder.go BuildOpenAPIV3`).
    let out = run(["explain", "widgets.spec"].map(String::from).to_vec()).await;
    let explained = out.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    for want in [
        "GROUP: example.com",
        "KIND: Widget",
        "VERSION: v1",
        "FIELD: spec <Object>",
        "size <integer> How many widgets there are.",
    ] {
        assert!(
            explained.contains(want),
            "explain lacks {want:?}:\n{}",
            out.stdout
        );
    }
    let out = run(["explain", "wd.metadata.name"].map(String::from).to_vec()).await;
    assert!(
        out.success && out.stdout.contains("FIELD: name <string>"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    let widget_file = file("widget.yaml", WIDGET_YAML);
    let out = run(vec!["apply".into(), "-f".into(), widget_file]).await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    for name in ["widgets", "widget", "wd", "widgets.example.com", "gadgetry"] {
        let out = run(vec!["get".into(), name.into()]).await;
        assert!(out.success, "get {name}: {}{}", out.stdout, out.stderr);
        let mut lines = out.stdout.lines();
        let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
        assert_eq!(header, ["NAME", "SIZE"], "get {name}: {}", out.stdout);
        let row: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
        assert_eq!(row, ["w1", "3"], "get {name}: {}", out.stdout);
    }
    let bad = file("bad.yaml", &WIDGET_YAML.replace("size: 3", "size: 30"));
    let out = run(vec!["apply".into(), "-f".into(), bad]).await;
    assert!(!out.success);
    assert!(
        out.stderr.contains(
            "spec.size: Invalid value: 30: spec.size in body should be less than or equal to 10"
        ),
        "{}",
        out.stderr
    );
    let out = run(["scale", "wd", "w1", "--replicas=4"]
        .map(String::from)
        .to_vec())
    .await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    let out = run(["get", "wd", "w1", "-o", "jsonpath={.spec.size}"]
        .map(String::from)
        .to_vec())
    .await;
    assert_eq!(out.stdout, "4", "{}", out.stderr);
    // A custom resource takes JSON, merge and apply patches, not strategic merge
    // (`customresource_handler.go` supportedTypes): kubectl's default patch type gets 415.
    let out = run(["patch", "wd", "w1", "-p", r#"{"spec":{"size":5}}"#]
        .map(String::from)
        .to_vec())
    .await;
    assert!(!out.success, "{}", out.stdout);
    assert!(
        out.stderr.contains(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        ),
        "{}",
        out.stderr
    );
    let out = run([
        "patch",
        "wd",
        "w1",
        "--type=merge",
        "-p",
        r#"{"spec":{"size":5}}"#,
    ]
    .map(String::from)
    .to_vec())
    .await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    let out = run(["get", "wd", "w1", "-o", "jsonpath={.spec.size}"]
        .map(String::from)
        .to_vec())
    .await;
    assert_eq!(out.stdout, "5", "{}", out.stderr);
    let out = run(vec!["delete".into(), "wd".into(), "w1".into()]).await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    let out = run(vec![
        "delete".into(),
        "crd".into(),
        "widgets.example.com".into(),
    ])
    .await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
}

/// `apiextensions-apiserver/pkg/apiserver/conversion` with the `None` strategy: one stored
/// form served under each version's `apiVersion`; a `deprecated` version answers with a
/// `Warning` header (`customresource_handler.go` and its `deprecationWarning`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_served_version_reads_the_one_stored_object_and_deprecated_ones_warn() {
    let server = memory_server().await;
    let client = Client::new(server.router(), "default");
    let mut crd = widget_crd();
    let v1 = crd["spec"]["versions"][0].clone();
    let mut beta = v1.clone();
    beta["name"] = json!("v1beta1");
    beta["storage"] = json!(false);
    beta["deprecated"] = json!(true);
    beta["deprecationWarning"] =
        json!("example.com/v1beta1 Widget is deprecated; use example.com/v1");
    crd["spec"]["versions"] = json!([beta, v1]);
    create_established(&client, crd).await;
    let body = json!({"apiVersion": "example.com/v1beta1", "kind": "Widget",
                      "metadata": {"name": "old"}, "spec": {"size": 2}});
    let (code, headers, _) = ccm_testkit::send(
        &server.router(),
        "POST",
        "/apis/example.com/v1beta1/namespaces/default/widgets",
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await;
    assert_eq!(code, 201);
    let warning = headers
        .get("warning")
        .and_then(|w| w.to_str().ok())
        .unwrap_or("");
    assert!(
        warning.contains("example.com/v1beta1 Widget is deprecated; use example.com/v1"),
        "{warning:?}"
    );
    let current = widgets(&client, "default").get("old").await.unwrap();
    assert_eq!(current.types.unwrap().api_version, "example.com/v1");
    assert_eq!(current.data["spec"]["size"], 2);
}

/// kube-aggregator's autoregister controller: a Local APIService, `Available`, for every
/// served group-version, a custom resource's included; a remote one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_served_group_version_has_a_local_available_apiservice() {
    let client = Client::new(memory_server().await.router(), "default");
    create_established(&client, widget_crd()).await;
    let gvk = GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService");
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "apiservices"),
    );
    let names = eventually(30, "the APIService of example.com/v1", || {
        let api = api.clone();
        async move {
            let list = api.list(&Default::default()).await.ok()?;
            let names: Vec<String> = list
                .items
                .iter()
                .filter_map(|o| o.metadata.name.clone())
                .collect();
            names.iter().any(|n| n == "v1.example.com").then_some(list)
        }
    })
    .await;
    for want in [
        "v1",
        "v1.apps",
        "v1.apiextensions.k8s.io",
        "v1.apiregistration.k8s.io",
    ] {
        let svc = names
            .items
            .iter()
            .find(|o| o.metadata.name.as_deref() == Some(want))
            .unwrap_or_else(|| panic!("{want} is listed"));
        assert!(svc.data["spec"]["service"].is_null(), "{want} is Local");
        assert_eq!(svc.data["status"]["conditions"][0]["type"], "Available");
        assert_eq!(svc.data["status"]["conditions"][0]["status"], "True");
    }
    let remote: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.metrics.k8s.io"},
        "spec": {"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                 "versionPriority": 100, "service": {"namespace": "kube-system", "name": "metrics-server"}},
    }))
    .unwrap();
    let err = api
        .create(&PostParams::default(), &remote)
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("no aggregation proxy"),
        "{}",
        status.message
    );
}

/// helm v3's chart `crds/` folder (`pkg/action/install.go installCRDs`): helm creates the
/// definitions, waits for them to be Established through discovery, then installs the
/// templates that use them. helm comes from PATH (scripts/helm.sh); the test fails, never
/// skips, without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helm_chart_with_a_crds_folder_installs() {
    let version = std::process::Command::new("helm")
        .args(["version", "--short"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(
        version.starts_with("v3."),
        "helm v3 is required on PATH for this test (scripts/helm.sh installs it); found {version:?}"
    );
    ccm_testkit::kubectl::require_kubectl("it reads the chart's custom resource back");
    let server = TestServer::start(memory_server().await).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("admin");
    std::fs::write(&config, server.admin_kubeconfig()).unwrap();
    let chart = dir.path().join("chart");
    std::fs::create_dir_all(chart.join("crds")).unwrap();
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: widgets\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(chart.join("crds/widgets.yaml"), CRD_YAML).unwrap();
    std::fs::write(
        chart.join("templates/widget.yaml"),
        WIDGET_YAML.replace("namespace: default", "namespace: {{ .Release.Namespace }}"),
    )
    .unwrap();
    let home = dir.path().to_owned();
    let (config2, chart2) = (config.clone(), chart.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("helm")
            .env("HOME", &home)
            .env("HELM_CONFIG_HOME", home.join("helm-config"))
            .env("HELM_CACHE_HOME", home.join("helm-cache"))
            .env("HELM_DATA_HOME", home.join("helm-data"))
            .env("KUBECONFIG", &config2)
            .args([
                "install",
                "demo",
                chart2.to_str().unwrap(),
                "--wait",
                "--timeout",
                "120s",
            ])
            .output()
            .expect("run helm")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let got = kubectl(
        dir.path(),
        &config,
        &["get", "wd", "w1", "-o", "jsonpath={.spec.size}"],
    )
    .await;
    assert_eq!(got.stdout, "3", "{}", got.stderr);
}

const RULED_CRD_YAML: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: ranges.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: ranges, singular: range, kind: Range}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - {rule: "self.min <= self.max", messageExpression: "'min (' + string(self.min) + ') exceeds max (' + string(self.max) + ')'"}
            properties:
              min: {type: integer}
              max: {type: integer}
              zone:
                type: string
                x-kubernetes-validations:
                - {rule: "self == oldSelf", message: zone is immutable}
"#;

const RANGE_YAML: &str = r#"
apiVersion: example.com/v1
kind: Range
metadata: {name: r1, namespace: default}
spec: {min: 1, max: 5, zone: a}
"#;

/// `apiserver/schema/cel/validation.go` through kubectl v1.32: a definition whose rule does
/// not compile is refused (`apis/apiextensions/validation` with cel's `ERROR: <input>:l:c:`);
/// on its objects a rule fails with its `messageExpression` as
/// `spec: Invalid value: "object": ...`, and the transition rule (`oldSelf`) lets the
/// create through and refuses the change on update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_meets_the_validation_rules_of_a_definition() {
    ccm_testkit::kubectl::require_kubectl("it applies CRDs with CEL rules");
    let server = TestServer::start(memory_server().await).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("admin");
    std::fs::write(&config, server.admin_kubeconfig()).unwrap();
    let apply = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let (dir, config) = (dir.path().to_owned(), config.clone());
        async move {
            let path = path.display().to_string();
            kubectl(&dir, &config, &["apply", "-f", &path]).await
        }
    };
    let broken = RULED_CRD_YAML.replace("self.min <= self.max", "self.min <=");
    let out = apply("broken.yaml", &broken).await;
    assert!(!out.success, "{}", out.stdout);
    assert!(
        out.stderr.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value:")
            && out.stderr.contains("compilation failed: ERROR: <input>:1:"),
        "{}",
        out.stderr
    );
    let out = apply("crd.yaml", RULED_CRD_YAML).await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    let out = kubectl(
        dir.path(),
        &config,
        &[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/ranges.example.com",
        ],
    )
    .await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);

    let out = apply("inverted.yaml", &RANGE_YAML.replace("min: 1", "min: 9")).await;
    assert!(!out.success, "{}", out.stdout);
    assert!(
        out.stderr
            .contains(r#"spec: Invalid value: "object": min (9) exceeds max (5)"#),
        "{}",
        out.stderr
    );
    // The transition rule is skipped on create, and holds on update.
    let out = apply("range.yaml", RANGE_YAML).await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
    let out = apply("moved.yaml", &RANGE_YAML.replace("zone: a", "zone: b")).await;
    assert!(!out.success, "{}", out.stdout);
    assert!(
        out.stderr
            .contains(r#"spec.zone: Invalid value: "string": zone is immutable"#),
        "{}",
        out.stderr
    );
    let out = apply("widened.yaml", &RANGE_YAML.replace("max: 5", "max: 7")).await;
    assert!(out.success, "{}{}", out.stdout, out.stderr);
}
