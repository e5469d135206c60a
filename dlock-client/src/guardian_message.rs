//! The messages dlock writes to its guardian (`guardian.rs`) over a pipe,
//! in one place: dlock's side and COMMAND's (`child.rs`, which names itself
//! between fork and exec) write them, the guardian reads them.

/// Bytes per message: a tag and a big-endian 64-bit value. Under PIPE_BUF,
/// so every write is whole or not at all.
pub(crate) const MESSAGE: usize = 9;
/// Tag: COMMAND has ended; exit without killing anything.
pub(crate) const DONE: u8 = b'X';
/// Tag: what to kill (a pid, or a negated process group id).
pub(crate) const TARGET: u8 = b'T';
/// Tag: when the target must be gone (CLOCK_MONOTONIC ns; 0 = no deadline).
pub(crate) const DEADLINE: u8 = b'D';

/// A message: `tag`, then `value` big-endian.
pub(crate) fn message(tag: u8, value: u64) -> [u8; MESSAGE] {
    let mut msg = [tag; MESSAGE];
    msg[1..].copy_from_slice(&value.to_be_bytes());
    msg
}

/// The message naming what to kill: `pid`, with its process group if
/// `group`. COMMAND writes it itself between fork and exec (no allocation,
/// so it is safe there): the guardian then knows its target before COMMAND
/// runs a single instruction of its own, whatever happens to dlock.
pub(crate) fn target_message(pid: i32, group: bool) -> [u8; MESSAGE] {
    let target = i64::from(if group { -pid } else { pid });
    message(TARGET, u64::from_be_bytes(target.to_be_bytes()))
}

/// A whole message's tag and value.
pub(crate) fn parse(msg: &[u8; MESSAGE]) -> (u8, u64) {
    let mut value = [0u8; 8];
    value.copy_from_slice(&msg[1..]);
    (msg[0], u64::from_be_bytes(value))
}
