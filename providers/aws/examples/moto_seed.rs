//! Starts moto on a free loopback port, seeds a cluster VPC with N instances, prints the
//! endpoint, the cloud-config and the instance IDs, and keeps moto running until Ctrl-C.
//!
//! ```text
//! CCM_MOTO_PYTHON=$(scripts/moto.sh) cargo run -p cloud-provider-aws --features test-util \
//!     --example moto_seed -- 5 demo
//! ```
//!
//! Arguments: the instance count (default 3) and the cluster ID (default `kubernetes`). The
//! cloud-config goes to `$TMPDIR/moto-<port>.conf` too, ready for `--cloud-config`; the
//! credentials are `AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing`.

use cloud_provider_aws::test_util::{MotoServer, SeedSpec};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let count: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(3);
    let cluster = args.next().unwrap_or_else(|| "kubernetes".to_owned());
    let moto = MotoServer::start().await?;
    let seed = moto.seed(&SeedSpec::new(&cluster, count)).await?;
    let config = seed.cloud_config(&moto);
    let path = std::env::temp_dir().join(format!("moto-{}.conf", moto.port()));
    std::fs::write(&path, &config)?;
    println!("endpoint: {}", moto.endpoint());
    println!("cloud-config: {}", path.display());
    println!("vpc: {}", seed.vpc_id);
    println!("subnets: {}", seed.subnet_ids.join(" "));
    println!("route-table: {}", seed.route_table_id);
    for (id, dns) in seed.instance_ids.iter().zip(&seed.private_dns_names) {
        println!("instance: {id} {dns}");
    }
    println!("moto runs until Ctrl-C");
    tokio::signal::ctrl_c().await?;
    moto.stop().await;
    Ok(())
}
