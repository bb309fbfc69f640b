//! The generic object store (upstream's `k8s.io/apiserver/pkg/registry/generic/registry`
//! `Store`): get, list, create, update and delete of any [`ResourceDef`] over the key-value
//! [`Store`], with the registry's strategies (defaulting, validation), `managedFields`,
//! admission ([`admission`]), Service IP and port allocation, graceful deletion and
//! finalizers, the namespace's finalization and the pod subresources that write (binding).
//!
//! It knows nothing of HTTP: [`crate::api`] parses requests and renders answers around it,
//! and [`crate::auth`] reads objects through its [`ObjectReader`]. Every committed write,
//! whatever made it (a request, the server's bootstrap, namespace cleanup), is announced to
//! the [`observe::WriteObserver`]s.

pub(crate) mod admission;
pub(crate) mod apiservice;
pub(crate) mod crd;
pub(crate) mod create;
pub(crate) mod custom_validation;
pub(crate) mod default_toleration_seconds;
pub(crate) mod delete;
pub(crate) mod ephemeral;
pub(crate) mod eviction;
pub(crate) mod get_list;
pub(crate) mod namespace;
pub(crate) mod observe;
pub(crate) mod pods;
pub(crate) mod ranges;
pub(crate) mod repair_events;
pub(crate) mod service_account;
pub(crate) mod status;
pub(crate) mod update;
pub(crate) mod user;

use std::{
    collections::HashMap,
    sync::{Arc, Weak},
};

use bytes::Bytes;
use serde_json::{Value, json};

use crate::{
    patch,
    registry::FieldError,
    registry::{
        Registry, ResourceDef,
        allocator::ServiceAllocator,
        meta::{meta_mut, str_at},
    },
    store::{KeyValue, Store, StoreError},
};
use admission::{Admission, AdmissionAttributes};
use observe::{ObjectChange, WriteObserver};
use status::{ApiError, Qualified};
use user::UserInfo;

/// Query parameters, last value wins.
pub(crate) type Query = HashMap<String, String>;

/// The namespaces every cluster has.
pub const SYSTEM_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// A boolean query parameter as upstream's `Convert_Slice_string_To_bool` reads it (for list
/// options and the request attributes alike): present and neither "0" nor "false" in any case
/// is true, so the Python client's `watch=True` is a watch.
pub(crate) fn query_bool(value: Option<&str>) -> bool {
    value.is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// A boolean query parameter (see [`query_bool`]).
pub(crate) fn flag(query: &Query, key: &str) -> bool {
    query_bool(query.get(key).map(String::as_str))
}

/// Who writes and with which options (`fieldManager`, `dryRun`, `fieldValidation`): what
/// upstream's generic store gets as the request context and the create/update options.
#[derive(Debug, Clone)]
pub(crate) struct WriteContext {
    /// The effective user, whom admission checks; the server's own writes are the loopback
    /// client's ([`UserInfo::loopback`]).
    pub(crate) user: UserInfo,
    /// The request's query parameters.
    pub(crate) query: Query,
    /// The field manager recorded in `metadata.managedFields` for this write (an `Update`
    /// entry); none for writes that are not tracked (the server's own, and applies, which
    /// record their `Apply` entry themselves).
    pub(crate) manager: Option<String>,
}

impl WriteContext {
    /// A write of `user` with `query`, tracked under the query's `fieldManager` if it names
    /// one.
    pub(crate) fn new(user: UserInfo, query: Query) -> Self {
        let manager = query.get("fieldManager").filter(|m| !m.is_empty()).cloned();
        WriteContext {
            user,
            query,
            manager,
        }
    }

    /// An API request's write: tracked under the query's `fieldManager`, else the prefix of
    /// the request's User-Agent (upstream's `managerOrUserAgent`).
    pub(crate) fn of_request(user: UserInfo, query: Query, user_agent: &str) -> Self {
        let mut ctx = WriteContext::new(user, query);
        if ctx.manager.is_none() {
            ctx.manager = Some(patch::manager_from_user_agent(user_agent));
        }
        ctx
    }

    /// The same write, not tracked as an `Update` (an apply records its own entry).
    pub(crate) fn untracked(mut self) -> Self {
        self.manager = None;
        self
    }

    /// A write of the server itself (bootstrap, manifests, namespace cleanup).
    pub(crate) fn server() -> Self {
        WriteContext::new(UserInfo::loopback(), Query::new())
    }

    fn dry_run(&self) -> bool {
        self.query.get("dryRun").is_some_and(|d| d == "All")
    }
}

/// The object a write is about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ObjectKey<'a> {
    /// Its resource.
    pub(crate) def: &'static ResourceDef,
    /// Its namespace (none at the cluster scope).
    pub(crate) namespace: Option<&'a str>,
    /// Its name.
    pub(crate) name: &'a str,
}

impl<'a> ObjectKey<'a> {
    /// `def` `namespace/name`.
    pub(crate) fn new(
        def: &'static ResourceDef,
        namespace: Option<&'a str>,
        name: &'a str,
    ) -> Self {
        ObjectKey {
            def,
            namespace,
            name,
        }
    }
}

/// The generic store: see the [module docs](self).
pub(crate) struct Storage {
    /// Lets background work (namespace cleanup) hold the storage.
    self_ref: Weak<Storage>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) registry: Registry,
    /// The Service ClusterIP and NodePort ranges, kept in the store.
    pub(crate) ranges: ranges::ServiceRanges,
    max_object_bytes: usize,
    admission: Vec<Arc<dyn Admission>>,
    observers: Vec<Arc<dyn WriteObserver>>,
    /// The observers that follow other servers' writes too (see [`Storage::followers`]):
    /// the ones given, and the definition controller (shared with `observers`, so one
    /// reconcile runs at a time whoever starts it).
    followed: Vec<Arc<dyn WriteObserver>>,
    /// The namespaces whose cleanup runs in this process now (one cleanup each).
    pub(crate) finalizing: parking_lot::Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("max_object_bytes", &self.max_object_bytes)
            .finish_non_exhaustive()
    }
}

impl Storage {
    /// The generic store over `store`: objects larger than `max_object_bytes` are refused
    /// (413), every write passes the `admission` chain in order, and every committed write
    /// is told to the `observers` (and to the namespace finalizer, which cleans up a
    /// namespace once its deletion is committed).
    pub(crate) fn new(
        store: Arc<dyn Store>,
        allocator: ServiceAllocator,
        max_object_bytes: usize,
        admission: Vec<Arc<dyn Admission>>,
        observers: Vec<Arc<dyn WriteObserver>>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|self_ref: &Weak<Storage>| {
            let crds: Arc<dyn WriteObserver> = Arc::new(crd::CrdController {
                storage: self_ref.clone(),
                running: Arc::default(),
            });
            let mut followed = observers.clone();
            followed.push(crds.clone());
            let mut observers = observers;
            observers.push(Arc::new(namespace::NamespaceFinalizer {
                storage: self_ref.clone(),
                takeover_after: None,
            }));
            observers.push(crds);
            Storage {
                self_ref: self_ref.clone(),
                ranges: ranges::ServiceRanges::new(store.clone(), allocator),
                store,
                registry: Registry::standard(),
                max_object_bytes,
                admission,
                observers,
                followed,
                finalizing: parking_lot::Mutex::default(),
            }
        })
    }

    /// What follows the writes other API servers sharing the store make (fed from a
    /// watch of the store, [`observe::follow_store`]), as upstream's informers feed every
    /// kube-apiserver: the observers of this server's own writes (authorizers, the custom
    /// resource definitions' controller), and the namespace finalizer in its takeover
    /// form: a namespace another server started deleting is cleaned up here only if it is
    /// still terminating `namespace_takeover_after` later (see
    /// [`namespace::NamespaceFinalizer`]).
    pub(crate) fn followers(
        &self,
        namespace_takeover_after: std::time::Duration,
    ) -> Vec<Arc<dyn WriteObserver>> {
        let mut followers = self.followed.clone();
        followers.push(Arc::new(namespace::NamespaceFinalizer {
            storage: self.self_ref.clone(),
            takeover_after: Some(namespace_takeover_after),
        }));
        followers
    }

    /// Reads of stored objects.
    pub(crate) fn reader(&self) -> ObjectReader {
        ObjectReader::new(self.store.clone())
    }

    /// Runs the admission chain (upstream's validating admission, in the order it was
    /// built): the first refusal is the answer.
    pub(crate) async fn admit(&self, attrs: &AdmissionAttributes<'_>) -> Result<(), ApiError> {
        for plugin in &self.admission {
            if let Err(e) = plugin.admit(attrs).await {
                tracing::debug!(
                    plugin = plugin.name(),
                    user = %attrs.user.name,
                    resource = attrs.resource.plural,
                    name = attrs.name,
                    "admission refused the write"
                );
                return Err(e);
            }
        }
        Ok(())
    }

    /// Runs the mutating admission chain on `object` (upstream's mutating admission, in
    /// the order the chain was built, before validation): the first refusal is the answer.
    pub(crate) async fn mutate(
        &self,
        attrs: &AdmissionAttributes<'_>,
        object: &mut Value,
    ) -> Result<(), ApiError> {
        for plugin in &self.admission {
            if let Err(e) = plugin.mutate(attrs, object).await {
                tracing::debug!(
                    plugin = plugin.name(),
                    user = %attrs.user.name,
                    resource = attrs.resource.plural,
                    name = attrs.name,
                    "mutating admission refused the write"
                );
                return Err(e);
            }
        }
        Ok(())
    }

    /// Runs the store write `op` of `key` (from `old`, none for a create, to `new`, none
    /// for a delete) and tells the observers of its resource once it is committed. When an
    /// observer follows the resource, the write and the telling run as one task, so a
    /// caller that goes away mid-write (a client gone, a request timed out) cannot leave a
    /// committed write untold. A write the store may or may not have made (it failed
    /// mid-way) is told as lost: the observers read the store again.
    async fn write<T: Send + 'static>(
        &self,
        key: ObjectKey<'_>,
        old: Option<&Value>,
        new: Option<&Value>,
        op: impl Future<Output = Result<T, StoreError>> + Send + 'static,
        revision: fn(&T) -> u64,
    ) -> Result<T, StoreError> {
        let observers: Vec<Arc<dyn WriteObserver>> = self
            .observers
            .iter()
            .filter(|o| o.observes(key.def))
            .cloned()
            .collect();
        if observers.is_empty() {
            return op.await;
        }
        let def = key.def;
        let (namespace, name) = (key.namespace.map(str::to_owned), key.name.to_owned());
        let (old, new) = (old.cloned(), new.cloned());
        let task = tokio::spawn(async move {
            let result = op.await;
            match &result {
                Ok(done) => {
                    let change = ObjectChange {
                        def,
                        namespace: namespace.as_deref(),
                        name: &name,
                        old: old.as_ref(),
                        new: new.as_ref(),
                        revision: revision(done),
                    };
                    for observer in &observers {
                        observer.changed(&change).await;
                    }
                }
                Err(
                    StoreError::NotFound { .. }
                    | StoreError::AlreadyExists { .. }
                    | StoreError::Conflict { .. }
                    | StoreError::Closed,
                ) => {}
                Err(_) => {
                    for observer in &observers {
                        observer.lost(def).await;
                    }
                }
            }
            result
        });
        match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(StoreError::Closed),
        }
    }

    /// Creates `key` holding `bytes`, the encoding of `new`.
    async fn create_key(
        &self,
        key: ObjectKey<'_>,
        new: &Value,
        bytes: Bytes,
    ) -> Result<u64, StoreError> {
        let (store, k) = (self.store.clone(), key.def.key(key.namespace, key.name));
        let op = async move { store.create(&k, bytes).await };
        self.write(key, None, Some(new), op, |r| *r).await
    }

    /// Replaces `key`, at `expected` revision, from `old` to `new` (encoded as `bytes`).
    async fn update_key(
        &self,
        key: ObjectKey<'_>,
        old: &Value,
        new: &Value,
        bytes: Bytes,
        expected: u64,
    ) -> Result<u64, StoreError> {
        let (store, k) = (self.store.clone(), key.def.key(key.namespace, key.name));
        let op = async move { store.update(&k, bytes, Some(expected)).await };
        self.write(key, Some(old), Some(new), op, |r| *r).await
    }

    /// Deletes `key`, holding `old`, at `expected` revision.
    async fn delete_key(
        &self,
        key: ObjectKey<'_>,
        old: &Value,
        expected: u64,
    ) -> Result<(u64, KeyValue), StoreError> {
        let (store, k) = (self.store.clone(), key.def.key(key.namespace, key.name));
        let op = async move { store.delete(&k, Some(expected)).await };
        self.write(key, Some(old), None, op, |(r, _)| *r).await
    }
}

/// Reads of stored objects, for the layers that only read ([`crate::auth`]'s node graph,
/// RBAC, bootstrap and reviews): get and list of a resource, decoded as served.
#[derive(Clone)]
pub(crate) struct ObjectReader {
    store: Arc<dyn Store>,
}

impl std::fmt::Debug for ObjectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectReader").finish_non_exhaustive()
    }
}

impl ObjectReader {
    /// Reads of `store`.
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        ObjectReader { store }
    }

    /// One stored object.
    pub(crate) async fn get(
        &self,
        def: &'static ResourceDef,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        Ok(get_list::get_object(&*self.store, def, ns, name).await?.1)
    }

    /// The revision `def` `ns/name` was last written at, or `None` if it is not stored.
    pub(crate) async fn revision(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self
            .store
            .get(&def.key(ns, name))
            .await?
            .map(|kv| kv.mod_revision))
    }

    /// The stored bytes of `def` `ns/name`, as the store holds them.
    pub(crate) async fn raw(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Option<Bytes>, StoreError> {
        Ok(self.store.get(&def.key(ns, name)).await?.map(|kv| kv.value))
    }

    /// Every stored object of the keys under `prefix`, raw (for indexes rebuilt from the
    /// store, as RBAC's).
    pub(crate) async fn list_raw(&self, prefix: &str) -> Result<Vec<KeyValue>, StoreError> {
        Ok(self.store.list(prefix, None, None, None).await?.items)
    }

    /// Every object of `def` (in `ns`, or all namespaces).
    pub(crate) async fn list(
        &self,
        def: &'static ResourceDef,
        ns: Option<&str>,
    ) -> Result<Vec<Value>, ApiError> {
        get_list::list_all(&*self.store, def, ns).await
    }
}

/// How many times an unconditional write retries after losing a race (GuaranteedUpdate).
pub(crate) const MAX_WRITE_ATTEMPTS: usize = 16;

/// How many names `generateName` tries before giving up (KEP-4420).
pub(crate) const GENERATE_NAME_ATTEMPTS: usize = 8;

/// The schema validation of a custom resource, its `x-kubernetes-validations` rules with
/// an update's `old` object (none for built-in resources, whose strategy validates them),
/// on the validation pool ([`custom_validation`]). A custom resource whose definition is no
/// longer served (deleted or changed while the request ran) is refused, never written
/// unvalidated.
pub(crate) async fn custom_errors(
    def: &ResourceDef,
    obj: &Value,
    old: Option<&Value>,
) -> Result<Vec<FieldError>, ApiError> {
    if !crate::crd::is_custom(def) {
        return Ok(Vec::new());
    }
    match crate::crd::custom(def) {
        Some(custom) => Ok(custom_validation::validate(custom, obj, old).await),
        None => Err(ApiError::not_found(&qualified(def, ""))),
    }
}

pub(crate) fn qualified(def: &ResourceDef, name: &str) -> Qualified {
    Qualified::new(def.group, def.plural, name)
}

/// A stored object as served: converted to the resource's version, with its resourceVersion.
pub(crate) fn decode(def: &ResourceDef, value: &[u8], revision: u64) -> Result<Value, ApiError> {
    let stored: Value = serde_json::from_slice(value)
        .map_err(|e| ApiError::internal(format!("stored object is not JSON: {e}")))?;
    let mut obj = (def.from_storage)(stored);
    if crate::crd::is_custom(def)
        && let Some(o) = obj.as_object_mut()
    {
        // `None` conversion: one stored form, served under each version's apiVersion.
        o.insert("apiVersion".into(), json!(def.api_version()));
    }
    meta_mut(&mut obj).insert("resourceVersion".into(), json!(revision.to_string()));
    Ok(obj)
}

pub(crate) fn decode_kv(def: &ResourceDef, kv: &KeyValue) -> Result<Value, ApiError> {
    decode(def, &kv.value, kv.mod_revision)
}

/// The stored form of an object, checked to be readable back: not nested deeper than the
/// read path's decoder accepts (422) and not larger than `max_object_bytes` (413, as etcd's
/// request size limit upstream). Nothing is stored that a later read would fail on.
pub(crate) fn encode(state: &Storage, def: &ResourceDef, obj: &Value) -> Result<Bytes, ApiError> {
    let name = str_at(obj, &["metadata", "name"]).unwrap_or("");
    if let Err(why) = patch::limits::check_depth(obj) {
        return Err(invalid(
            def,
            name,
            vec![FieldError::invalid("", &Value::Null, why)],
        ));
    }
    let mut stored = (def.to_storage)(obj.clone());
    if let Some(custom) = crate::crd::custom(def)
        && let Some(o) = stored.as_object_mut()
    {
        o.insert("apiVersion".into(), json!(custom.storage_api_version));
    }
    meta_mut(&mut stored).remove("resourceVersion");
    let bytes = serde_json::to_vec(&stored)
        .map_err(|e| ApiError::internal(format!("encoding the object: {e}")))?;
    // The read path's own decoder has the last word on what is readable.
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
        return Err(invalid(
            def,
            name,
            vec![FieldError::invalid(
                "",
                &Value::Null,
                format!("the object could not be read back: {e}"),
            )],
        ));
    }
    let limit = state.max_object_bytes;
    if bytes.len() > limit {
        return Err(ApiError::entity_too_large(format!(
            "the object {name:?} would be {} bytes, more than the limit of {limit} bytes per stored object",
            bytes.len()
        )));
    }
    Ok(Bytes::from(bytes))
}

/// A 422 naming the object by its internal kind, as upstream's strategies do:
/// events.k8s.io/v1 Events are core Events inside kube-apiserver (`Event "a" is invalid`).
pub(crate) fn invalid(def: &ResourceDef, name: &str, errors: Vec<FieldError>) -> ApiError {
    let group = if def.storage == "core/events" {
        ""
    } else {
        def.group
    };
    ApiError::invalid(def.kind, group, name, errors)
}

pub(crate) fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))
}

#[cfg(test)]
mod tests {
    use futures::future::BoxFuture;
    use serde_json::json;

    use super::*;
    use crate::{
        registry::resources::{CONFIG_MAPS, NAMESPACES},
        store::MemoryStore,
    };

    /// What a [`Recorder`] was told: (plural, name, had old, had new, revision).
    type Told = (String, String, bool, bool, u64);

    /// Records the changes of ConfigMaps it is told of.
    #[derive(Default)]
    struct Recorder(parking_lot::Mutex<Vec<Told>>);

    impl WriteObserver for Recorder {
        fn observes(&self, def: &ResourceDef) -> bool {
            def.plural == "configmaps"
        }

        fn changed<'a>(&'a self, change: &'a ObjectChange<'a>) -> BoxFuture<'a, ()> {
            Box::pin(async move {
                self.0.lock().push((
                    change.def.plural.to_owned(),
                    change.name.to_owned(),
                    change.old.is_some(),
                    change.new.is_some(),
                    change.revision,
                ));
            })
        }

        fn lost<'a>(&'a self, _def: &'a ResourceDef) -> BoxFuture<'a, ()> {
            Box::pin(async {})
        }
    }

    /// Refuses every write of the user `mallory`.
    struct NoMallory;

    impl Admission for NoMallory {
        fn name(&self) -> &'static str {
            "NoMallory"
        }

        fn admit<'a>(
            &'a self,
            attrs: &'a AdmissionAttributes<'a>,
        ) -> BoxFuture<'a, Result<(), ApiError>> {
            Box::pin(async move {
                if attrs.user.name == "mallory" {
                    return Err(ApiError::forbidden(
                        &Qualified::new("", attrs.resource.plural, attrs.name),
                        "mallory may not write",
                    ));
                }
                Ok(())
            })
        }
    }

    fn storage(recorder: Arc<Recorder>) -> Arc<Storage> {
        let allocator = ServiceAllocator::new(vec!["10.96.0.0/12".parse().unwrap()], 30000..=32767);
        Storage::new(
            Arc::new(MemoryStore::new()),
            allocator,
            1 << 20,
            vec![Arc::new(NoMallory)],
            vec![recorder],
        )
    }

    fn configmap(name: &str, data: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": "a"}, "data": {"k": data}})
    }

    /// Upstream's generic `Store` with its watch: every committed create, update and delete
    /// is one change with the object before and after and the store's revision; writes of
    /// other resources, and writes admission refused, tell nothing.
    #[tokio::test]
    async fn observers_are_told_each_committed_write_with_its_revision() {
        let recorder = Arc::new(Recorder::default());
        let storage = storage(recorder.clone());
        let ctx = WriteContext::server();
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}});
        create::create_object(&storage, &ctx, &NAMESPACES, None, ns)
            .await
            .unwrap();
        let created =
            create::create_object(&storage, &ctx, &CONFIG_MAPS, Some("a"), configmap("c", "1"))
                .await
                .unwrap();
        let key = ObjectKey::new(&CONFIG_MAPS, Some("a"), "c");
        let mut changed = created.clone();
        changed["data"]["k"] = json!("2");
        let updated = update::update_object(&storage, &ctx, key, None, changed)
            .await
            .unwrap();
        let mallory = WriteContext::new(UserInfo::new("mallory", ["dev"]), Query::new());
        let refused = create::create_object(
            &storage,
            &mallory,
            &CONFIG_MAPS,
            Some("a"),
            configmap("m", "1"),
        )
        .await
        .unwrap_err();
        assert_eq!(refused.code, 403);
        let options = delete::DeleteOptions::default();
        delete::delete_object(&storage, &ctx, key, options)
            .await
            .unwrap();
        let revision = |obj: &Value| -> u64 {
            obj["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        };
        let deleted_at = storage.store.current_revision().await.unwrap();
        let told = recorder.0.lock().clone();
        let cm = |old, new, rv| ("configmaps".to_owned(), "c".to_owned(), old, new, rv);
        assert_eq!(
            told,
            vec![
                cm(false, true, revision(&created)),
                cm(true, true, revision(&updated)),
                cm(true, false, deleted_at),
            ]
        );
    }
}
