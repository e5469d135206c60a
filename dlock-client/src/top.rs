//! `dlock top`: a live view of a server or cluster, refreshed about once a
//! second: the busiest keys (holders, fences, waiters, hold and wait
//! times), grants and hand-offs per second, connections and sessions, and
//! on a cluster each node's role, term and lag. Quits on `q`, Esc or
//! Ctrl-C, and on SIGINT, SIGTERM or SIGHUP.

mod sample;
mod screen;

use crate::cli::Output;
use crate::connect::Connection;
use crate::exit::{self, Failure};
use clap::Parser;
use crossterm::event::{Event, EventStream, KeyCode, KeyEvent, KeyModifiers};
use futures_util::StreamExt;
use ratatui::DefaultTerminal;
use sample::{Sample, Sampler};
use std::io::IsTerminal;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;

const AFTER_HELP: &str = "\
The view, refreshed every --interval:
  the server (on a cluster, the leader) and the counts: connections,
  sessions, held keys, waiting requests, grants and hand-offs per second;
  on a cluster, each node's role, term, applied index, lag and version;
  the busiest keys: the most waiters first, then held longest (or, with
  -k, the keys named), with state, fencing token, holder, how long held,
  lease left, waiters and the longest wait.
Keys: q, Esc or Ctrl-C quits.

Exit codes:
  0    quit
  64   usage error, or not on a terminal
  69   cannot reach the server
  70   the server refused the request (shutting down, or another refusal),
       or the terminal could not be used
  77   access denied";

/// Watch a dlock server or cluster live.
#[derive(Debug, Parser)]
#[command(name = "dlock top", version = crate::cli::VERSION, after_help = AFTER_HELP)]
#[command(override_usage = "dlock top [OPTIONS] [-k KEY...] [--interval DURATION]")]
pub struct TopArgs {
    /// How often the view is refreshed (at least 100ms).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = dlock::duration::parse_positive)]
    pub interval: Duration,

    /// Show these keys instead of the busiest ones.
    #[arg(short, long = "key", value_name = "KEY")]
    pub keys: Vec<String>,

    #[command(flatten)]
    pub conn: Connection,
}

/// Draws until the user quits.
///
/// # Errors
/// A [`Failure`] with its exit code and message.
pub async fn run(top: TopArgs) -> Result<u8, Failure> {
    if top.interval < Duration::from_millis(100) {
        return Err(Failure::new(
            exit::USAGE,
            "dlock top: --interval is at least 100ms",
        ));
    }
    if top.conn.output == Output::Json || !std::io::stdout().is_terminal() {
        return Err(Failure::new(
            exit::USAGE,
            "dlock top draws on a terminal; for a script, use dlock --inspect -o json",
        ));
    }
    let server = &top.conn.server;
    let options = top.conn.client_options()?;
    let client = crate::connect::connect(server, options.clone()).await?;
    // Refused tokens show at once, before the screen is taken over.
    client
        .stats()
        .await
        .map_err(|e| exit::from_client_error(e, server))?;
    let sampler = Sampler::new(client, options, top.keys);
    let quit = Quit::install()?;
    let mut terminal = ratatui::try_init()
        .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot use the terminal: {e}")))?;
    let drawn = view(&mut terminal, sampler, top.interval, quit).await;
    ratatui::restore();
    drawn.map(|()| 0)
}

/// Refreshes and draws until a quit key or signal.
async fn view(
    terminal: &mut DefaultTerminal,
    mut sampler: Sampler,
    every: Duration,
    mut quit: Quit,
) -> Result<(), Failure> {
    let broken = |e: std::io::Error| Failure::new(exit::SOFTWARE, format!("terminal: {e}"));
    let mut keys = EventStream::new();
    let mut shown = Sample::default();
    let mut next = Instant::now();
    loop {
        terminal
            .draw(|f| screen::draw(f, &shown, every))
            .map_err(broken)?;
        let height = terminal.size().map_err(broken)?.height;
        let rows = screen::key_rows(height, &shown);
        // A refresh that a key or a resize interrupts starts again at
        // once, so the view never waits on a slow server to quit.
        let refresh = async {
            tokio::time::sleep_until(next).await;
            sampler.sample(rows).await
        };
        tokio::select! {
            s = refresh => {
                shown = s;
                next = Instant::now() + every;
            }
            event = keys.next() => match event {
                Some(Ok(Event::Key(k))) if quits(k) => return Ok(()),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(broken(e)),
                None => return Ok(()),
            },
            () = quit.signalled() => return Ok(()),
        }
    }
}

/// q, Esc and Ctrl-C (which a terminal in raw mode sends as a key).
fn quits(k: KeyEvent) -> bool {
    match k.code {
        KeyCode::Char('q') | KeyCode::Esc => true,
        KeyCode::Char('c') => k.modifiers.contains(KeyModifiers::CONTROL),
        _ => false,
    }
}

/// The signals that end the view as `q` does, so the terminal is always
/// given back as it was.
struct Quit {
    signals: [tokio::signal::unix::Signal; 3],
}

impl Quit {
    fn install() -> Result<Quit, Failure> {
        let on = |kind| {
            signal(kind)
                .map_err(|e| Failure::new(exit::SOFTWARE, format!("cannot watch signals: {e}")))
        };
        Ok(Quit {
            signals: [
                on(SignalKind::interrupt())?,
                on(SignalKind::terminate())?,
                on(SignalKind::hangup())?,
            ],
        })
    }

    async fn signalled(&mut self) {
        let [int, term, hup] = &mut self.signals;
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q_esc_and_ctrl_c_quit_and_nothing_else_does() {
        let key = |code, modifiers| KeyEvent::new(code, modifiers);
        assert!(quits(key(KeyCode::Char('q'), KeyModifiers::NONE)));
        assert!(quits(key(KeyCode::Esc, KeyModifiers::NONE)));
        assert!(quits(key(KeyCode::Char('c'), KeyModifiers::CONTROL)));
        assert!(!quits(key(KeyCode::Char('c'), KeyModifiers::NONE)));
        assert!(!quits(key(KeyCode::Char('x'), KeyModifiers::NONE)));
    }
}
