//! A path the checker found, printed as a numbered timeline: each step's
//! actor, what it sent, delivered or lost, the clock, and what each client
//! believes after it. A reader follows a counterexample without knowing
//! stateright's types.

use std::fmt::Write as _;

use crate::client::Client;
use crate::cluster::Role;
use crate::model::{Action, SessionModel, State};
use stateright::Path;

/// The name the timeline gives client `id`: A, B, C…
pub fn client_name(id: u8) -> char {
    char::from(b'A'.saturating_add(id))
}

/// `path` as a timeline, one numbered line per step, the start as step 0.
pub fn timeline(model: &SessionModel, path: Path<State, Action>) -> String {
    let steps = path.into_vec();
    let mut out = String::new();
    let mut before: Option<(&State, Action)> = None;
    for (n, (state, action)) in steps.iter().enumerate() {
        let (actor, event) = match before {
            None => ("start".to_string(), start(state)),
            Some((last, action)) => describe(last, action, state),
        };
        let _ = write!(out, "{n:>3}  {actor:<9} {event:<62} | t={}", state.now);
        for (id, c) in (0u8..).zip(&state.clients) {
            let _ = write!(out, " | {}: {}", client_name(id), belief(model, state, c));
        }
        if model.believers(state) > 1 {
            out.push_str("  <-- two believers");
        }
        out.push('\n');
        before = action.map(|a| (state, a));
    }
    if let Some((last, _)) = steps.last() {
        in_flight(&mut out, last);
    }
    out
}

/// What is still on the wire at the end: an answer never read is, to its
/// client, an answer lost.
fn in_flight(out: &mut String, state: &State) {
    for (id, c) in (0u8..).zip(&state.clients) {
        for r in &c.conn.out {
            let _ = writeln!(
                out,
                "     in flight to n{}: {}'s {r}",
                c.conn.node,
                client_name(id)
            );
        }
        for a in &c.conn.back {
            let _ = writeln!(out, "     in flight to {}: {a}", client_name(id));
        }
    }
}

fn start(state: &State) -> String {
    format!(
        "n0 leads term {}; sessions open, TTL from 0",
        state.cluster.term
    )
}

fn belief(model: &SessionModel, state: &State, c: &Client) -> String {
    match (c.held, c.jeopardy_at(&model.cfg)) {
        (Some(held), Some(until)) if c.believes(state.now, &model.cfg) => {
            format!("holds fence {} until {until}", held.fence)
        }
        (Some(_), _) => "in jeopardy".to_string(),
        _ if c.ended => "session ended".to_string(),
        _ => "not held".to_string(),
    }
}

fn role(state: &State, node: u8) -> &'static str {
    match state.cluster.role(node) {
        Role::Leader => "leader",
        Role::Deposed => "deposed",
        Role::Follower => "follower",
    }
}

/// The actor and the event of the step from `last` by `action` to `next`.
fn describe(last: &State, action: Action, next: &State) -> (String, String) {
    let client = |id: u8| last.clients.get(usize::from(id));
    let name = |id: u8| format!("client {}", client_name(id));
    match action {
        Action::Tick => ("clock".into(), format!("time passes to {}", next.now)),
        Action::Elect { node } => (
            format!("n{node}"),
            format!("wins the election for term {}", next.cluster.term),
        ),
        Action::Learn { node } => (format!("n{node}"), "learns it was deposed".into()),
        Action::Send { client: id, kind } => {
            let node = client(id).map_or(0, |c| c.conn.node);
            (name(id), format!("sends {kind} to n{node}"))
        }
        Action::Deliver { client: id } => {
            let Some(c) = client(id) else {
                return (name(id), "?".into());
            };
            let node = c.conn.node;
            let answer = next
                .clients
                .get(usize::from(id))
                .and_then(|n| n.conn.back.last());
            let what = match answer {
                Some(a) => format!("{:?}{}", a.status, fence(a.fence)),
                None => "?".into(),
            };
            let req = c
                .conn
                .out
                .first()
                .map_or("?".into(), |r| r.kind.to_string());
            (
                format!("n{node}"),
                format!(
                    "({}) {}'s {req}: answers {what}",
                    role(last, node),
                    client_name(id)
                ),
            )
        }
        Action::Receive { client: id } => {
            let Some(c) = client(id) else {
                return (name(id), "?".into());
            };
            let mut event = c
                .conn
                .back
                .first()
                .map_or("?".into(), |a| format!("reads {a}"));
            let moved = next.clients.get(usize::from(id)).map(|n| n.conn.node);
            if moved != Some(c.conn.node) {
                let _ = write!(event, "; goes to n{}", moved.unwrap_or(0));
            }
            (name(id), event)
        }
        Action::DropRequest { client: id } => {
            let req = client(id)
                .and_then(|c| c.conn.out.first())
                .map_or("?".into(), |r| r.kind.to_string());
            (
                "network".into(),
                format!("loses {}'s {req}", client_name(id)),
            )
        }
        Action::DropAnswer { client: id } => {
            let answer = client(id)
                .and_then(|c| c.conn.back.first())
                .map_or("?".into(), |a| {
                    format!("{:?}{} to {}", a.status, fence(a.fence), a.to.kind)
                });
            (
                "network".into(),
                format!("loses the answer {answer} for {}", client_name(id)),
            )
        }
        Action::Reset { client: id } => {
            let from = client(id).map_or(0, |c| c.conn.node);
            let to = next.clients.get(usize::from(id)).map_or(0, |c| c.conn.node);
            (
                name(id),
                format!("connection to n{from} reset; connects to n{to}"),
            )
        }
    }
}

fn fence(fence: Option<u64>) -> String {
    fence.map_or(String::new(), |f| format!(" fence {f}"))
}
