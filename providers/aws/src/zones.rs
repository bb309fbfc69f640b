//! Availability-zone IDs (`use1-az1`…) for the `topology.k8s.aws/zone-id` label, from one
//! DescribeAvailabilityZones per region, cached; a zone the cache does not know triggers a
//! refresh, at most once a minute (upstream: `zones.go`).

use std::{collections::HashMap, time::Duration};

use cloud_provider::{CloudError, CloudResult};
use tokio::time::Instant;

use crate::{Inner, client::aws_error};

/// The label upstream's provider sets to the instance's availability-zone ID.
pub const ZONE_ID_LABEL: &str = "topology.k8s.aws/zone-id";

/// The shortest time between two refreshes caused by an unknown zone.
const REFRESH_INTERVAL: Duration = Duration::from_secs(60);

/// Zone name to zone ID, and when it was last filled.
#[derive(Default)]
pub(crate) struct ZoneCache {
    state: tokio::sync::Mutex<(HashMap<String, String>, Option<Instant>)>,
}

impl Inner {
    /// The IDs of `zones` (zone name to zone ID). Unknown zones are an error naming them.
    pub(crate) async fn zone_ids(&self, zones: &[&str]) -> CloudResult<HashMap<String, String>> {
        let mut state = self.zones.state.lock().await;
        let missing = |map: &HashMap<String, String>| {
            zones
                .iter()
                .filter(|z| !z.is_empty() && !map.contains_key(**z))
                .map(|z| z.to_string())
                .collect::<Vec<_>>()
        };
        let stale = state.1.is_none_or(|at| at.elapsed() >= REFRESH_INTERVAL);
        if !missing(&state.0).is_empty() && stale {
            let clients = self.clients().await?;
            let out = clients
                .ec2
                .describe_availability_zones()
                .send()
                .await
                .map_err(|e| aws_error("ec2:DescribeAvailabilityZones", e))?;
            for z in out.availability_zones() {
                if let (Some(name), Some(id)) = (z.zone_name(), z.zone_id()) {
                    state.0.insert(name.to_owned(), id.to_owned());
                }
            }
            state.1 = Some(Instant::now());
        }
        let unknown = missing(&state.0);
        if !unknown.is_empty() {
            return Err(CloudError::retry_after(
                REFRESH_INTERVAL,
                format!(
                    "DescribeAvailabilityZones in region {} does not know zone(s) {}",
                    self.clients().await?.region,
                    unknown.join(", ")
                ),
            ));
        }
        Ok(zones
            .iter()
            .filter_map(|z| state.0.get(*z).map(|id| (z.to_string(), id.clone())))
            .collect())
    }
}
