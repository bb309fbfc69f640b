//! Beyond upstream: several cloud controller managers in one cluster (the shape of the
//! provisional KEP-5778). Each ccm owns the Nodes of its platforms and acts only on them:
//! initialization, address refresh, deletion, the shutdown taint, maintenance, routes and
//! load-balancer backends. It never deletes a Node it does not own, and counts every skip in
//! `cloudprovider_node_ownership_skipped_total{controller}`.
//!
//! A Node's platform is its `cloudprovider.kubernetes.io/platform` annotation, else the scheme
//! of its `spec.providerID` (`aws` for `aws:///us-east-1a/i-…`). A ccm's platforms are
//! `--cloud-provider-platforms`, else the provider's
//! [`supported_platforms`](cloud_provider::CloudProvider::supported_platforms); when neither
//! names any, the ccm owns every Node, as upstream's does. With platforms, a Node whose platform
//! is unknown (no annotation, no provider ID yet) belongs to no ccm: it must carry the
//! annotation (or the kubelet's `--provider-id`) to be initialized.

use std::{collections::BTreeSet, sync::Arc};

use k8s_openapi::api::core::v1::Node;
use prometheus_client::metrics::{counter::Counter, family::Family};

/// The Node annotation that names its platform.
pub const PLATFORM_ANNOTATION: &str = "cloudprovider.kubernetes.io/platform";

/// The skip counter, by controller.
pub(crate) type SkipCounter = Family<[(&'static str, &'static str); 1], Counter>;

/// Which Nodes this ccm owns. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct NodeOwnership {
    /// `None`: every Node (upstream's behaviour).
    platforms: Option<Arc<BTreeSet<String>>>,
}

impl NodeOwnership {
    /// Owns every Node (upstream's behaviour, and the default).
    pub fn all() -> Self {
        NodeOwnership { platforms: None }
    }

    /// Owns the Nodes of `platforms`; an empty list owns every Node.
    pub fn of<I, S>(platforms: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let set: BTreeSet<String> = platforms
            .into_iter()
            .map(Into::into)
            .filter(|p| !p.is_empty())
            .collect();
        NodeOwnership {
            platforms: (!set.is_empty()).then(|| Arc::new(set)),
        }
    }

    /// The platforms owned, or `None` for every Node.
    pub fn platforms(&self) -> Option<&BTreeSet<String>> {
        self.platforms.as_deref()
    }

    /// Whether this ccm owns `node`.
    pub fn owns(&self, node: &Node) -> bool {
        match &self.platforms {
            None => true,
            Some(platforms) => platform_of(node).is_some_and(|p| platforms.contains(p)),
        }
    }
}

/// A Node's platform: its [`PLATFORM_ANNOTATION`], else its provider ID's scheme.
pub fn platform_of(node: &Node) -> Option<&str> {
    if let Some(platform) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PLATFORM_ANNOTATION))
        .filter(|p| !p.is_empty())
    {
        return Some(platform);
    }
    let provider_id = node.spec.as_ref()?.provider_id.as_deref()?;
    provider_id
        .split_once("://")
        .map(|(scheme, _)| scheme)
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(annotation: Option<&str>, provider_id: Option<&str>) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("n".into());
        if let Some(a) = annotation {
            node.metadata.annotations =
                Some([(PLATFORM_ANNOTATION.to_owned(), a.to_owned())].into());
        }
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: provider_id.map(str::to_owned),
            ..Default::default()
        });
        node
    }

    #[test]
    fn the_annotation_names_the_platform_before_the_provider_id() {
        assert_eq!(
            platform_of(&node(Some("onprem"), Some("aws:///z/i-1"))),
            Some("onprem")
        );
        assert_eq!(platform_of(&node(None, Some("aws:///z/i-1"))), Some("aws"));
        assert_eq!(
            platform_of(&node(Some(""), Some("fake://i-1"))),
            Some("fake")
        );
        assert_eq!(platform_of(&node(None, Some("i-1"))), None);
        assert_eq!(platform_of(&node(None, None)), None);
    }

    #[test]
    fn without_platforms_every_node_is_owned() {
        let all = NodeOwnership::of(Vec::<String>::new());
        assert!(all.platforms().is_none());
        assert!(all.owns(&node(None, None)));
        assert!(all.owns(&node(Some("other"), Some("other://x"))));
    }

    #[test]
    fn with_platforms_only_their_nodes_are_owned() {
        let aws = NodeOwnership::of(["aws"]);
        assert!(aws.owns(&node(None, Some("aws:///z/i-1"))));
        assert!(aws.owns(&node(Some("aws"), None)));
        assert!(!aws.owns(&node(Some("onprem"), Some("aws:///z/i-1"))));
        assert!(!aws.owns(&node(None, Some("fake://i-1"))));
        // Unknown platform: owned by no ccm that names platforms.
        assert!(!aws.owns(&node(None, None)));
    }
}
