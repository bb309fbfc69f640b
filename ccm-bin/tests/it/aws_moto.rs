//! `ccm --cloud-provider aws` against moto (a local EC2 and ELBv2, started by the test; see
//! `providers/aws/src/moto.rs`): the embedded cluster's simulated nodes are named after moto
//! instances, and the ccm initializes them as upstream's AWS provider would (providerID
//! `aws:///<zone>/<instance-id>`, zone, region and instance-type labels, InternalIP and
//! InternalDNS addresses). A LoadBalancer Service made with `kubectl expose` gets an NLB whose
//! DNS name lands in the Service's status and whose target group holds every instance;
//! deleting the Service leaves no load balancer or target group behind. The provider's AWS call,
//! error and throttle counters are on the ccm's `/metrics` under upstream's names.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::support::{https_get, require_kubectl, wait_until};
use cloud_provider_aws::test_util::{MotoServer, SeedSpec};

struct Ccm {
    child: Child,
    kubeconfig: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl Drop for Ccm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Ccm {
    fn kubectl(&self, args: &[&str]) -> String {
        let out = Command::new("kubectl")
            .env("KUBECONFIG", &self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.dir.join("cache"))
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

#[test]
fn ccm_with_aws_initializes_nodes_named_after_moto_instances_and_ensures_nlbs() {
    require_kubectl("it reads the cluster of `ccm --cloud-provider aws` with kubectl");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let moto = runtime
        .block_on(MotoServer::start())
        .expect("moto (run ./scripts/test, which installs it)");
    let seed = runtime
        .block_on(moto.seed(&SeedSpec::new("ccm-e2e", 3)))
        .unwrap();
    let ec2 = runtime.block_on(moto.ec2());
    let elbv2 = runtime.block_on(moto.elbv2());
    // What EC2 says about each instance: zone, private IP, private DNS name, type.
    let described = runtime
        .block_on(
            ec2.describe_instances()
                .set_instance_ids(Some(seed.instance_ids.clone()))
                .send(),
        )
        .unwrap();
    let mut instances = BTreeMap::new();
    for instance in described.reservations().iter().flat_map(|r| r.instances()) {
        let id = instance.instance_id().unwrap().to_owned();
        let zone = instance
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap()
            .to_owned();
        let ip = instance.private_ip_address().unwrap().to_owned();
        let dns = instance.private_dns_name().unwrap().to_owned();
        let kind = instance.instance_type().unwrap().as_str().to_owned();
        instances.insert(id, (zone, ip, dns, kind));
    }
    assert_eq!(instances.len(), 3);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloud.conf");
    std::fs::write(&config, seed.cloud_config(&moto)).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let names = seed.instance_ids.join(",");
    let metrics_port = ccm_testkit::free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args(["--cloud-provider", "aws", "--cloud-config"])
        .arg(&config)
        .args(["--sim-node-names", &names, "--sim-zones", "us-east-1a"])
        .args(["--listen", "127.0.0.1:0", "--secure-port"])
        .arg(metrics_port.to_string())
        .arg("--write-kubeconfig")
        .arg(&kubeconfig)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        // The SDK's default credential chain, as in a pod with an IAM role; moto accepts any.
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    assert!(first.starts_with("embedded cluster"), "{first}");
    std::thread::spawn(move || for _ in reader.lines() {});
    let ccm = Ccm {
        child,
        kubeconfig,
        dir: dir.path().to_owned(),
    };

    let initialized = wait_until(Duration::from_secs(60), || {
        ccm.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].spec.providerID}"])
            .split_whitespace()
            .filter(|id| id.starts_with("aws:///"))
            .count()
            == 3
    });
    assert!(
        initialized,
        "{}",
        ccm.kubectl(&["get", "nodes", "-o", "yaml"])
    );
    for (id, (zone, ip, dns, kind)) in &instances {
        let node: serde_json::Value =
            serde_json::from_str(&ccm.kubectl(&["get", "node", id, "-o", "json"])).unwrap();
        assert_eq!(
            node["spec"]["providerID"],
            format!("aws:///{zone}/{id}"),
            "{node}"
        );
        let labels = &node["metadata"]["labels"];
        assert_eq!(labels["topology.kubernetes.io/zone"], zone.as_str());
        assert_eq!(labels["topology.kubernetes.io/region"], "us-east-1");
        assert_eq!(labels["node.kubernetes.io/instance-type"], kind.as_str());
        let addresses: Vec<(String, String)> = node["status"]["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["type"].as_str().unwrap().to_owned(),
                    a["address"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert!(
            addresses.contains(&("InternalIP".to_owned(), ip.clone())),
            "{addresses:?}"
        );
        assert!(
            addresses.contains(&("InternalDNS".to_owned(), dns.clone())),
            "{addresses:?}"
        );
        let taints = ccm.kubectl(&["get", "node", id, "-o", "jsonpath={.spec.taints}"]);
        assert!(!taints.contains("uninitialized"), "{taints}");
    }

    // A LoadBalancer Service: an NLB with the instances as targets, its DNS name in status.
    ccm.kubectl(&["run", "web", "--image=nginx", "--labels=app=web"]);
    let exposed = ccm.kubectl(&["expose", "pod", "web", "--type=LoadBalancer", "--port=80"]);
    assert!(exposed.contains("exposed"), "{exposed}");
    let mut hostname = String::new();
    let ensured = wait_until(Duration::from_secs(60), || {
        hostname = ccm.kubectl(&[
            "get",
            "service",
            "web",
            "-o",
            "jsonpath={.status.loadBalancer.ingress[0].hostname}",
        ]);
        !hostname.is_empty()
    });
    assert!(ensured, "{}", ccm.kubectl(&["get", "events"]));
    let lbs = runtime
        .block_on(elbv2.describe_load_balancers().send())
        .unwrap();
    let lb = &lbs.load_balancers()[0];
    assert_eq!(lbs.load_balancers().len(), 1);
    assert_eq!(lb.dns_name(), Some(hostname.as_str()));
    assert_eq!(lb.r#type().map(|t| t.as_str()), Some("network"));
    let groups = runtime
        .block_on(
            elbv2
                .describe_target_groups()
                .load_balancer_arn(lb.load_balancer_arn().unwrap())
                .send(),
        )
        .unwrap();
    assert_eq!(
        groups.target_groups().len(),
        1,
        "one port, one target group"
    );
    let health = runtime
        .block_on(
            elbv2
                .describe_target_health()
                .target_group_arn(groups.target_groups()[0].target_group_arn().unwrap())
                .send(),
        )
        .unwrap();
    let mut targets: Vec<String> = health
        .target_health_descriptions()
        .iter()
        .filter_map(|d| d.target().and_then(|t| t.id()).map(str::to_owned))
        .collect();
    targets.sort();
    let mut expected = seed.instance_ids.clone();
    expected.sort();
    assert_eq!(targets, expected, "every instance is a target");

    // The AWS provider's call metrics are on the ccm's /metrics, under upstream's names.
    // HTTPS with delegated auth: the admin's client certificate (the embedded cluster's CA
    // is the ccm's client CA).
    let (code, metrics) = https_get(metrics_port, "/metrics", &ccm.kubeconfig).unwrap_or_default();
    assert_eq!(code, 200, "{metrics}");
    let count_of = |operation: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("cloudprovider_aws_api_request_duration_seconds_count{")
                    && l.contains(&format!(":{operation}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert!(count_of("DescribeInstances") >= 1, "{metrics}");
    assert!(count_of("CreateLoadBalancer") == 1, "{metrics}");
    assert!(count_of("RegisterTargets") >= 1, "{metrics}");
    // The error and throttle families appear with their first sample (moto does not throttle;
    // their names are checked by the provider's unit test).
    assert!(
        metrics.contains("# TYPE cloudprovider_aws_api_request_duration_seconds histogram"),
        "{metrics}"
    );

    // Deleting the Service deletes the NLB and its target group.
    let deleted = ccm.kubectl(&["delete", "service", "web", "--timeout=60s"]);
    assert!(deleted.contains("deleted"), "{deleted}");
    let lbs = runtime
        .block_on(elbv2.describe_load_balancers().send())
        .unwrap();
    assert!(lbs.load_balancers().is_empty(), "{lbs:?}");
    let groups = runtime
        .block_on(elbv2.describe_target_groups().send())
        .unwrap();
    assert!(groups.target_groups().is_empty(), "{groups:?}");
    drop(ccm);
    runtime.block_on(moto.stop());
}
