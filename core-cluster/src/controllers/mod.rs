//! The control-plane controllers of the node side, each a kube-rs client of the API server
//! like any other (they never touch the store): node lifecycle, taint eviction, node IPAM,
//! garbage collection.

pub mod node_lifecycle;
pub mod taint_eviction;
