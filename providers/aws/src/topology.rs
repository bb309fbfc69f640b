//! Network topology labels `topology.k8s.aws/network-node-layer-1..N` from EC2
//! DescribeInstanceTopology (upstream: `topology.go`).
//!
//! Only instances whose type matches `SupportedTopologyInstanceTypePattern` are asked about, up
//! to 100 instance IDs per call (upstream asks about every type and uses the pattern to decide
//! whether an answer is required). Answers are cached. The labels are best effort: a failed or
//! empty answer never fails the node's metadata, the labels are just left out. Upstream's rules
//! for remembering what does not work are kept (24 h for a region answering
//! `UnsupportedOperation` or `UnauthorizedOperation`, and for an instance EC2 gives no topology),
//! and any other failure is remembered for `AwsOptions::topology_failure_backoff` (5 min), so a failing API (moto answers
//! with a 500) costs one call of one attempt per period, not the SDK's retries on every sync.

use std::{collections::HashMap, time::Duration};

use aws_config::retry::RetryConfig;
use aws_sdk_ec2::types::Instance;
use regex_lite::Regex;
use tokio::time::Instant;

use crate::{
    Inner,
    client::{aws_error, error_code},
    config::DEFAULT_TOPOLOGY_INSTANCE_TYPE_PATTERN,
};

/// The prefix of the labels; layer `N` (from 1, nearest the root first) is
/// `topology.k8s.aws/network-node-layer-N`.
pub const NETWORK_NODE_LABEL_PREFIX: &str = "topology.k8s.aws/network-node-layer-";

/// Instance IDs per DescribeInstanceTopology call (the API's limit).
pub(crate) const TOPOLOGY_IDS_PER_CALL: usize = 100;
/// How long a topology answer is reused (it changes only when an instance is moved).
const TOPOLOGY_TTL: Duration = Duration::from_secs(600);
/// How long an unsupported region or an instance without topology is not asked about again
/// (upstream's `instanceTopologyManagerCacheTimeout`).
const UNSUPPORTED_TTL: Duration = Duration::from_secs(24 * 3600);

/// What is known of instance topologies.
#[derive(Default)]
struct State {
    /// Network nodes by instance ID, and when they were fetched.
    nodes: HashMap<String, (Vec<String>, Instant)>,
    /// Instances EC2 gave no topology, and when.
    without: HashMap<String, Instant>,
    /// When the region answered UnsupportedOperation or UnauthorizedOperation.
    unsupported_since: Option<Instant>,
    /// When the last other failure happened.
    failed_at: Option<Instant>,
}

/// The topology cache of a provider.
pub(crate) struct TopologyCache {
    /// Instance types asked about; `None` when the configured pattern does not compile.
    pattern: Option<Regex>,
    state: tokio::sync::Mutex<State>,
}

impl TopologyCache {
    /// A cache for the types matching `pattern` (upstream's default when `None`).
    pub(crate) fn new(pattern: Option<&str>) -> TopologyCache {
        let source = pattern.unwrap_or(DEFAULT_TOPOLOGY_INSTANCE_TYPE_PATTERN);
        let pattern = match Regex::new(source) {
            Ok(re) => Some(re),
            Err(err) => {
                tracing::warn!(
                    pattern = source,
                    %err,
                    "SupportedTopologyInstanceTypePattern does not compile; no topology labels"
                );
                None
            }
        };
        TopologyCache {
            pattern,
            state: tokio::sync::Mutex::default(),
        }
    }

    /// Whether instances of `instance_type` get topology labels.
    fn supports(&self, instance_type: &str) -> bool {
        !instance_type.is_empty()
            && self
                .pattern
                .as_ref()
                .is_some_and(|p| p.is_match(instance_type))
    }
}

/// The labels for `network_nodes`, layer 1 first.
pub(crate) fn labels(network_nodes: &[String]) -> impl Iterator<Item = (String, String)> + '_ {
    network_nodes.iter().enumerate().map(|(i, node)| {
        (
            format!("{NETWORK_NODE_LABEL_PREFIX}{}", i + 1),
            node.clone(),
        )
    })
}

impl Inner {
    /// The network nodes of those `instances` whose type supports a topology, by instance ID.
    /// Never fails: what cannot be learnt now is absent.
    pub(crate) async fn topologies(&self, instances: &[&Instance]) -> HashMap<String, Vec<String>> {
        let cache = &self.topology;
        let wanted: Vec<&str> = instances
            .iter()
            .filter(|i| cache.supports(i.instance_type().map(|t| t.as_str()).unwrap_or_default()))
            .filter_map(|i| i.instance_id())
            .collect();
        if wanted.is_empty() {
            return HashMap::new();
        }
        let mut state = cache.state.lock().await;
        let mut out = HashMap::new();
        let mut ask = Vec::new();
        for id in wanted {
            if let Some((nodes, at)) = state.nodes.get(id)
                && at.elapsed() < TOPOLOGY_TTL
            {
                out.insert(id.to_owned(), nodes.clone());
            } else if state
                .without
                .get(id)
                .is_none_or(|at| at.elapsed() >= UNSUPPORTED_TTL)
                && !ask.contains(&id)
            {
                ask.push(id);
            }
        }
        let region_off = state
            .unsupported_since
            .is_some_and(|at| at.elapsed() < UNSUPPORTED_TTL);
        let backoff = self.options.topology_failure_backoff;
        let backing_off = state.failed_at.is_some_and(|at| at.elapsed() < backoff);
        if ask.is_empty() || region_off || backing_off {
            return out;
        }
        let Ok(clients) = self.clients().await else {
            return out;
        };
        for chunk in ask.chunks(TOPOLOGY_IDS_PER_CALL) {
            let ids: Vec<String> = chunk.iter().map(|s| s.to_string()).collect();
            let mut answered = Vec::new();
            let mut failure = None;
            let mut next_token: Option<String> = None;
            loop {
                // One attempt: a failure is remembered below instead of retried on every sync.
                let resp = clients
                    .ec2
                    .describe_instance_topology()
                    .set_instance_ids(Some(ids.clone()))
                    .set_next_token(next_token.take())
                    .customize()
                    .config_override(
                        aws_sdk_ec2::config::Builder::default()
                            .retry_config(RetryConfig::standard().with_max_attempts(1)),
                    )
                    .send()
                    .await;
                match resp {
                    Ok(page) => {
                        answered.extend(page.instances().iter().cloned());
                        next_token = page
                            .next_token()
                            .filter(|t| !t.is_empty())
                            .map(str::to_owned);
                        if next_token.is_none() {
                            break;
                        }
                    }
                    Err(err) => {
                        failure = Some(err);
                        break;
                    }
                }
            }
            let now = Instant::now();
            if let Some(err) = failure {
                let code = error_code(&err).map(str::to_owned);
                let err = aws_error("ec2:DescribeInstanceTopology", err);
                match code.as_deref() {
                    Some("UnsupportedOperation" | "UnauthorizedOperation") => {
                        tracing::warn!(%err, "no network topology labels in this region for 24 h");
                        state.unsupported_since = Some(now);
                    }
                    _ => {
                        tracing::warn!(
                            %err,
                            backoff_secs = backoff.as_secs(),
                            "DescribeInstanceTopology failed; network topology labels left out"
                        );
                        state.failed_at = Some(now);
                    }
                }
                return out;
            }
            for topo in &answered {
                if let Some(id) = topo.instance_id() {
                    let nodes = topo.network_nodes().to_vec();
                    state.nodes.insert(id.to_owned(), (nodes.clone(), now));
                    out.insert(id.to_owned(), nodes);
                }
            }
            for id in chunk {
                if !answered.iter().any(|t| t.instance_id() == Some(*id)) {
                    tracing::info!(instance = *id, "EC2 lists no network topology");
                    state.without.insert((*id).to_owned(), now);
                }
            }
        }
        state.failed_at = None;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_default_pattern_selects_p_trn_and_hpc_types() {
        let cache = TopologyCache::new(None);
        for t in [
            "p4d.24xlarge",
            "p5.48xlarge",
            "trn1.32xlarge",
            "trn2u.48xlarge",
            "hpc7g.4xlarge",
        ] {
            assert!(cache.supports(t), "{t}");
        }
        for t in ["t3.large", "m5.xlarge", "", "gp4.large", "xp4d.24xlarge"] {
            assert!(!cache.supports(t), "{t}");
        }
        let custom = TopologyCache::new(Some("^t3\\."));
        assert!(custom.supports("t3.large"));
        assert!(!custom.supports("p4d.24xlarge"));
        assert!(!TopologyCache::new(Some("(")).supports("p4d.24xlarge"));
    }

    #[test]
    fn layers_are_numbered_from_one() {
        let nodes = vec!["nn-a".to_owned(), "nn-b".to_owned(), "nn-c".to_owned()];
        let got: Vec<(String, String)> = labels(&nodes).collect();
        assert_eq!(
            got,
            vec![
                (
                    "topology.k8s.aws/network-node-layer-1".into(),
                    "nn-a".into()
                ),
                (
                    "topology.k8s.aws/network-node-layer-2".into(),
                    "nn-b".into()
                ),
                (
                    "topology.k8s.aws/network-node-layer-3".into(),
                    "nn-c".into()
                ),
            ]
        );
    }
}
