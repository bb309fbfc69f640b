//! ccm-bin's integration tests: the `ccm` binary run as a process, one module per area,
//! linked into one test binary.

// `ccm --cloud-provider aws` needs the provider linked (the default `aws` feature).
#[cfg(feature = "aws")]
mod aws_moto;
mod cli;
mod deploy;
mod durability;
mod embedded;
mod etcd;
mod kubectl;
mod manage;
mod support;
