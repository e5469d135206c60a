//! The honest clients: they lock, write to the fenced register only while
//! they hold, and check every answer. Two kinds, because they test
//! different promises:
//!
//! - `wire`: raw frames on one connection to a single server, which is the
//!   owner: pipelined requests, leases let run out, connections dropped
//!   while holding;
//! - `library`: the `dlock` library on either target, whose session
//!   follows a cluster's leader through faults.

pub mod library;
pub mod wire;
