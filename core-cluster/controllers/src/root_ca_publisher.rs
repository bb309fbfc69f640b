//! The root-CA publisher: the ConfigMap `kube-root-ca.crt` in every namespace, holding the
//! CA bundle that verifies the API server (`ca.crt`), which every pod's projected
//! service-account volume mounts.
//!
//! # What upstream does (`pkg/controller/certificates/rootcacertpublisher/publisher.go`)
//!
//! Namespaces (added or updated) and the `kube-root-ca.crt` ConfigMaps (updated or deleted)
//! queue their namespace. `syncNamespace` creates the ConfigMap when it is missing, with
//! `data: {ca.crt: <root CA>}` and the annotation `kubernetes.io/description` (a create
//! refused because the namespace is gone or terminating is not retried); when it exists
//! but its data differ or the annotation is missing, it is updated back (any other key
//! dropped, other annotations and labels kept). A deleted one is therefore recreated and
//! an edited one repaired.
//!
//! # Where we differ
//!
//! The controller watches only ConfigMaps named `kube-root-ca.crt` (a field selector),
//! where upstream's informer lists every ConfigMap and filters.

use std::{collections::BTreeMap, time::Duration};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api, Client, ResourceExt,
    api::{ObjectMeta, PostParams},
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::workload::{Reconcile, drive, watch, watch_with};

/// The ConfigMap's name in every namespace (`RootCACertConfigMapName`).
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
/// The key of the CA bundle in it.
pub const CA_KEY: &str = "ca.crt";
/// The annotation describing the ConfigMap (`DescriptionAnnotation`).
pub const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
/// Its value (`Description`).
pub const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

/// The root-CA publisher.
pub struct RootCaPublisher {
    client: Client,
    root_ca: String,
}

impl std::fmt::Debug for RootCaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RootCaPublisher").finish_non_exhaustive()
    }
}

impl RootCaPublisher {
    /// A publisher of `root_ca` (PEM, the CA that signed the API server's serving
    /// certificate: upstream's `--root-ca-file`) talking to the API server through `client`.
    pub fn new(client: Client, root_ca: impl Into<String>) -> Self {
        Self {
            client,
            root_ca: root_ca.into(),
        }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (namespaces, namespace_events) =
            watch(Api::<Namespace>::all(self.client.clone()), |n| {
                vec![n.name_any()]
            });
        let (configmaps, configmap_events) = watch_with(
            Api::<ConfigMap>::all(self.client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={ROOT_CA_CONFIGMAP}")),
            |c| c.namespace().into_iter().collect(),
        );
        let sync = Sync {
            client: self.client,
            root_ca: self.root_ca,
            namespaces,
            configmaps,
        };
        drive(sync, vec![namespace_events, configmap_events], shutdown).await;
    }
}

struct Sync {
    client: Client,
    root_ca: String,
    namespaces: Store<Namespace>,
    configmaps: Store<ConfigMap>,
}

/// Whether a write was refused because its namespace is gone or being deleted: not
/// retried, as upstream's `NamespaceTerminatingCause` and `IsNotFound` checks.
pub(crate) fn namespace_gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404
        || (s.code == 403 && s.message.contains("being terminated")))
}

/// What `cm` should become, or `None` when it is right (`syncNamespace`'s check: the data
/// are exactly the CA and the description annotation is set).
pub fn repaired(cm: &ConfigMap, root_ca: &str) -> Option<ConfigMap> {
    let data = BTreeMap::from([(CA_KEY.to_owned(), root_ca.to_owned())]);
    let described = cm
        .annotations()
        .get(DESCRIPTION_ANNOTATION)
        .is_some_and(|d| !d.is_empty());
    if cm.data.as_ref() == Some(&data) && described {
        return None;
    }
    let mut fixed = cm.clone();
    fixed.data = Some(data);
    fixed.binary_data = None;
    fixed
        .annotations_mut()
        .insert(DESCRIPTION_ANNOTATION.to_owned(), DESCRIPTION.to_owned());
    Some(fixed)
}

#[async_trait]
impl Reconcile for Sync {
    fn name(&self) -> &'static str {
        "root-ca-cert-publisher"
    }

    async fn reconcile(&mut self, ns: &str) -> Result<Option<Duration>, kube::Error> {
        let Some(namespace) = self.namespaces.get(&ObjectRef::new(ns)) else {
            return Ok(None);
        };
        if namespace.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        let cached = self
            .configmaps
            .get(&ObjectRef::new(ROOT_CA_CONFIGMAP).within(ns));
        let result = match cached {
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(ROOT_CA_CONFIGMAP.to_owned()),
                        annotations: Some(BTreeMap::from([(
                            DESCRIPTION_ANNOTATION.to_owned(),
                            DESCRIPTION.to_owned(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    data: Some(BTreeMap::from([(CA_KEY.to_owned(), self.root_ca.clone())])),
                    ..ConfigMap::default()
                };
                match api.create(&PostParams::default(), &cm).await {
                    Ok(_) => {
                        info!(namespace = ns, "published {ROOT_CA_CONFIGMAP}");
                        Ok(())
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Some(cm) => match repaired(&cm, &self.root_ca) {
                None => Ok(()),
                Some(fixed) => {
                    info!(namespace = ns, "repairing {ROOT_CA_CONFIGMAP}");
                    match api
                        .replace(ROOT_CA_CONFIGMAP, &PostParams::default(), &fixed)
                        .await
                    {
                        // A newer one is on its way to the cache: that event queues again.
                        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                        other => other.map(|_| ()),
                    }
                }
            },
        };
        match result {
            Err(e) if namespace_gone(&e) => Ok(None),
            other => other.map(|()| None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(value: serde_json::Value) -> ConfigMap {
        serde_json::from_value(value).unwrap()
    }

    /// `syncNamespace`: a ConfigMap with exactly the CA and the description is left alone;
    /// other data, a missing annotation or an extra key are put back, keeping the other
    /// annotations and labels.
    #[test]
    fn an_edited_configmap_is_repaired_and_a_right_one_left_alone() {
        let right = cm(
            json!({"metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": "a",
            "annotations": {DESCRIPTION_ANNOTATION: DESCRIPTION}},
            "data": {"ca.crt": "PEM"}}),
        );
        assert!(repaired(&right, "PEM").is_none());
        let edited = cm(
            json!({"metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": "a",
            "labels": {"l": "v"}, "annotations": {"x": "y"}},
            "data": {"ca.crt": "forged", "extra": "1"}}),
        );
        let fixed = repaired(&edited, "PEM").expect("a repair");
        assert_eq!(
            fixed.data,
            Some(BTreeMap::from([("ca.crt".to_owned(), "PEM".to_owned())]))
        );
        assert_eq!(fixed.annotations()["x"], "y");
        assert_eq!(fixed.annotations()[DESCRIPTION_ANNOTATION], DESCRIPTION);
        assert_eq!(fixed.labels()["l"], "v");
        let undescribed = cm(
            json!({"metadata": {"name": ROOT_CA_CONFIGMAP, "namespace": "a"},
            "data": {"ca.crt": "PEM"}}),
        );
        assert!(repaired(&undescribed, "PEM").is_some());
    }
}
