//! The one redb file of the Raft log: its log table and what can go wrong
//! in it, shared by the store (`log_store`) and its writer thread
//! (`log_writer`).

use redb::TableDefinition;

/// The log entries, by index.
pub(super) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");

/// What can go wrong in the file, before openraft's error types wrap it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DiskError {
    /// redb failed (I/O, a damaged file, the file open twice). Boxed:
    /// redb's error is large and this one travels in every `Result`.
    #[error("raft log database: {0}")]
    Redb(#[source] Box<redb::Error>),
    /// A record did not encode, or a stored one did not decode: the file
    /// was damaged or written by a newer version.
    #[error("raft log record: {0}")]
    Codec(#[from] super::encoding::CodecError),
    /// The writer thread could not be started or has stopped.
    #[error("raft log writer: {0}")]
    Io(#[source] std::io::Error),
}

pub(super) fn redb<E: Into<redb::Error>>(e: E) -> DiskError {
    DiskError::Redb(Box::new(e.into()))
}
