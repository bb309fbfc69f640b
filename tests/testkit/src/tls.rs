//! [`TestServer`]: the API server over TLS on a free loopback port, as `ccm apiserver` serves
//! it, with its PKI in a temporary directory.

use std::{net::SocketAddr, path::PathBuf};

use core_cluster::{
    ApiServer,
    auth::pki::{self, Credentials},
    serve::{
        Security, ServeError, ServeOptions, bind, client_config, https_url, secure_router,
        serve_tls,
    },
};
use tokio_util::sync::CancellationToken;

/// An API server served over TLS on a free loopback port, with its PKI in a temporary
/// directory: for tests and benchmarks. Stops when dropped.
#[derive(Debug)]
pub struct TestServer {
    addr: SocketAddr,
    server: ApiServer,
    security: Security,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), ServeError>>,
    dir: tempfile::TempDir,
}

impl TestServer {
    /// Serves `server` with [`ServeOptions::default`].
    pub async fn start(server: ApiServer) -> Result<TestServer, ServeError> {
        Self::start_with(server, ServeOptions::default()).await
    }

    /// Serves `server` with `options`.
    pub async fn start_with(
        server: ApiServer,
        options: ServeOptions,
    ) -> Result<TestServer, ServeError> {
        let dir = tempfile::tempdir()?;
        let security = Security::load(&server, dir.path(), &[])?;
        Self::start_secured(server, security, options, dir).await
    }

    /// Serves `server` with `security` (a custom token clock, say), keeping `dir` alive.
    pub async fn start_secured(
        server: ApiServer,
        security: Security,
        options: ServeOptions,
        dir: tempfile::TempDir,
    ) -> Result<TestServer, ServeError> {
        security.publish_client_ca(&server).await?;
        let (listener, addr) = bind("127.0.0.1:0").await?;
        let shutdown = CancellationToken::new();
        let router = secure_router(&server, security.authenticator.clone());
        let task = tokio::spawn(serve_tls(
            router,
            listener,
            security.tls.clone(),
            options,
            shutdown.clone(),
        ));
        Ok(TestServer {
            addr,
            server,
            security,
            shutdown,
            task,
            dir,
        })
    }

    /// The address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        https_url(self.addr)
    }

    /// The API server.
    pub fn api(&self) -> &ApiServer {
        &self.server
    }

    /// The PKI, authenticator and TLS configuration.
    pub fn security(&self) -> &Security {
        &self.security
    }

    /// The temporary data directory (holding `pki/`).
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// The admin kubeconfig (`system:masters`), as YAML text.
    pub fn admin_kubeconfig(&self) -> String {
        self.security.admin_kubeconfig(self.addr)
    }

    /// A kubeconfig for a client certificate of `user` in `groups`, as YAML text.
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<String, ServeError> {
        let cert = self.security.pki.issue_client(user, groups)?;
        Ok(self.security.pki.kubeconfig(&self.url(), &cert))
    }

    /// A kubeconfig authenticating with a bearer `token`, as YAML text.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        let ca = self.security.pki.ca_pem();
        pki::kubeconfig_yaml(&self.url(), ca, Credentials::Token(token))
    }

    /// A kubeconfig trusting the CA and presenting no credentials (anonymous).
    pub fn anonymous_kubeconfig(&self) -> String {
        let ca = self.security.pki.ca_pem();
        pki::kubeconfig_yaml(&self.url(), ca, Credentials::Anonymous)
    }

    /// A kube-rs client of the admin.
    pub async fn admin_client(&self) -> Result<kube::Client, ServeError> {
        self.client(&self.admin_kubeconfig()).await
    }

    /// A kube-rs client for `kubeconfig` YAML text.
    pub async fn client(&self, kubeconfig: &str) -> Result<kube::Client, ServeError> {
        let config = client_config(kubeconfig).await?;
        kube::Client::try_from(config).map_err(|e| ServeError::Client(e.to_string()))
    }

    /// Stops serving and waits for the server to finish.
    pub async fn stop(mut self) -> Result<(), ServeError> {
        self.shutdown.cancel();
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => Err(ServeError::Client(format!("server task: {e}"))),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
