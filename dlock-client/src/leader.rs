//! `dlock leader -k KEY [--watch]`: who leads the election on KEY (its
//! identity, fencing token and since when), and with `--watch` every
//! change, pushed by the server, until interrupted.

use crate::cli::Args;
use crate::exit::{self, Failure};
use crate::say;
use clap::Parser;
use dlock::{Client, ClientOptions, Election, Leader};
use std::time::{SystemTime, UNIX_EPOCH};

const AFTER_HELP: &str = "\
Output, one line per state:
  leader ID fence N since 2026-11-23T22:40:01.250Z
  no leader
ID is the leader's --id (dlock elect), printed as text, or as 0x-hex when it
is not printable. With --watch, a line for the current state, then one for
every change (a new leader, a new ID), until SIGINT or SIGTERM. When the
connection is lost (a server restarts), --watch says so on stderr, connects
again (trying after a pause doubling from 100 ms to 4 s) and goes on, with a
line for the state it finds if that differs from the last one printed.

Exit codes:
  0    a leader was printed; with --watch, interrupted
  1    there is no leader (change with -E)
  64   usage error
  69   cannot reach the server, or (without --watch) the connection was lost
  70   the server refused the request
  77   access denied";

/// Print the leader of an election, or follow it.
#[derive(Debug, Parser)]
#[command(name = "dlock leader", version = crate::cli::VERSION, after_help = AFTER_HELP)]
#[command(override_usage = "dlock leader [OPTIONS] -k KEY [--watch]")]
pub struct LeaderArgs {
    /// Print every change of leader until interrupted.
    #[arg(long)]
    pub watch: bool,

    #[command(flatten)]
    pub run: Args,
}

/// Prints the leader, or follows it with `--watch`.
///
/// # Errors
/// A [`Failure`] with its exit code and message.
pub async fn run(l: LeaderArgs) -> Result<u8, Failure> {
    let args = &l.run;
    if args.keys.len() != 1 {
        return Err(Failure::new(
            exit::USAGE,
            "dlock leader: name exactly one key with -k KEY",
        ));
    }
    let options = crate::connect::client_options(args)?;
    // The first connect fails at once (a wrong address, a server not
    // started); once following, a lost server is waited for.
    let client = crate::connect::connect(&args.server, options.clone()).await?;
    let failed = |e| exit::from_client_error(e, &args.server);
    let election = Election::new(&client, args.keys[0].as_str());
    if !l.watch {
        let leader = election.leader().await.map_err(failed)?;
        crate::stdout::print(format!("{}\n", report(args.output, leader.as_ref())))?;
        return Ok(if leader.is_some() {
            0
        } else {
            args.conflict_exit_code
        });
    }
    watch(args, &options, client).await
}

/// `--watch`: follows the leader through `client`, and after a lost
/// connection through a new one, until SIGINT or SIGTERM.
async fn watch(args: &Args, options: &ClientOptions, client: Client) -> Result<u8, Failure> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot watch for SIGTERM: {e}")))?;
    let mut client = client;
    let mut last = None;
    let mut pacer = crate::connect::Pacer::default();
    loop {
        let lost = tokio::select! {
            lost = follow(args, &client, &mut last) => lost?,
            _ = tokio::signal::ctrl_c() => return Ok(0),
            _ = term.recv() => return Ok(0),
        };
        say!("{}; reconnecting", lost.message);
        let again = async {
            pacer.failed().await;
            crate::connect::reconnect(&args.server, options).await
        };
        client = tokio::select! {
            c = again => c?,
            _ = tokio::signal::ctrl_c() => return Ok(0),
            _ = term.recv() => return Ok(0),
        };
    }
}

/// Prints the state, then every change, through `client` until its
/// connection is lost: returns why, for the caller to reconnect. A state
/// the same as `last`, the line printed before, is not printed again (the
/// state found on a new connection, when nothing changed meanwhile).
///
/// # Errors
/// A failure that reconnecting cannot mend, or stdout gone.
async fn follow(
    args: &Args,
    client: &Client,
    last: &mut Option<String>,
) -> Result<Failure, Failure> {
    // Why following ended: to reconnect after, or to end dlock with.
    let lost = |e: dlock::Error| match exit::from_client_error(e, &args.server) {
        f if f.transient => Ok(f),
        f => Err(f),
    };
    let election = Election::new(client, args.keys[0].as_str());
    let mut changes = match election.observe().await {
        Ok(changes) => changes,
        Err(e) => return lost(e),
    };
    loop {
        let line = report(args.output, changes.borrow_and_update().as_ref());
        if last.as_ref() != Some(&line) {
            crate::stdout::print(format!("{line}\n"))?;
            *last = Some(line);
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            reason = client.closed() => return lost(reason.into()),
        }
    }
    // The observer ends only with its connection.
    if client.is_closed() {
        return lost(client.closed().await.into());
    }
    Err(Failure::new(
        exit::UNAVAILABLE,
        "stopped following the leader",
    ))
}

/// One line for a state, as `output` asks: text (see [`line()`]), or a JSON
/// object whose `leader` is null when there is none.
fn report(output: crate::cli::Output, leader: Option<&Leader>) -> String {
    match output {
        crate::cli::Output::Text => line(leader),
        crate::cli::Output::Json => {
            let leader = leader.map(|l| {
                serde_json::json!({
                    "id": std::str::from_utf8(&l.value).ok(),
                    "id_hex": l.value.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                    "fence": l.fence,
                    "since": rfc3339(l.since),
                })
            });
            serde_json::json!({ "leader": leader }).to_string()
        }
    }
}

/// One line for a state: `leader ID fence N since TIME` or `no leader`.
fn line(leader: Option<&Leader>) -> String {
    match leader {
        None => "no leader".to_string(),
        Some(l) => format!(
            "leader {} fence {} since {}",
            printable(&l.value),
            l.fence,
            rfc3339(l.since)
        ),
    }
}

/// `value` as text when it is UTF-8 without spaces or control characters
/// (so a line splits into words as documented), else as 0x-hex; `-` when
/// empty.
pub fn printable(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok("") => "-".to_string(),
        Ok(s) if !s.chars().any(|c| c.is_control() || c.is_whitespace()) => s.to_string(),
        _ => {
            let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}")
        }
    }
}

/// `t` in UTC as RFC 3339 with milliseconds. Times come from the
/// server's clock: one before the epoch reads as the epoch, and one
/// humantime cannot write (past the year 9999) as seconds since the epoch,
/// rather than a panic.
fn rfc3339(t: SystemTime) -> String {
    use std::fmt::Write;
    let t = t.max(UNIX_EPOCH);
    let mut out = String::new();
    match write!(out, "{}", humantime::format_rfc3339_millis(t)) {
        Ok(()) => out,
        Err(_) => format!(
            "@{}",
            t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn lines_name_the_leader_or_say_there_is_none() {
        assert_eq!(line(None), "no leader");
        let l = Leader {
            value: b"web-1:42".to_vec(),
            fence: 7,
            since: UNIX_EPOCH + Duration::from_millis(1_795_473_601_250),
        };
        assert_eq!(
            line(Some(&l)),
            "leader web-1:42 fence 7 since 2026-11-23T22:40:01.250Z"
        );
        assert_eq!(printable(b"a b"), "0x612062");
        assert_eq!(printable(b""), "-");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
        let year_10000 = UNIX_EPOCH + Duration::from_secs(253_402_300_800);
        assert_eq!(rfc3339(year_10000), "@253402300800");
    }

    #[test]
    fn json_reports_the_leader_or_null() {
        use crate::cli::Output::Json;
        assert_eq!(report(Json, None), r#"{"leader":null}"#);
        let l = Leader {
            value: b"web-1".to_vec(),
            fence: 7,
            since: UNIX_EPOCH + Duration::from_millis(1_795_473_601_250),
        };
        let v: serde_json::Value = serde_json::from_str(&report(Json, Some(&l))).unwrap();
        assert_eq!(v["leader"]["id"], "web-1");
        assert_eq!(v["leader"]["id_hex"], "7765622d31");
        assert_eq!(v["leader"]["fence"], 7);
        assert_eq!(v["leader"]["since"], "2026-11-23T22:40:01.250Z");
    }
}
