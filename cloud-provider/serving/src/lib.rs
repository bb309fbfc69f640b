//! # ccm-serving: the HTTPS plumbing of both servers
//!
//! What the cloud-controller-manager's secure port (`cloud-provider-app`) and core-cluster's
//! API server share, written once and depending on neither:
//!
//! - [`serve`]: the TLS accept loop: rustls handshakes with a timeout, HTTP/2 or HTTP/1.1 as
//!   ALPN chose, Go's `http.Server` timeouts as kube-apiserver sets them
//!   (`staging/src/k8s.io/apiserver/pkg/server/secure_serving.go`), graceful shutdown on a
//!   `CancellationToken`, and a [`ConnectionHook`] asked about every connection (admit or
//!   refuse it, close it to make room, learn when it authenticated);
//! - [`CertificateIdentity`]: the user a verified client certificate names (upstream's x509
//!   `CommonNameUserConversion`);
//! - [`bearer_token`]: the token of an `Authorization` header (upstream's
//!   `plugin/pkg/authenticator/request/bearertoken/bearertoken.go`);
//! - [`healthz`]: `/healthz`, `/livez`, `/readyz` bodies as `k8s.io/apiserver/pkg/server/healthz`
//!   writes them;
//! - [`self_signed`]: a serving certificate when none is given (client-go's
//!   `GenerateSelfSignedCertKey`);
//! - [`connections`]: bounds on plain TCP connections carried in process for what would run
//!   outside it (a cloud's load balancer, kube-proxy's node ports): an idle timeout on a
//!   spliced or served connection, a cap of concurrent connections per listener, and a
//!   process-wide budget of file descriptors (a quarter of `RLIMIT_NOFILE`) shared by
//!   several listeners, each connection taking as many permits as the descriptors it holds;
//!   a connection beyond them is reset at accept, with a warning at most once a minute.

mod bearer;
pub mod connections;
pub mod healthz;
mod identity;
mod selfsigned;
mod serve;

pub use bearer::bearer_token;
pub use identity::{CertificateIdentity, Peer};
pub use selfsigned::{CertKey, CertificateError, self_signed};
pub use serve::{
    Activity, Busy, ConnectionAuth, ConnectionHook, ConnectionSlot, HandshakeLimit, Timeouts, serve,
};
