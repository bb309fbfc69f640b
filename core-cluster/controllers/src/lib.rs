//! # core-cluster-controllers: the built-in controllers
//!
//! The control-plane controllers of the node side, each a kube-rs client of the API server
//! like any other (they never touch the store): node lifecycle, taint eviction, node IPAM,
//! garbage collection, pod garbage collection, TTL-after-finished, the scheduler, the
//! workload controllers (ReplicaSet, Deployment, Job, DaemonSet), the disruption controller,
//! the Services' endpoint controllers (EndpointSlice, Endpoints, EndpointSlice mirroring),
//! the namespace controller (a deleted namespace's contents, then its finalizer), the
//! serviceaccounts controller and the root-CA publisher (a pod's identity: the `default`
//! ServiceAccount and the `kube-root-ca.crt` ConfigMap in every namespace); and the
//! [`supervisor`] that restarts any of them after a panic.
//!
//! The controllers stand on `core-cluster-machinery` (resource defaults, quantities, the
//! clock, the health-check trait) and reach the API server through kube-rs only: this crate
//! may not depend on the API server or the store (its unit tests run an in-memory server as
//! a dev-dependency).

// The machinery under the paths this code has always used (`crate::registry::…`).
pub(crate) use core_cluster_machinery::{clock, registry};

pub mod csr_approving;
pub mod csr_signing;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod endpointslice;
pub mod endpointslice_mirroring;
pub mod garbage_collector;
pub mod job;
pub mod namespace;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod pod_gc;
pub mod replicaset;
pub mod root_ca_publisher;
pub mod scheduler;
pub mod serviceaccounts;
pub mod supervisor;
pub mod taint_eviction;
pub mod ttl_after_finished;
mod workload;
