//! InstancesV2 over EC2: lookups by provider ID, `i-` node name or private DNS name, one
//! DescribeInstances per 1,000 instances for batches, coalesced single lookups, and a
//! short-lived cache shared with the load-balancer and route code.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, Instance};
use cloud_provider::{CloudError, CloudResult, InstanceMetadata, InstancesV2, ScheduledEvent};
use futures::{FutureExt, future::BoxFuture, future::Shared};
use k8s_openapi::api::core::v1::Node;
use tokio::time::Instant;

use crate::{
    AwsCloud, Inner, ZONE_ID_LABEL,
    client::{aws_error, error_code},
    ids::{self, Lifecycle},
    topology,
};

/// Instance IDs per DescribeInstances call.
pub(crate) const IDS_PER_CALL: usize = 1000;
/// Filter values per call (AWS allows 200).
const FILTER_VALUES_PER_CALL: usize = 150;
/// States in which a name lookup finds an instance (upstream's list).
const LIVE_STATES: [&str; 5] = ["pending", "running", "shutting-down", "stopping", "stopped"];

/// A cached lookup: the instance, or `None` when EC2 does not know it.
#[derive(Clone)]
pub(crate) struct Cached {
    pub(crate) instance: Option<Instance>,
    at: Instant,
}

type BatchOutput = Result<Arc<HashMap<String, Instance>>, Arc<CloudError>>;

/// A copy of an error shared by several callers, keeping its kind (throttling included, so the
/// shared limiter sees it in every caller) and retry delay.
pub(crate) fn copy_error(err: &CloudError) -> CloudError {
    match err {
        CloudError::RetryAfter {
            retry_after,
            message,
        } => CloudError::retry_after(*retry_after, message.clone()),
        CloudError::Throttled {
            retry_after,
            message,
        } => CloudError::throttled(*retry_after, message.clone()),
        CloudError::InstanceNotFound => CloudError::InstanceNotFound,
        other if other.is_throttled() => {
            CloudError::throttled(other.retry_after_delay(), other.to_string())
        }
        other => match other.retry_after_delay() {
            Some(delay) => CloudError::retry_after(delay, other.to_string()),
            None => CloudError::message(other.to_string()),
        },
    }
}

/// Single lookups waiting to be sent together.
pub(crate) struct PendingBatch {
    generation: u64,
    ids: Arc<parking_lot::Mutex<Vec<String>>>,
    result: Shared<BoxFuture<'static, BatchOutput>>,
}

/// The shared instance state of a provider.
#[derive(Default)]
pub(crate) struct InstanceState {
    pub(crate) cache: parking_lot::Mutex<HashMap<String, Cached>>,
    pub(crate) pending: parking_lot::Mutex<Option<PendingBatch>>,
    generation: std::sync::atomic::AtomicU64,
    /// Node names seen for instance IDs, so routes and backends name Nodes as the cluster does.
    pub(crate) node_names: parking_lot::Mutex<HashMap<String, String>>,
}

/// How a Node is found in EC2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeKey {
    /// By instance ID (provider ID or `i-` node name).
    Id(String),
    /// By private DNS name (the node name).
    Dns(String),
}

/// How to find `node`: its provider ID, else an `i-` name, else its name as a private DNS name.
pub(crate) fn node_key(node: &Node) -> CloudResult<NodeKey> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if let Some(pid) = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|p| !p.is_empty())
    {
        return ids::instance_id_from_provider_id(pid)
            .map(NodeKey::Id)
            .ok_or_else(|| {
                CloudError::message(format!(
                    "node {name}: provider ID {pid:?} does not name an EC2 instance \
                     (expected aws:///<zone>/i-…)"
                ))
            });
    }
    if let Some(id) = ids::instance_id_from_node_name(name) {
        return Ok(NodeKey::Id(id));
    }
    if name.is_empty() {
        return Err(CloudError::message(
            "node has neither a provider ID nor a name",
        ));
    }
    Ok(NodeKey::Dns(name.to_owned()))
}

/// The availability zone of an instance (empty when EC2 gives none).
fn zone_of(instance: &Instance) -> &str {
    instance
        .placement()
        .and_then(|p| p.availability_zone())
        .unwrap_or_default()
}

impl Inner {
    /// Looks up instances by ID: one DescribeInstances per 1,000 IDs. IDs EC2 does not know are
    /// absent from the map (and remembered as unknown in the cache).
    pub(crate) async fn describe_ids(
        &self,
        ids: &[String],
    ) -> CloudResult<HashMap<String, Instance>> {
        let mut unique: Vec<String> = Vec::with_capacity(ids.len());
        let mut seen = HashSet::new();
        for id in ids {
            // Duplicate IDs break DescribeInstances (moto answers 500); send each once.
            if seen.insert(id.as_str()) {
                unique.push(id.clone());
            }
        }
        let clients = self.clients().await?;
        let mut found = HashMap::new();
        for chunk in unique.chunks(IDS_PER_CALL) {
            let resp = clients
                .ec2
                .describe_instances()
                .set_instance_ids(Some(chunk.to_vec()))
                .send()
                .await;
            let instances: Vec<Instance> = match resp {
                Ok(out) => out
                    .reservations()
                    .iter()
                    .flat_map(|r| r.instances().iter().cloned())
                    .collect(),
                Err(err)
                    if error_code(&err).is_some_and(|c| {
                        c == "InvalidInstanceID.NotFound" || c == "InvalidInstanceID.Malformed"
                    }) =>
                {
                    // One unknown ID fails the whole call; the filter form skips unknown IDs.
                    self.describe_filtered("instance-id", chunk, false).await?
                }
                Err(err) => return Err(aws_error("ec2:DescribeInstances", err)),
            };
            for instance in instances {
                if let Some(id) = instance.instance_id() {
                    found.insert(id.to_owned(), instance.clone());
                }
            }
        }
        let now = Instant::now();
        let mut cache = self.instances.cache.lock();
        for id in &unique {
            cache.insert(
                id.clone(),
                Cached {
                    instance: found.get(id).cloned(),
                    at: now,
                },
            );
        }
        Ok(found)
    }

    /// DescribeInstances with a filter over `values`, paged, at most 150 values per call.
    pub(crate) async fn describe_filtered(
        &self,
        filter: &str,
        values: &[String],
        live_only: bool,
    ) -> CloudResult<Vec<Instance>> {
        let clients = self.clients().await?;
        let mut out = Vec::new();
        for chunk in values.chunks(FILTER_VALUES_PER_CALL) {
            let mut req = clients.ec2.describe_instances().filters(
                Filter::builder()
                    .name(filter)
                    .set_values(Some(chunk.to_vec()))
                    .build(),
            );
            if live_only {
                req = req.filters(
                    Filter::builder()
                        .name("instance-state-name")
                        .set_values(Some(LIVE_STATES.iter().map(|s| s.to_string()).collect()))
                        .build(),
                );
            }
            let mut pages = req.max_results(1000).into_paginator().send();
            while let Some(page) = pages.next().await {
                let page = page.map_err(|e| aws_error("ec2:DescribeInstances", e))?;
                for r in page.reservations() {
                    out.extend(r.instances().iter().cloned());
                }
            }
        }
        Ok(out)
    }

    /// Instances by ID, from the cache when fresh, else one batched DescribeInstances.
    pub(crate) async fn cached_instances(
        &self,
        ids: &[String],
    ) -> CloudResult<HashMap<String, Instance>> {
        let ttl = self.options.instance_cache_ttl;
        let mut found = HashMap::new();
        let mut missing = Vec::new();
        {
            let cache = self.instances.cache.lock();
            for id in ids {
                match cache.get(id) {
                    Some(c) if c.at.elapsed() < ttl => {
                        if let Some(i) = &c.instance {
                            found.insert(id.clone(), i.clone());
                        }
                    }
                    _ => missing.push(id.clone()),
                }
            }
        }
        if !missing.is_empty() {
            found.extend(self.describe_ids(&missing).await?);
        }
        Ok(found)
    }

    /// One instance by ID, joining other lookups that arrive within the coalescing window into
    /// one DescribeInstances. `None` if EC2 does not know it.
    pub(crate) async fn lookup_one(self: &Arc<Self>, id: &str) -> CloudResult<Option<Instance>> {
        let result = {
            let mut pending = self.instances.pending.lock();
            match pending.as_ref() {
                Some(batch) if batch.ids.lock().len() < IDS_PER_CALL => {
                    batch.ids.lock().push(id.to_owned());
                    batch.result.clone()
                }
                _ => {
                    let generation = self
                        .instances
                        .generation
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let ids = Arc::new(parking_lot::Mutex::new(vec![id.to_owned()]));
                    let inner = self.clone();
                    let batch_ids = ids.clone();
                    let fut: BoxFuture<'static, BatchOutput> = async move {
                        tokio::time::sleep(inner.options.coalesce_window).await;
                        {
                            let mut pending = inner.instances.pending.lock();
                            if pending.as_ref().is_some_and(|b| b.generation == generation) {
                                *pending = None;
                            }
                        }
                        let ids = batch_ids.lock().clone();
                        inner
                            .describe_ids(&ids)
                            .await
                            .map(Arc::new)
                            .map_err(Arc::new)
                    }
                    .boxed();
                    let result = fut.shared();
                    *pending = Some(PendingBatch {
                        generation,
                        ids,
                        result: result.clone(),
                    });
                    result
                }
            }
        };
        match result.await {
            Ok(map) => Ok(map.get(id).cloned()),
            Err(err) => Err(copy_error(&err)),
        }
    }

    /// The instance behind a Node, or `None` if there is none (terminated counts as none).
    pub(crate) async fn instance_for_node(
        self: &Arc<Self>,
        node: &Node,
    ) -> CloudResult<Option<Instance>> {
        let key = node_key(node)?;
        let instance = match &key {
            NodeKey::Id(id) => self.lookup_one(id).await?,
            NodeKey::Dns(name) => {
                let mut found = self.by_dns_names(std::slice::from_ref(name)).await?;
                found.remove(name)
            }
        };
        let instance = instance.filter(|i| ids::lifecycle(i) != Lifecycle::Gone);
        if let (Some(i), Some(name)) = (&instance, node.metadata.name.as_deref()) {
            self.remember_node_name(i, name);
        }
        Ok(instance)
    }

    /// Instances by private DNS name (live states, cluster-tagged when a cluster ID is set).
    /// More than one instance for a name is an error.
    pub(crate) async fn by_dns_names(
        &self,
        names: &[String],
    ) -> CloudResult<HashMap<String, Instance>> {
        let found = self
            .describe_filtered("private-dns-name", names, true)
            .await?;
        let mut out: HashMap<String, Instance> = HashMap::new();
        for instance in found {
            if !self.has_cluster_tag(instance.tags()) {
                continue;
            }
            let Some(dns) = instance.private_dns_name().map(str::to_owned) else {
                continue;
            };
            if let Some(prev) = out.get(&dns) {
                return Err(CloudError::message(format!(
                    "found multiple instances with private DNS name {dns}: {} and {}",
                    prev.instance_id().unwrap_or_default(),
                    instance.instance_id().unwrap_or_default()
                )));
            }
            if let Some(id) = instance.instance_id() {
                self.instances.cache.lock().insert(
                    id.to_owned(),
                    Cached {
                        instance: Some(instance.clone()),
                        at: Instant::now(),
                    },
                );
            }
            out.insert(dns, instance);
        }
        Ok(out)
    }

    pub(crate) fn remember_node_name(&self, instance: &Instance, node_name: &str) {
        if let Some(id) = instance.instance_id() {
            self.instances
                .node_names
                .lock()
                .insert(id.to_owned(), node_name.to_owned());
        }
    }

    /// Node names by instance ID, from the cluster's Nodes (their provider IDs, else `i-`
    /// names), as upstream's provider-ID index: deterministic, and the same after a restart.
    /// `None` when the provider was not initialized with a cluster.
    pub(crate) async fn cluster_node_names(&self) -> CloudResult<Option<HashMap<String, String>>> {
        let Some(client) = self.cluster.get() else {
            return Ok(None);
        };
        let nodes = kube::Api::<Node>::all(client.clone())
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| CloudError::context("listing the cluster's Nodes", e))?;
        let mut out = HashMap::new();
        for node in nodes {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            if let Ok(NodeKey::Id(id)) = node_key(&node) {
                out.insert(id, name);
            }
        }
        Ok(Some(out))
    }

    /// The Node name of an instance: from the cluster's Nodes when `index` is given (else, for
    /// a provider used without a cluster, the name last seen for it); failing that its private
    /// DNS name (upstream's default naming), else its ID.
    pub(crate) fn node_name_of(
        &self,
        instance_id: &str,
        instance: Option<&Instance>,
        index: Option<&HashMap<String, String>>,
    ) -> String {
        let known = match index {
            Some(index) => index.get(instance_id).cloned(),
            None => self.instances.node_names.lock().get(instance_id).cloned(),
        };
        if let Some(name) = known {
            return name;
        }
        instance
            .and_then(|i| i.private_dns_name())
            .filter(|d| !d.is_empty())
            .map(str::to_owned)
            .unwrap_or_else(|| instance_id.to_owned())
    }

    /// The metadata of `instance`, with the `topology.k8s.aws/zone-id` label when `zone_ids`
    /// knows its zone and the network topology labels when `topologies` has its network nodes.
    pub(crate) fn metadata_of(
        &self,
        instance: &Instance,
        region: &str,
        zone_ids: &HashMap<String, String>,
        topologies: &HashMap<String, Vec<String>>,
    ) -> InstanceMetadata {
        let zone = zone_of(instance);
        let id = instance.instance_id().unwrap_or_default();
        let mut meta = InstanceMetadata::new(ids::provider_id(zone, id))
            .with_instance_type(
                instance
                    .instance_type()
                    .map(|t| t.as_str().to_owned())
                    .unwrap_or_default(),
            )
            .with_zone(zone, region)
            .with_addresses(ids::node_addresses(instance, &self.config.node_ip_families));
        if let Some(zone_id) = zone_ids.get(zone) {
            meta = meta.with_label(ZONE_ID_LABEL, zone_id.clone());
        }
        for (key, value) in topologies
            .get(id)
            .map(Vec::as_slice)
            .into_iter()
            .flat_map(topology::labels)
        {
            meta = meta.with_label(key, value);
        }
        meta
    }
}

#[async_trait]
impl InstancesV2 for AwsCloud {
    #[tracing::instrument(skip_all, fields(node = node.metadata.name.as_deref().unwrap_or_default()))]
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.inner.instance_for_node(node).await?.is_some())
    }

    #[tracing::instrument(skip_all, fields(node = node.metadata.name.as_deref().unwrap_or_default()))]
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        Ok(self
            .inner
            .instance_for_node(node)
            .await?
            .is_some_and(|i| ids::lifecycle(&i) == Lifecycle::Stopped))
    }

    #[tracing::instrument(skip_all, fields(node = node.metadata.name.as_deref().unwrap_or_default()))]
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let region = self.inner.clients().await?.region.clone();
        match self.inner.instance_for_node(node).await? {
            Some(instance) => {
                let zone_ids = self.inner.zone_ids(&[zone_of(&instance)]).await?;
                let topologies = self.inner.topologies(&[&instance]).await;
                Ok(Some(self.inner.metadata_of(
                    &instance,
                    &region,
                    &zone_ids,
                    &topologies,
                )))
            }
            None => Err(CloudError::InstanceNotFound),
        }
    }

    #[tracing::instrument(skip_all, fields(nodes = nodes.len()))]
    async fn instance_metadata_batch(
        &self,
        nodes: &[&Node],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        let inner = &self.inner;
        let keys: Vec<CloudResult<NodeKey>> = nodes.iter().map(|n| node_key(n)).collect();
        let region = match inner.clients().await {
            Ok(c) => c.region.clone(),
            Err(e) => return nodes.iter().map(|_| Err(copy_error(&e))).collect(),
        };
        let id_list: Vec<String> = keys
            .iter()
            .filter_map(|k| match k {
                Ok(NodeKey::Id(id)) => Some(id.clone()),
                _ => None,
            })
            .collect();
        let dns_list: Vec<String> = keys
            .iter()
            .filter_map(|k| match k {
                Ok(NodeKey::Dns(n)) => Some(n.clone()),
                _ => None,
            })
            .collect();
        let by_id = if id_list.is_empty() {
            Ok(HashMap::new())
        } else {
            inner.describe_ids(&id_list).await
        };
        let by_dns = if dns_list.is_empty() {
            Ok(HashMap::new())
        } else {
            inner.by_dns_names(&dns_list).await
        };
        let zones: HashSet<&str> = by_id
            .iter()
            .chain(by_dns.iter())
            .flat_map(|m| m.values().map(zone_of))
            .collect();
        let zone_ids = inner.zone_ids(&zones.into_iter().collect::<Vec<_>>()).await;
        let live: Vec<&Instance> = by_id
            .iter()
            .chain(by_dns.iter())
            .flat_map(|m| m.values())
            .filter(|i| ids::lifecycle(i) != Lifecycle::Gone)
            .collect();
        let topologies = inner.topologies(&live).await;
        nodes
            .iter()
            .zip(keys)
            .map(|(node, key)| {
                let found = match key? {
                    NodeKey::Id(id) => by_id.as_ref().map_err(copy_error)?.get(&id).cloned(),
                    NodeKey::Dns(name) => by_dns.as_ref().map_err(copy_error)?.get(&name).cloned(),
                };
                match found.filter(|i| ids::lifecycle(i) != Lifecycle::Gone) {
                    Some(instance) => {
                        if let Some(name) = node.metadata.name.as_deref() {
                            inner.remember_node_name(&instance, name);
                        }
                        let zone_ids = zone_ids.as_ref().map_err(copy_error)?;
                        Ok(Some(inner.metadata_of(
                            &instance,
                            &region,
                            zone_ids,
                            &topologies,
                        )))
                    }
                    None => Err(CloudError::InstanceNotFound),
                }
            })
            .collect()
    }

    /// Beyond upstream: EC2's scheduled instance events (DescribeInstanceStatus).
    #[tracing::instrument(skip_all)]
    async fn scheduled_events(&self) -> CloudResult<Vec<ScheduledEvent>> {
        self.inner.scheduled_events().await
    }
}
