//! Loopback ports for node processes (`dlock-server local-cluster`, the
//! test clusters) that must be free when the node binds them, and again
//! when it comes back after a kill.
//!
//! A port the kernel hands out for `127.0.0.1:0` lies in the ephemeral range
//! (`net.ipv4.ip_local_port_range`), from which it also picks the source
//! port of every outgoing connection. While a node is down, any connection
//! on the machine (another test's, or a restarted node dialling its peers)
//! may be given its port, and the node then fails to listen on it again:
//! "Address already in use". The same holds for the moment between
//! choosing a port and the node binding it. Ports below the ephemeral range
//! are never handed out that way, so a node finds its port free.

use std::net::{SocketAddr, TcpListener};

/// Where the search starts when the range cannot be read: Linux's default
/// ephemeral range starts at 32768.
const DEFAULT_EPHEMERAL_LOW: u16 = 32768;

/// The lowest port tried: above the well-known and most registered ones.
const LOWEST: u16 = 10_000;

/// A free loopback port below the ephemeral range, with a listener that
/// holds it until dropped (drop it just before the node binds the port).
///
/// # Errors
/// No port in the range is free.
pub fn reserve() -> std::io::Result<(SocketAddr, TcpListener)> {
    let high = ephemeral_low().max(LOWEST + 1_000);
    let span = u32::from(high - LOWEST);
    // Different processes (test binaries run in parallel) start at
    // different places, so they rarely race for the same port.
    let start = (std::process::id().wrapping_mul(2_654_435_761) ^ nanos()) % span;
    for i in 0..span {
        let port = LOWEST + ((start + i) % span) as u16;
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            return Ok((l.local_addr()?, l));
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free loopback port between {LOWEST} and {high}"),
    ))
}

fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_LOW)
}

fn nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}
