//! core-cluster's integration tests, one module per area, linked into one test binary
//! (linkerd2-proxy's and kube-rs' layout): one link instead of one per file.

mod api_kube_rs;
mod authz;
mod conformance;
mod connection_limits;
mod controllers_ipam_gc;
mod disruption;
mod durability;
mod endpoints;
mod etcd_faults;
mod finished_work;
mod fuzz_inputs;
mod hardening;
mod hostile_numbers;
mod kubelet_api;
mod kubelet_metrics;
mod node_authorizer;
mod node_graph_cost;
mod node_lifecycle;
mod openapi_kubectl;
mod protobuf_http;
mod protobuf_kubectl;
mod protobuf_schema;
mod python_client;
mod rbac_escalation;
mod rbac_write_path;
mod request_bodies;
mod scheduler;
mod sim;
mod sim_images;
mod sim_shutdown;
mod store_failures;
mod tls_auth;
mod type_meta;
mod watch_backlogs;
mod workloads;
