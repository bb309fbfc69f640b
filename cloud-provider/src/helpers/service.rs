//! Service helpers for load-balancer providers, with upstream's rules
//! (`k8s.io/cloud-provider/service/helpers`).

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service};

use super::parse_cidr_sloppy;
use crate::well_known::{ANNOTATION_LOAD_BALANCER_SOURCE_RANGES, FINALIZER_LOAD_BALANCER_CLEANUP};

/// The source ranges used when a Service names none: everything, IPv4 only (as upstream).
pub const DEFAULT_LOAD_BALANCER_SOURCE_RANGES: &str = "0.0.0.0/0";

/// The health-check path for Services with `externalTrafficPolicy: Local`.
pub const HEALTH_CHECK_PATH: &str = "/healthz";

/// A source range that is not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {value:?} is not valid. Expecting a list of IP ranges. For example, 10.0.0.0/24")]
pub struct SourceRangeError {
    /// Where the range came from: `spec.loadBalancerSourceRanges` or the annotation.
    pub field: &'static str,
    /// The value that did not parse.
    pub value: String,
}

/// The client CIDRs allowed to reach the Service's load balancer: `spec.loadBalancerSourceRanges`
/// if non-empty, else the `service.beta.kubernetes.io/load-balancer-source-ranges` annotation
/// (comma-separated), else `0.0.0.0/0`. Spaces around each range are ignored.
///
/// ```
/// use cloud_provider::helpers::service::load_balancer_source_ranges;
/// use k8s_openapi::api::core::v1::{Service, ServiceSpec};
///
/// let mut svc = Service::default();
/// assert_eq!(load_balancer_source_ranges(&svc).unwrap()[0].to_string(), "0.0.0.0/0");
/// svc.spec = Some(ServiceSpec {
///     load_balancer_source_ranges: Some(vec!["10.1.2.3/16".into()]),
///     ..Default::default()
/// });
/// assert_eq!(load_balancer_source_ranges(&svc).unwrap()[0].to_string(), "10.1.0.0/16");
/// ```
pub fn load_balancer_source_ranges(service: &Service) -> Result<Vec<IpNet>, SourceRangeError> {
    let from_spec = service
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_source_ranges.as_ref())
        .filter(|ranges| !ranges.is_empty());
    let (field, ranges): (&'static str, Vec<&str>) = match from_spec {
        Some(ranges) => (
            "spec.loadBalancerSourceRanges",
            ranges.iter().map(String::as_str).collect(),
        ),
        None => {
            let annotation = service
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_LOAD_BALANCER_SOURCE_RANGES))
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
                .unwrap_or(DEFAULT_LOAD_BALANCER_SOURCE_RANGES);
            (
                "metadata.annotations[service.beta.kubernetes.io/load-balancer-source-ranges]",
                annotation.split(',').collect(),
            )
        }
    };
    ranges
        .into_iter()
        .map(|range| {
            parse_cidr_sloppy(range.trim()).ok_or_else(|| SourceRangeError {
                field,
                value: range.to_owned(),
            })
        })
        .collect()
}

/// Whether the ranges allow every IPv4 client (contain `0.0.0.0/0`).
pub fn is_allow_all(ranges: &[IpNet]) -> bool {
    ranges
        .iter()
        .any(|r| r.prefix_len() == 0 && matches!(r, IpNet::V4(_)))
}

fn spec_type(service: &Service) -> Option<&str> {
    service.spec.as_ref().and_then(|s| s.type_.as_deref())
}

/// Whether the Service is `type: LoadBalancer` with no `loadBalancerClass`: the service
/// controller handles exactly these. Any class means another controller owns it.
pub fn wants_load_balancer(service: &Service) -> bool {
    spec_type(service) == Some("LoadBalancer")
        && service
            .spec
            .as_ref()
            .is_none_or(|s| s.load_balancer_class.is_none())
}

/// Whether the Service is LoadBalancer or NodePort with `externalTrafficPolicy: Local`.
pub fn requests_only_local_traffic(service: &Service) -> bool {
    matches!(spec_type(service), Some("LoadBalancer" | "NodePort"))
        && service
            .spec
            .as_ref()
            .and_then(|s| s.external_traffic_policy.as_deref())
            == Some("Local")
}

/// Whether the load balancer needs a health check on the health-check node port: a
/// LoadBalancer Service with `externalTrafficPolicy: Local`.
pub fn needs_health_check(service: &Service) -> bool {
    spec_type(service) == Some("LoadBalancer") && requests_only_local_traffic(service)
}

/// The health-check path and node port (`/healthz`, `spec.healthCheckNodePort`) when the
/// Service needs a health check and has a port; `None` otherwise.
pub fn health_check_path_port(service: &Service) -> Option<(&'static str, i32)> {
    if !needs_health_check(service) {
        return None;
    }
    let port = service.spec.as_ref()?.health_check_node_port?;
    (port != 0).then_some((HEALTH_CHECK_PATH, port))
}

/// Whether the Service carries the load-balancer cleanup finalizer.
pub fn has_load_balancer_finalizer(service: &Service) -> bool {
    service
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP))
}

/// Whether two load-balancer statuses have the same ingress list, in the same order.
pub fn load_balancer_status_equal(a: &LoadBalancerStatus, b: &LoadBalancerStatus) -> bool {
    a.ingress.as_deref().unwrap_or_default() == b.ingress.as_deref().unwrap_or_default()
}

/// Upstream's default load-balancer name: `"a"` followed by the Service UID without dashes,
/// cut to 32 characters (GCE needs a leading letter, AWS at most 32 bytes).
///
/// ```
/// use cloud_provider::helpers::service::default_load_balancer_name;
/// use k8s_openapi::api::core::v1::Service;
///
/// let mut svc = Service::default();
/// svc.metadata.uid = Some("8f1c2b7e-3d4a-4c5b-9e6f-0a1b2c3d4e5f".into());
/// assert_eq!(default_load_balancer_name(&svc), "a8f1c2b7e3d4a4c5b9e6f0a1b2c3d4e5");
/// ```
pub fn default_load_balancer_name(service: &Service) -> String {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    let mut name: String = std::iter::once('a')
        .chain(uid.chars().filter(|c| *c != '-'))
        .collect();
    // UIDs are ASCII; cut on a char boundary all the same.
    if let Some((idx, _)) = name.char_indices().nth(32) {
        name.truncate(idx);
    }
    name
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{LoadBalancerIngress, ServiceSpec};

    use super::*;

    fn svc(type_: &str, etp: Option<&str>, hcnp: Option<i32>) -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                external_traffic_policy: etp.map(Into::into),
                health_check_node_port: hcnp,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn source_ranges_from_annotation_with_spaces() {
        let mut s = svc("LoadBalancer", None, None);
        s.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_LOAD_BALANCER_SOURCE_RANGES.to_owned(),
            " 10.0.0.0/8 , 192.168.1.1/24 ".to_owned(),
        )]));
        let got: Vec<String> = load_balancer_source_ranges(&s)
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, ["10.0.0.0/8", "192.168.1.0/24"]);
        assert!(!is_allow_all(&load_balancer_source_ranges(&s).unwrap()));
    }

    #[test]
    fn spec_wins_over_annotation_and_bad_ranges_error() {
        let mut s = svc("LoadBalancer", None, None);
        s.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_LOAD_BALANCER_SOURCE_RANGES.to_owned(),
            "10.0.0.0/8".to_owned(),
        )]));
        s.spec.as_mut().unwrap().load_balancer_source_ranges =
            Some(vec!["fd00::/64".into(), "nonsense".into()]);
        let err = load_balancer_source_ranges(&s).unwrap_err();
        assert_eq!(err.field, "spec.loadBalancerSourceRanges");
        assert_eq!(err.value, "nonsense");
    }

    #[test]
    fn default_is_ipv4_allow_all() {
        let ranges = load_balancer_source_ranges(&svc("LoadBalancer", None, None)).unwrap();
        assert!(is_allow_all(&ranges));
        assert!(!is_allow_all(&["::/0".parse().unwrap()]));
    }

    #[test]
    fn local_traffic_and_health_check() {
        assert!(requests_only_local_traffic(&svc(
            "NodePort",
            Some("Local"),
            None
        )));
        assert!(!needs_health_check(&svc(
            "NodePort",
            Some("Local"),
            Some(30000)
        )));
        assert!(!requests_only_local_traffic(&svc(
            "ClusterIP",
            Some("Local"),
            None
        )));
        assert_eq!(
            health_check_path_port(&svc("LoadBalancer", Some("Local"), Some(31000))),
            Some(("/healthz", 31000))
        );
        assert_eq!(
            health_check_path_port(&svc("LoadBalancer", Some("Local"), Some(0))),
            None
        );
        assert_eq!(
            health_check_path_port(&svc("LoadBalancer", Some("Cluster"), Some(31000))),
            None
        );
    }

    // Upstream `k8s.io/cloud-provider/controllers/service/controller.go` `wantsLoadBalancer`:
    // a LoadBalancer with no class is ours; any class is not.
    #[test]
    fn only_load_balancer_services_without_a_class_want_a_load_balancer() {
        assert!(wants_load_balancer(&svc("LoadBalancer", None, None)));
        assert!(!wants_load_balancer(&svc("NodePort", None, None)));
        let mut classed = svc("LoadBalancer", None, None);
        classed.spec.as_mut().unwrap().load_balancer_class = Some("example.com/lb".into());
        assert!(!wants_load_balancer(&classed));
    }

    // Upstream `k8s.io/cloud-provider/service/helpers/helper.go` `LoadBalancerStatusEqual`:
    // ingress compared in order.
    #[test]
    fn load_balancer_status_equality_compares_ingress_in_order() {
        let ing = |ip: &str| LoadBalancerIngress {
            ip: Some(ip.into()),
            ..Default::default()
        };
        let a = LoadBalancerStatus {
            ingress: Some(vec![ing("1.1.1.1"), ing("2.2.2.2")]),
        };
        let b = LoadBalancerStatus {
            ingress: Some(vec![ing("2.2.2.2"), ing("1.1.1.1")]),
        };
        assert!(load_balancer_status_equal(&a, &a.clone()));
        assert!(!load_balancer_status_equal(&a, &b));
        assert!(load_balancer_status_equal(
            &LoadBalancerStatus::default(),
            &LoadBalancerStatus {
                ingress: Some(vec![]),
            }
        ));
    }

    // Upstream `k8s.io/cloud-provider/cloud.go` `DefaultLoadBalancerName`: "a" + UID without
    // dashes, at most 32 characters.
    #[test]
    fn the_default_load_balancer_name_is_a_and_the_uid_without_dashes_cut_to_32() {
        let mut s = Service::default();
        s.metadata.uid = Some("12345678-1234-1234-1234-123456789012".into());
        let name = default_load_balancer_name(&s);
        assert_eq!(name, "a1234567812341234123412345678901");
        assert_eq!(name.len(), 32);
        s.metadata.uid = Some("ab-c".into());
        assert_eq!(default_load_balancer_name(&s), "aabc");
    }

    #[test]
    fn finalizer_detection() {
        let mut s = svc("LoadBalancer", None, None);
        assert!(!has_load_balancer_finalizer(&s));
        s.metadata.finalizers = Some(vec![FINALIZER_LOAD_BALANCER_CLEANUP.into()]);
        assert!(has_load_balancer_finalizer(&s));
    }
}
