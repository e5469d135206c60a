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
    let access = match shared.access.reload() {
        Ok(()) => {
            if shared.access.enabled() {
                tracing::info!("access rules reloaded");
            }
            true
        }
        Err(e) => {
            // The error names the file and line, never a token.
            tracing::warn!(error = %format!("{e:#}"), "reload failed; the access rules in force stay");
            false
        }
    };
    let tls = match shared.tls.as_ref().map(|t| t.reload()) {
        None => true,
        Some(Ok(())) => {
            tracing::info!("TLS certificates reloaded");
            true
        }
        Some(Err(e)) => {
            tracing::warn!(error = %format!("{e:#}"), "reload failed; the TLS certificates in force stay");
            false
        }
    };
    let peer_tls = match shared
        .cluster
        .as_ref()
        .and_then(|node| node.cluster().reload_peer_tls())
    {
        None => true,
        Some(Ok(())) => {
            tracing::info!("peer TLS certificates reloaded");
            true
        }
        Some(Err(e)) => {
            tracing::warn!(error = %format!("{e:#}"), "reload failed; the peer TLS certificates in force stay");
            false
        }
    };
    access && tls && peer_tls
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
