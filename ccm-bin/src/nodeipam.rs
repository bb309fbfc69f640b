//! The `nodeipam` controller of the ccm, as upstream's sample `main`
//! (`k8s.io/cloud-provider/sample/nodeipamcontroller.go` `startNodeIpamController`) adds it:
//! off unless named in `--controllers`, idle unless `--allocate-node-cidrs`, and then a range
//! allocator over `--cluster-cidr` (one CIDR, or one per IP family) that gives each Node
//! `spec.podCIDRs` of `--node-cidr-mask-size[-ipv4|-ipv6]`, never inside
//! `--service-cluster-ip-range`. The allocator is core-cluster's
//! [`NodeIpamController`], a kube-rs client like every other controller.

use std::sync::OnceLock;

use cloud_provider::BoxError;
use cloud_provider_app::{
    CloudControllerManagerOptions, ControllerFuture, ControllerRegistry,
    controllers::ControllerContext,
};
use core_cluster::controllers::node_ipam::{NodeIpamConfig, NodeIpamController};
use ipnet::IpNet;

/// The controller's name in `--controllers` (upstream's sample registers it so).
pub(crate) const NODE_IPAM_CONTROLLER: &str = "nodeipam";
/// The only allocator the ccm has (upstream's `ipam.RangeAllocatorType`).
const RANGE_ALLOCATOR: &str = "RangeAllocator";
/// Upstream's `defaultNodeMaskCIDRIPv4`.
const DEFAULT_NODE_MASK_IPV4: u8 = 24;
/// Upstream's `defaultNodeMaskCIDRIPv6`.
const DEFAULT_NODE_MASK_IPV6: u8 = 64;

/// The node IPAM flags (upstream's `NodeIPAMControllerOptions`), for the ccm against any
/// cluster and for the embedded default alike. `--cidr-allocator-type` is the SDK's (it accepts
/// it for every vendor binary); `nodeipam` gives it its meaning.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct NodeIpamArgs {
    /// Mask size for node CIDRs in a single-stack cluster (default 24 for IPv4, 64 for
    /// IPv6); not allowed with dual stack.
    #[arg(long, value_name = "SIZE")]
    node_cidr_mask_size: Option<u8>,
    /// Mask size for IPv4 node CIDRs in a dual-stack (or IPv4) cluster (default 24).
    #[arg(long, value_name = "SIZE")]
    node_cidr_mask_size_ipv4: Option<u8>,
    /// Mask size for IPv6 node CIDRs in a dual-stack (or IPv6) cluster (default 64).
    #[arg(long, value_name = "SIZE")]
    node_cidr_mask_size_ipv6: Option<u8>,
    /// The Services' cluster IP range(s), one CIDR or one per IP family: node CIDRs are never
    /// allocated inside them. The embedded default's API server allocates cluster IPs from
    /// it too (default there: 10.96.0.0/12).
    #[arg(long, value_name = "CIDRS")]
    pub(crate) service_cluster_ip_range: Option<String>,
}

/// A validated node IPAM setup: the allocator's configuration and the ranges it must skip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeIpamSetup {
    /// The range allocator's configuration.
    pub(crate) config: NodeIpamConfig,
    /// The service ranges no node CIDR may overlap.
    pub(crate) service_cidrs: Vec<IpNet>,
}

impl NodeIpamSetup {
    /// The allocator, with the service ranges taken out of the cluster CIDRs.
    pub(crate) fn controller(&self, client: kube::Client) -> Result<NodeIpamController, BoxError> {
        let mut controller = NodeIpamController::new(client, self.config.clone())?;
        for cidr in &self.service_cidrs {
            controller.exclude(cidr);
        }
        Ok(controller)
    }
}

/// Upstream's `processCIDRs`: a comma list of CIDRs, and whether it is dual stack.
fn parse_cidrs(list: &str, flag: &str) -> Result<Vec<IpNet>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| {
            c.parse::<IpNet>()
                .map(|n| n.trunc())
                .map_err(|_| format!("{flag}: invalid CIDR address: {c}"))
        })
        .collect()
}

fn is_dual_stack(cidrs: &[IpNet]) -> bool {
    cidrs.iter().any(|c| matches!(c, IpNet::V4(_)))
        && cidrs.iter().any(|c| matches!(c, IpNet::V6(_)))
}

/// The node IPAM setup from the flags, refused with upstream's messages
/// (`startNodeIpamController`, `setNodeCIDRMaskSizes`, `NewNodeIpamController`, `ipam.New`).
pub(crate) fn setup(
    args: &NodeIpamArgs,
    ccm: &CloudControllerManagerOptions,
) -> Result<NodeIpamSetup, String> {
    setup_from(
        args,
        &ccm.cluster_cidr,
        ccm.allocate_node_cidrs,
        ccm.accepted.cidr_allocator_type.as_deref(),
    )
}

/// [`setup`] from `--cluster-cidr`, `--allocate-node-cidrs` and `--cidr-allocator-type`
/// (`None`: the range allocator) wherever they come from (`ccm controller-manager` has
/// them as kube-controller-manager's).
pub(crate) fn setup_from(
    args: &NodeIpamArgs,
    cluster_cidr: &str,
    allocate_node_cidrs: bool,
    cidr_allocator_type: Option<&str>,
) -> Result<NodeIpamSetup, String> {
    let allocator = cidr_allocator_type.unwrap_or(RANGE_ALLOCATOR);
    match allocator {
        RANGE_ALLOCATOR => {}
        "CloudAllocator" => {
            return Err(
                "--cidr-allocator-type=CloudAllocator: the cloud allocator is not supported; use RangeAllocator"
                    .to_owned(),
            );
        }
        other => return Err(format!("invalid CIDR allocator type: {other}")),
    }
    let clusters = parse_cidrs(cluster_cidr, "--cluster-cidr")?;
    let dual_stack = is_dual_stack(&clusters);
    if clusters.len() > 1 && !dual_stack {
        return Err(format!(
            "len of ClusterCIDRs=={} and they are not configured as dual stack (at least one from each IPFamily",
            clusters.len()
        ));
    }
    if clusters.len() > 2 {
        return Err(format!(
            "len of clusters is:{} > more than max allowed of 2",
            clusters.len()
        ));
    }
    let services = match &args.service_cluster_ip_range {
        Some(list) => parse_cidrs(list, "--service-cluster-ip-range")?,
        None => Vec::new(),
    };
    if services.len() > 2 {
        return Err(format!(
            "--service-cluster-ip-range: at most two CIDRs (one per IP family), got {}",
            services.len()
        ));
    }
    if services.len() == 2 && !is_dual_stack(&services) {
        return Err(
            "serviceCIDR and secondaryServiceCIDR are not dualstack (from different IPfamiles)"
                .to_owned(),
        );
    }
    if allocate_node_cidrs && clusters.is_empty() {
        return Err(
            "Controller: Must specify --cluster-cidr if --allocate-node-cidrs is set".to_owned(),
        );
    }
    let (ipv4, ipv6) = node_mask_sizes(args, &clusters)?;
    for cluster in &clusters {
        let node_mask = match cluster {
            IpNet::V4(_) => ipv4,
            IpNet::V6(_) => ipv6,
        };
        if cluster.prefix_len() > node_mask {
            return Err("Controller: Invalid --cluster-cidr, mask size of cluster CIDR must be less than or equal to --node-cidr-mask-size configured for CIDR family".to_owned());
        }
    }
    let config = NodeIpamConfig {
        allocate_node_cidrs,
        cluster_cidrs: clusters,
        node_cidr_mask_size_ipv4: ipv4,
        node_cidr_mask_size_ipv6: ipv6,
    };
    config.validate().map_err(|e| e.to_string())?;
    Ok(NodeIpamSetup {
        config,
        service_cidrs: services,
    })
}

/// Upstream's `setNodeCIDRMaskSizes`: `(ipv4, ipv6)` node mask sizes.
fn node_mask_sizes(args: &NodeIpamArgs, clusters: &[IpNet]) -> Result<(u8, u8), String> {
    let (mut ipv4, mut ipv6) = (DEFAULT_NODE_MASK_IPV4, DEFAULT_NODE_MASK_IPV6);
    if clusters.len() > 1 {
        if args.node_cidr_mask_size.is_some() {
            return Err(
                "usage of --node-cidr-mask-size is not allowed with dual-stack clusters".to_owned(),
            );
        }
        return Ok((
            args.node_cidr_mask_size_ipv4.unwrap_or(ipv4),
            args.node_cidr_mask_size_ipv6.unwrap_or(ipv6),
        ));
    }
    let single_stack_ipv6 = matches!(clusters.first(), Some(IpNet::V6(_)));
    if let Some(mask) = args.node_cidr_mask_size {
        if args.node_cidr_mask_size_ipv4.is_some() || args.node_cidr_mask_size_ipv6.is_some() {
            return Err("usage of --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6 is not allowed if --node-cidr-mask-size is set. For dual-stack clusters please unset it and use IPFamily specific flags".to_owned());
        }
        return Ok((mask, mask));
    }
    if let Some(mask) = args.node_cidr_mask_size_ipv4 {
        if single_stack_ipv6 {
            return Err(
                "usage of --node-cidr-mask-size-ipv4 is not allowed for a single-stack IPv6 cluster"
                    .to_owned(),
            );
        }
        ipv4 = mask;
    }
    if let Some(mask) = args.node_cidr_mask_size_ipv6 {
        if !single_stack_ipv6 {
            return Err(
                "usage of --node-cidr-mask-size-ipv6 is not allowed for a single-stack IPv4 cluster"
                    .to_owned(),
            );
        }
        ipv6 = mask;
    }
    Ok((ipv4, ipv6))
}

/// Whether `--controllers` turns `nodeipam` on: only by name, since `*` leaves it off (as
/// upstream's sample lists it in `ControllersDisabledByDefault`).
pub(crate) fn enabled(ccm: &CloudControllerManagerOptions) -> bool {
    ccm.controllers
        .iter()
        .map(|c| c.trim())
        .find(|c| c.trim_start_matches('-') == NODE_IPAM_CONTROLLER)
        .is_some_and(|c| !c.starts_with('-'))
}

/// The setup the `nodeipam` constructor starts from; [`registry`] sets it once per process.
static SETUP: OnceLock<NodeIpamSetup> = OnceLock::new();

/// The ccm's controllers: the SDK's four, and `nodeipam`, off by default. The flags are
/// checked here, so bad ones fail before anything starts, as upstream's do when the
/// controller is enabled; `--cidr-allocator-type` is then taken (the SDK would otherwise warn
/// that it has no effect).
pub(crate) fn registry(
    args: &NodeIpamArgs,
    ccm: &mut CloudControllerManagerOptions,
) -> Result<ControllerRegistry, String> {
    let registry = cloud_provider_app::default_registry();
    if !enabled(ccm) || !ccm.allocate_node_cidrs {
        // Upstream's `startNodeIpamController` returns "not started" without
        // --allocate-node-cidrs; the name stays known to --controllers.
        return Ok(registry.with_disabled_by_default(NODE_IPAM_CONTROLLER, skip));
    }
    let setup = setup(args, ccm)?;
    ccm.accepted.cidr_allocator_type = None;
    SETUP
        .set(setup)
        .map_err(|_| "the nodeipam controller is configured once per process".to_owned())?;
    Ok(registry.with_disabled_by_default(NODE_IPAM_CONTROLLER, start))
}

fn skip(
    _ctx: ControllerContext,
    _options: &CloudControllerManagerOptions,
) -> Result<Option<ControllerFuture>, BoxError> {
    Ok(None)
}

fn start(
    ctx: ControllerContext,
    _options: &CloudControllerManagerOptions,
) -> Result<Option<ControllerFuture>, BoxError> {
    let Some(setup) = SETUP.get() else {
        return Ok(None);
    };
    let controller = setup.controller(ctx.client.clone())?;
    let shutdown = ctx.shutdown.clone();
    Ok(Some(Box::pin(async move {
        controller.run(shutdown).await;
        Ok(())
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        ccm: CloudControllerManagerOptions,
        #[command(flatten)]
        ipam: NodeIpamArgs,
    }

    fn parse(flags: &[&str]) -> Result<NodeIpamSetup, String> {
        let mut argv = vec!["ccm", "--cloud-provider=fake", "--allocate-node-cidrs"];
        argv.extend_from_slice(flags);
        let f = Flags::try_parse_from(argv).expect("flags parse");
        setup(&f.ipam, &f.ccm)
    }

    /// Upstream's `setNodeCIDRMaskSizes`: single stack takes `--node-cidr-mask-size` or the
    /// family's flag, dual stack the per-family flags (defaults 24 and 64).
    #[test]
    fn node_mask_sizes_follow_upstreams_set_node_cidr_mask_sizes() {
        let s = parse(&["--cluster-cidr=10.244.0.0/16", "--node-cidr-mask-size=26"]).unwrap();
        assert_eq!(s.config.node_cidr_mask_size_ipv4, 26);
        let s = parse(&["--cluster-cidr=10.244.0.0/16"]).unwrap();
        assert_eq!(s.config.node_cidr_mask_size_ipv4, 24);
        let s = parse(&[
            "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
            "--node-cidr-mask-size-ipv4=25",
            "--node-cidr-mask-size-ipv6=72",
        ])
        .unwrap();
        assert_eq!(
            (
                s.config.node_cidr_mask_size_ipv4,
                s.config.node_cidr_mask_size_ipv6
            ),
            (25, 72)
        );
        assert_eq!(s.config.cluster_cidrs.len(), 2);
    }

    /// The messages of upstream's `startNodeIpamController` and `setNodeCIDRMaskSizes`.
    #[test]
    fn bad_ipam_flags_get_upstreams_messages() {
        let cases: &[(&[&str], &str)] = &[
            (
                &[
                    "--cluster-cidr=10.244.0.0/16,fd00::/56",
                    "--node-cidr-mask-size=24",
                ],
                "usage of --node-cidr-mask-size is not allowed with dual-stack clusters",
            ),
            (
                &[
                    "--cluster-cidr=10.244.0.0/16",
                    "--node-cidr-mask-size=24",
                    "--node-cidr-mask-size-ipv4=24",
                ],
                "usage of --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6 is not allowed if --node-cidr-mask-size is set",
            ),
            (
                &["--cluster-cidr=fd00::/56", "--node-cidr-mask-size-ipv4=24"],
                "usage of --node-cidr-mask-size-ipv4 is not allowed for a single-stack IPv6 cluster",
            ),
            (
                &[
                    "--cluster-cidr=10.244.0.0/16",
                    "--node-cidr-mask-size-ipv6=64",
                ],
                "usage of --node-cidr-mask-size-ipv6 is not allowed for a single-stack IPv4 cluster",
            ),
            (
                &["--cluster-cidr=10.244.0.0/16", "--node-cidr-mask-size=8"],
                "Controller: Invalid --cluster-cidr, mask size of cluster CIDR must be less than or equal to --node-cidr-mask-size configured for CIDR family",
            ),
            (
                &[
                    "--cluster-cidr=10.244.0.0/16",
                    "--service-cluster-ip-range=10.96.0.0/12,10.97.0.0/16",
                ],
                "serviceCIDR and secondaryServiceCIDR are not dualstack (from different IPfamiles)",
            ),
            (
                &["--cluster-cidr=10.244.0.0/16", "--cidr-allocator-type=Foo"],
                "invalid CIDR allocator type: Foo",
            ),
            (
                &[],
                "Controller: Must specify --cluster-cidr if --allocate-node-cidrs is set",
            ),
        ];
        for (flags, message) in cases {
            let error = parse(flags).expect_err(&format!("{flags:?} is refused"));
            assert!(error.starts_with(message), "{flags:?}: {error}");
        }
    }

    /// `*` leaves `nodeipam` off (upstream's `ControllersDisabledByDefault`); naming it turns
    /// it on; `-nodeipam` keeps it off.
    #[test]
    fn nodeipam_runs_only_when_named_in_controllers() {
        let on = |list: &str| {
            let flag = format!("--controllers={list}");
            let f = Flags::try_parse_from(["ccm", flag.as_str()]).unwrap();
            enabled(&f.ccm)
        };
        assert!(!on("*"));
        assert!(on("*,nodeipam"));
        assert!(!on("-nodeipam,nodeipam"));
        assert!(on("nodeipam"));
    }
}
