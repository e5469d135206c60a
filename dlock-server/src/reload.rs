//! SIGHUP: re-read what may change while the server runs (the access rules
//! of `--token-file`, and the TLS certificates of the client and peer
//! ports) without touching a connection.
//! A file that cannot be used is reported and the settings in force stay.

use crate::shared::Shared;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Re-reads every reloadable file of `shared`; logs what happened. Returns
/// whether everything was reloaded.
pub fn reload(shared: &Shared) -> bool {
    let access = shared.service.access();
    let access = access.enabled().then(|| access.reload());
    let tls = shared.tls.as_ref().map(|t| t.reload());
    let peer_tls = shared
        .service
        .engine()
        .cluster()
        .and_then(|c| c.reload_peer_tls());
    // Every one is tried, whatever the others did.
    let access = logged("access rules", access);
    let tls = logged("TLS certificates", tls);
    let peer_tls = logged("peer TLS certificates", peer_tls);
    access && tls && peer_tls
}

/// Logs the outcome of reloading `what` (`None`: not configured); whether
/// it was reloaded or had nothing to reload. Errors name the file and
/// line, never a token.
fn logged(what: &str, outcome: Option<anyhow::Result<()>>) -> bool {
    match outcome {
        None => true,
        Some(Ok(())) => {
            tracing::info!("{what} reloaded");
            true
        }
        Some(Err(e)) => {
            tracing::warn!(error = %format!("{e:#}"), "reload failed; the {what} in force stay");
            false
        }
    }
}

/// Reloads on every SIGHUP until `shutdown`.
pub async fn on_sighup(shared: Arc<Shared>, shutdown: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGHUP; no reloads");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    reload(&shared);
                }
            }
        }
    }
    #[cfg(not(unix))]
    shutdown.cancelled().await;
}
