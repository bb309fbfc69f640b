//! Serving the API on a socket, and the kubeconfig clients use to reach it.

use std::{net::SocketAddr, path::Path};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::ApiServer;

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("could not listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig could not be written.
    #[error("could not write kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The server failed.
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
}

/// Binds `addr` (port 0 picks a free port) and returns the listener and its address.
pub async fn bind(addr: &str) -> Result<(TcpListener, SocketAddr), ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: addr.to_owned(),
            source,
        })?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// Serves `server` on `listener` until `shutdown` is cancelled.
pub async fn serve(
    server: ApiServer,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    axum::serve(listener, server.router())
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
}

/// A kubeconfig for `http://<addr>` (no TLS or auth yet), as YAML text.
pub fn kubeconfig(addr: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ccm\n  cluster:\n    server: http://{addr}\ncontexts:\n- name: ccm\n  context:\n    cluster: ccm\n    user: ccm\n    namespace: default\ncurrent-context: ccm\nusers:\n- name: ccm\n  user: {{}}\npreferences: {{}}\n"
    )
}

/// Writes the kubeconfig for `addr` to `path` atomically (write, then rename).
pub fn write_kubeconfig(path: &Path, addr: SocketAddr) -> Result<(), ServeError> {
    let err = |source| ServeError::Kubeconfig {
        path: path.display().to_string(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, kubeconfig(addr)).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
