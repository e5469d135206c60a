//! How a cluster node encodes what it keeps and sends: log entries and
//! metadata in its log file, messages to its peers, snapshots.
//!
//! Since this version: MessagePack (rmp-serde), behind a version byte,
//! [`BINARY`]. Structs are written as maps with their field names, so the
//! `#[serde(default)]` and `skip_serializing_if` that let older records
//! decode keep working, as they would not in a format that leaves names
//! out. A byte of a value takes one or two bytes instead of JSON's one to
//! three digits and a comma, and numbers are read without parsing text.
//!
//! Before this version everything was JSON, and a node still reads it:
//! [`decode`] tells the two apart by the first byte, which JSON never
//! starts with [`BINARY`] (0xB1 is not even UTF-8 at the start of a text).
//! A byte neither starts is a record of a newer format: refused with an
//! error that says so, rather than misread.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{BufRead, Write};

/// The first byte of a record in MessagePack, version 1.
pub(crate) const BINARY: u8 = 0xB1;

/// Why a record could not be written or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CodecError {
    /// MessagePack refused to write the value.
    #[error("cannot encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    /// A MessagePack record did not decode.
    #[error("{0}")]
    Binary(#[from] rmp_serde::decode::Error),
    /// A JSON record (from an older version) did not decode.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// Reading or writing a stream failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The first byte is neither this format's nor JSON's.
    #[error("unknown encoding (first byte {0:#04x}): written by a newer dlock?")]
    Unknown(u8),
}

/// `value` as a binary record.
pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(64);
    out.push(BINARY);
    rmp_serde::encode::write_named(&mut out, value)?;
    Ok(out)
}

/// Writes `value` as a binary record to `out`, as it is encoded: for
/// records too large to hold twice in memory (snapshots).
pub(crate) fn encode_to<T: Serialize + ?Sized>(
    out: &mut impl Write,
    value: &T,
) -> Result<(), CodecError> {
    out.write_all(&[BINARY])?;
    rmp_serde::encode::write_named(out, value)?;
    Ok(())
}

/// Reads a record in either format from `input`, as it is decoded.
pub(crate) fn decode_from<T: DeserializeOwned>(mut input: impl BufRead) -> Result<T, CodecError> {
    match input.fill_buf()?.first().copied() {
        Some(BINARY) => {
            input.consume(1);
            Ok(rmp_serde::from_read(input)?)
        }
        Some(b) if !starts_json(b) => Err(CodecError::Unknown(b)),
        _ => Ok(serde_json::from_reader(input)?),
    }
}

/// `value` as JSON: for a peer older than the binary format.
pub(crate) fn encode_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(serde_json::to_vec(value)?)
}

/// Reads a record in either format.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    match bytes.first() {
        Some(&BINARY) => Ok(rmp_serde::from_slice(&bytes[1..])?),
        Some(b) if !starts_json(*b) => Err(CodecError::Unknown(*b)),
        // Empty, or JSON: serde_json says what is wrong with it.
        _ => Ok(serde_json::from_slice(bytes)?),
    }
}

/// Whether a JSON text can start with `b`.
fn starts_json(b: u8) -> bool {
    matches!(
        b,
        b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n'
    ) || b.is_ascii_whitespace()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// A record as an older version wrote it, and the field added since,
    /// left out when empty: the shape of the table's own types.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Old {
        at: u64,
        keys: Vec<String>,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct New {
        at: u64,
        keys: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        value: Vec<u8>,
        #[serde(default)]
        since: Option<u64>,
    }

    #[test]
    fn records_read_back_in_both_formats_across_versions() {
        let new = New {
            at: 7,
            keys: vec!["a".into()],
            value: b"web-1".to_vec(),
            since: Some(3),
        };
        assert_eq!(decode::<New>(&encode(&new).unwrap()).unwrap(), new);
        assert_eq!(decode::<New>(&encode_json(&new).unwrap()).unwrap(), new);
        // Written before `value` and `since` existed, in either format.
        let old = Old {
            at: 7,
            keys: vec!["a".into()],
        };
        let want = New {
            value: Vec::new(),
            since: None,
            ..new
        };
        assert_eq!(decode::<New>(&encode(&old).unwrap()).unwrap(), want);
        assert_eq!(decode::<New>(br#"{"at":7,"keys":["a"]}"#).unwrap(), want);
        assert_eq!(decode::<Option<u64>>(b"null").unwrap(), None);
    }

    #[test]
    fn streamed_records_read_back_in_both_formats() {
        let new = New {
            at: 7,
            keys: vec!["a".into(), "b".into()],
            value: b"web-1".to_vec(),
            since: None,
        };
        let mut streamed = Vec::new();
        encode_to(&mut streamed, &new).unwrap();
        assert_eq!(streamed, encode(&new).unwrap());
        assert_eq!(decode_from::<New>(&streamed[..]).unwrap(), new);
        assert_eq!(
            decode_from::<New>(&encode_json(&new).unwrap()[..]).unwrap(),
            new
        );
        assert!(matches!(
            decode_from::<New>(&[0xB2, 1][..]),
            Err(CodecError::Unknown(0xB2))
        ));
        assert!(decode_from::<New>(&streamed[..streamed.len() - 1]).is_err());
    }

    #[test]
    fn a_record_of_an_unknown_format_is_refused_and_says_so() {
        let e = decode::<u64>(&[0xB2, 1]).unwrap_err();
        assert!(e.to_string().contains("newer dlock"), "{e}");
        assert!(decode::<u64>(&[]).is_err());
        assert!(decode::<u64>(&[BINARY]).is_err());
        assert!(decode::<New>(&[BINARY, 0xc1]).is_err());
    }

    #[test]
    fn entries_and_snapshots_of_the_real_types_read_back_the_same() {
        use crate::engine::raft::types::{Entry, LogId, Stamped};
        use crate::table::{Command, LockTable, Sharing, TableLimits, Time, WaitLimit};
        let lock = |owner, key: &str| Command::Lock {
            owner,
            keys: vec![key.into(), "shared".into()],
            sharing: Sharing::exclusive(),
            wait: WaitLimit::For(std::time::Duration::from_millis(1500)),
            lease: Some(std::time::Duration::from_secs(30)),
            value: b"web-1\xff".to_vec(),
        };
        let entry = Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(3, 1), 42),
            payload: openraft::EntryPayload::Normal(Stamped {
                at: Time::from_micros(7),
                cmds: vec![lock(1, "a"), Command::Advance],
            }),
        };
        let back: Entry = decode(&encode(&entry).unwrap()).unwrap();
        assert_eq!(format!("{back:?}"), format!("{entry:?}"));

        let mut t = LockTable::new(
            TableLimits {
                max_waiters: 10,
                max_held_keys: 10,
            },
            1,
        );
        for (i, owner) in [1, 2, 3].into_iter().enumerate() {
            t.apply(lock(owner, "a"), Time::from_micros(i as u64));
        }
        assert_eq!(
            (t.held_keys(), t.waiting()),
            (2, 2),
            "a holder, two waiters"
        );
        let snapshot = t.snapshot();
        let back: crate::table::Snapshot = decode(&encode(&snapshot).unwrap()).unwrap();
        assert_eq!(back, snapshot);
        // And what a node of the version before wrote.
        let json: crate::table::Snapshot = decode(&encode_json(&snapshot).unwrap()).unwrap();
        assert_eq!(json, snapshot);
        // Streamed both ways, as a node writes and loads its snapshot file,
        // and loaded from a file of the version before.
        let mut streamed = Vec::new();
        encode_to(&mut streamed, &t.snapshot_view()).unwrap();
        for bytes in [streamed, encode_json(&snapshot).unwrap()] {
            let loaded: crate::table::LoadedSnapshot = decode_from(&bytes[..]).unwrap();
            let restored = LockTable::restore_loaded(loaded).unwrap();
            assert_eq!(restored.snapshot(), snapshot);
        }
    }

    #[test]
    fn bytes_take_at_most_two_bytes_each_not_a_number_in_text() {
        let new = New {
            at: 1,
            keys: Vec::new(),
            value: vec![200; 1000],
            since: None,
        };
        let (binary, json) = (encode(&new).unwrap(), encode_json(&new).unwrap());
        assert!(
            binary.len() < 2100 && json.len() > 4000,
            "{} {}",
            binary.len(),
            json.len()
        );
    }
}
