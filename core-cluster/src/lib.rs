//! The core of a Kubernetes-compatible API server.
//!
//! For now this crate holds the storage layer, [`store`]: a versioned key-value store
//! with the semantics the API server needs from etcd — one global, monotonic revision
//! (the `resourceVersion`), optimistic concurrency on a key's modification revision,
//! paginated lists served at one consistent revision, and watches that replay history
//! from a revision and report "too old" (HTTP 410 Gone) when that history is gone.
//!
//! Two backends implement the [`store::Store`] trait:
//!
//! * [`store::SqliteStore`], the durable default: SQLite in WAL mode with
//!   `synchronous=FULL`, one writer thread doing group commit, reads on separate
//!   connections.
//! * [`store::MemoryStore`], a `BTreeMap` for tests.
//!
//! The store deals in keys and bytes only; it knows nothing of Kubernetes types.
//!
//! [`patch`] implements the PATCH verbs on objects held as JSON: JSON patch, JSON merge
//! patch, strategic merge patch with per-kind list semantics, and server-side apply
//! with `managedFields` ownership tracking.

pub mod patch;
pub mod store;
