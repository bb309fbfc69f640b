//! The ServiceAccount admission plugin (upstream's
//! `plugin/pkg/admission/serviceaccount/admission.go`), on pod creates only:
//!
//! - `Admit` (mutating): a pod naming no service account gets `default`; the account must
//!   exist (the `default` one is waited for a little, as upstream retries it 10 times,
//!   since the serviceaccounts controller creates it just after its namespace); unless the
//!   pod's `automountServiceAccountToken`, or else the account's, is false, every container
//!   and init container mounts a projected `kube-api-access-<5 random>` volume (a bound
//!   token of 3607 s, `kube-root-ca.crt`'s `ca.crt`, the namespace) read-only at
//!   [`TOKEN_MOUNT_PATH`], unless it mounts something there already; the account's
//!   `imagePullSecrets` are copied when the pod has none;
//! - `Validate`: a pod must name an account that exists; a mirror pod (kubelet's static
//!   pod) is left as it is and may reference no service account, no secret and no token
//!   projection.
//!
//! That a pod's service account cannot change afterwards is pod update validation
//! (`ValidatePodUpdate`), in the registry.

use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{
    ObjectReader,
    admission::{Admission, AdmissionAttributes, Operation},
    status::{ApiError, Qualified},
};
use crate::registry::{
    meta,
    resources::{PODS, SERVICE_ACCOUNTS},
};

/// The service account of a pod that names none (`DefaultServiceAccountName`).
pub(crate) const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// Where the token volume is mounted (`DefaultAPITokenMountPath`).
pub(crate) const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The prefix of the token volume's name (`ServiceAccountVolumeName` + `-`).
pub(crate) const TOKEN_VOLUME_PREFIX: &str = "kube-api-access-";
/// The ConfigMap holding the cluster's root CA in every namespace.
pub(crate) const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
/// The token's lifetime in the projected volume (`WarnOnlyBoundTokenExpirationSeconds`).
pub(crate) const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
/// The annotation that makes a pod a mirror pod (`kubernetes.io/config.mirror`).
const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// How many times the `default` account is looked up before the pod is refused.
const DEFAULT_ACCOUNT_ATTEMPTS: usize = 10;

/// The plugin: see the [module docs](self).
#[derive(Debug)]
pub(crate) struct ServiceAccountAdmission {
    reader: ObjectReader,
}

impl ServiceAccountAdmission {
    /// The plugin, reading service accounts through `reader`.
    pub(crate) fn new(reader: ObjectReader) -> Self {
        ServiceAccountAdmission { reader }
    }

    /// The account `ns/name`, or upstream's refusal: `pods "p" is forbidden: error looking
    /// up service account ns/name: serviceaccount "name" not found`. The default account
    /// is looked up 10 times, 100 to 200 ms apart (`getServiceAccount`).
    async fn service_account(&self, ns: &str, name: &str, pod: &str) -> Result<Value, ApiError> {
        let attempts = if name == DEFAULT_SERVICE_ACCOUNT {
            DEFAULT_ACCOUNT_ATTEMPTS
        } else {
            1
        };
        let interval = Duration::from_millis(100 + fastrand::u64(..100));
        let mut last = None;
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(interval).await;
            }
            match self.reader.get(&SERVICE_ACCOUNTS, Some(ns), name).await {
                Ok(account) => return Ok(account),
                Err(e) if e.code == 404 => {
                    last = Some(format!("serviceaccount \"{name}\" not found"));
                }
                Err(e) => {
                    last = Some(e.message);
                    break;
                }
            }
        }
        Err(ApiError::forbidden(
            &Qualified::new("", "pods", pod),
            &format!(
                "error looking up service account {ns}/{name}: {}",
                last.unwrap_or_default()
            ),
        ))
    }
}

/// Whether the admission applies: pod creates (`shouldIgnore` and the create-only rule).
fn applies(attrs: &AdmissionAttributes<'_>) -> bool {
    std::ptr::eq(attrs.resource, &PODS)
        && attrs.subresource.is_none()
        && attrs.operation == Operation::Create
}

fn is_mirror_pod(pod: &Value) -> bool {
    pod["metadata"]["annotations"]
        .as_object()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

fn account_name(pod: &Value) -> &str {
    pod["spec"]["serviceAccountName"].as_str().unwrap_or("")
}

/// `shouldAutomount`: the pod's choice, else the account's, else true.
fn should_automount(account: &Value, pod: &Value) -> bool {
    pod["spec"]["automountServiceAccountToken"]
        .as_bool()
        .or_else(|| account["automountServiceAccountToken"].as_bool())
        .unwrap_or(true)
}

/// The projected volume source of the token (`TokenVolumeSource`).
pub(crate) fn token_volume_source() -> Value {
    json!({
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_SECONDS}},
            {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace",
                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ],
    })
}

/// `mountServiceAccountToken`: the token volume (an existing `kube-api-access-*` one, or a
/// new one) mounted in every container and init container that mounts nothing at
/// [`TOKEN_MOUNT_PATH`]; the volume is added only when a container needs it.
fn mount_token(pod: &mut Value) {
    let existing = pod["spec"]["volumes"].as_array().and_then(|vs| {
        vs.iter()
            .filter_map(|v| v["name"].as_str())
            .find(|n| n.starts_with(TOKEN_VOLUME_PREFIX))
            .map(str::to_owned)
    });
    let volume_name = existing
        .clone()
        .unwrap_or_else(|| meta::generate_name(TOKEN_VOLUME_PREFIX));
    let mount = json!({"name": volume_name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH});
    let mut needs_volume = false;
    for list in ["initContainers", "containers"] {
        let Some(containers) = pod["spec"][list].as_array_mut() else {
            continue;
        };
        for c in containers {
            let mounted = c["volumeMounts"]
                .as_array()
                .is_some_and(|ms| ms.iter().any(|m| m["mountPath"] == TOKEN_MOUNT_PATH));
            if mounted {
                continue;
            }
            match c["volumeMounts"].as_array_mut() {
                Some(ms) => ms.push(mount.clone()),
                None => c["volumeMounts"] = json!([mount.clone()]),
            }
            needs_volume = true;
        }
    }
    if existing.is_none() && needs_volume {
        let volume = json!({"name": volume_name, "projected": token_volume_source()});
        match pod["spec"]["volumes"].as_array_mut() {
            Some(vs) => vs.push(volume),
            None => pod["spec"]["volumes"] = json!([volume]),
        }
    }
}

/// Whether a mirror pod references a secret (`VisitPodSecretNames`): image pull secrets,
/// secret volumes and projections, env and envFrom secret references.
fn references_secrets(pod: &Value) -> bool {
    let spec = &pod["spec"];
    let nonempty = |v: &Value| v.as_array().is_some_and(|a| !a.is_empty());
    if nonempty(&spec["imagePullSecrets"]) {
        return true;
    }
    let volumes = spec["volumes"].as_array().into_iter().flatten();
    for v in volumes {
        if v.get("secret").is_some()
            || v["projected"]["sources"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s.get("secret").is_some()))
            || [
                "azureFile",
                "cephfs",
                "cinder",
                "flexVolume",
                "csi",
                "iscsi",
                "rbd",
                "scaleIO",
                "storageos",
            ]
            .iter()
            .any(|k| v[*k]["secretRef"].is_object() || v[*k]["nodePublishSecretRef"].is_object())
        {
            return true;
        }
    }
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|l| spec[*l].as_array().into_iter().flatten())
        .any(|c| {
            c["envFrom"]
                .as_array()
                .is_some_and(|e| e.iter().any(|e| e.get("secretRef").is_some()))
                || c["env"].as_array().is_some_and(|e| {
                    e.iter()
                        .any(|e| e["valueFrom"].get("secretKeyRef").is_some())
                })
        })
}

fn has_token_projection(pod: &Value) -> bool {
    pod["spec"]["volumes"].as_array().is_some_and(|vs| {
        vs.iter().any(|v| {
            v["projected"]["sources"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| s.get("serviceAccountToken").is_some()))
        })
    })
}

impl Admission for ServiceAccountAdmission {
    fn name(&self) -> &'static str {
        "ServiceAccount"
    }

    fn mutate<'a>(
        &'a self,
        attrs: &'a AdmissionAttributes<'a>,
        pod: &'a mut Value,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            // Mirror pods are never changed: kubelet would see its spec altered and
            // delete it; `admit` checks what they reference.
            if !applies(attrs) || is_mirror_pod(pod) {
                return Ok(());
            }
            let ns = attrs.namespace.unwrap_or("");
            // The deprecated `serviceAccount` is the name's older spelling (conversion).
            let mut name = account_name(pod).to_owned();
            if name.is_empty() {
                name = pod["spec"]["serviceAccount"]
                    .as_str()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(DEFAULT_SERVICE_ACCOUNT)
                    .to_owned();
            }
            pod["spec"]["serviceAccountName"] = json!(name);
            pod["spec"]["serviceAccount"] = json!(name);
            let account = self.service_account(ns, &name, attrs.name).await?;
            if should_automount(&account, pod) {
                mount_token(pod);
            }
            let pull_secrets = pod["spec"]["imagePullSecrets"]
                .as_array()
                .is_some_and(|a| !a.is_empty());
            if !pull_secrets
                && let Some(secrets) = account["imagePullSecrets"]
                    .as_array()
                    .filter(|a| !a.is_empty())
            {
                pod["spec"]["imagePullSecrets"] = json!(
                    secrets
                        .iter()
                        .map(|s| json!({"name": s["name"]}))
                        .collect::<Vec<_>>()
                );
            }
            Ok(())
        })
    }

    fn admit<'a>(
        &'a self,
        attrs: &'a AdmissionAttributes<'a>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let Some(pod) = attrs.object.filter(|_| applies(attrs)) else {
                return Ok(());
            };
            let refuse = |why: &str| {
                Err(ApiError::forbidden(
                    &Qualified::new("", "pods", attrs.name),
                    why,
                ))
            };
            if is_mirror_pod(pod) {
                if !account_name(pod).is_empty() {
                    return refuse("a mirror pod may not reference service accounts");
                }
                if references_secrets(pod) {
                    return refuse("a mirror pod may not reference secrets");
                }
                if has_token_projection(pod) {
                    return refuse(
                        "a mirror pod may not use ServiceAccountToken volume projections",
                    );
                }
                return Ok(());
            }
            let ns = attrs.namespace.unwrap_or("");
            let name = account_name(pod);
            if name.is_empty() {
                return refuse(&format!(
                    "no service account specified for pod {ns}/{}",
                    attrs.name
                ));
            }
            self.service_account(ns, name, attrs.name).await.map(|_| ())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::*;
    use crate::{
        registry::{
            allocator::ServiceAllocator,
            resources::{NAMESPACES, PODS, SERVICE_ACCOUNTS},
        },
        storage::{
            ObjectKey, Query, Storage, WriteContext, create::create_object, update::update_object,
            user::UserInfo,
        },
        store::MemoryStore,
    };

    async fn storage() -> Arc<Storage> {
        let store = Arc::new(MemoryStore::new());
        let allocator = ServiceAllocator::new(vec!["10.96.0.0/12".parse().unwrap()], 30000..=32767);
        let plugin = Arc::new(ServiceAccountAdmission::new(ObjectReader::new(
            store.clone(),
        )));
        let storage = Storage::new(store, allocator, 1 << 20, vec![plugin], vec![]);
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}});
        create_object(&storage, &ctx(), &NAMESPACES, None, ns)
            .await
            .unwrap();
        storage
    }

    fn ctx() -> WriteContext {
        WriteContext::new(UserInfo::new("alice", ["dev"]), Query::new())
    }

    async fn account(storage: &Storage, name: &str, extra: Value) {
        let mut sa = json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": "a"}});
        for (k, v) in extra.as_object().unwrap() {
            sa[k] = v.clone();
        }
        create_object(storage, &ctx(), &SERVICE_ACCOUNTS, Some("a"), sa)
            .await
            .unwrap();
    }

    fn pod(name: &str, spec: Value) -> Value {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "a"},
            "spec": {"containers": [{"name": "c", "image": "i"}, {"name": "d", "image": "i"}],
                     "initContainers": [{"name": "init", "image": "i"}]}});
        for (k, v) in spec.as_object().unwrap() {
            pod["spec"][k] = v.clone();
        }
        pod
    }

    async fn create(storage: &Storage, pod: Value) -> Result<Value, ApiError> {
        create_object(storage, &ctx(), &PODS, Some("a"), pod).await
    }

    fn mounts(pod: &Value, list: &str) -> Vec<Value> {
        pod["spec"][list]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["volumeMounts"].clone())
            .collect()
    }

    /// `admission.go` `Admit` with `mountServiceAccountToken` and `TokenVolumeSource`: a pod
    /// naming no account gets `default` and the projected `kube-api-access-<5>` volume
    /// (token 3607 s, `kube-root-ca.crt`'s `ca.crt`, the namespace), mounted read-only at
    /// the token path in every container and init container.
    #[tokio::test]
    async fn a_pod_gets_the_default_account_and_its_projected_token_volume() {
        let storage = storage().await;
        account(&storage, "default", json!({})).await;
        let created = create(&storage, pod("p", json!({}))).await.unwrap();
        let spec = &created["spec"];
        assert_eq!(spec["serviceAccountName"], "default");
        assert_eq!(spec["serviceAccount"], "default");
        let volumes = spec["volumes"].as_array().unwrap();
        assert_eq!(volumes.len(), 1);
        let name = volumes[0]["name"].as_str().unwrap();
        let suffix = name.strip_prefix("kube-api-access-").unwrap();
        assert_eq!(suffix.len(), 5);
        assert!(
            suffix
                .chars()
                .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
        );
        assert_eq!(
            volumes[0]["projected"],
            json!({"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]})
        );
        let mount = json!([{"name": name, "readOnly": true,
            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]);
        assert_eq!(
            mounts(&created, "containers"),
            [mount.clone(), mount.clone()]
        );
        assert_eq!(mounts(&created, "initContainers"), [mount]);
    }

    /// `shouldAutomount`: the pod's `automountServiceAccountToken` wins over the account's,
    /// which wins over the default (true); a container that already mounts something at the
    /// token path keeps it, and the volume is added only when some container needs it.
    #[tokio::test]
    async fn automount_follows_the_pod_then_the_account() {
        let storage = storage().await;
        account(
            &storage,
            "quiet",
            json!({"automountServiceAccountToken": false,
            "imagePullSecrets": [{"name": "registry"}]}),
        )
        .await;
        let off = create(&storage, pod("off", json!({"serviceAccountName": "quiet"})))
            .await
            .unwrap();
        assert!(off["spec"]["volumes"].is_null());
        assert_eq!(mounts(&off, "containers"), [Value::Null, Value::Null]);
        assert_eq!(
            off["spec"]["imagePullSecrets"],
            json!([{"name": "registry"}])
        );
        let on = create(
            &storage,
            pod(
                "on",
                json!({"serviceAccountName": "quiet", "automountServiceAccountToken": true}),
            ),
        )
        .await
        .unwrap();
        assert_eq!(on["spec"]["volumes"].as_array().unwrap().len(), 1);
        let own = json!([{"name": "mine", "mountPath": TOKEN_MOUNT_PATH}]);
        let mut spec = json!({"serviceAccountName": "quiet", "automountServiceAccountToken": true,
            "volumes": [{"name": "mine", "emptyDir": {}}]});
        for list in ["containers", "initContainers"] {
            let mut cs = pod("x", json!({}))["spec"][list].clone();
            for c in cs.as_array_mut().unwrap() {
                c["volumeMounts"] = own.clone();
            }
            spec[list] = cs;
        }
        let kept = create(&storage, pod("kept", spec)).await.unwrap();
        assert_eq!(
            kept["spec"]["volumes"],
            json!([{"name": "mine", "emptyDir": {}}])
        );
        assert_eq!(mounts(&kept, "containers"), [own.clone(), own]);
    }

    /// `getServiceAccount` and `Validate`: a pod naming an account that does not exist is
    /// refused with upstream's message (after waiting for it only when it is `default`),
    /// and nothing is stored.
    #[tokio::test(start_paused = true)]
    async fn a_pod_naming_a_missing_account_is_refused() {
        let storage = storage().await;
        let e = create(&storage, pod("p", json!({"serviceAccountName": "ghost"})))
            .await
            .unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "pods \"p\" is forbidden: error looking up service account a/ghost: serviceaccount \"ghost\" not found"
        );
        let started = tokio::time::Instant::now();
        let e = create(&storage, pod("p", json!({}))).await.unwrap_err();
        assert_eq!(
            e.message,
            "pods \"p\" is forbidden: error looking up service account a/default: serviceaccount \"default\" not found"
        );
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(900) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
        let stored = storage.reader().list(&PODS, Some("a")).await.unwrap();
        assert!(stored.is_empty());
    }

    /// `getServiceAccount`: the `default` account created while the pod waits for it (the
    /// serviceaccounts controller just behind a new namespace) lets the pod in.
    #[tokio::test(start_paused = true)]
    async fn a_pod_waits_for_the_default_account_being_created() {
        let storage = storage().await;
        let late = storage.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(450)).await;
            account(&late, "default", json!({})).await;
        });
        let created = create(&storage, pod("p", json!({}))).await.unwrap();
        assert_eq!(created["spec"]["serviceAccountName"], "default");
    }

    /// `Admit` leaves mirror pods as they are, and `Validate` refuses one that references a
    /// service account, a secret or a token projection.
    #[tokio::test]
    async fn mirror_pods_are_untouched_and_may_not_reference_accounts_or_secrets() {
        let storage = storage().await;
        let mirror = |name: &str, spec: Value| {
            let mut p = pod(name, spec);
            p["metadata"]["annotations"] = json!({MIRROR_POD_ANNOTATION: "hash"});
            p
        };
        let created = create(&storage, mirror("m", json!({}))).await.unwrap();
        assert!(created["spec"]["serviceAccountName"].is_null());
        assert!(created["spec"]["volumes"].is_null());
        for (spec, why) in [
            (
                json!({"serviceAccountName": "default"}),
                "a mirror pod may not reference service accounts",
            ),
            (
                json!({"volumes": [{"name": "s", "secret": {"secretName": "s"}}]}),
                "a mirror pod may not reference secrets",
            ),
            (
                json!({"volumes": [{"name": "t", "projected": token_volume_source()}]}),
                "a mirror pod may not use ServiceAccountToken volume projections",
            ),
        ] {
            let e = create(&storage, mirror("bad", spec)).await.unwrap_err();
            assert_eq!(e.code, 403);
            assert_eq!(e.message, format!("pods \"bad\" is forbidden: {why}"));
        }
    }

    /// `ValidatePodUpdate`: an update may not change the pod's service account nor its
    /// volumes (the token volume among them).
    #[tokio::test]
    async fn an_update_may_not_change_the_service_account() {
        let storage = storage().await;
        account(&storage, "default", json!({})).await;
        account(&storage, "other", json!({})).await;
        let created = create(&storage, pod("p", json!({}))).await.unwrap();
        let key = ObjectKey::new(&PODS, Some("a"), "p");
        let mut changed = created.clone();
        changed["spec"]["serviceAccountName"] = json!("other");
        changed["spec"]["serviceAccount"] = json!("other");
        let e = update_object(&storage, &ctx(), key, None, changed)
            .await
            .unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message.contains("pod updates may not change fields"),
            "{}",
            e.message
        );
        let mut unmounted = created.clone();
        unmounted["spec"]["volumes"] = json!([]);
        let e = update_object(&storage, &ctx(), key, None, unmounted)
            .await
            .unwrap_err();
        assert_eq!(e.code, 422);
        let mut labelled = created.clone();
        labelled["metadata"]["labels"] = json!({"a": "b"});
        let updated = update_object(&storage, &ctx(), key, None, labelled)
            .await
            .unwrap();
        assert_eq!(updated["spec"]["volumes"], created["spec"]["volumes"]);
    }
}
