//! Conformance tests: the SDK, the providers and the kit, used as an outside user uses them.

// Link the providers, as a ccm binary would.
use cloud_provider_fake as _;
use hello_cloud_provider as _;

mod app;
mod authz;
mod batching;
mod ccm;
mod cloud_node;
mod metrics;
mod provider_kit;
mod registry;
mod route;
mod secure_port;
mod service;
mod tap;

/// An API server over an in-memory store, for tests that talk to it in process.
pub(crate) async fn memory_server() -> core_cluster::ApiServer {
    core_cluster::ApiServer::new(
        std::sync::Arc::new(core_cluster::store::MemoryStore::new()),
        core_cluster::ApiServerConfig::default(),
    )
    .await
    .expect("the in-memory API server starts")
}
