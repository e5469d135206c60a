//! The latest snapshot on disk: one file, `snapshot`, replaced atomically.
//!
//! The file is the snapshot's metadata as one line of JSON, a newline, then
//! the snapshot data exactly as it is sent to peers (see `machine`). Data
//! is streamed: written to the file as it is encoded, sent to a peer in
//! chunks read from the file, received into an unnamed temporary file, so
//! a snapshot is never held whole in memory beside the table.
//!
//! A new snapshot is written to a temporary file of its own
//! (`snapshot.tmp.*`), fsynced, renamed over `snapshot`, and the directory
//! fsynced, so after a crash the file is either the old snapshot or the
//! new one, whole. Every one of those file and directory operations goes
//! through `storage`, so unit tests run them on a simulated disk that power
//! cuts tear (the received file, unnamed and never needed after a crash,
//! stays a real one). Snapshots are large (the whole lock table) and written
//! rarely, which is why they live in a file of their own beside the log
//! instead of in it: a snapshot written into the log would hold up log
//! appends while it is written.

use super::ids::{LogId, SnapshotMeta};
use super::storage::{ReadFrom, Storage, StorageFile};
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};

const NAME: &str = "snapshot";
/// Snapshots being written are temporary files named this and a random
/// suffix; left over only by a crash, and deleted on start.
const TMP_PREFIX: &str = "snapshot.tmp.";

/// Left over by a crash, deleted on start: files of [`TMP_PREFIX`] (and
/// the fixed `snapshot.tmp` of older versions), and the named temporary
/// file a received snapshot goes to where the filesystem has no unnamed
/// ones (tempfile's `.tmp` prefix, unlinked as soon as it is created).
fn is_leftover(name: &str) -> bool {
    name.starts_with("snapshot.tmp") || name.starts_with(".tmp")
}

/// A snapshot on disk: its metadata, and its file.
pub(crate) struct Found {
    /// What the snapshot covers.
    pub(crate) meta: SnapshotMeta,
    /// The file (metadata line, then data).
    pub(crate) data: StorageFile,
    /// Where the data starts in the file.
    pub(crate) start: u64,
}

impl Found {
    /// Reads the data from its first byte.
    pub(crate) fn reader(&self) -> ReadFrom<'_> {
        ReadFrom::new(&self.data, self.start)
    }

    /// The data's length in bytes.
    ///
    /// # Errors
    /// The file's length cannot be read.
    pub(crate) fn len(&self) -> io::Result<u64> {
        Ok(self.data.len()?.saturating_sub(self.start))
    }
}

/// The snapshot file of one data directory; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct SnapshotFile {
    storage: Storage,
    dir: PathBuf,
    /// What the file holds now. Checked and updated under the lock as a
    /// new file is renamed into place (a snapshot being built and one being
    /// installed can race), so an older snapshot never replaces a newer one.
    current: Arc<Mutex<Option<LogId>>>,
    /// How fast a snapshot this node builds is written, in bytes a second;
    /// `None`: as fast as the disk takes it. See [`WriteAt::pace`].
    write_rate: Option<NonZeroU64>,
}

impl SnapshotFile {
    /// The snapshot file in `dir`, and the snapshot it holds, if any.
    ///
    /// # Errors
    /// The file exists but cannot be read, or its metadata line does not
    /// decode.
    pub(crate) fn open(dir: &Path) -> io::Result<(SnapshotFile, Option<Found>)> {
        SnapshotFile::open_on(Storage::Real, dir)
    }

    /// [`SnapshotFile::open`] on the disk `storage`.
    ///
    /// # Errors
    /// As for [`SnapshotFile::open`].
    pub(crate) fn open_on(
        storage: Storage,
        dir: &Path,
    ) -> io::Result<(SnapshotFile, Option<Found>)> {
        let file = SnapshotFile {
            storage,
            dir: dir.to_path_buf(),
            current: Arc::new(Mutex::new(None)),
            write_rate: None,
        };
        // Leftovers from a crash while writing: never renamed, so never used.
        for name in file.storage.list(dir)? {
            if is_leftover(&name) {
                file.storage.remove_file(&dir.join(name))?;
            }
        }
        let found = file.read()?;
        *file.lock() = found.as_ref().and_then(|f| f.meta.last_log_id);
        Ok((file, found))
    }

    fn lock(&self) -> MutexGuard<'_, Option<LogId>> {
        // Holds only a log id, valid whatever a panicking writer did.
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The snapshot on disk, if any; only its metadata line is read.
    /// Blocking.
    ///
    /// # Errors
    /// The file cannot be read or its metadata does not decode.
    pub(crate) fn read(&self) -> io::Result<Option<Found>> {
        let file = match self.storage.open(&self.dir.join(NAME)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        // The metadata is a few hundred bytes; a line far longer is not one.
        let mut line = Vec::new();
        let mut reader = BufReader::new(ReadFrom::new(&file, 0)).take(1 << 20);
        reader.read_until(b'\n', &mut line)?;
        drop(reader);
        if line.last() != Some(&b'\n') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "snapshot file has no metadata line",
            ));
        }
        let meta: SnapshotMeta = serde_json::from_slice(&line)?;
        let start = line.len() as u64;
        Ok(Some(Found {
            meta,
            data: file,
            start,
        }))
    }

    /// Starts writing a snapshot covering what `meta` says: the metadata
    /// is written, the data goes to [`Writer::data`]. Blocking.
    ///
    /// # Errors
    /// The temporary file cannot be created or written.
    pub(crate) fn create(&self, meta: &SnapshotMeta) -> io::Result<Writer> {
        self.create_at(meta, None)
    }

    /// [`SnapshotFile::create`] for a snapshot this node builds: written
    /// no faster than [`SnapshotFile::pace_writes`] said.
    ///
    /// # Errors
    /// As for [`SnapshotFile::create`].
    pub(crate) fn create_paced(&self, meta: &SnapshotMeta) -> io::Result<Writer> {
        self.create_at(meta, self.write_rate)
    }

    /// Writes the snapshots this node builds at most `bytes_per_second`
    /// (0: as fast as the disk takes them). A snapshot received from the
    /// leader is not paced: the node waits for it to catch up.
    pub(crate) fn pace_writes(&mut self, bytes_per_second: u64) {
        self.write_rate = NonZeroU64::new(bytes_per_second);
    }

    fn create_at(&self, meta: &SnapshotMeta, rate: Option<NonZeroU64>) -> io::Result<Writer> {
        // A name of its own, so that a snapshot being built and one being
        // installed never write the same file. Created with the process's
        // umask, readable by others like the rest of the data directory (a
        // backup run as another user).
        let (file, path) = loop {
            let path = self.dir.join(format!(
                "{TMP_PREFIX}{:08x}",
                super::storage::unpredictable()
            ));
            match self.storage.create(&path, true) {
                Ok(file) => break (file, path),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        };
        let tmp = TmpName {
            storage: self.storage.clone(),
            path: Some(path),
        };
        let mut line = serde_json::to_vec(meta)?;
        line.push(b'\n');
        let mut out = BufWriter::with_capacity(
            1 << 20,
            WriteAt {
                file,
                at: 0,
                unsynced: 0,
                pace: rate.map(|rate| Pace {
                    rate,
                    started: Instant::now(),
                }),
            },
        );
        out.write_all(&line)?;
        let start = line.len() as u64;
        Ok(Writer {
            out,
            tmp,
            start,
            meta: meta.clone(),
            file: self.clone(),
        })
    }

    /// An unnamed file in the data directory to receive a snapshot from
    /// the leader into; it disappears when closed. Blocking.
    ///
    /// # Errors
    /// The file cannot be created.
    pub(crate) fn receiving(&self) -> io::Result<File> {
        tempfile::tempfile_in(&self.dir)
    }
}

/// A snapshot being written; see [`SnapshotFile::create`].
pub(crate) struct Writer {
    out: BufWriter<WriteAt>,
    tmp: TmpName,
    start: u64,
    meta: SnapshotMeta,
    file: SnapshotFile,
}

impl Writer {
    /// Where the snapshot data goes.
    pub(crate) fn data(&mut self) -> &mut impl Write {
        &mut self.out
    }

    /// Makes the snapshot the one on disk, durably, unless the file
    /// already holds a later one. Either way the data can still be read
    /// from what this returns, and the flag says whether it was kept.
    /// Blocking.
    ///
    /// # Errors
    /// Writing, syncing or renaming failed (the previous snapshot is
    /// intact), or syncing the directory after the rename did (the new one
    /// is in place, but a crash could still bring the previous one back).
    pub(crate) fn commit(self) -> io::Result<(Found, bool)> {
        let Writer {
            out,
            mut tmp,
            start,
            meta,
            file,
        } = self;
        let covers = meta.last_log_id;
        let data = out
            .into_inner()
            .map_err(io::IntoInnerError::into_error)?
            .file;
        data.sync_all()?;
        let mut current = file.lock();
        let kept = if *current > covers {
            // Deleted from the directory (as `tmp` is dropped), still
            // readable through the handle.
            false
        } else {
            let path = tmp
                .path
                .take()
                .ok_or_else(|| io::Error::other("renamed twice"))?;
            if let Err(e) = file.storage.rename(&path, &file.dir.join(NAME)) {
                tmp.path = Some(path);
                return Err(e);
            }
            // In place now, whatever happens next: no older one may replace it.
            *current = covers;
            // The rename is durable only once the directory is.
            file.storage.sync_dir(&file.dir)?;
            true
        };
        drop(current);
        drop(tmp);
        Ok((Found { meta, data, start }, kept))
    }
}

/// A file written front to back through `write_all_at`.
struct WriteAt {
    file: StorageFile,
    at: u64,
    /// Bytes written since the last sync.
    unsynced: u64,
    pace: Option<Pace>,
}

/// The rate a snapshot is written at, and since when.
struct Pace {
    rate: NonZeroU64,
    started: Instant,
}

/// Written before any pacing: a small table's snapshot is never slowed.
const UNPACED: u64 = SYNC_STEP;

/// A snapshot being written is synced every this many bytes. Left to the
/// end, the 83 MiB of a table of 1,000,000 keys reach the disk in one burst,
/// and the log's fsyncs (every commit waits for one) queue behind it for
/// tens of milliseconds; in steps, a commit waits behind a step at most.
const SYNC_STEP: u64 = 4 << 20;

impl WriteAt {
    /// Waits until the bytes written so far are due at the pace's rate.
    /// The log's fsyncs share the disk with the snapshot, and on the
    /// machines measured (BENCHMARKS.md, "no stall during a snapshot") what
    /// a commit waits for is the snapshot's bytes the disk has taken since
    /// the last fsync: written at full speed, 83 MiB in 150-250 ms, they
    /// doubled the tail of every commit meanwhile; spread out, each fsync
    /// carries only a little of them. Sleeping is right here: this runs on
    /// the snapshot's thread of its own, never on the runtime.
    fn pace(&self) {
        let Some(pace) = &self.pace else { return };
        let ahead = self.at.saturating_sub(UNPACED);
        let due = Duration::from_secs_f64(ahead as f64 / pace.rate.get() as f64);
        if let Some(wait) = due.checked_sub(pace.started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
}

impl Write for WriteAt {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pace();
        self.file.write_all_at(buf, self.at)?;
        self.at += buf.len() as u64;
        self.unsynced += buf.len() as u64;
        if self.unsynced >= SYNC_STEP {
            self.file.sync_data()?;
            self.unsynced = 0;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The temporary name of a snapshot being written: removed when dropped
/// unless it was renamed into place (an error or an older snapshot leaves
/// nothing behind; a crash leaves it for [`SnapshotFile::open`]).
struct TmpName {
    storage: Storage,
    path: Option<PathBuf>,
}

impl Drop for TmpName {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            if let Err(e) = self.storage.remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a snapshot's temporary file");
            }
        }
    }
}

/// A snapshot's data as openraft reads (to send it) and writes (to
/// receive it): a file, seen from where its data starts.
#[derive(Debug)]
pub struct SnapshotData {
    file: tokio::fs::File,
    start: u64,
    /// A seek was started and has not completed.
    seeking: bool,
}

impl SnapshotData {
    /// The data of `found`.
    ///
    /// # Errors
    /// Its file is not a real one (a test's simulated disk), or cannot be
    /// positioned.
    pub(crate) fn new(found: Found) -> io::Result<Self> {
        let mut file = found.data.into_real()?;
        file.seek(SeekFrom::Start(found.start))?;
        Ok(SnapshotData {
            file: tokio::fs::File::from_std(file),
            start: found.start,
            seeking: false,
        })
    }

    /// An empty file to receive a snapshot into.
    pub(crate) fn receiving(file: File) -> Self {
        SnapshotData {
            file: tokio::fs::File::from_std(file),
            start: 0,
            seeking: false,
        }
    }

    /// The file, every write finished, positioned at the data's start.
    ///
    /// # Errors
    /// A write to the file failed.
    pub(crate) async fn into_file(mut self) -> io::Result<File> {
        use tokio::io::AsyncWriteExt;
        // A failed write surfaces here, not lost with the handle.
        self.file.flush().await?;
        let mut file = self.file.into_std().await;
        file.seek(SeekFrom::Start(self.start))?;
        Ok(file)
    }
}

impl AsyncRead for SnapshotData {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotData {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.file).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotData {
    fn start_seek(mut self: Pin<&mut Self>, pos: SeekFrom) -> io::Result<()> {
        let pos = match pos {
            SeekFrom::Start(p) => {
                SeekFrom::Start(self.start.checked_add(p).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "seek past the end")
                })?)
            }
            relative => relative,
        };
        Pin::new(&mut self.file).start_seek(pos)?;
        self.seeking = true;
        Ok(())
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        let (start, seeking) = (self.start, self.seeking);
        let done = ready!(Pin::new(&mut self.file).poll_complete(cx));
        self.seeking = false;
        let pos = done?;
        match pos.checked_sub(start) {
            Some(p) => Poll::Ready(Ok(p)),
            // A seek of ours landed in the metadata line before the data.
            None if seeking => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the data",
            ))),
            // Asked with no seek started: tokio's File does not know where a
            // file it was given stands, and says 0.
            None => Poll::Ready(Ok(0)),
        }
    }
}

#[cfg(test)]
#[path = "snapshot_power_cut.rs"]
mod power_cut;

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

    fn meta(index: u64) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index)),
            last_membership: Default::default(),
            snapshot_id: format!("1-{index}-0"),
        }
    }

    fn write(file: &SnapshotFile, index: u64, data: &[u8]) -> (Found, bool) {
        let mut w = file.create(&meta(index)).unwrap();
        w.data().write_all(data).unwrap();
        w.commit().unwrap()
    }

    /// Larger than a chunk, so a reader crosses chunk boundaries.
    fn data(seed: u8) -> Vec<u8> {
        (0..(9 << 20))
            .map(|i: u32| (i % 251) as u8 ^ seed)
            .collect()
    }

    #[tokio::test]
    async fn openraft_sees_only_the_data_and_reads_it_in_chunks_from_any_offset() {
        let dir = tempfile::tempdir().unwrap();
        let (file, none) = SnapshotFile::open(dir.path()).unwrap();
        assert!(none.is_none());
        let want = data(0);
        let (found, kept) = write(&file, 10, &want);
        assert!(kept);
        assert_eq!(found.meta, meta(10));
        let mut d = SnapshotData::new(found).unwrap();
        // What openraft's sender does: the length, then a chunk at a time.
        assert_eq!(d.seek(SeekFrom::End(0)).await.unwrap(), want.len() as u64);
        let mut got = Vec::new();
        for offset in (0..want.len()).step_by(4 << 20) {
            assert_eq!(
                d.seek(SeekFrom::Start(offset as u64)).await.unwrap(),
                offset as u64
            );
            let mut chunk = vec![0; (4 << 20).min(want.len() - offset)];
            d.read_exact(&mut chunk).await.unwrap();
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got, want);
        // Nothing before the data can be reached, not even relatively.
        let before_start = -(want.len() as i64) - 1;
        assert!(d.seek(SeekFrom::End(before_start)).await.is_err());
        // And the file on disk, opened again, gives the same.
        let again = file.read().unwrap().expect("the snapshot");
        assert_eq!(again.meta, meta(10));
        let mut all = Vec::new();
        SnapshotData::new(again)
            .unwrap()
            .read_to_end(&mut all)
            .await
            .unwrap();
        assert_eq!(all, want);
    }

    #[tokio::test]
    async fn an_older_snapshot_never_replaces_a_newer_one_but_stays_readable() {
        let dir = tempfile::tempdir().unwrap();
        let (file, _) = SnapshotFile::open(dir.path()).unwrap();
        write(&file, 20, b"newer");
        let (older, kept) = write(&file, 10, b"older");
        assert!(!kept);
        let mut got = Vec::new();
        SnapshotData::new(older)
            .unwrap()
            .read_to_end(&mut got)
            .await
            .unwrap();
        assert_eq!(got, b"older");
        assert_eq!(file.read().unwrap().unwrap().meta, meta(20));
        // Nothing is left behind but the snapshot itself.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![NAME]);
    }

    #[tokio::test]
    async fn a_received_snapshot_is_read_back_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let (file, _) = SnapshotFile::open(dir.path()).unwrap();
        let want = data(7);
        let mut d = SnapshotData::receiving(file.receiving().unwrap());
        // Chunks as openraft's receiver writes them, one resent.
        for offset in [0, 4 << 20, 4 << 20, 8 << 20] {
            d.seek(SeekFrom::Start(offset as u64)).await.unwrap();
            let end = (offset + (4 << 20)).min(want.len());
            d.write_all(&want[offset..end]).await.unwrap();
        }
        let mut received = d.into_file().await.unwrap();
        let mut got = Vec::new();
        received.read_to_end(&mut got).unwrap();
        assert_eq!(got, want);
        // It was never a named file in the directory.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn leftovers_of_a_crash_are_removed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let (file, _) = SnapshotFile::open(dir.path()).unwrap();
        write(&file, 5, b"kept");
        fs::write(dir.path().join("snapshot.tmp"), b"from an older version").unwrap();
        fs::write(dir.path().join("snapshot.tmp.a1b2c3"), b"half written").unwrap();
        fs::write(dir.path().join(".tmpXyZ123"), b"half received").unwrap();
        let (_, found) = SnapshotFile::open(dir.path()).unwrap();
        assert_eq!(found.expect("the snapshot").meta, meta(5));
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![NAME]);
    }
}
