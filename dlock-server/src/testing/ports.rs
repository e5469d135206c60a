//! Loopback ports for test node processes: `ops::ports`, which
//! `dlock-server local-cluster` uses too, for tests that cannot go on
//! without one.

use std::net::{SocketAddr, TcpListener};

/// A free loopback port below the ephemeral range, held by the listener
/// until it is dropped (see `ops::ports`).
///
/// # Panics
/// When no port in the range is free: a broken test machine.
pub fn reserve() -> (SocketAddr, TcpListener) {
    crate::ops::ports::reserve().expect("a free loopback port below the ephemeral range")
}
