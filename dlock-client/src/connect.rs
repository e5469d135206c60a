//! From flags to a connected client, shared by every subcommand that talks
//! to a server (the main path, `cluster`, `elect`, `leader`, `top`): the
//! client's options (timeouts, access token, TLS), the connect whose
//! failure becomes an exit code, and the patient connect of a form that
//! outlives a server's restart (`elect`, `leader --watch`).

use crate::cli::Args;
use crate::exit::{self, Failure};
use crate::say;
use dlock::{Client, ClientOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The client's options from the command line: timeouts, token, TLS.
///
/// # Errors
/// An unreadable token file or TLS file.
pub fn client_options(args: &Args) -> Result<ClientOptions, Failure> {
    Ok(ClientOptions {
        connect_timeout: args.connect_timeout,
        access_token: token(args)?,
        tls: tls(args)?,
        ..ClientOptions::default()
    })
}

/// The TLS settings of --tls-ca, --tls-cert and --tls-key; `None` for
/// plain TCP.
fn tls(args: &Args) -> Result<Option<Arc<dlock::tls::rustls::ClientConfig>>, Failure> {
    tls_from(
        args.tls_ca.as_deref(),
        args.tls_cert.as_deref(),
        args.tls_key.as_deref(),
    )
}

/// The TLS configuration of --tls-ca, --tls-cert and --tls-key: none
/// without a CA.
pub fn tls_from(
    ca: Option<&std::path::Path>,
    cert: Option<&std::path::Path>,
    key: Option<&std::path::Path>,
) -> Result<Option<Arc<dlock::tls::rustls::ClientConfig>>, Failure> {
    let Some(ca) = ca else {
        return Ok(None);
    };
    dlock::tls::client_config(ca, cert.zip(key))
        .map(Some)
        .map_err(|e| Failure::new(exit::USAGE, format!("TLS: {e}")))
}

/// The access token: from --token-file (the first token in it), else
/// DLOCK_TOKEN.
fn token(args: &Args) -> Result<Option<String>, Failure> {
    token_from(args.token_file.as_deref())
}

/// The access token: the first in `file` when given, else DLOCK_TOKEN.
pub fn token_from(file: Option<&std::path::Path>) -> Result<Option<String>, Failure> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Failure::new(
                exit::USAGE,
                format!("cannot read token file {}: {e}", path.display()),
            )
        })?;
        let Some(token) = dlock::token_file::tokens(&text).next() else {
            return Err(Failure::new(
                exit::USAGE,
                format!("token file {} holds no token", path.display()),
            ));
        };
        return Ok(Some(token.to_string()));
    }
    Ok(std::env::var("DLOCK_TOKEN").ok().filter(|t| !t.is_empty()))
}

/// Connects, mapping failures to exit codes.
///
/// # Errors
/// Exit code 69 with a message naming the address and the fix.
pub async fn connect(server: &str, options: ClientOptions) -> Result<Client, Failure> {
    Client::connect_with(server, options)
        .await
        .map_err(|e| exit::from_client_error(e, server))
}

/// First pause before trying again to reach a server that was lost: a
/// restart takes from a fraction of a second to several.
const RETRY_FIRST: Duration = Duration::from_millis(100);

/// Longest pause between tries: a server back after a long outage is
/// found within this, and a host that waits for it costs it little.
const RETRY_MAX: Duration = Duration::from_secs(4);

/// Connects again after the server was lost, for a form that must outlive
/// a restart or a failover (`dlock elect` campaigning again, `dlock leader
/// --watch`). While the server cannot be reached ([`Failure::transient`])
/// it tries again, after a pause that doubles from 100 ms to 4 s, saying
/// so on stderr once, and once more when the server answers again. Never
/// ends on its own while the server stays away: the caller selects it
/// against its signals.
///
/// # Errors
/// A failure that trying again cannot mend (access denied, TLS), at once.
pub async fn reconnect(server: &str, options: &ClientOptions) -> Result<Client, Failure> {
    let started = Instant::now();
    let mut pause = RETRY_FIRST;
    let mut said = false;
    loop {
        match Client::connect_with(server, options.clone()).await {
            Ok(client) => {
                if said {
                    say!(
                        "{server} answers again, after {:.1}s",
                        started.elapsed().as_secs_f64()
                    );
                }
                return Ok(client);
            }
            Err(e) => {
                // The library's words, not the exit message: its hint to
                // check the address is wrong for a server that was there.
                let text = e.to_string();
                let failure = exit::from_client_error(e, server);
                if !failure.transient {
                    return Err(failure);
                }
                if !said {
                    say!("{text}; trying again until it answers");
                    said = true;
                }
            }
        }
        tokio::time::sleep(jittered(pause)).await;
        pause = (pause * 2).min(RETRY_MAX);
    }
}

/// A pause between half of `pause` and `pause`: every dlock of a fleet
/// notices a server's restart at the same moment, and should not all
/// arrive at the same moment when it is back.
/// How long a loop of [`reconnect`]s must go without a failure for its
/// next one to count as a first.
const GOOD_SPELL: Duration = Duration::from_secs(10);

/// Paces a loop that reconnects after each failure: a connect may succeed
/// while what follows fails at once (a node that is not the leader yet, a
/// server still stopping), and the loop must not spin on it. A failure
/// within [`GOOD_SPELL`] of the last waits, the wait doubling from 100 ms
/// to 4 s; one after a good spell goes at once.
#[derive(Debug, Default)]
pub struct Pacer {
    pause: Duration,
    last: Option<Instant>,
}

impl Pacer {
    /// Waits as the failure just met calls for.
    pub async fn failed(&mut self) {
        let soon = self.last.is_some_and(|t| t.elapsed() < GOOD_SPELL);
        if soon {
            self.pause = (self.pause * 2).clamp(RETRY_FIRST, RETRY_MAX);
            tokio::time::sleep(jittered(self.pause)).await;
        } else {
            self.pause = Duration::ZERO;
        }
        self.last = Some(Instant::now());
    }
}

fn jittered(pause: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // std's per-process random hash keys: random enough to spread dlocks
    // out, without a dependency.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let half = pause / 2;
    let spread = u64::try_from((pause - half).as_nanos()).unwrap_or(u64::MAX);
    half + Duration::from_nanos(random % spread.saturating_add(1))
}

/// The options of a form that only talks to the server (`dlock cluster`,
/// `dlock top`): where, with which token, over TLS or not, and how the
/// answer is printed.
#[derive(Debug, clap::Args)]
pub struct Connection {
    /// Nodes of the cluster, separated by commas: the first that answers
    /// is asked (dlock cluster add and remove go on to the leader it names).
    #[arg(short, long, global = true, env = "DLOCK_SERVER", default_value = dlock::DEFAULT_ADDR, value_name = "HOST:PORT[,...]", value_parser = crate::cli::server_addresses)]
    pub server: String,

    /// Read the access token from this file; DLOCK_TOKEN otherwise.
    #[arg(
        long,
        global = true,
        env = "DLOCK_CLIENT_TOKEN_FILE",
        value_name = "PATH"
    )]
    pub token_file: Option<PathBuf>,

    /// Connect with TLS, trusting the CA certificates in this PEM file.
    #[arg(long, global = true, env = "DLOCK_TLS_CA", value_name = "PATH")]
    pub tls_ca: Option<PathBuf>,

    /// Client certificate chain (PEM) for a server that requires one.
    #[arg(long, global = true, env = "DLOCK_TLS_CERT", value_name = "PATH", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --tls-cert.
    #[arg(
        long,
        global = true,
        env = "DLOCK_TLS_KEY",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

    /// How the answer is printed: text for people, or one json object
    /// for scripts.
    #[arg(short = 'o', long, global = true, value_enum, default_value_t = crate::cli::Output::Text, value_name = "FORMAT")]
    pub output: crate::cli::Output,

    /// How long to wait for a connection (and its TLS handshake).
    #[arg(long, global = true, value_name = "DURATION", default_value = "5s", value_parser = dlock::duration::parse_positive)]
    pub connect_timeout: std::time::Duration,

    /// Say on stderr which node was asked and answered, and where a change
    /// was sent on to (dlock cluster). dlock top's screen already shows it.
    #[arg(short, long, global = true)]
    pub verbose: bool,
}

impl Connection {
    /// The token and TLS of every other form.
    ///
    /// # Errors
    /// An unreadable token file or TLS file.
    pub fn client_options(&self) -> Result<dlock::ClientOptions, Failure> {
        Ok(dlock::ClientOptions {
            connect_timeout: self.connect_timeout,
            access_token: token_from(self.token_file.as_deref())?,
            tls: tls_from(
                self.tls_ca.as_deref(),
                self.tls_cert.as_deref(),
                self.tls_key.as_deref(),
            )?,
            ..dlock::ClientOptions::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long `pacer.failed()` waited.
    async fn waited(pacer: &mut Pacer) -> Duration {
        let before = Instant::now();
        pacer.failed().await;
        before.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn failures_in_a_row_wait_longer_and_a_good_spell_starts_over() {
        let mut pacer = Pacer::default();
        // The first failure goes at once; the next ones wait, longer each
        // time, up to the most.
        assert_eq!(waited(&mut pacer).await, Duration::ZERO);
        let mut last = Duration::ZERO;
        for _ in 0..8 {
            let w = waited(&mut pacer).await;
            assert!(w >= RETRY_FIRST / 2 && w <= RETRY_MAX, "{w:?}");
            assert!(w >= last / 2, "{w:?} after {last:?}");
            last = w;
        }
        assert!(last >= RETRY_MAX / 2, "{last:?}");
        // After a good spell, at once again.
        tokio::time::sleep(GOOD_SPELL).await;
        assert_eq!(waited(&mut pacer).await, Duration::ZERO);
    }
}
