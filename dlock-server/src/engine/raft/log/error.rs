//! What can go wrong in the Raft log's files, shared by the log
//! (`wal`), its store (`log_store`), its writer thread (`log_writer`) and
//! the import of older logs (`redb_import`).

use std::path::PathBuf;

/// What can go wrong in the log, before openraft's error types wrap it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DiskError {
    /// A read, write or sync failed, or the writer thread has stopped.
    /// Its text is said here, not also as the source: a chain printed with
    /// `{:#}` said it twice.
    #[error("raft log: {0}")]
    Io(std::io::Error),
    /// The files do not hold what this version wrote: cut short, changed,
    /// partly deleted, or written by a newer version.
    #[error("the raft log is damaged: {0}")]
    Damaged(String),
    /// Another process has the log open.
    #[error("the raft log {} is in use by another process (is a node running on this directory?)", .0.display())]
    InUse(PathBuf),
    /// A record did not encode, or a stored one did not decode: the file
    /// was damaged or written by a newer version.
    #[error("raft log record: {0}")]
    Codec(#[from] crate::engine::raft::encoding::CodecError),
    /// The redb file of an older version could not be read. Boxed: redb's
    /// error is large and this one travels in every `Result`.
    #[error("raft log database raft.redb: {0}")]
    Redb(#[source] Box<redb::Error>),
}

impl From<std::io::Error> for DiskError {
    fn from(e: std::io::Error) -> DiskError {
        DiskError::Io(e)
    }
}

pub(super) fn redb<E: Into<redb::Error>>(e: E) -> DiskError {
    DiskError::Redb(Box::new(e.into()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_io_error_is_said_once_in_a_chain() {
        let e = super::DiskError::from(std::io::Error::other("Permission denied"));
        let chain = format!(
            "{:#}",
            anyhow::Error::new(e).context("cannot open the raft log")
        );
        assert_eq!(
            chain,
            "cannot open the raft log: raft log: Permission denied"
        );
    }
}
