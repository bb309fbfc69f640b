//! What a simulated container sees of its pod's identity, as kubelet gives it:
//!
//! - the service environment (`pkg/kubelet/kubelet_pods.go` `getServiceEnvVarMap` and
//!   `pkg/kubelet/envvars/envvars.go` `FromServices`): `KUBERNETES_SERVICE_HOST`,
//!   `KUBERNETES_SERVICE_PORT(_HTTPS)` and the Docker-links variables (`KUBERNETES_PORT`,
//!   `KUBERNETES_PORT_443_TCP(_PROTO|_PORT|_ADDR)`) of the `default/kubernetes` Service
//!   always, and of every Service of the pod's namespace when `enableServiceLinks` is not
//!   false; Services without a cluster IP are skipped, and the container's own `env`
//!   wins over them;
//! - the files of its projected volumes mounted in the container (`pkg/volume/projected`):
//!   a `serviceAccountToken` source is a token of the pod's service account minted through
//!   TokenRequest, bound to the pod (its name and UID), for the source's audience (the API
//!   server's when none) and `expirationSeconds`, and minted again once 80 % of its life
//!   has passed (`pkg/kubelet/token/token_manager.go` `requiresRefresh`); a `configMap`
//!   source is the ConfigMap's keys (or its `items`); a `downwardAPI` source the pod's
//!   fields (`metadata.namespace`, `name`, `uid`, `labels`, `annotations`,
//!   `spec.serviceAccountName`, `spec.nodeName`).
//!
//! # Where we differ
//!
//! Kubelet computes the environment when the container starts; the simulator computes it
//! when a command runs, from the Services created before the container started (their
//! `creationTimestamp` against the container's `startedAt`), which gives the same result
//! unless a Service was deleted since. Files are read when a command runs, as if kubelet's
//! volume manager had just synced them.

use std::{collections::HashMap, time::Duration};

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{ConfigMap, Container as ContainerSpec, Pod, Service, ServiceAccount},
};
use kube::{Api, Client, ResourceExt, api::PostParams};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::kubelet_api::Container;

/// The namespace of the API server's own Service (kubelet's `masterServiceNamespace`).
const MASTER_SERVICE_NAMESPACE: &str = "default";
/// The API server's own Service.
const MASTER_SERVICE: &str = "kubernetes";

/// The tokens kubelet holds for its pods' projected volumes, by pod UID and request.
#[derive(Debug, Default)]
pub(crate) struct TokenCache {
    tokens: Mutex<HashMap<TokenKey, (String, Instant, Instant)>>,
}

/// A token request: pod UID, account, audience, lifetime.
type TokenKey = (String, String, String, i64);

impl TokenCache {
    /// A token of `key`'s account bound to `pod`, from the cache while it is fresh (less
    /// than 80 % of its life gone), else minted through `client`.
    async fn token(&self, client: &Client, pod: &Pod, key: TokenKey) -> Result<String, String> {
        let now = Instant::now();
        if let Some((token, refresh, _)) = self.tokens.lock().get(&key)
            && now < *refresh
        {
            return Ok(token.clone());
        }
        let (_, account, audience, expiration) = &key;
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: if audience.is_empty() {
                    Vec::new()
                } else {
                    vec![audience.clone()]
                },
                expiration_seconds: Some(*expiration),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name_any()),
                    uid: pod.uid(),
                }),
            },
            ..TokenRequest::default()
        };
        let api: Api<ServiceAccount> =
            Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
        let minted = api
            .create_token_request(account, &PostParams::default(), &request)
            .await
            .map_err(|e| format!("failed to fetch token: {e}"))?;
        let token = minted.status.map(|s| s.token).unwrap_or_default();
        let life = Duration::from_secs(u64::try_from(*expiration).unwrap_or(0));
        let mut tokens = self.tokens.lock();
        tokens.retain(|_, (_, _, expires)| *expires > now);
        tokens.insert(key, (token.clone(), now + life * 4 / 5, now + life));
        Ok(token)
    }
}

/// `makeEnvVariableName`.
fn env_name(service: &str) -> String {
    service.replace('-', "_").to_uppercase()
}

/// `FromServices` for one Service: its `_SERVICE_HOST`, `_SERVICE_PORT`, named ports and
/// Docker-links variables.
pub(crate) fn service_env(service: &Service) -> Vec<(String, String)> {
    let Some(spec) = service.spec.as_ref() else {
        return Vec::new();
    };
    let ip = spec.cluster_ip.as_deref().unwrap_or("");
    let ports = spec.ports.as_deref().unwrap_or_default();
    if ip.is_empty() || ip == "None" || ports.is_empty() {
        return Vec::new();
    }
    let prefix = env_name(&service.name_any());
    let mut env = vec![
        (format!("{prefix}_SERVICE_HOST"), ip.to_owned()),
        (format!("{prefix}_SERVICE_PORT"), ports[0].port.to_string()),
    ];
    for p in ports {
        if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
            env.push((
                format!("{prefix}_SERVICE_PORT_{}", env_name(name)),
                p.port.to_string(),
            ));
        }
    }
    let host = |port: i32| match ip.contains(':') {
        true => format!("[{ip}]:{port}"),
        false => format!("{ip}:{port}"),
    };
    for (i, p) in ports.iter().enumerate() {
        let protocol = p.protocol.as_deref().unwrap_or("TCP");
        let url = format!("{}://{}", protocol.to_lowercase(), host(p.port));
        if i == 0 {
            env.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", p.port, protocol.to_uppercase());
        env.push((format!("{port_prefix}_PROTO"), protocol.to_lowercase()));
        env.push((format!("{port_prefix}_PORT"), p.port.to_string()));
        env.push((format!("{port_prefix}_ADDR"), ip.to_owned()));
        env.push((port_prefix, url));
    }
    env
}

/// `getServiceEnvVarMap`: the Services whose variables a pod of `namespace` gets, from
/// `services` (all namespaces): `default/kubernetes`, and the namespace's own when
/// `service_links`.
pub(crate) fn services_for<'a>(
    services: &'a [Service],
    namespace: &str,
    service_links: bool,
) -> Vec<&'a Service> {
    let mut chosen: Vec<&Service> = Vec::new();
    for s in services {
        let ns = s.namespace().unwrap_or_default();
        let name = s.name_any();
        if ns == MASTER_SERVICE_NAMESPACE && name == MASTER_SERVICE {
            // Added unless the pod's namespace has a Service of that name already.
            if !chosen.iter().any(|c| c.name_any() == name) {
                chosen.push(s);
            }
        } else if ns == namespace && service_links {
            // A Service of the pod's namespace named `kubernetes` wins over the master's.
            chosen.retain(|c| c.name_any() != name);
            chosen.push(s);
        }
    }
    chosen
}

/// A downward API field of `pod` (`fieldRef.fieldPath`).
fn pod_field(pod: &Pod, path: &str) -> Option<String> {
    let map = |m: &std::collections::BTreeMap<String, String>| {
        m.iter()
            .map(|(k, v)| format!("{k}={v:?}\n"))
            .collect::<String>()
    };
    Some(match path {
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.name" => pod.name_any(),
        "metadata.uid" => pod.uid().unwrap_or_default(),
        "metadata.labels" => map(pod.labels()),
        "metadata.annotations" => map(pod.annotations()),
        "spec.serviceAccountName" => pod.spec.as_ref()?.service_account_name.clone()?,
        "spec.nodeName" => pod.spec.as_ref()?.node_name.clone()?,
        _ => return None,
    })
}

/// Adds to `view` (the container `container` of `pod`, from `Container::of`) the service
/// environment and the files of its projected volumes, read and minted through `client`
/// (the pod's kubelet's). What cannot be read is left out, with a debug line, as a
/// volume that failed to set up would have kept the container from starting.
pub(crate) async fn extend(
    client: &Client,
    tokens: &TokenCache,
    pod: &Pod,
    container: &str,
    view: &mut Container,
) {
    let namespace = pod.namespace().unwrap_or_default();
    let Some(spec) = pod.spec.as_ref() else {
        return;
    };
    let started = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == container))
        .and_then(|c| c.state.as_ref()?.running.as_ref()?.started_at.clone());
    match Api::<Service>::all(client.clone())
        .list(&Default::default())
        .await
    {
        Ok(list) => {
            let before_start: Vec<Service> = list
                .items
                .into_iter()
                .filter(|s| match (&started, &s.metadata.creation_timestamp) {
                    (Some(started), Some(created)) => created.0 <= started.0,
                    _ => true,
                })
                .collect();
            let links = spec.enable_service_links.unwrap_or(true);
            for s in services_for(&before_start, &namespace, links) {
                for (k, v) in service_env(s) {
                    view.env.entry(k).or_insert(v);
                }
            }
        }
        Err(error) => tracing::debug!(%error, "listing services for a pod's environment"),
    }
    let Some(c): Option<&ContainerSpec> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == container)
    else {
        return;
    };
    for mount in c.volume_mounts.iter().flatten() {
        let Some(projected) = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.projected.as_ref())
        else {
            continue;
        };
        let dir = mount.mount_path.trim_end_matches('/');
        for source in projected.sources.iter().flatten() {
            if let Some(t) = &source.service_account_token {
                let account = spec
                    .service_account_name
                    .clone()
                    .unwrap_or_else(|| "default".into());
                let key = (
                    pod.uid().unwrap_or_default(),
                    account,
                    t.audience.clone().unwrap_or_default(),
                    t.expiration_seconds.unwrap_or(3600),
                );
                match tokens.token(client, pod, key).await {
                    Ok(token) => {
                        view.files.insert(format!("{dir}/{}", t.path), token);
                    }
                    Err(error) => tracing::debug!(%error, pod = %pod.name_any(), "projected token"),
                }
            }
            if let Some(cm) = &source.config_map {
                let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
                match api.get_opt(&cm.name).await {
                    Ok(Some(found)) => {
                        let data = found.data.unwrap_or_default();
                        match &cm.items {
                            Some(items) => {
                                for item in items {
                                    if let Some(v) = data.get(&item.key) {
                                        view.files
                                            .insert(format!("{dir}/{}", item.path), v.clone());
                                    }
                                }
                            }
                            None => {
                                for (k, v) in data {
                                    view.files.insert(format!("{dir}/{k}"), v);
                                }
                            }
                        }
                    }
                    Ok(None) => {
                        tracing::debug!(configmap = %cm.name, "projected configmap is missing")
                    }
                    Err(error) => tracing::debug!(%error, "projected configmap"),
                }
            }
            if let Some(downward) = &source.downward_api {
                for item in downward.items.iter().flatten() {
                    if let Some(value) = item
                        .field_ref
                        .as_ref()
                        .and_then(|f| pod_field(pod, &f.field_path))
                    {
                        view.files.insert(format!("{dir}/{}", item.path), value);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn service(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip, "ports": ports}}))
        .unwrap()
    }

    /// `envvars.go` `FromServices` for the `kubernetes` Service: what every container of a
    /// real cluster shows in `env`.
    #[test]
    fn the_kubernetes_service_gives_upstreams_variables() {
        let kubernetes = service(
            "default",
            "kubernetes",
            "10.96.0.1",
            json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]),
        );
        let env: std::collections::BTreeMap<String, String> =
            service_env(&kubernetes).into_iter().collect();
        let expected: std::collections::BTreeMap<String, String> = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(env, expected);
        let headless = service("a", "h", "None", json!([{"port": 80}]));
        assert!(service_env(&headless).is_empty());
        let dashed = service(
            "a",
            "my-db",
            "10.0.0.5",
            json!([{"port": 5432, "protocol": "UDP"}]),
        );
        let env: HashMap<String, String> = service_env(&dashed).into_iter().collect();
        assert_eq!(env["MY_DB_SERVICE_PORT"], "5432");
        assert_eq!(env["MY_DB_PORT"], "udp://10.0.0.5:5432");
        assert_eq!(env["MY_DB_PORT_5432_UDP_ADDR"], "10.0.0.5");
    }

    /// `getServiceEnvVarMap`: `default/kubernetes` always; the pod's namespace's Services
    /// only with `enableServiceLinks`; other namespaces' never.
    #[test]
    fn service_links_follow_enable_service_links() {
        let services = vec![
            service("default", "kubernetes", "10.96.0.1", json!([{"port": 443}])),
            service("a", "web", "10.96.0.9", json!([{"port": 80}])),
            service("b", "other", "10.96.0.7", json!([{"port": 80}])),
        ];
        let names = |links| -> Vec<String> {
            services_for(&services, "a", links)
                .iter()
                .map(|s| s.name_any())
                .collect()
        };
        assert_eq!(names(true), ["kubernetes", "web"]);
        assert_eq!(names(false), ["kubernetes"]);
    }
}
