//! Command-line interface of `dlock`.

use clap::{Parser, ValueEnum};
use dlock::duration;
use std::path::PathBuf;
use std::time::Duration;

const EXAMPLES: &str = "\
Commands (each has its own --help; -s, the token and TLS options, -o and -v
may come before the command's name or after it):
  elect     run COMMAND while this machine leads an election on KEY
  leader    print who leads an election on KEY, or follow it with --watch
  cluster   show a cluster's members (status), add or remove one
  top       a live view: busiest keys, grants and hand-offs per second,
            connections, sessions, and each cluster node's role and lag

Examples:
  # Run a cron job on one machine of the fleet at a time:
  dlock -k reports/daily -- /usr/local/bin/make-report --yesterday

  # Skip this run if another machine is already running it (flock -n):
  dlock -n -k backup -- backup.sh

  # Same cron line on every machine; the key is derived from the command:
  */5 * * * * dlock -n --auto-key --hold 4m -- /opt/sync.sh

  # Many readers at once, never alongside a writer (flock -s):
  dlock --shared -k config -- render-site.sh

  # At most 3 transcoders across the fleet:
  dlock --limit 3 -k transcode -- ffmpeg -i in.mov out.mp4

  # Say so when the job has to wait its turn:
  dlock --on-queued 'echo deploy queued, $DLOCK_PLACE ahead' -k deploy -- deploy.sh

  # Wait at most 2.5 s, run a shell snippet:
  dlock -w 2.5s -k deploy/web -c 'git pull && systemctl restart web'

  # Who holds a lock, and is the server up? (-o json for a script)
  dlock --inspect -k deploy/web
  dlock --ping

  # Leader election: run the scheduler on one machine, another takes over
  # when it goes away; who leads, and every change:
  dlock elect -k services/scheduler --id \"$(hostname)\" -- scheduler --serve
  dlock leader -k services/scheduler --watch

Environment:
  DLOCK_SERVER      server address, or a cluster's nodes: a:7436,b:7436,c:7436
                    (default 127.0.0.1:7436)
  DLOCK_TOKEN       access token (or --token-file; never on the command line)
  DLOCK_CLIENT_TOKEN_FILE
                    --token-file: a file holding the token; used before DLOCK_TOKEN
  The command gets DLOCK_KEYS (keys, comma-separated) and DLOCK_FENCE (fencing token).";

/// The text after the options in `--help`: examples, then the exit codes
/// from `exit::TABLE`, so the help cannot disagree with what dlock returns.
fn after_help() -> String {
    format!("{EXAMPLES}\n\n{}", crate::exit::help_text())
}

/// Run a command while holding a distributed lock: flock(1) for a fleet.
///
/// dlock takes all keys at once from a dlock server, runs COMMAND (directly,
/// no shell; or `-c STRING` through `sh -c`), and releases the keys when it
/// ends. If the lock is lost while COMMAND runs, dlock stops COMMAND.
/// What `--version` prints after the name: the release, the commit it was
/// built from and the wire protocol it speaks, so an operator can match a
/// client with its servers (`dlock-server --version`, `dlock cluster
/// status`). The protocol is `dlock::PROTOCOL_VERSION` (a test checks).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("DLOCK_COMMIT"),
    "), protocol 2"
);

#[derive(Debug, Parser)]
#[command(name = "dlock", version = VERSION, about, long_about = None, after_help = after_help())]
#[command(
    override_usage = "dlock [OPTIONS] -k KEY... -- COMMAND [ARGS]...\n       \
                            dlock [OPTIONS] -k KEY... -c STRING\n       \
                            dlock --inspect -k KEY...\n       \
                            dlock --ping\n       \
                            dlock elect [OPTIONS] -k KEY [--id NAME] [--once] -- COMMAND [ARGS]...\n       \
                            dlock leader [OPTIONS] -k KEY [--watch]\n       \
                            dlock cluster [OPTIONS] status|add|remove\n       \
                            dlock top [OPTIONS] [-k KEY...]"
)]
pub struct Args {
    /// Server address, or a cluster's nodes separated by commas (any
    /// of them; dlock finds the leader and follows it through a failover).
    #[arg(short, long, env = "DLOCK_SERVER", default_value = dlock::DEFAULT_ADDR, value_name = "HOST:PORT[,...]", value_parser = server_addresses)]
    pub server: String,

    /// Read the access token from this file (the first line that is not
    /// blank or a '#' comment). DLOCK_TOKEN is used when this is not given.
    #[arg(long, env = "DLOCK_CLIENT_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,

    /// Connect with TLS, trusting the CA certificates in this PEM file. The
    /// server's certificate must name the host of --server.
    #[arg(long, env = "DLOCK_TLS_CA", value_name = "PATH")]
    pub tls_ca: Option<PathBuf>,

    /// Client certificate chain (PEM) for a server that requires one
    /// (mutual TLS); with --tls-key and --tls-ca.
    #[arg(long, env = "DLOCK_TLS_CERT", value_name = "PATH", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --tls-cert.
    #[arg(
        long,
        env = "DLOCK_TLS_KEY",
        value_name = "PATH",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,

    /// Key to lock; repeat for several keys, taken atomically.
    #[arg(short, long = "key", value_name = "KEY")]
    pub keys: Vec<String>,

    /// Derive the key from the command line (after PREFIX, default
    /// "auto:"), so the same command on every machine shares one lock.
    #[arg(long, value_name = "PREFIX", num_args = 0..=1, default_missing_value = "auto:")]
    pub auto_key: Option<String>,

    /// Wait at most this long for the lock (e.g. 30s, 2.5s, 500ms); by
    /// default dlock waits without limit.
    #[arg(short, long, value_name = "DURATION", value_parser = duration::parse, conflicts_with = "nonblock")]
    pub wait: Option<Duration>,

    /// Fail at once if the lock is busy.
    #[arg(short, long)]
    pub nonblock: bool,

    /// Take the keys shared (a reader lock): any number of --shared holders
    /// at once, never alongside an exclusive one. A shared request behind a
    /// waiting exclusive one waits. Unlike flock(1), there is no -s: dlock's
    /// -s has always been --server, and reading an old `-s HOST` as
    /// "shared" would run HOST as the command.
    #[arg(long)]
    pub shared: bool,

    /// Take the keys as a semaphore: shared, at most N holders at once.
    /// Everyone taking the key must give the same N.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: Option<u32>,

    /// Run CMD with `sh -c` once the lock request is in line (the keys are
    /// busy; not when the lock is granted at once), then wait for the lock.
    /// CMD runs to its end before the wait, with DLOCK_KEYS and DLOCK_PLACE
    /// (requests ahead of this one) set; the request keeps its place
    /// meanwhile. A failing CMD is reported, and dlock still waits. If dlock
    /// stops waiting first (-w, a signal), CMD and what it started are killed.
    #[arg(long, value_name = "CMD", conflicts_with = "nonblock")]
    pub on_queued: Option<String>,

    /// Run STRING with `sh -c` instead of a command from the arguments.
    #[arg(short, long, value_name = "STRING", conflicts_with = "command_args")]
    pub command: Option<String>,

    /// Take the lock as a lease of this length, renewed while the command
    /// runs, so a short network drop of this machine does not lose it.
    /// At least 100ms.
    #[arg(long, value_name = "DURATION", value_parser = lease)]
    pub lease: Option<Duration>,

    /// Keep the lock at least this long from when it was taken, even if the
    /// command ends sooner (the rest becomes a lease; dlock exits at once).
    #[arg(long, value_name = "DURATION", value_parser = duration::parse_positive)]
    pub hold: Option<Duration>,

    /// Stop the command (SIGTERM, then SIGKILL after --grace) if it runs
    /// longer than this; exit 124.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse_positive)]
    pub max_time: Option<Duration>,

    /// What to do with the command if the lock is lost while it runs, or
    /// is about to be: dlock gives the lock up before the server could hand
    /// it to someone else (see "What dlock guarantees" in the README). dlock
    /// exits 75 after a loss, whatever the action.
    #[arg(long, value_enum, default_value_t = OnLost::Term, value_name = "ACTION")]
    pub on_lost: OnLost,

    /// Time between SIGTERM and SIGKILL when dlock stops the command. When
    /// the lock is in jeopardy, SIGKILL comes sooner if needed, so the
    /// command is gone before the server could hand the lock on.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::parse)]
    pub grace: Duration,

    /// Give the lock back (or leave it as a --hold lease) within this long
    /// after the command ends; if the server does not answer in time, dlock
    /// says so and exits with the command's code anyway.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration::parse_positive)]
    pub release_timeout: Duration,

    /// Exit code when the lock is busy or the wait times out.
    #[arg(short = 'E', long, value_name = "CODE", default_value_t = 1)]
    pub conflict_exit_code: u8,

    /// Give up connecting after this long.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration::parse_positive)]
    pub connect_timeout: Duration,

    /// Say on stderr what dlock waits for, who holds it, and how long it took.
    #[arg(short, long)]
    pub verbose: bool,

    /// Print who holds and who waits for the keys, then exit; without keys,
    /// print the server's counts.
    #[arg(long, conflicts_with_all = ["command", "command_args", "ping"])]
    pub inspect: bool,

    /// How --inspect, --ping and `dlock leader` print: text for people, or
    /// json for scripts (one object; with `dlock leader --watch`, one per
    /// line).
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text, value_name = "FORMAT")]
    pub output: Output,

    /// Check that the server answers, print the round trip, then exit.
    #[arg(long, conflicts_with_all = ["command", "command_args", "keys", "auto_key"])]
    pub ping: bool,

    /// Print a completion script for SHELL and exit (see the README for
    /// where to put it).
    #[arg(long, value_name = "SHELL", value_enum, conflicts_with_all = ["keys", "command", "command_args", "inspect", "ping", "man"])]
    pub completions: Option<clap_complete::Shell>,

    /// Print dlock's man page (roff, section 1) and exit.
    #[arg(long, conflicts_with_all = ["keys", "command", "command_args", "inspect", "ping"])]
    pub man: bool,

    /// The command to run, and its arguments.
    #[arg(trailing_var_arg = true, value_name = "COMMAND")]
    pub command_args: Vec<String>,
}

/// How a report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns and lines for people.
    Text,
    /// JSON, for scripts and `jq`.
    Json,
}

/// Checks the form of every address of a comma-separated list (a cluster's
/// nodes): see [`server_address`].
pub fn server_addresses(s: &str) -> Result<String, String> {
    let list = dlock::Servers::parse(s);
    if list.addrs().is_empty() {
        return Err("expected HOST:PORT, for example 127.0.0.1:7436".into());
    }
    for a in list.addrs() {
        server_address(a).map_err(|e| format!("{a}: {e}"))?;
    }
    Ok(list.to_string())
}

/// Checks the form of a server address: HOST:PORT, with an IPv6 host in
/// brackets. Whether HOST resolves is found out when connecting.
pub fn server_address(s: &str) -> Result<String, String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or("expected HOST:PORT, for example 127.0.0.1:7436")?;
    let bracketed = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    if host.is_empty() || bracketed == Some("") {
        return Err("no host before the port (for example 127.0.0.1:7436)".into());
    }
    if bracketed.is_none() && host.contains(':') {
        return Err("put an IPv6 address in brackets: [::1]:7436".into());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(s.to_string()),
        _ => Err(format!("'{port}' is not a port number (1 to 65535)")),
    }
}

/// The shortest `--lease` dlock takes: below it, dlock's own machinery
/// uses up the lease, not the network. A lease L shorter than 8 s gets a
/// safety margin of L/4 (`dlock::safety::margin`): dlock renews at L/3 and
/// gives the lock up as in jeopardy at 3L/4 unless the renewal was
/// answered, which leaves 5L/12 for dlock, the server and dlock again to
/// run; and the guardian kills COMMAND at 15L/16 unless dlock, which tells
/// it the moved deadline every L/8 but never more often than every 10 ms,
/// has done so by then. At 100ms that is about 40 ms for the renewal (after
/// dlock started the guardian and COMMAND, if the lease was granted at once)
/// and 60 ms, six ticks, for the guardian to hear of it. At 20ms the tick
/// alone outlasts the guardian's 12 ms, and the guardian killed COMMAND
/// nearly every time. A stall of the whole machine longer than 5L/12 still
/// loses any lease; that is what the margin and exit 75 are for.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// Reads `--lease`: a duration of at least [`MIN_LEASE`].
fn lease(s: &str) -> Result<Duration, String> {
    let d = duration::parse_positive(s)?;
    if d < MIN_LEASE {
        return Err(format!(
            "{} is too short to be renewed safely: dlock renews a lease at a third of its \
             length and gives it up a quarter before its end; the minimum is {}",
            duration::format(d),
            duration::format(MIN_LEASE)
        ));
    }
    Ok(d)
}

/// Reaction to a lost lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnLost {
    /// SIGTERM, then SIGKILL after --grace.
    Term,
    /// SIGKILL at once.
    Kill,
    /// Let the command finish; only report the loss (dlock still exits 75).
    Ignore,
}

impl Args {
    /// The argv of the child: `sh -c STRING` or the trailing arguments.
    pub fn argv(&self) -> Vec<String> {
        match &self.command {
            Some(s) => vec!["sh".into(), "-c".into(), s.clone()],
            None => self.command_args.clone(),
        }
    }

    /// The keys to lock: the `-k` keys plus the derived one.
    pub fn all_keys(&self) -> Vec<String> {
        let mut keys = self.keys.clone();
        if let Some(prefix) = &self.auto_key {
            keys.push(auto_key(prefix, &self.argv()));
        }
        keys
    }
}

/// PREFIX followed by the first 128 bits of SHA-256 over the argv joined
/// with NUL: stable across machines and versions, and the same for the same
/// command line only.
pub fn auto_key(prefix: &str, argv: &[String]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for (i, arg) in argv.iter().enumerate() {
        if i > 0 {
            hasher.update([0u8]);
        }
        hasher.update(arg.as_bytes());
    }
    let digest = hasher.finalize();
    let mut key = prefix.to_string();
    for b in digest.iter().take(16) {
        key.push_str(&format!("{b:02x}"));
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_lease_too_short_to_renew_is_refused_with_the_minimum() {
        let e = Args::try_parse_from(["dlock", "--lease", "10ms", "-k", "k", "--", "true"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("too short") && e.contains("100ms"), "{e}");
        let a =
            Args::try_parse_from(["dlock", "--lease", "100ms", "-k", "k", "--", "true"]).unwrap();
        assert_eq!(a.lease, Some(MIN_LEASE));
    }

    #[test]
    fn auto_key_is_stable_and_distinguishes_arguments() {
        let a = auto_key("auto:", &argv(&["backup.sh", "--full"]));
        assert_eq!(a, auto_key("auto:", &argv(&["backup.sh", "--full"])));
        assert_ne!(a, auto_key("auto:", &argv(&["backup.sh --full"])));
        assert_ne!(a, auto_key("auto:", &argv(&["backup.sh", "--fast"])));
        assert!(a.starts_with("auto:") && a.len() == 5 + 32);
    }

    #[test]
    fn server_addresses_are_checked_for_form() {
        for good in ["127.0.0.1:7436", "locks.internal:1", "[::1]:7436"] {
            assert_eq!(server_address(good).as_deref(), Ok(good));
        }
        for bad in [
            "nonsense:port",
            ":99999",
            ":7436",
            "host",
            "::1:7436",
            "h:0",
            "[]:1",
        ] {
            assert!(server_address(bad).is_err(), "{bad}");
        }
        assert_eq!(
            server_addresses("127.0.0.1:1, 127.0.0.2:2").as_deref(),
            Ok("127.0.0.1:1,127.0.0.2:2")
        );
        let bad = server_addresses("127.0.0.1:1,host").unwrap_err();
        assert!(bad.starts_with("host: "), "{bad}");
        assert!(server_addresses(" , ").is_err());
    }

    #[test]
    fn parses_flock_like_lines() {
        let a = Args::try_parse_from([
            "dlock", "-n", "-k", "a", "-k", "b", "--", "echo", "-n", "hi",
        ])
        .unwrap();
        assert!(a.nonblock);
        assert_eq!(a.keys, ["a", "b"]);
        assert_eq!(a.argv(), ["echo", "-n", "hi"]);
        let a = Args::try_parse_from(["dlock", "--auto-key", "-w", "2.5s", "--", "job"]).unwrap();
        assert_eq!(a.auto_key.as_deref(), Some("auto:"));
        assert_eq!(a.wait, Some(Duration::from_millis(2500)));
        assert_eq!(a.all_keys().len(), 1);
        // A ping locks nothing: a key with it would be silently ignored.
        for extra in [["-k", "x"], ["--auto-key", "--"]] {
            let e = Args::try_parse_from(["dlock", "--ping", extra[0], extra[1]]).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{extra:?}"
            );
        }
        let a = Args::try_parse_from(["dlock", "--auto-key=cron/", "-c", "x"]).unwrap();
        assert!(a.all_keys()[0].starts_with("cron/"));
        assert!(Args::try_parse_from(["dlock", "-n", "-w", "1s", "-k", "a", "--", "x"]).is_err());
        assert!(Args::try_parse_from(["dlock", "-k", "a", "-c", "x", "--", "y"]).is_err());
    }

    #[test]
    fn shared_and_limit_parse_and_s_stays_server() {
        let a = Args::try_parse_from(["dlock", "--shared", "-k", "a", "--", "x"]).unwrap();
        assert!(a.shared && a.limit.is_none());
        let a = Args::try_parse_from(["dlock", "--limit", "3", "-k", "a", "--", "x"]).unwrap();
        assert_eq!(a.limit, Some(3));
        assert!(Args::try_parse_from(["dlock", "--limit", "0", "-k", "a", "--", "x"]).is_err());
        // flock's `-s` is not shared here: it still names the server.
        let a = Args::try_parse_from(["dlock", "-s", "h:1", "-k", "a", "--", "x"]).unwrap();
        assert_eq!(a.server, "h:1");
        assert!(!a.shared);
        assert!(Args::try_parse_from(["dlock", "-s", "-k", "a", "--", "x"]).is_err());
    }
}
