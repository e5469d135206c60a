"""What a connect can tell of a TLS setup that does not fit the server's
(mirrors `looks_like_tls` and `tls_failure` of src/transport.rs in the Rust
library): a TLS record where a plain client expects a frame, a handshake
that read no TLS, a server certificate that is a CA's, a server that
refuses the protocol name dlock offers."""

from __future__ import annotations

import ssl
from typing import Any, Dict, Iterator, Optional, Tuple

#: The OpenSSL reasons of a handshake whose answer is no TLS record (a
#: dlock-server without TLS answers a ClientHello with a frame).
_NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "PACKET_LENGTH_TOO_LONG"})

#: The object identifier of basic constraints (2.5.29.19), DER-encoded.
_BASIC_CONSTRAINTS = bytes.fromhex("551d13")


def looks_like_tls(head: bytes) -> bool:
    """Whether the first bytes of an answer are a TLS record header (an
    alert or a handshake, versions 3.0 to 3.4): a TLS server's answer to a
    plain client, which must not be read as a frame length (0x15030300
    would claim a frame of 352 MB)."""
    return len(head) >= 3 and head[0] in (0x15, 0x16) and head[1] == 0x03 and head[2] <= 0x04


def not_tls(e: ssl.SSLError) -> bool:
    """Whether the handshake failed because what came back is no TLS."""
    return e.reason in _NOT_TLS_REASONS


#: The TLS protocol name (ALPN) dlock's clients offer
#: (dlock_proto::tls::CLIENT_ALPN): a dlock-server's client port names none
#: and takes any client, a cluster node's TLS peer port refuses it at once.
CLIENT_ALPN = "dlock"


def no_application_protocol(e: ssl.SSLError) -> bool:
    """Whether the handshake failed on the server's alert
    no_application_protocol (120): it names no protocol the client offered.
    OpenSSL 3 reports it as reason TLSV1_ALERT_NO_APPLICATION_PROTOCOL; a
    Python whose table lacks that name gives only OpenSSL's words."""
    return e.reason in ("TLSV1_ALERT_NO_APPLICATION_PROTOCOL", "NO_APPLICATION_PROTOCOL") or (
        "alert no application protocol" in str(e) or "alert number 120" in str(e)
    )


def detail(e: ssl.SSLError) -> str:
    """OpenSSL's words for `e`: "ssl: wrong version number" rather than
    "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1006)"."""
    text = str(e.args[1]) if len(e.args) > 1 else str(e)
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    text = text.split(" (_ssl.c:", 1)[0]
    return f"ssl: {text or e.reason or type(e).__name__}"


#: OpenSSL's verify codes of a server certificate no trusted CA signed.
_UNTRUSTED = frozenset({2, 7, 18, 19, 20, 21})
#: ... of one that names another host or address.
_MISNAMED = frozenset({62, 64})
#: ... of one not valid now.
_NOT_NOW = frozenset({9, 10})


def certificate_hint(e: ssl.SSLError, addr: str) -> str:
    """What to change when the handshake failed on the server's certificate,
    as " (...)" to follow OpenSSL's words, else "" (mirrors
    `with_certificate_hint` of src/transport.rs)."""
    if not isinstance(e, ssl.SSLCertVerificationError):
        return ""
    host = addr.rsplit(":", 1)[0].strip("[]")
    if e.verify_code in _UNTRUSTED:
        return (
            " (the server's certificate is not signed by the CA this client trusts: give tls_ca "
            "(DLOCK_TLS_CA) the CA file that signed it, the ca.pem of `dlock-server cert`)"
        )
    if e.verify_code in _MISNAMED:
        return (
            f" (the server's certificate does not name {host}: dial a name or address it holds, "
            f"or give the server a certificate for {host} "
            f"(dlock-server cert create-node NAME --addr {host}))"
        )
    if e.verify_code in _NOT_NOW:
        return (
            " (the server's certificate is not valid now (expired, or the clocks disagree): "
            "renew it (dlock-server cert create-node) and send the server SIGHUP)"
        )
    return ""


def ca_as_own(ssl_object: Optional[ssl.SSLObject]) -> Optional[str]:
    """Why the server's certificate must be refused as a CA's (its basic
    constraints say CA:TRUE), else None. OpenSSL accepts such a
    certificate when it is in the CA file itself (one self-signed
    certificate given as both the server's and the clients' CA); rustls, so
    the Rust client and dlock, refuse it (CaUsedAsEndEntity), and so do the
    Go client and this one. Nothing is checked for a context that verifies
    nothing (`ssl.CERT_NONE`)."""
    if ssl_object is None or ssl_object.context.verify_mode == ssl.CERT_NONE:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der or not is_ca(der):
        return None
    subject = _subject(ssl_object.getpeercert())
    return f'its certificate "{subject}" has basic constraints CA:TRUE'


def is_ca(der: bytes) -> bool:
    """Whether the DER certificate `der` has basic constraints with cA
    true. Anything it cannot read counts as no."""
    try:
        _, start, end = _tlv(der, 0)  # Certificate
        _, start, end = _tlv(der, start)  # TBSCertificate
        for tag, field, field_end in _items(der, start, end):
            if tag != 0xA3:  # [3] extensions
                continue
            _, start, end = _tlv(der, field)  # SEQUENCE OF Extension
            for _, ext, ext_end in _items(der, start, end):
                parts = list(_items(der, ext, ext_end))  # extnID, critical?, extnValue
                oid_tag, oid, oid_end = parts[0]
                if oid_tag != 0x06 or der[oid:oid_end] != _BASIC_CONSTRAINTS:
                    continue
                value_tag, value, _ = parts[-1]
                if value_tag != 0x04:
                    return False
                _, start, end = _tlv(der, value)  # BasicConstraints
                for tag, flag, flag_end in _items(der, start, end):
                    # cA BOOLEAN DEFAULT FALSE comes first when present.
                    return tag == 0x01 and der[flag:flag_end] != b"\x00"
                return False
        return False
    except (IndexError, ValueError):
        return False


def _tlv(der: bytes, pos: int) -> Tuple[int, int, int]:
    """(tag, start, end) of the DER element at `pos`: its contents are
    der[start:end]."""
    tag = der[pos]
    n = der[pos + 1]
    pos += 2
    if n & 0x80:
        size = n & 0x7F
        if not 0 < size <= 4:
            raise ValueError("unsupported DER length")
        n = int.from_bytes(der[pos : pos + size], "big")
        pos += size
    if pos + n > len(der):
        raise ValueError("DER element past the end")
    return tag, pos, pos + n


def _items(der: bytes, start: int, end: int) -> Iterator[Tuple[int, int, int]]:
    """The elements of the contents der[start:end], in order."""
    while start < end:
        tag, item, item_end = _tlv(der, start)
        if item_end > end:
            raise ValueError("DER element past its container")
        yield tag, item, item_end
        start = item_end


_SHORT_NAMES = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
}


def _subject(cert: Dict[str, Any]) -> str:
    """A certificate's subject as `ssl.getpeercert()` gives it, written as
    "CN=127.0.0.1,O=..." (RFC 4514's order, as Go and OpenSSL print it)."""
    names = [
        f"{_SHORT_NAMES.get(key, key)}={value}" for rdn in cert.get("subject", ()) for key, value in rdn
    ]
    return ",".join(reversed(names))
