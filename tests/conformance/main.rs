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
mod ownership;
mod provider_kit;
mod registry;
mod route;
mod secure_port;
mod service;
mod tap;
