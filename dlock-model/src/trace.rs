//! A path the checker found, printed as a numbered timeline: each step's
//! actor, what it sent, delivered or lost, the servers' time and the
//! clients' clocks, and what each client believes after it. A reader follows a counterexample without knowing
//! stateright's types.

use std::fmt::Write as _;

use crate::client::Client;
use crate::cluster::Role;
use crate::model::{Action, SessionModel, State};
use crate::tick::Tick;
use crate::{ownership, replication};
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
            Some((last, action)) => {
                let (actor, mut event) = describe(last, action, state);
                event.push_str(&decided(last, state));
                (actor, event)
            }
        };
        // The servers' time, then the clients' clocks (one reading: they
        // drift alike), then each client's belief by its clock.
        let clock = model.clock(state.now);
        let _ = write!(
            out,
            "{n:>3}  {actor:<9} {event:<62} | t={} clients {clock}",
            state.now
        );
        for (id, c) in (0u8..).zip(&state.clients) {
            let _ = write!(out, " | {}: {}", client_name(id), belief(model, clock, c));
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
        let Some(conn) = &c.conn else { continue };
        for r in &conn.out {
            let _ = writeln!(
                out,
                "     in flight to n{}: {}'s {r}",
                conn.node,
                client_name(id)
            );
        }
        for a in &conn.back {
            let _ = writeln!(out, "     in flight to {}: {a}", client_name(id));
        }
        if let Some(p) = conn.parked {
            let _ = writeln!(
                out,
                "     waiting at n{} ({}): {}'s {} (request {})",
                conn.node,
                role(state, conn.node),
                client_name(id),
                p.req,
                p.ticket
            );
        }
    }
}

/// What the step decided for requests waiting in line (the table's
/// grants to them), and the requests waiting at nodes that it answered: a
/// grant or a timeout, a node that learned it no longer leads.
fn decided(last: &State, next: &State) -> String {
    let mut out = String::new();
    for fence in next
        .cluster
        .waited_grants
        .iter()
        .skip(last.cluster.waited_grants.len())
    {
        let _ = write!(out, "; the table grants the waiting request fence {fence}");
    }
    for (id, (before, after)) in (0u8..).zip(last.clients.iter().zip(&next.clients)) {
        let (Some(b), Some(a)) = (&before.conn, &after.conn) else {
            continue;
        };
        let Some(p) = b.parked else { continue };
        if a.parked.is_some() || b.id != a.id {
            continue;
        }
        if let Some(answer) = a.back.iter().rev().find(|x| x.to == p.req) {
            let _ = write!(
                out,
                "; n{} answers {}'s waiting {}: {:?}{}",
                a.node,
                client_name(id),
                p.req.kind,
                answer.status,
                fence(answer.fence)
            );
        }
    }
    out
}

fn start(state: &State) -> String {
    format!(
        "n0 leads term {}; sessions open, TTL from 0",
        state.cluster.term
    )
}

fn belief(model: &SessionModel, clock: Tick, c: &Client) -> String {
    match (c.held, c.jeopardy_at(&model.cfg)) {
        (Some(held), Some(until)) if c.believes(clock, &model.cfg) => {
            format!("holds fence {} until {until}", held.fence)
        }
        (Some(_), _) => "in jeopardy".to_string(),
        _ if c.ended => "session ended".to_string(),
        _ if c.wait.is_some() => "waiting".to_string(),
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

/// " #seq" for a request numbered in its session; nothing for one that is not.
fn seq_mark(seq: u8) -> String {
    if seq == 0 {
        String::new()
    } else {
        format!(" #{seq}")
    }
}

/// The actor and the event of the step from `last` by `action` to `next`.
fn describe(last: &State, action: Action, next: &State) -> (String, String) {
    let client = |id: u8| last.clients.get(usize::from(id));
    let conn = |id: u8| client(id).and_then(|c| c.conn.as_ref());
    let node_of = |id: u8| conn(id).map_or("?".to_string(), |c| format!("n{}", c.node));
    let name = |id: u8| format!("client {}", client_name(id));
    // The answer a node's step put on the client's connection, or the
    // request it parked there to answer later.
    let answered = |id: u8| {
        let conn = next
            .clients
            .get(usize::from(id))
            .and_then(|n| n.conn.as_ref());
        if let Some(p) = conn.and_then(|c| c.parked) {
            return format!("waits in line (request {})", p.ticket);
        }
        conn.and_then(|n| n.back.last()).map_or("?".into(), |a| {
            let ticket = a.ticket.map_or(String::new(), |t| format!(" ticket {t}"));
            format!("{:?}{}{ticket}", a.status, fence(a.fence))
        })
    };
    match action {
        Action::Tick => ("clock".into(), format!("time passes to {}", next.now)),
        Action::Elect { node } => (
            format!("n{node}"),
            format!("wins the election for term {}", next.cluster.term),
        ),
        Action::Learn { node } => (format!("n{node}"), "learns it was deposed".into()),
        Action::Pause { node } => (
            format!("n{node}"),
            "(leader) pauses: it reads and answers nothing more".into(),
        ),
        Action::BreakOff { client: id } => (
            name(id),
            format!(
                "probe finds {} silent: breaks off (a reset) to resume elsewhere",
                node_of(id)
            ),
        ),
        Action::Advance => {
            let leader = (0..u8::try_from(next.cluster.leads.len()).unwrap_or(0))
                .find(|&n| next.cluster.role(n) == Role::Leader)
                .map_or("?".to_string(), |n| format!("n{n}"));
            let at = |s: &State| dlock_server::table::Time::from_micros(s.now.0 * 1_000);
            let holder = |s: &State| s.cluster.table.holder(at(s)).map(|(_, f)| f);
            let what = match (holder(last), holder(next)) {
                (Some(_), None) => ": the lease ends, the key is free".to_string(),
                (Some(a), Some(b)) if a != b => {
                    format!(": the lease ends, the key passes to fence {b}")
                }
                _ => String::new(),
            };
            (
                leader,
                format!(
                    "(leader) its timer advances the table to {}{what}",
                    next.now
                ),
            )
        }
        Action::Send { client: id, kind } => {
            let seq = next
                .clients
                .get(usize::from(id))
                .and_then(|c| c.pending.last())
                .map_or(0, |r| r.seq);
            let num = seq_mark(seq);
            (name(id), format!("sends {kind}{num} to {}", node_of(id)))
        }
        Action::Deliver { client: id } => {
            let Some(c) = conn(id) else {
                return (name(id), "?".into());
            };
            let node = c.node;
            let what = answered(id);
            let req = c
                .out
                .first()
                .map_or("?".into(), |r| format!("{}{}", r.kind, seq_mark(r.seq)));
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
            let Some(c) = conn(id) else {
                return (name(id), "?".into());
            };
            let mut event = c.back.first().map_or("?".into(), |a| format!("reads {a}"));
            let after = next.clients.get(usize::from(id));
            match after.and_then(|n| n.conn.as_ref()) {
                None => event.push_str("; resets the connection"),
                Some(n) if n.out.len() > c.out.len() => {
                    let _ = write!(
                        event,
                        "; sends again {} unanswered",
                        n.out.len() - c.out.len()
                    );
                }
                Some(_) => {}
            }
            (name(id), event)
        }
        Action::DeliverUncommitted { client: id, kept } => {
            let Some(c) = conn(id) else {
                return (name(id), "?".into());
            };
            let what = answered(id);
            let req = c.out.first().map_or("?".into(), |r| r.kind.to_string());
            (
                format!("n{}", c.node),
                format!(
                    "(leader) applies {}'s {req}, deposed before it knows a majority has it \
                     (n{} wins term {}, {}): answers {what}",
                    client_name(id),
                    (c.node + 1) % u8::try_from(next.cluster.leads.len()).unwrap_or(1).max(1),
                    next.cluster.term,
                    if kept { "with it" } else { "without it" }
                ),
            )
        }
        Action::DeliverLate { client: id } => {
            let Some(end) = client(id).and_then(|c| c.closing.first()) else {
                return ("?".into(), "?".into());
            };
            let req = end.out.first().map_or("?".into(), |r| r.to_string());
            (
                format!("n{}", end.node),
                format!(
                    "({}) reads {}'s {req} late, on ended connection {}",
                    role(last, end.node),
                    client_name(id),
                    end.conn
                ),
            )
        }
        Action::Reset { client: id } => (
            "network".into(),
            format!("resets {}'s connection to {}", client_name(id), node_of(id)),
        ),
        Action::Abandon { client: id } => {
            let how = next
                .clients
                .get(usize::from(id))
                .and_then(|c| c.closing.last())
                .map_or("?".into(), |e| e.how.to_string());
            (
                name(id),
                format!("gives up resuming at {}: closes it with {how}", node_of(id)),
            )
        }
        Action::Connect { client: id, node } => {
            let what = if client(id).is_some_and(|c| c.session.is_some()) {
                "; sends Resume"
            } else {
                ""
            };
            (name(id), format!("connects to n{node}{what}"))
        }
        Action::End { client: id } => {
            let Some(end) = client(id).and_then(|c| c.closing.first()) else {
                return ("?".into(), "?".into());
            };
            let held = |s: &State| {
                s.cluster
                    .table
                    .holder(dlock_server::table::Time::from_micros(s.now.0 * 1_000))
            };
            let freed = if held(last).is_some() && held(next).is_none() {
                ": the key is free"
            } else {
                ""
            };
            (
                format!("n{}", end.node),
                format!(
                    "({}) reads {}'s {} of connection {}{freed}",
                    role(last, end.node),
                    client_name(id),
                    end.how,
                    end.conn
                ),
            )
        }
    }
}

fn fence(fence: Option<u64>) -> String {
    fence.map_or(String::new(), |f| format!(" fence {f}"))
}

/// A path of the replication model as a timeline: each step's actor and
/// event, then every node's term, standing, log and commit after it. An
/// entry prints as its payload and term: `A@1` is client A's Lock appended
/// in term 1, `-@2` a new leader's blank entry of term 2; `|` marks the end
/// of the prefix the node knows committed.
pub fn replication_timeline(path: Path<replication::State, replication::Action>) -> String {
    let steps = path.into_vec();
    let mut out = String::new();
    let mut before: Option<(&replication::State, replication::Action)> = None;
    for (n, (state, action)) in steps.iter().enumerate() {
        let (actor, event) = match before {
            None => (
                "start".to_string(),
                "n0 leads term 1, every log empty".into(),
            ),
            Some((last, action)) => replication_step(last, action, state),
        };
        let _ = write!(out, "{n:>3}  {actor:<5} {event:<58}");
        for (id, node) in (0u8..).zip(&state.nodes) {
            let _ = write!(out, " | n{id} {}", node_state(node));
        }
        out.push('\n');
        before = action.map(|a| (state, a));
    }
    out
}

fn node_state(node: &replication::Node) -> String {
    let role = match node.role {
        replication::Role::Leader { .. } => "leader",
        replication::Role::Candidate { .. } => "candidate",
        replication::Role::Follower => "follower",
    };
    let mut log = String::new();
    for (i, e) in (1u8..).zip(&node.log) {
        let who = match e.payload {
            replication::Payload::Blank => '-',
            replication::Payload::Lock(c) => client_name(c),
        };
        let _ = write!(log, "{}{who}@{}", if i == 1 { "" } else { " " }, e.term);
        if i == node.commit {
            log.push_str(" |");
        }
    }
    format!("t{} {role:<9} [{log}]", node.term)
}

fn replication_step(
    last: &replication::State,
    action: replication::Action,
    next: &replication::State,
) -> (String, String) {
    use replication::Action as A;
    let term = |s: &replication::State, id: u8| s.nodes.get(usize::from(id)).map_or(0, |n| n.term);
    let leads = |s: &replication::State, id: u8| {
        s.nodes
            .get(usize::from(id))
            .is_some_and(|n| matches!(n.role, replication::Role::Leader { .. }))
    };
    match action {
        A::Stand { node } => (
            format!("n{node}"),
            format!("stands for election in term {}", term(next, node)),
        ),
        A::Vote { voter, candidate } => {
            let voted = next
                .nodes
                .get(usize::from(voter))
                .is_some_and(|v| v.voted == Some(candidate) && v.term == term(last, candidate));
            let mut event = if term(last, voter) > term(last, candidate) {
                format!(
                    "refuses n{candidate} (term {} is behind)",
                    term(last, candidate)
                )
            } else if voted {
                format!("votes for n{candidate} in term {}", term(last, candidate))
            } else {
                format!("refuses n{candidate} in term {}", term(last, candidate))
            };
            if !leads(last, candidate) && leads(next, candidate) {
                let _ = write!(event, "; n{candidate} leads");
            }
            (format!("n{voter}"), event)
        }
        A::Append { node, client } => (
            format!("n{node}"),
            format!("appends {}'s Lock", client_name(client)),
        ),
        A::Copy {
            leader,
            follower,
            len,
        } => {
            let mut event = if term(last, follower) > term(last, leader) {
                format!(
                    "copies to n{follower}: refused, n{leader} learns term {}",
                    term(last, follower)
                )
            } else {
                format!("copies its first {len} to n{follower}")
            };
            for ack in next.acks.iter().skip(last.acks.len()) {
                let _ = write!(
                    event,
                    "; commits {}: {} told Ok fence {}",
                    ack.index,
                    client_name(ack.client),
                    ack.fence
                );
            }
            (format!("n{leader}"), event)
        }
    }
}

/// A path of the ownership model as a timeline: each step, then each
/// task's account of the key and who holds it at the server.
pub fn ownership_timeline(path: Path<ownership::State, ownership::Action>) -> String {
    let steps = path.into_vec();
    let mut out = String::new();
    let mut before: Option<(&ownership::State, ownership::Action)> = None;
    for (n, (state, action)) in steps.iter().enumerate() {
        let event = match before.map(|(_, a)| a) {
            None => "start: tasks T0 and T1 share one client".to_string(),
            Some(ownership::Action::Lock(id)) => {
                let conn = match state.tasks.get(usize::from(id)) {
                    Some(t) if t.shared => "the shared connection".to_string(),
                    _ => format!("a connection of its own (c{})", 1 + id),
                };
                format!("T{id} calls Lock: sent on {conn}")
            }
            Some(ownership::Action::Apply(conn)) => {
                let head = before
                    .and_then(|(last, _)| last.queues.get(usize::from(conn)))
                    .and_then(|q| q.first());
                match head {
                    Some(&(id, true)) => format!("the server applies T{id}'s Lock on c{conn}"),
                    Some(&(id, false)) => format!("the server applies T{id}'s Unlock on c{conn}"),
                    None => format!("the server applies c{conn}'s next"),
                }
            }
            Some(ownership::Action::Return(id)) => format!("T{id} returns from Lock"),
            Some(ownership::Action::Unlock(id)) => format!("T{id} calls Unlock"),
        };
        let server = state
            .holder
            .map_or("free".to_string(), |(_, f)| format!("fence {f}"));
        let _ = write!(out, "{n:>3}  {event:<52} | server: {server:<8}");
        for (id, t) in (0u8..).zip(&state.tasks) {
            let what = match t.phase {
                _ if t.lost => format!("told lost (fence {})", t.fence),
                ownership::Phase::Idle => "idle".to_string(),
                ownership::Phase::Asking => "asking".to_string(),
                ownership::Phase::Granted => format!("granted fence {}, not returned", t.fence),
                ownership::Phase::Holding => format!("holds fence {}", t.fence),
            };
            let _ = write!(out, " | T{id}: {what}");
        }
        out.push('\n');
        before = action.map(|a| (state, a));
    }
    out
}
