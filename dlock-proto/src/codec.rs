//! Length-prefixed framing: a 4-byte big-endian length, then that many bytes.
//!
//! [`FrameCodec`] splits a byte stream into frame bodies and refuses a length
//! over its limit before buffering anything, so a peer cannot make the reader
//! allocate more than `max_frame` bytes per frame. Decoding the protobuf body is
//! left to the caller: a body that is not valid protobuf is an error the server
//! answers on a connection that stays usable, while a bad length breaks the
//! framing and ends the connection.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// Size of the length prefix in bytes.
pub const LEN_PREFIX: usize = 4;

/// Errors from reading or writing frames.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer announced a frame longer than the limit.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Announced body length.
        len: usize,
        /// The limit in force.
        max: usize,
    },
    /// The underlying stream failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Splits a byte stream into frame bodies and writes protobuf messages as frames.
#[derive(Debug, Clone)]
pub struct FrameCodec {
    max_frame: usize,
}

impl FrameCodec {
    /// A codec that accepts bodies of at most `max_frame` bytes.
    pub fn new(max_frame: usize) -> Self {
        FrameCodec { max_frame }
    }

    /// The largest body this codec accepts.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }
}

impl Default for FrameCodec {
    fn default() -> Self {
        FrameCodec::new(crate::DEFAULT_MAX_FRAME)
    }
}

impl Decoder for FrameCodec {
    type Item = Bytes;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
        match frame_len(src, self.max_frame)? {
            Some(len) => {
                src.advance(LEN_PREFIX);
                Ok(Some(src.split_to(len).freeze()))
            }
            None => {
                if let Some(len) = announced_len(src) {
                    // Reserve once for the whole frame instead of growing read by read.
                    src.reserve(LEN_PREFIX + len - src.len());
                }
                Ok(None)
            }
        }
    }
}

fn announced_len(buf: &[u8]) -> Option<usize> {
    let prefix = buf.get(..LEN_PREFIX)?;
    Some(u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize)
}

/// The body length of the frame at the start of `buf`, if all of it is there.
///
/// `Ok(None)` means more bytes are needed. Readers that decode in place use
/// it to walk a buffer without splitting it: the body is
/// `buf[LEN_PREFIX..LEN_PREFIX + len]`.
///
/// # Errors
/// [`FrameError::TooLarge`] when the announced length exceeds `max_frame`,
/// as soon as the length prefix is there; the stream cannot be read further.
pub fn frame_len(buf: &[u8], max_frame: usize) -> Result<Option<usize>, FrameError> {
    let Some(len) = announced_len(buf) else {
        return Ok(None);
    };
    if len > max_frame {
        return Err(FrameError::TooLarge {
            len,
            max: max_frame,
        });
    }
    Ok((buf.len() >= LEN_PREFIX + len).then_some(len))
}

impl<M: prost::Message> Encoder<&M> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, msg: &M, dst: &mut BytesMut) -> Result<(), FrameError> {
        encode_frame(msg, dst);
        Ok(())
    }
}

/// Appends `msg` to `dst` as one frame.
///
/// Outgoing frames are not checked against a limit: the writer controls their
/// size, and a server's responses are bounded by the requests it accepted.
pub fn encode_frame<M: prost::Message>(msg: &M, dst: &mut BytesMut) {
    let len = msg.encoded_len();
    let start = dst.len();
    // Sized once and filled as a plain slice: prost writes varints a byte
    // at a time, and through BytesMut each byte would be a bounds-checked
    // copy of its own (a quarter of a pipelining server's time).
    dst.resize(start + LEN_PREFIX + len, 0);
    let frame = &mut dst[start..];
    // A protobuf message over 4 GiB cannot be produced from bounded input;
    // saturating keeps this total without a panic path.
    frame[..LEN_PREFIX].copy_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
    let mut body = &mut frame[LEN_PREFIX..];
    // Exactly `len` bytes of room: encoding cannot fail.
    let _ = msg.encode(&mut body);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Request, RequestType};
    use bytes::BufMut;
    use prost::Message;

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut v = (body.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn frame_split_over_many_reads() {
        let mut codec = FrameCodec::new(64);
        let wire = frame(b"hello");
        let mut buf = BytesMut::new();
        for (i, b) in wire.iter().enumerate() {
            buf.put_u8(*b);
            let got = codec.decode(&mut buf).unwrap();
            if i + 1 < wire.len() {
                assert!(got.is_none(), "frame decoded early at byte {i}");
            } else {
                assert_eq!(got.as_deref(), Some(&b"hello"[..]));
            }
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn many_frames_in_one_read() {
        let mut codec = FrameCodec::new(64);
        let mut buf = BytesMut::new();
        for body in [&b"a"[..], b"", b"ccc"] {
            buf.extend_from_slice(&frame(body));
        }
        buf.extend_from_slice(&[0, 0]);
        assert_eq!(codec.decode(&mut buf).unwrap().as_deref(), Some(&b"a"[..]));
        assert_eq!(codec.decode(&mut buf).unwrap().as_deref(), Some(&b""[..]));
        assert_eq!(
            codec.decode(&mut buf).unwrap().as_deref(),
            Some(&b"ccc"[..])
        );
        assert!(codec.decode(&mut buf).unwrap().is_none());
        assert_eq!(buf.len(), 2);
    }

    #[test]
    fn oversize_length_rejected_before_body_arrives() {
        let mut codec = FrameCodec::new(8);
        let mut buf = BytesMut::from(&9u32.to_be_bytes()[..]);
        match codec.decode(&mut buf) {
            Err(FrameError::TooLarge { len: 9, max: 8 }) => {}
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }

    #[test]
    fn frame_len_finds_whole_frames_only() {
        let wire = frame(b"abc");
        assert_eq!(frame_len(&wire[..3], 8).unwrap(), None);
        assert_eq!(frame_len(&wire[..6], 8).unwrap(), None);
        assert_eq!(frame_len(&wire, 8).unwrap(), Some(3));
        assert!(matches!(
            frame_len(&wire[..4], 2),
            Err(FrameError::TooLarge { len: 3, max: 2 })
        ));
    }

    #[test]
    fn encode_then_decode_roundtrip() {
        let req = Request {
            version: 2,
            id: 7,
            r#type: RequestType::Ping as i32,
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        encode_frame(&req, &mut buf);
        let body = FrameCodec::default().decode(&mut buf).unwrap().unwrap();
        assert_eq!(Request::decode(body).unwrap(), req);
    }

    proptest::proptest! {
        #[test]
        fn any_chunking_yields_the_same_frames(
            bodies in proptest::collection::vec(proptest::collection::vec(proptest::num::u8::ANY, 0..40), 0..8),
            cuts in proptest::collection::vec(1usize..16, 0..64),
        ) {
            let wire: Vec<u8> = bodies.iter().flat_map(|b| frame(b)).collect();
            let mut codec = FrameCodec::new(64);
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            let mut pos = 0;
            let mut cuts = cuts.into_iter();
            while pos < wire.len() {
                let n = cuts.next().unwrap_or(wire.len()).min(wire.len() - pos);
                buf.extend_from_slice(&wire[pos..pos + n]);
                pos += n;
                while let Some(f) = codec.decode(&mut buf).unwrap() {
                    out.push(f.to_vec());
                }
            }
            proptest::prop_assert_eq!(out, bodies);
        }
    }
}
