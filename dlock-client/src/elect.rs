//! `dlock elect -k KEY [--id NAME] [--once] -- COMMAND`: run COMMAND while
//! this process leads the election on KEY, campaign again when leadership
//! is lost.
//!
//! Campaigning is dlock's normal path with the identity as the hold's value
//! (see `run::run_locked`): the wait in line, the keeping of the lock, the
//! guardian, the signals and the stopping of COMMAND when the lock is lost
//! are the same. Only the end differs: a loss (exit 75 of the normal path)
//! starts the next campaign, unless `--once`.

use crate::cli::Args;
use crate::exit::{self, Failure};
use crate::say;
use clap::Parser;

const AFTER_HELP: &str = "\
Leadership is the lock on KEY, held by this process's connection (on a
cluster: its session) or, with --lease, a lease renewed while COMMAND runs;
its value is the --id, which `dlock leader -k KEY` prints. Campaigners wait in
line, first come first served. When leadership is lost (the server stopped
answering, the connection broke, the lease ran out), COMMAND is stopped as
dlock stops a command whose lock is lost (--on-lost, --grace), and dlock
campaigns again. When COMMAND exits on its own, dlock resigns and exits with
its code.

A server that cannot be reached when dlock starts ends it (69). Once it was
reached, a server that goes away (a restart, a cluster without a leader) is
waited for: dlock tries again after a pause doubling from 100 ms to 4 s,
says so once, and campaigns again when the server answers. A refusal that
trying again cannot mend (access denied, TLS) still ends it.

Examples:
  # Run the scheduler on one machine of the fleet; another takes over when it
  # goes away:
  dlock elect -k services/scheduler --id \"$(hostname)\" -- scheduler --serve

  # Exit instead of campaigning again once leadership is lost:
  dlock elect --once -k services/scheduler -- scheduler --serve

Exit codes: as dlock's (dlock --help), and:
  N    COMMAND exited on its own with N; dlock resigned
  75   --once: leadership was lost while COMMAND ran; COMMAND was stopped";

/// Run COMMAND while this process is the elected leader of KEY.
#[derive(Debug, Parser)]
#[command(name = "dlock elect", version = crate::cli::VERSION, after_help = AFTER_HELP)]
#[command(
    override_usage = "dlock elect [OPTIONS] -k KEY [--id NAME] [--once] -- COMMAND [ARGS]..."
)]
pub struct ElectArgs {
    /// The identity this process campaigns with, shown to observers
    /// (`dlock leader`); at most 1024 bytes. Default: HOSTNAME:PID.
    #[arg(long, value_name = "NAME")]
    pub id: Option<String>,

    /// Exit (75) when leadership is lost instead of campaigning again.
    #[arg(long)]
    pub once: bool,

    #[command(flatten)]
    pub run: Args,
}

/// Campaigns and runs COMMAND while leader, again and again.
///
/// # Errors
/// A [`Failure`] with its exit code and message.
pub async fn run(e: ElectArgs) -> Result<u8, Failure> {
    let args = &e.run;
    check(args)?;
    let keys = args.all_keys();
    let argv = crate::run::command_line(args, &keys)?;
    let options = crate::connect::client_options(args)?;
    let id = e.id.clone().unwrap_or_else(default_id);
    if id.len() > dlock::MAX_VALUE_LEN {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "--id is {} bytes long; the limit is {}",
                id.len(),
                dlock::MAX_VALUE_LEN
            ),
        ));
    }
    let mut signals = crate::run::install_signals()?;
    // The first connect fails at once: a server never reached is most
    // likely a wrong address or one not started, which the user must see.
    // Once reached, a server away is an outage to wait out.
    let mut client = crate::connect::connect(&args.server, options.clone()).await?;
    let mut pacer = crate::connect::Pacer::default();
    loop {
        if args.verbose {
            say!("campaigning for {} as {id:?}", crate::say::keys(&keys));
        }
        let campaign = crate::run::run_locked(
            args,
            options.clone(),
            client,
            &keys,
            &argv,
            id.as_bytes(),
            &mut signals,
        )
        .await;
        // A leadership lost campaigns again at once; a campaign that
        // failed before it led is paced (it may fail again at once).
        let paced = match campaign {
            Ok(code) if code != exit::LOCK_LOST || e.once => return Ok(code),
            Ok(_) => {
                say!(
                    "leadership of {} lost; campaigning again",
                    crate::say::keys(&keys)
                );
                false
            }
            // Lost while waiting in line (the server restarts, a cluster
            // without a leader): this dlock never led, so not even --once
            // ends here.
            Err(f) if f.transient => {
                say!("{}; campaigning again", f.message);
                true
            }
            Err(f) => return Err(f),
        };
        let again = async {
            if paced {
                pacer.failed().await;
            }
            crate::connect::reconnect(&args.server, &options).await
        };
        client = tokio::select! {
            c = again => c?,
            sig = crate::run::interrupt(&mut signals) => {
                say!(
                    "interrupted by {} while waiting for the server; command not run",
                    crate::signals::name(sig)
                );
                return Ok(128 + sig as u8);
            }
        };
    }
}

/// Refuses what does not make sense for an election.
fn check(args: &Args) -> Result<(), Failure> {
    let usage = |what: &str| Err(Failure::new(exit::USAGE, format!("dlock elect: {what}")));
    if args.keys.len() != 1 || args.auto_key.is_some() {
        return usage("name exactly one key with -k KEY");
    }
    if args.shared || args.limit.is_some() {
        return usage("leadership is exclusive: --shared and --limit do not apply");
    }
    if args.nonblock || args.wait.is_some() || args.hold.is_some() {
        return usage("-n, -w and --hold do not apply: a campaign waits in line until it leads");
    }
    if args.inspect || args.ping {
        return usage("--inspect and --ping do not apply; see `dlock leader`");
    }
    Ok(())
}

/// HOSTNAME:PID, so that two campaigners on one machine differ.
fn default_id() -> String {
    let uname = rustix::system::uname();
    let host = match uname.nodename().to_string_lossy() {
        h if h.is_empty() => "localhost".to_string(),
        h => h.into_owned(),
    };
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elect_parses_its_own_flags_and_the_command() {
        let e = ElectArgs::try_parse_from([
            "elect", "--once", "--id", "a", "-k", "svc", "--", "run", "-x",
        ])
        .unwrap();
        assert!(e.once);
        assert_eq!(e.id.as_deref(), Some("a"));
        assert_eq!(e.run.keys, ["svc"]);
        assert_eq!(e.run.argv(), ["run", "-x"]);
        assert!(check(&e.run).is_ok());
        let two = ElectArgs::try_parse_from(["elect", "-k", "a", "-k", "b", "--", "x"]).unwrap();
        assert!(check(&two.run).is_err());
        let shared =
            ElectArgs::try_parse_from(["elect", "--shared", "-k", "a", "--", "x"]).unwrap();
        assert!(check(&shared.run).is_err());
        assert!(default_id().contains(':'));
    }
}
