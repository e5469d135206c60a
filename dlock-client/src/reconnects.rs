//! What `dlock -v` says about a cluster failover: one line when the
//! connections to a node break and one when they have moved on, however
//! many connections the run has (each lock has one of its own, and each
//! breaks and resumes on its own, at about the same moment).

use dlock::Event;

/// The last failover reported.
#[derive(Debug, Default)]
pub(crate) struct Reconnects {
    /// The node whose connections were last reported broken.
    from: Option<String>,
    /// The node they were last reported resumed on, since then.
    to: Option<String>,
}

impl Reconnects {
    /// The line to print for `event`, or `None` when it repeats what was
    /// just said for another connection.
    pub(crate) fn line(&mut self, event: &Event) -> Option<String> {
        match event {
            Event::Reconnecting { from, .. } => {
                if self.from.as_deref() == Some(from.as_str()) {
                    return None;
                }
                self.from = Some(from.clone());
                self.to = None;
            }
            Event::Resumed { addr, .. } => {
                if self.to.as_deref() == Some(addr.as_str()) {
                    return None;
                }
                self.to = Some(addr.clone());
                // Back on the node that was left: its next break is news.
                if self.from.as_deref() == Some(addr.as_str()) {
                    self.from = None;
                }
            }
            _ => {}
        }
        Some(event.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::Reconnects;
    use dlock::{Disconnect, Event};
    use std::time::Duration;

    fn broke(from: &str) -> Event {
        Event::Reconnecting {
            from: from.into(),
            reason: Disconnect::Closed,
        }
    }

    fn resumed(addr: &str, session: u64) -> Event {
        Event::Resumed {
            addr: addr.into(),
            session,
            after: Duration::from_millis(820),
        }
    }

    #[test]
    fn a_break_after_resuming_on_the_same_node_is_said_again() {
        let mut r = Reconnects::default();
        let said = [broke("a:1"), resumed("a:1", 7), broke("a:1")]
            .iter()
            .filter_map(|e| r.line(e))
            .count();
        assert_eq!(said, 3);
    }

    #[test]
    fn one_failover_is_two_lines_however_many_connections_move() {
        let mut r = Reconnects::default();
        let said: Vec<String> = [
            broke("a:1"),
            broke("a:1"),
            resumed("b:1", 7),
            resumed("b:1", 8),
            // The next failover, from the new leader.
            broke("b:1"),
            resumed("c:1", 7),
            broke("b:1"),
            resumed("c:1", 8),
        ]
        .iter()
        .filter_map(|e| r.line(e))
        .collect();
        assert_eq!(
            said,
            [
                "connection to a:1 lost (the server closed the connection); reconnecting",
                "session 7 resumed on b:1 after 820 ms",
                "connection to b:1 lost (the server closed the connection); reconnecting",
                "session 7 resumed on c:1 after 820 ms",
            ]
        );
    }
}
