//! Process signals.

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub(crate) async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs until SIGTERM or Ctrl-C, then cancels `shutdown` and gives `tasks` up to 10 seconds
/// to stop (controllers release their Leases as they go): the end of the subcommands that
/// attach to a cluster.
pub(crate) async fn stop_on_termination(
    shutdown: &tokio_util::sync::CancellationToken,
    tasks: &mut tokio::task::JoinSet<()>,
) {
    terminated().await;
    shutdown.cancel();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
}
