"""The length-prefixed framing, without a server."""

import struct

import pytest

from dlock import ProtocolError
from dlock._proto import dlock_pb2 as pb
from dlock.framing import FrameDecoder, encode


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_encode_prefixes_the_body_with_its_big_endian_length():
    req = pb.Request(version=2, id=7, type=pb.Ping)
    data = encode(req)
    assert data[:4] == struct.pack(">I", len(data) - 4)
    assert pb.Request.FromString(data[4:]) == req


def test_a_frame_split_over_many_reads_comes_out_once_whole():
    data = frame(b"hello world")
    dec = FrameDecoder()
    out = []
    for i in range(len(data)):
        out += dec.feed(data[i : i + 1])
    assert out == [b"hello world"]
    assert dec.pending() == 0


def test_many_frames_in_one_read_come_out_in_order():
    bodies = [bytes([i]) * i for i in range(50)]
    dec = FrameDecoder()
    assert dec.feed(b"".join(frame(b) for b in bodies)) == bodies


def test_an_empty_body_is_a_frame():
    assert FrameDecoder().feed(frame(b"") + frame(b"x")) == [b"", b"x"]


def test_an_oversize_length_is_refused_before_its_body_is_buffered():
    dec = FrameDecoder(max_frame=100)
    with pytest.raises(ProtocolError, match="101 bytes is over the limit of 100"):
        dec.feed(struct.pack(">I", 101))
