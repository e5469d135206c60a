//! Server configuration: command-line flags, their defaults and limits.

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The dlock lock server.
///
/// Holds named locks in memory and serves them over TCP with the dlock v2
/// protocol (see docs/PROTOCOL.md). Every limit below is per server unless it
/// says otherwise; a request that hits one gets a status naming it.
#[derive(Debug, Clone, Parser)]
#[command(name = "dlock-server", version, about, long_about = None)]
pub struct Config {
    /// Address to listen on. Loopback by default; use 0.0.0.0:7436 to serve
    /// other machines (and set --token-file).
    #[arg(long, env = "DLOCK_LISTEN", default_value = dlock::DEFAULT_ADDR)]
    pub listen: SocketAddr,

    /// Access control file: tokens (a bare token per line has every right)
    /// and named identities with rules such as "lock jobs/*" (see
    /// docs/PROTOCOL.md). When set, every request must come from one of
    /// them. Re-read on SIGHUP.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,

    /// Serve clients over TLS with this certificate chain (PEM, leaf
    /// first). Re-read on SIGHUP; open connections keep theirs.
    #[arg(
        long,
        env = "DLOCK_TLS_CERT",
        value_name = "PATH",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --tls-cert.
    #[arg(
        long,
        env = "DLOCK_TLS_KEY",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

    /// Require clients to present a certificate signed by a CA in this PEM
    /// file (mutual TLS). A certificate's subject CN or DNS name can stand
    /// for an access token: see "identity" in the token file.
    #[arg(
        long,
        env = "DLOCK_TLS_CLIENT_CA",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    pub tls_client_ca: Option<PathBuf>,

    /// File that keeps fencing tokens increasing even if the wall clock steps
    /// back across a restart. Without it tokens are derived from the clock.
    #[arg(long, value_name = "PATH")]
    pub fence_file: Option<PathBuf>,

    /// Largest request frame body, in bytes.
    #[arg(long, default_value_t = dlock::DEFAULT_MAX_FRAME, value_parser = frame_size)]
    pub max_frame: usize,

    /// Most keys in one request.
    #[arg(long, default_value_t = 256, value_parser = positive)]
    pub max_keys: usize,

    /// Longest key, in bytes.
    #[arg(long, default_value_t = 1024, value_parser = positive)]
    pub max_key_len: usize,

    /// Most client connections at once; further clients get LimitReached.
    #[arg(long, default_value_t = 10_000, value_parser = positive)]
    pub max_connections: usize,

    /// Most unanswered requests per connection; the server stops reading the
    /// connection until it catches up.
    #[arg(long, default_value_t = 1024, value_parser = positive)]
    pub max_pipeline: usize,

    /// Most Lock requests waiting at once, over all connections.
    #[arg(long, default_value_t = 100_000, value_parser = positive)]
    pub max_waiters: usize,

    /// Most keys held at once, over all connections.
    #[arg(long, default_value_t = 4_000_000, value_parser = positive)]
    pub max_held_keys: usize,

    /// Longest lease a Lock or Renew may ask for.
    #[arg(long, default_value = "30days", value_parser = dlock::duration::parse_positive)]
    pub max_lease: Duration,

    /// Close a connection that sends no complete request for this long.
    #[arg(long, default_value = "60s", value_parser = dlock::duration::parse_positive)]
    pub idle_timeout: Duration,

    /// Close a connection whose responses cannot be written for this long
    /// (a client that stopped reading).
    #[arg(long, default_value = "10s", value_parser = dlock::duration::parse_positive)]
    pub write_timeout: Duration,

    /// TCP keepalive: idle time before the first probe.
    #[arg(long, default_value = "30s", value_parser = dlock::duration::parse_positive)]
    pub keepalive_time: Duration,

    /// TCP keepalive: time between probes.
    #[arg(long, default_value = "10s", value_parser = dlock::duration::parse_positive)]
    pub keepalive_interval: Duration,

    /// TCP keepalive: unanswered probes before the connection is dropped.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=255))]
    pub keepalive_retries: u32,

    /// How long shutdown waits for connections to finish.
    #[arg(long, default_value = "5s", value_parser = dlock::duration::parse_positive)]
    pub shutdown_timeout: Duration,

    /// Worker threads; 0 = one per CPU core. With 1 the server runs on a
    /// single thread: no cross-thread wake-ups, and a release hands its key
    /// to the next waiter before answering the releaser, which makes lock
    /// hand-offs on a contended key about 30% faster (see BENCHMARKS.md).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,

    /// Serve Prometheus metrics (/metrics) and health probes (/healthz,
    /// /readyz) over HTTP on this address. Off by default.
    #[arg(long, env = "DLOCK_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,

    /// Log filter (e.g. info, debug, dlock_server=trace). Overrides RUST_LOG.
    #[arg(long)]
    pub log_level: Option<String>,

    /// Log line format: text for people, json (one object per line) for a
    /// log collector.
    #[arg(long, env = "DLOCK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `tracing`'s human-readable lines.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `message`, the
    /// event's fields, and `span` (the connection's `peer`) when in one.
    Json,
}

impl Default for Config {
    fn default() -> Self {
        // The flag defaults are the one source of truth for defaults.
        Config::parse_from(["dlock-server"])
    }
}

impl Config {
    /// How long after the last request this server may end a connection:
    /// the idle timeout, or sooner the keepalive give-up time (first probe,
    /// then every unanswered retry), or the write timeout (an answer to a
    /// later request that cannot be written). Locks bound to the connection
    /// are released then, so a client must treat this as its deadline.
    pub fn session_timeout(&self) -> Duration {
        let keepalive = self.keepalive_time + self.keepalive_interval * self.keepalive_retries;
        self.idle_timeout.min(keepalive).min(self.write_timeout)
    }

    /// The limits a client is told in the answer to Hello.
    pub fn limits(&self) -> dlock::proto::ServerLimits {
        let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let small = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        dlock::proto::ServerLimits {
            session_timeout_micro: micros(self.session_timeout()),
            max_lease_micro: micros(self.max_lease),
            max_keys: small(self.max_keys),
            max_key_len: small(self.max_key_len),
            max_frame: small(self.max_frame),
            max_pipeline: small(self.max_pipeline),
        }
    }
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Frames must fit a request with a few keys, and their length must fit
/// the 4-byte prefix with room to spare.
fn frame_size(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if !(64..=64 * 1024 * 1024).contains(&n) {
        return Err("must be between 64 and 67108864 bytes".into());
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse() {
        let c = Config::default();
        assert_eq!(c.listen.to_string(), dlock::DEFAULT_ADDR);
        assert_eq!(c.max_frame, 16 * 1024);
        assert_eq!(c.idle_timeout, Duration::from_secs(60));
        assert_eq!(c.log_format, LogFormat::Text);
    }

    #[test]
    fn session_timeout_is_the_soonest_way_the_server_ends_a_connection() {
        // The write timeout, 10 s by default.
        assert_eq!(Config::default().session_timeout(), Duration::from_secs(10));
        let c = Config::parse_from([
            "s",
            "--keepalive-time",
            "5s",
            "--keepalive-interval",
            "1s",
            "--write-timeout",
            "60s",
        ]);
        // 5 s + 3 retries x 1 s
        assert_eq!(c.session_timeout(), Duration::from_secs(8));
        let c = Config::parse_from(["s", "--idle-timeout", "2s"]);
        assert_eq!(c.limits().session_timeout_micro, 2_000_000);
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(Config::try_parse_from(["s", "--max-keys", "0"]).is_err());
        assert!(Config::try_parse_from(["s", "--idle-timeout", "0s"]).is_err());
        assert!(Config::try_parse_from(["s", "--idle-timeout", "soon"]).is_err());
        assert!(Config::try_parse_from(["s", "--max-frame", "1"]).is_err());
        assert!(Config::try_parse_from(["s", "--log-format", "xml"]).is_err());
    }
}
