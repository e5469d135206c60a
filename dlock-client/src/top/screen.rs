//! How `dlock top` draws a [`Sample`]: a header line, the counts, on a
//! cluster a line per node, then the keys, busiest first. ratatui lays
//! the tables out, so no column width is computed here.

use super::sample::Sample;
use crate::cluster::{role_word, NodeView};
use dlock::duration::human;
use dlock::KeyState;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Row, Table};
use ratatui::Frame;

/// The rows above the keys: the header, the counts and a blank line, plus
/// the cluster's table (its header and a row per member) on a cluster.
fn rows_above(s: &Sample) -> u16 {
    let cluster = match s.nodes.len() {
        0 => 0,
        n => u16::try_from(n).unwrap_or(u16::MAX).saturating_add(2),
    };
    3u16.saturating_add(cluster)
}

/// How many keys fit under the rest on a screen `height` rows high (the
/// keys' header takes one).
pub fn key_rows(height: u16, last: &Sample) -> u16 {
    height.saturating_sub(rows_above(last)).saturating_sub(1)
}

/// Draws `s`, refreshed every `every`.
pub fn draw(frame: &mut Frame, s: &Sample, every: std::time::Duration) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let cluster_rows = rows_above(s) - 3;
    let [head, counts, nodes, keys] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(2),
        Constraint::Length(cluster_rows),
        Constraint::Fill(1),
    ])
    .areas(frame.area());

    let what = match (s.cluster, s.answered_by.as_str()) {
        (_, "") => String::new(),
        (true, a) => format!("leader {a}"),
        (false, a) => format!("server {a}"),
    };
    frame.render_widget(
        Paragraph::new(Line::from(format!(
            "dlock top  {what}  every {}  q: quit",
            human(every)
        )))
        .style(bold),
        head,
    );

    let counts_line = match &s.error {
        Some(e) => format!("error: {e}"),
        None => {
            let rate = |r: Option<f64>| r.map_or_else(|| "-".to_string(), |r| format!("{r:.1}"));
            format!(
                "connections {}  sessions {}  held keys {}  waiting {}  grants/s {}  hand-offs/s {}",
                s.connections,
                s.sessions,
                s.held_keys,
                s.waiting,
                rate(s.grants_per_sec),
                rate(s.handoffs_per_sec)
            )
        }
    };
    frame.render_widget(Paragraph::new(counts_line), counts);

    if cluster_rows > 0 {
        frame.render_widget(nodes_table(s), nodes);
    }
    frame.render_widget(keys_table(&s.keys), keys);
}

/// A table's header row, in bold.
fn header<const N: usize>(names: [&'static str; N]) -> Row<'static> {
    Row::new(names).style(Style::default().add_modifier(Modifier::BOLD))
}

fn nodes_table(s: &Sample) -> Table<'static> {
    let lag = |id: u64| {
        s.leader_view
            .as_ref()
            .and_then(|v| v.members.iter().find(|m| m.node_id == id))
            .filter(|m| m.replication_known)
            .map_or_else(|| "-".to_string(), |m| m.lag.to_string())
    };
    let rows = s.nodes.iter().map(|n: &NodeView| match &n.view {
        Ok(c) => Row::new([
            n.id.to_string(),
            n.addr.clone(),
            role_word(&c.role, false),
            c.term.to_string(),
            c.last_applied_index.to_string(),
            lag(n.id),
            c.version.clone(),
        ]),
        Err(e) => Row::new([
            n.id.to_string(),
            n.addr.clone(),
            "no answer".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            e.clone(),
        ]),
    });
    Table::new(
        rows,
        [
            Constraint::Length(5),
            Constraint::Length(22),
            Constraint::Length(10),
            Constraint::Length(6),
            Constraint::Length(10),
            Constraint::Length(6),
            Constraint::Fill(1),
        ],
    )
    .header(header([
        "NODE", "ADDRESS", "ROLE", "TERM", "APPLIED", "LAG", "VERSION",
    ]))
}

fn keys_table(keys: &[KeyState]) -> Table<'static> {
    let rows = keys.iter().map(|k| {
        // Holders the server left out of a long list count too.
        let holders = k.holders.len() + k.holders_omitted as usize;
        let state = match (holders, k.shared, k.limit) {
            (0, _, _) => "free".to_string(),
            (_, false, _) => "held".to_string(),
            (n, true, 0) => format!("shared {n}"),
            (n, true, l) => format!("shared {n}/{l}"),
        };
        let first = k.first();
        let holder = first
            .and_then(|h| h.holder_addr)
            .map_or_else(String::new, |a| a.to_string());
        let lease = first
            .and_then(|h| h.lease_remaining)
            .map_or_else(String::new, human);
        let held = first.map_or_else(String::new, |h| human(h.held_for));
        let waited = match k.waiters {
            0 => String::new(),
            _ => human(k.waited_for),
        };
        Row::new([
            k.key.clone(),
            state,
            k.fence().map_or_else(String::new, |f| f.to_string()),
            holder,
            held,
            lease,
            k.waiters.to_string(),
            waited,
        ])
    });
    Table::new(
        rows,
        [
            Constraint::Fill(2),
            Constraint::Length(11),
            // A fencing token is up to 20 digits; most are 19, as the
            // first token is taken from the clock.
            Constraint::Length(20),
            Constraint::Length(22),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(7),
            Constraint::Length(12),
        ],
    )
    .header(header([
        "KEY",
        "STATE",
        "FENCE",
        "HOLDER",
        "HELD",
        "LEASE",
        "WAITERS",
        "LONGEST WAIT",
    ]))
}
