"""The wire framing: a 4-byte big-endian length, then that many bytes of protobuf."""

from __future__ import annotations

import struct
from typing import List

from google.protobuf.message import Message

from .errors import ProtocolError

_LEN = struct.Struct(">I")

#: Largest response body this client accepts. The server's largest answer is
#: an Inspect of max_keys keys of max_key_len bytes (256 × 1 KiB by default);
#: the Rust client uses the same 4 MiB cap, so a corrupt length cannot make
#: either buffer without bound.
MAX_RESPONSE_FRAME = 4 * 1024 * 1024


def encode(message: Message) -> bytes:
    """`message` as one frame: length prefix and body."""
    body = message.SerializeToString()
    return _LEN.pack(len(body)) + body


class FrameDecoder:
    """Splits a byte stream into frame bodies, whatever the reads' boundaries.

    Holds at most one partial frame: a length over `max_frame` raises
    `ProtocolError` before anything of that frame is buffered.
    """

    def __init__(self, max_frame: int = MAX_RESPONSE_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> List[bytes]:
        """Adds `data`; returns the bodies of the frames it completed, in order."""
        buf = self._buf
        buf += data
        out = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (n,) = _LEN.unpack_from(buf, pos)
            if n > self._max:
                raise ProtocolError(f"frame of {n} bytes is over the limit of {self._max}")
            if end - pos - 4 < n:
                break
            out.append(bytes(buf[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        if pos:
            del buf[:pos]
        return out

    def pending(self) -> int:
        """Bytes of an incomplete frame held back."""
        return len(self._buf)
