//! SIGHUP: re-read what may change while the server runs (the access rules
//! of `--token-file`, and the TLS certificates of the client and peer
//! ports) without touching a connection.
//! A file that cannot be used is reported and the settings in force stay.

use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// One thing SIGHUP re-reads, with its name for the log.
pub struct Reloadable {
    /// What it is, for the log ("access rules").
    pub what: &'static str,
    /// Re-reads it; `None` when it is not configured.
    pub reload: Box<dyn Fn() -> Option<anyhow::Result<()>> + Send + Sync>,
}

/// Re-reads every one of `items`; logs what happened. Returns whether
/// everything was reloaded. Every one is tried, whatever the others did.
pub fn reload(items: &[Reloadable]) -> bool {
    // Collected first: `all` alone would stop at the first failure.
    let reloaded: Vec<bool> = items.iter().map(|r| logged(r.what, (r.reload)())).collect();
    reloaded.into_iter().all(|ok| ok)
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
pub async fn on_sighup(items: Arc<Vec<Reloadable>>, shutdown: CancellationToken) {
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
                    reload(&items);
                }
            }
        }
    }
    #[cfg(not(unix))]
    shutdown.cancelled().await;
}
