//! What wakes the expiry task early: a command that gives the table a
//! deadline earlier than the one the task sleeps until. One rule for both
//! engines; each keeps its [`Armed`] under the lock it applies commands
//! under, so the comparison sees every command.

use crate::table::Time;
use tokio::sync::Notify;

/// The deadline the expiry task sleeps until, as the table last told it.
#[derive(Debug, Default, Clone, Copy)]
pub struct Armed(Option<Time>);

impl Armed {
    /// The task looked at the table: it sleeps until `next`.
    pub fn set(&mut self, next: Option<Time>) {
        self.0 = next;
    }

    /// After a command: rings `alarm` when the table's `next` deadline is
    /// earlier than the one the task sleeps until.
    pub fn rearm(&mut self, next: Option<Time>, alarm: &Notify) {
        if next.is_some() && (self.0.is_none() || next < self.0) {
            self.0 = next;
            alarm.notify_one();
        }
    }
}
