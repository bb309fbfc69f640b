//! hello-cloud: a complete out-of-tree cloud provider. Config: one `name zone ip` per line.
use std::{collections::BTreeMap, sync::Arc};

use async_trait::async_trait;
use cloud_provider::{CloudConfig, CloudError, CloudProvider, CloudResult, InstanceMetadata};
use cloud_provider::{InstancesV2, node_address, register_cloud_provider};
use k8s_openapi::api::core::v1::Node;

/// A cloud whose instances are listed in its config file.
pub struct HelloCloud(BTreeMap<String, (String, String)>);

impl HelloCloud {
    /// Parses `name zone ip` lines; blank lines and `#` comments are skipped.
    pub fn from_config(text: &str) -> CloudResult<Self> {
        let mut instances = BTreeMap::new();
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().starts_with('#'))
        {
            match line.split_whitespace().collect::<Vec<_>>()[..] {
                [] => {}
                [name, zone, ip] if ip.parse::<std::net::IpAddr>().is_ok() => {
                    instances.insert(name.into(), (zone.into(), ip.into()));
                }
                _ => {
                    return Err(CloudError::message(format!(
                        "line {}: want `name zone ip`",
                        n + 1
                    )));
                }
            }
        }
        Ok(HelloCloud(instances))
    }

    fn find(&self, node: &Node) -> CloudResult<(&String, &(String, String))> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        self.0
            .get_key_value(name)
            .ok_or(CloudError::InstanceNotFound)
    }
}

#[async_trait]
impl InstancesV2 for HelloCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.find(node).is_ok())
    }
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.find(node).map(|_| false)
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let (name, (zone, ip)) = self.find(node)?;
        Ok(Some(
            InstanceMetadata::new(format!("hello://{name}"))
                .with_zone(zone, "hello-region")
                .with_addresses(vec![node_address("InternalIP", ip)]),
        ))
    }
}

impl CloudProvider for HelloCloud {
    fn provider_name(&self) -> &str {
        "hello"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}

fn new_hello_cloud(config: Option<&CloudConfig>) -> CloudResult<Arc<dyn CloudProvider>> {
    let text = config
        .map(CloudConfig::as_str)
        .transpose()?
        .unwrap_or_default();
    Ok(Arc::new(HelloCloud::from_config(text)?))
}

register_cloud_provider!("hello", new_hello_cloud);
