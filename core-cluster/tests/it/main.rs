//! core-cluster's integration tests, one module per area, linked into one test binary
//! (linkerd2-proxy's and kube-rs' layout): one link instead of one per file.

mod agent_tunnel;
mod api_kube_rs;
mod authz;
mod conformance;
mod connection_limits;
mod controllers_ipam_gc;
mod crd;
mod crd_kube_derive;
mod csr;

mod default_toleration_seconds;
mod disruption;
mod durability;
mod endpoints;
mod ephemeral_containers;
mod etcd_faults;
mod etcd_servers;
mod finished_work;
mod fuzz_inputs;
mod hardening;
mod hostile_numbers;
mod kube_ws;
mod kubelet_api;
mod kubelet_configz;
mod kubelet_metrics;
mod kubelet_proxy;
mod node_authorizer;
mod node_graph_cost;
mod node_lifecycle;
mod openapi_kubectl;
mod port_forward;
mod protobuf_http;
mod protobuf_kubectl;
mod protobuf_schema;
mod python_client;
mod rbac_escalation;
mod rbac_write_path;
mod recent_copies;
mod request_bodies;
mod scheduler;
mod service_proxy;
mod service_ranges;

mod service_account_identity;
mod sim;
mod sim_eviction;
mod sim_images;
mod sim_node_config;
mod sim_shutdown;
mod store_failures;
mod tls_auth;
mod type_meta;
mod watch_backlogs;
mod watch_history;
mod workloads;
