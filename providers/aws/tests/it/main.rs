//! The AWS provider's integration tests, one module per area, linked into one test binary:
//! against moto (`moto`), and against a loopback stand-in where moto cannot produce a
//! condition (`events`, `throttling`, `topology`).

mod common;
mod events;
mod moto;
mod throttling;
mod topology;
