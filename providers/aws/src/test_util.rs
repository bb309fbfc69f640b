//! Test support (feature `test-util`): a local moto server (PyPI `moto[server]`) and a seeded
//! cluster VPC, for this crate's tests and other crates' (e.g. a CCM run against simulated
//! Nodes). Enable it in dev-dependencies only:
//! `cloud-provider-aws = { ..., features = ["test-util"] }`.
//!
//! `scripts/test` installs moto with `scripts/moto.sh` and exports `CCM_MOTO_PYTHON`, the
//! virtualenv's python. [`MotoServer::start`] runs `$CCM_MOTO_PYTHON -m moto.server` on a free
//! loopback port (falling back to `$HOME/.cache/ccm-rs/moto-venv/bin/python`), waits until it
//! answers, and kills it when dropped. Without moto it fails, saying to run `./scripts/test`.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use cloud_provider_aws::{AwsCloud, test_util::{MotoServer, SeedSpec}};
//!
//! let moto = MotoServer::start().await?;
//! let seed = moto.seed(&SeedSpec::new("demo", 3)).await?;
//! let cloud = AwsCloud::from_config_text_with(&seed.cloud_config(&moto), moto.options())?;
//! println!("instances: {:?}", seed.instance_ids);
//! # Ok(()) }
//! ```

use std::{path::PathBuf, process::Stdio, time::Duration};

use aws_config::{BehaviorVersion, Region, SdkConfig, retry::RetryConfig};
use aws_sdk_ec2::{
    config::Credentials,
    types::{Filter, InstanceType, ResourceType, Tag, TagSpecification},
};
use tokio::process::{Child, Command};

use crate::client::AwsOptions;

/// The environment variable naming the python that runs moto (set by `scripts/test`).
pub const MOTO_PYTHON_ENV: &str = "CCM_MOTO_PYTHON";
/// The region tests use.
pub const MOTO_REGION: &str = "us-east-1";
/// An AMI in moto's bundled list.
pub const MOTO_AMI: &str = "ami-12c6146b";
/// The fake credentials (moto does not check signatures).
pub const MOTO_ACCESS_KEY: &str = "testing";

/// Why moto could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MotoError {
    /// moto is not installed where we look.
    #[error(
        "moto is not installed: run ./scripts/test (which runs scripts/moto.sh and exports \
         {MOTO_PYTHON_ENV}), or set {MOTO_PYTHON_ENV} to a python with moto[server] ({0})"
    )]
    NotInstalled(String),
    /// The server did not start or answer.
    #[error("moto server did not start: {0}")]
    Start(String),
    /// A seeding call failed.
    #[error("seeding moto failed at {step}: {detail}")]
    Seed {
        /// What was being created.
        step: String,
        /// The SDK's error.
        detail: String,
    },
}

fn seed_err<E: std::error::Error>(step: &str) -> impl FnOnce(E) -> MotoError + '_ {
    move |e| MotoError::Seed {
        step: step.to_owned(),
        detail: aws_sdk_ec2::error::DisplayErrorContext(&e).to_string(),
    }
}

/// A moto server on a loopback port, killed on drop.
pub struct MotoServer {
    child: Child,
    port: u16,
}

impl std::fmt::Debug for MotoServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MotoServer")
            .field("port", &self.port)
            .finish()
    }
}

/// The python that runs moto: `$CCM_MOTO_PYTHON`, else the default venv of `scripts/moto.sh`.
pub fn moto_python() -> Result<PathBuf, MotoError> {
    if let Some(p) = std::env::var_os(MOTO_PYTHON_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.exists() {
            Ok(p)
        } else {
            Err(MotoError::NotInstalled(format!(
                "{MOTO_PYTHON_ENV}={} does not exist",
                p.display()
            )))
        };
    }
    let venv = std::env::var_os("MOTO_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ccm-rs/moto-venv"))
        })
        .ok_or_else(|| MotoError::NotInstalled("HOME is not set".to_owned()))?;
    let python = venv.join("bin/python");
    if python.exists() {
        Ok(python)
    } else {
        Err(MotoError::NotInstalled(format!(
            "{MOTO_PYTHON_ENV} is unset and {} does not exist",
            python.display()
        )))
    }
}

impl MotoServer {
    /// Starts moto on a free loopback port and waits (up to 60 s) until it answers.
    pub async fn start() -> Result<MotoServer, MotoError> {
        let python = moto_python()?;
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0")
                .map_err(|e| MotoError::Start(format!("no free port: {e}")))?;
            listener
                .local_addr()
                .map_err(|e| MotoError::Start(e.to_string()))?
                .port()
        };
        let mut child = Command::new(&python)
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| MotoError::Start(format!("{} -m moto.server: {e}", python.display())))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(MotoError::Start(format!(
                    "{} -m moto.server exited with {status}",
                    python.display()
                )));
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(MotoServer { child, port });
            }
            if tokio::time::Instant::now() > deadline {
                let _ = child.start_kill();
                return Err(MotoError::Start(format!(
                    "no answer on 127.0.0.1:{port} after 60 s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The endpoint, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Provider options for moto: fake static credentials, 2 attempts with short backoff, and
    /// no instance cache between calls of a test unless asked.
    pub fn options(&self) -> AwsOptions {
        AwsOptions::default()
            .with_static_credentials(MOTO_ACCESS_KEY, MOTO_ACCESS_KEY)
            .with_max_attempts(2)
            .with_backoff(Duration::from_millis(50), Duration::from_millis(200))
    }

    /// An SDK config for moto, for tests that check or seed through the API directly.
    pub async fn sdk_config(&self) -> SdkConfig {
        aws_config::defaults(BehaviorVersion::latest())
            .http_client(crate::client::https_client())
            .region(Region::new(MOTO_REGION))
            .endpoint_url(self.endpoint())
            .credentials_provider(Credentials::new(
                MOTO_ACCESS_KEY,
                MOTO_ACCESS_KEY,
                None,
                None,
                "moto",
            ))
            .retry_config(RetryConfig::standard().with_max_attempts(2))
            .load()
            .await
    }

    /// An EC2 client for moto.
    pub async fn ec2(&self) -> aws_sdk_ec2::Client {
        aws_sdk_ec2::Client::new(&self.sdk_config().await)
    }

    /// An ELBv2 client for moto.
    pub async fn elbv2(&self) -> aws_sdk_elasticloadbalancingv2::Client {
        aws_sdk_elasticloadbalancingv2::Client::new(&self.sdk_config().await)
    }

    /// A Classic ELB client for moto (to stage what cloud-provider-aws would have made).
    pub async fn elb_classic(&self) -> aws_sdk_elasticloadbalancing::Client {
        aws_sdk_elasticloadbalancing::Client::new(&self.sdk_config().await)
    }

    /// Requests a certificate for `domain` from moto's ACM and returns its ARN, for TLS
    /// listeners (moto's CreateListener checks that the certificate exists). Uses the boto3
    /// that moto depends on, since the provider links no ACM client.
    pub async fn acm_certificate(&self, domain: &str) -> Result<String, MotoError> {
        const SCRIPT: &str = "import sys, boto3\n\
            acm = boto3.client('acm', endpoint_url=sys.argv[1], region_name=sys.argv[2], \
            aws_access_key_id='testing', aws_secret_access_key='testing')\n\
            print(acm.request_certificate(DomainName=sys.argv[3])['CertificateArn'])\n";
        let out = Command::new(moto_python()?)
            .args(["-c", SCRIPT, &self.endpoint(), MOTO_REGION, domain])
            .output()
            .await
            .map_err(|e| MotoError::Seed {
                step: "RequestCertificate".to_owned(),
                detail: e.to_string(),
            })?;
        let arn = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !out.status.success() || !arn.starts_with("arn:") {
            return Err(MotoError::Seed {
                step: "RequestCertificate".to_owned(),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(arn)
    }

    /// Seeds a cluster VPC as [`SeedSpec`] says.
    pub async fn seed(&self, spec: &SeedSpec) -> Result<Seed, MotoError> {
        seed(&self.ec2().await, spec).await
    }

    /// Kills the server now (dropping it does the same).
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// What to seed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SeedSpec {
    /// The cluster ID for the tags.
    pub cluster_id: String,
    /// How many instances to run.
    pub instances: usize,
    /// The zones, one subnet each.
    pub zones: Vec<String>,
    /// The instance type.
    pub instance_type: String,
}

impl SeedSpec {
    /// A VPC for `cluster_id` with `instances` instances over two zones of us-east-1.
    pub fn new(cluster_id: &str, instances: usize) -> Self {
        SeedSpec {
            cluster_id: cluster_id.to_owned(),
            instances,
            zones: vec!["us-east-1a".to_owned(), "us-east-1b".to_owned()],
            instance_type: "m5.large".to_owned(),
        }
    }
}

/// What was seeded.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Seed {
    /// The cluster ID.
    pub cluster_id: String,
    /// The VPC (10.0.0.0/16).
    pub vpc_id: String,
    /// One subnet per zone, tagged with the cluster and `kubernetes.io/role/elb`.
    pub subnet_ids: Vec<String>,
    /// The cluster-tagged route table (associated with the subnets, default route to the
    /// internet gateway).
    pub route_table_id: String,
    /// The cluster-tagged node security group.
    pub node_security_group_id: String,
    /// The instances, in launch order, spread over the subnets.
    pub instance_ids: Vec<String>,
    /// Their private DNS names, in the same order.
    pub private_dns_names: Vec<String>,
}

impl Seed {
    /// A cloud-config for this VPC with moto as the endpoint of every service.
    pub fn cloud_config(&self, moto: &MotoServer) -> String {
        format!(
            "[Global]\nRegion = {MOTO_REGION}\nVPC = {}\nSubnetID = {}\nKubernetesClusterID = {}\n\n\
             [ServiceOverride \"ec2\"]\nService = ec2\nURL = {endpoint}\n\n\
             [ServiceOverride \"elb\"]\nService = elasticloadbalancing\nURL = {endpoint}\n\n\
             [ServiceOverride \"sts\"]\nService = sts\nURL = {endpoint}\n",
            self.vpc_id,
            self.subnet_ids
                .first()
                .map(String::as_str)
                .unwrap_or_default(),
            self.cluster_id,
            endpoint = moto.endpoint(),
        )
    }
}

fn tag(k: &str, v: &str) -> Tag {
    Tag::builder().key(k).value(v).build()
}

fn tags(resource: ResourceType, tags: Vec<Tag>) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(resource)
        .set_tags(Some(tags))
        .build()
}

/// Seeds a cluster VPC with `ec2`: VPC, internet gateway, one tagged subnet per zone, a tagged
/// route table with a default route to the gateway, a tagged node security group and the
/// instances (cluster-tagged, in the node group).
pub async fn seed(ec2: &aws_sdk_ec2::Client, spec: &SeedSpec) -> Result<Seed, MotoError> {
    let cluster_tag = format!("{}{}", crate::CLUSTER_TAG_PREFIX, spec.cluster_id);
    let owned = || tag(&cluster_tag, "owned");
    let vpc = ec2
        .create_vpc()
        .cidr_block("10.0.0.0/16")
        .tag_specifications(tags(ResourceType::Vpc, vec![owned()]))
        .send()
        .await
        .map_err(seed_err("CreateVpc"))?;
    let vpc_id = vpc
        .vpc()
        .and_then(|v| v.vpc_id())
        .unwrap_or_default()
        .to_owned();
    let igw = ec2
        .create_internet_gateway()
        .send()
        .await
        .map_err(seed_err("CreateInternetGateway"))?;
    let igw_id = igw
        .internet_gateway()
        .and_then(|g| g.internet_gateway_id())
        .unwrap_or_default()
        .to_owned();
    ec2.attach_internet_gateway()
        .internet_gateway_id(&igw_id)
        .vpc_id(&vpc_id)
        .send()
        .await
        .map_err(seed_err("AttachInternetGateway"))?;
    let rt = ec2
        .create_route_table()
        .vpc_id(&vpc_id)
        .tag_specifications(tags(ResourceType::RouteTable, vec![owned()]))
        .send()
        .await
        .map_err(seed_err("CreateRouteTable"))?;
    let route_table_id = rt
        .route_table()
        .and_then(|r| r.route_table_id())
        .unwrap_or_default()
        .to_owned();
    ec2.create_route()
        .route_table_id(&route_table_id)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw_id)
        .send()
        .await
        .map_err(seed_err("CreateRoute"))?;
    let mut subnet_ids = Vec::new();
    for (i, zone) in spec.zones.iter().enumerate() {
        // /18 per zone: room for thousands of instances.
        let cidr = format!("10.0.{}.0/18", i * 64);
        let s = ec2
            .create_subnet()
            .vpc_id(&vpc_id)
            .cidr_block(cidr)
            .availability_zone(zone)
            .tag_specifications(tags(
                ResourceType::Subnet,
                vec![
                    owned(),
                    tag("kubernetes.io/role/elb", "1"),
                    tag("Name", &format!("{}-{zone}", spec.cluster_id)),
                ],
            ))
            .send()
            .await
            .map_err(seed_err("CreateSubnet"))?;
        let id = s
            .subnet()
            .and_then(|s| s.subnet_id())
            .unwrap_or_default()
            .to_owned();
        ec2.associate_route_table()
            .route_table_id(&route_table_id)
            .subnet_id(&id)
            .send()
            .await
            .map_err(seed_err("AssociateRouteTable"))?;
        subnet_ids.push(id);
    }
    let sg = ec2
        .create_security_group()
        .group_name(format!("{}-nodes", spec.cluster_id))
        .description("cluster nodes")
        .vpc_id(&vpc_id)
        .tag_specifications(tags(ResourceType::SecurityGroup, vec![owned()]))
        .send()
        .await
        .map_err(seed_err("CreateSecurityGroup"))?;
    let node_security_group_id = sg.group_id().unwrap_or_default().to_owned();

    let mut seed = Seed {
        cluster_id: spec.cluster_id.clone(),
        vpc_id,
        subnet_ids,
        route_table_id,
        node_security_group_id,
        instance_ids: Vec::new(),
        private_dns_names: Vec::new(),
    };
    run_instances(ec2, spec, &mut seed, spec.instances).await?;
    Ok(seed)
}

/// Runs `count` more instances into the seeded VPC (spread over its subnets), appending their
/// IDs and DNS names to `seed`. Returns the new IDs.
pub async fn run_instances(
    ec2: &aws_sdk_ec2::Client,
    spec: &SeedSpec,
    seed: &mut Seed,
    count: usize,
) -> Result<Vec<String>, MotoError> {
    let cluster_tag = format!("{}{}", crate::CLUSTER_TAG_PREFIX, spec.cluster_id);
    let zones = seed.subnet_ids.len().max(1);
    let mut new_ids = Vec::new();
    for (i, subnet) in seed.subnet_ids.clone().iter().enumerate() {
        let mut n = count / zones + usize::from(i < count % zones);
        while n > 0 {
            let batch = n.min(250);
            n -= batch;
            let out = ec2
                .run_instances()
                .image_id(MOTO_AMI)
                .instance_type(InstanceType::from(spec.instance_type.as_str()))
                .min_count(batch as i32)
                .max_count(batch as i32)
                .subnet_id(subnet)
                .security_group_ids(&seed.node_security_group_id)
                .tag_specifications(tags(
                    ResourceType::Instance,
                    vec![tag(&cluster_tag, "owned")],
                ))
                .send()
                .await
                .map_err(seed_err("RunInstances"))?;
            for inst in out.instances() {
                if let Some(id) = inst.instance_id() {
                    new_ids.push(id.to_owned());
                    seed.instance_ids.push(id.to_owned());
                    seed.private_dns_names
                        .push(inst.private_dns_name().unwrap_or_default().to_owned());
                }
            }
        }
    }
    Ok(new_ids)
}

/// Stops instances (they stay, in state `stopped`).
pub async fn stop_instances(ec2: &aws_sdk_ec2::Client, ids: &[String]) -> Result<(), MotoError> {
    ec2.stop_instances()
        .set_instance_ids(Some(ids.to_vec()))
        .send()
        .await
        .map_err(seed_err("StopInstances"))?;
    Ok(())
}

/// Terminates instances.
pub async fn terminate_instances(
    ec2: &aws_sdk_ec2::Client,
    ids: &[String],
) -> Result<(), MotoError> {
    ec2.terminate_instances()
        .set_instance_ids(Some(ids.to_vec()))
        .send()
        .await
        .map_err(seed_err("TerminateInstances"))?;
    Ok(())
}

/// Whether an instance's source/dest check is on (routes turn it off).
pub async fn source_dest_check(
    ec2: &aws_sdk_ec2::Client,
    id: &str,
) -> Result<Option<bool>, MotoError> {
    let out = ec2
        .describe_instances()
        .filters(Filter::builder().name("instance-id").values(id).build())
        .send()
        .await
        .map_err(seed_err("DescribeInstances"))?;
    Ok(out
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find(|i| i.instance_id() == Some(id))
        .and_then(|i| i.source_dest_check()))
}
