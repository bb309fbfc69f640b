//! ccm-bin's integration tests: the `ccm` binary run as a process, one module per area,
//! linked into one test binary.

mod attach;
// `ccm --cloud-provider aws` needs the provider linked (the default `aws` feature).
#[cfg(feature = "aws")]
mod aws_moto;
mod budgets;
mod cli;
mod data_path;
mod deploy;
mod durability;
mod embedded;
mod endpoints;
mod etcd;
mod helm;
mod identity;
mod image;
mod kubectl;
mod kubelet_api;
mod kubelet_certificates;
mod manage;
mod nodeipam;
mod platforms;
mod sim_config;
mod support;
