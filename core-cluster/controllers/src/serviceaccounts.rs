//! The serviceaccounts controller: the `default` ServiceAccount in every namespace, which
//! the ServiceAccount admission plugin gives every pod that names none.
//!
//! # What upstream does (`pkg/controller/serviceaccount/serviceaccounts_controller.go`)
//!
//! Namespaces (added or updated) and deleted ServiceAccounts queue their namespace.
//! `syncNamespace` skips a namespace that is gone or not `Active`, and creates each account
//! of `ServiceAccountsToEnsure` (`default`) that is missing, with nothing but its name; an
//! `AlreadyExists`, or a refusal because the namespace is terminating, is not an error. A
//! deleted `default` account is therefore recreated (with a new UID: the old one's tokens
//! stop authenticating).
//!
//! # Where we differ
//!
//! Nothing beyond the accounts to ensure being fixed to `default`.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
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

use super::{
    root_ca_publisher::namespace_gone,
    workload::{Reconcile, drive, watch, watch_with},
};

/// The account every namespace gets (`ServiceAccountsToEnsure`).
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// The serviceaccounts controller.
pub struct ServiceAccountsController {
    client: Client,
}

impl std::fmt::Debug for ServiceAccountsController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountsController")
            .finish_non_exhaustive()
    }
}

impl ServiceAccountsController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (namespaces, namespace_events) =
            watch(Api::<Namespace>::all(self.client.clone()), |n| {
                vec![n.name_any()]
            });
        let (accounts, account_events) = watch_with(
            Api::<ServiceAccount>::all(self.client.clone()),
            watcher::Config::default().fields(&format!("metadata.name={DEFAULT_SERVICE_ACCOUNT}")),
            |sa| sa.namespace().into_iter().collect(),
        );
        let sync = Sync {
            client: self.client,
            namespaces,
            accounts,
        };
        drive(sync, vec![namespace_events, account_events], shutdown).await;
    }
}

struct Sync {
    client: Client,
    namespaces: Store<Namespace>,
    accounts: Store<ServiceAccount>,
}

/// Whether `namespace` takes new accounts (`syncNamespace`: `Active` and not deleted).
pub fn active(namespace: &Namespace) -> bool {
    namespace.metadata.deletion_timestamp.is_none()
        && namespace
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|p| p == "Active")
}

#[async_trait]
impl Reconcile for Sync {
    fn name(&self) -> &'static str {
        "serviceaccount"
    }

    async fn reconcile(&mut self, ns: &str) -> Result<Option<Duration>, kube::Error> {
        let Some(namespace) = self.namespaces.get(&ObjectRef::new(ns)) else {
            return Ok(None);
        };
        if !active(&namespace) {
            return Ok(None);
        }
        let key = ObjectRef::new(DEFAULT_SERVICE_ACCOUNT).within(ns);
        if self.accounts.get(&key).is_some() {
            return Ok(None);
        }
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(DEFAULT_SERVICE_ACCOUNT.to_owned()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        match api.create(&PostParams::default(), &account).await {
            Ok(_) => {
                info!(namespace = ns, "created the default service account");
                Ok(None)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
            Err(e) if namespace_gone(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `syncNamespace` skips namespaces that are not `Active` or are being deleted.
    #[test]
    fn only_active_namespaces_get_accounts() {
        let ns = |v| serde_json::from_value::<Namespace>(v).unwrap();
        assert!(active(&ns(json!({"metadata": {"name": "a"}}))));
        assert!(active(&ns(
            json!({"metadata": {"name": "a"}, "status": {"phase": "Active"}})
        )));
        assert!(!active(&ns(
            json!({"metadata": {"name": "a"}, "status": {"phase": "Terminating"}})
        )));
        assert!(!active(&ns(
            json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z"}})
        )));
    }
}
