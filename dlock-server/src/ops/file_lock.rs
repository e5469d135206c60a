//! A file that one process at a time may hold: the fence file's and the
//! local cluster folder's lock (`flock`, released when the process ends,
//! however it ends).

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// Makes `path` if needed and takes its exclusive lock without waiting;
/// the lock lasts as long as the returned file is open.
///
/// # Errors
/// `ErrorKind::WouldBlock` when another process holds it; any other error
/// when the file cannot be made or locked.
pub fn exclusive(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_second_holder_is_told_it_would_wait_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let first = super::exclusive(&path).unwrap();
        let e = super::exclusive(&path).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        drop(first);
        assert!(super::exclusive(&path).is_ok());
    }
}
