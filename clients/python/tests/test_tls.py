"""TLS from Python against a real server: certificates made in the test
(trustme, cryptography, `dlock-server cert`), never checked in. The right CA
and name connect; no CA, a wrong CA, a wrong name, and a missing client
certificate under mutual TLS are refused promptly with ConnectError. A TLS
setup that does not fit the server's (a plain client at a TLS port, a TLS
client at a plain port, a CA certificate presented as the server's own) is a
TLSError that says what to change, not tried on the other nodes."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, List, Tuple

import pytest
import trustme

import dlock
import dlock.aio
from dlock import ConnectError
from conftest import LIMIT, SERVER_BIN, run


def _server_files(tmp_path: Path, ca: trustme.CA, *names: str) -> Tuple[str, str]:
    cert = ca.issue_cert(*names)
    cert_file, key_file = tmp_path / "server.pem", tmp_path / "server.key"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    return str(cert_file), str(key_file)


def _ca_file(tmp_path: Path, ca: trustme.CA, name: str) -> str:
    path = tmp_path / f"{name}.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
def tls_server(start_server: Any, tmp_path: Path) -> Tuple[Any, str]:
    ca = trustme.CA()
    cert, key = _server_files(tmp_path, ca, "127.0.0.1")
    return start_server("--tls-cert", cert, "--tls-key", key), _ca_file(tmp_path, ca, "ca")


def test_a_lock_over_tls_with_the_right_ca_sync_and_asyncio(tls_server):
    server, ca = tls_server
    with dlock.Client(server.addr, tls_ca=ca) as client:
        with client.lock("tls/sync", wait=5) as lock:
            assert lock.fence > 0
            assert client.inspect("tls/sync")[0].held_by_caller

    async def body():
        async with dlock.aio.connect(server.addr, tls_ca=ca) as client:
            lock = await client.lock("tls/aio", wait=5)
            await lock.unlock()
            assert await client.ping() >= 0

    run(body())


def test_the_env_vars_turn_tls_on(tls_server, monkeypatch):
    server, ca = tls_server
    monkeypatch.setenv("DLOCK_TLS_CA", ca)
    with dlock.Client(server.addr) as client:
        assert client.ping() >= 0


def test_no_ca_a_wrong_ca_and_a_wrong_name_are_refused_promptly(tls_server, start_server, tmp_path):
    server, _ = tls_server
    started = time.monotonic()
    # Plain TCP against a TLS port: the server's answer is a TLS record, not
    # a frame; the connect fails within its timeout, not later.
    with pytest.raises(ConnectError, match="tls_ca"):
        dlock.Client(server.addr, connect_timeout=2)
    other = _ca_file(tmp_path, trustme.CA(), "other")
    with pytest.raises(ConnectError, match="give tls_ca"):
        dlock.Client(server.addr, tls_ca=other, connect_timeout=2)
    # A certificate for another name, signed by the CA the client trusts.
    ca = trustme.CA()
    cert, key = _server_files(tmp_path, ca, "dlock.example")
    misnamed = start_server("--tls-cert", cert, "--tls-key", key)
    with pytest.raises(ConnectError, match="does not name 127.0.0.1"):
        dlock.Client(misnamed.addr, tls_ca=_ca_file(tmp_path, ca, "ca2"), connect_timeout=2)
    assert time.monotonic() - started < 15


def test_mutual_tls_needs_a_client_certificate_of_the_servers_ca(start_server, tmp_path):
    ca = trustme.CA()
    cert, key = _server_files(tmp_path, ca, "127.0.0.1")
    ca_file = _ca_file(tmp_path, ca, "ca")
    server = start_server("--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca_file)
    with pytest.raises(ConnectError):
        # TLS 1.3 reports a missing client certificate after the handshake:
        # the Hello then fails, within the connect timeout.
        dlock.Client(server.addr, tls_ca=ca_file, connect_timeout=3)
    client_cert = ca.issue_cert("jobs-client")
    cfile, kfile = tmp_path / "client.pem", tmp_path / "client.key"
    client_cert.cert_chain_pems[0].write_to_path(str(cfile))
    client_cert.private_key_pem.write_to_path(str(kfile))
    with dlock.Client(server.addr, tls_ca=ca_file, tls_cert=str(cfile), tls_key=str(kfile)) as client:
        with client.lock("mtls", wait=5) as lock:
            assert lock.fence > 0


def test_half_a_client_certificate_is_refused_before_connecting(tmp_path):
    with pytest.raises(ValueError, match="go together"):
        dlock.Client("127.0.0.1:1", tls_ca="ca.pem", tls_cert="c.pem")
    with pytest.raises(ValueError, match="needs tls_ca"):
        dlock.Client("127.0.0.1:1", tls_cert="c.pem", tls_key="k.pem")


# -- TLS setups that do not fit the server's -------------------------------


def _closed_port() -> str:
    """An address nothing listens on (a port just given up)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1:%d" % s.getsockname()[1]


def _cert_command(certs: Path, *args: str) -> None:
    done = subprocess.run(
        [str(SERVER_BIN), "cert", *args, "--dir", str(certs)], capture_output=True, text=True, timeout=LIMIT
    )
    assert done.returncode == 0, f"dlock-server cert {args}: {done.stderr}"


def _dlock_server_certs(tmp_path: Path) -> Tuple[str, str, str]:
    """(CA, node certificate, node key) made by `dlock-server cert`."""
    certs = tmp_path / "certs"
    _cert_command(certs, "create-ca")
    _cert_command(certs, "create-node", "n1", "--addr", "127.0.0.1")
    return str(certs / "ca.pem"), str(certs / "n1.pem"), str(certs / "n1.key")


def _ca_as_own_cert(tmp_path: Path) -> Tuple[str, str]:
    """One self-signed certificate with basic constraints CA:TRUE and the IP
    name 127.0.0.1, to be both the server's certificate and the client's CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "both.pem", tmp_path / "both.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_file), str(key_file)


def _want_tls_error(error: BaseException, problem: str, *want: str) -> None:
    """`error` is a dlock.TLSError of `problem` (raised as it is, not a
    ConnectError listing attempts: no other node was tried), a ConnectError
    too, whose message says every part of `want`."""
    text = str(error)
    for part in want:
        assert part in text, f"{text!r} does not say {part!r}"
    assert "is dlock-server running" not in text
    assert type(error) is dlock.TLSError, f"want a TLSError ({problem}), got {type(error).__name__}: {error}"
    assert isinstance(error, ConnectError)
    assert error.problem is getattr(dlock.TLSProblem, problem), error.problem


def test_a_plain_client_at_a_tls_port_is_told_to_give_the_ca(start_server, tmp_path, monkeypatch):
    # The server answers with a TLS alert, whose first bytes read as a frame
    # of 352,518,912 bytes: read as TLS, not tried on the other node.
    ca, cert, key = _dlock_server_certs(tmp_path)
    server = start_server("--tls-cert", cert, "--tls-key", key)
    monkeypatch.delenv("DLOCK_TLS_CA", raising=False)
    want = (
        f"the server at {server.addr} speaks TLS: give the CA certificate that signed its certificate "
        "with tls_ca= (DLOCK_TLS_CA)"
    )
    started = time.monotonic()
    with pytest.raises(ConnectError) as e:
        dlock.Client(f"{server.addr},{_closed_port()}", connect_timeout=5)
    assert time.monotonic() - started < 2, "went round the nodes"
    _want_tls_error(e.value, "SERVER_SPEAKS_TLS", want)
    assert str(e.value) == want
    assert "352518912" not in str(e.value)

    async def body() -> None:
        with pytest.raises(ConnectError) as e:
            await dlock.aio.connect(server.addr, connect_timeout=5)
        _want_tls_error(e.value, "SERVER_SPEAKS_TLS", want)

    run(body())
    # With the CA, the same server serves.
    with dlock.Client(server.addr, tls_ca=ca) as client:
        assert client.ping() >= 0


def test_a_tls_client_at_a_plain_port_is_told_the_server_does_not_speak_tls(server, tmp_path):
    ca, _, _ = _dlock_server_certs(tmp_path)
    with pytest.raises(ConnectError) as e:
        dlock.Client(f"{server.addr},{_closed_port()}", tls_ca=ca, connect_timeout=5)
    _want_tls_error(
        e.value,
        "SERVER_SPEAKS_NO_TLS",
        f"the server at {server.addr} does not speak TLS (",
        "): connect without tls_ca= (DLOCK_TLS_CA), or start dlock-server with --tls-cert and --tls-key",
    )
    assert isinstance(e.value.__cause__, ssl.SSLError), repr(e.value.__cause__)


class _TlsFront:
    """TLS on loopback with the given certificate, each connection's bytes
    passed on to and from a plain server at `target`: a server that presents
    a certificate dlock-server would not take. Its threads end with the
    process (daemon), or when either side closes."""

    def __init__(self, cert: str, key: str, target: str) -> None:
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(cert, key)
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            tls = self._context.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            conn.close()  # the client refused the certificate: as it should
            return
        plain = socket.create_connection(self._target, timeout=LIMIT)
        threading.Thread(target=_pass_on, args=(plain, tls), daemon=True).start()
        _pass_on(tls, plain)


def _pass_on(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.close()
        except OSError:
            pass


def test_a_ca_certificate_as_the_servers_own_is_refused(start_server, tmp_path, monkeypatch):
    # Python's ssl (OpenSSL) accepts it; rustls (the Rust client, dlock) and
    # the Go client refuse it, and so does this client, saying what to do.
    # dlock-server refuses such a certificate at start: a TLS front with it,
    # before a plain server, presents it.
    both, both_key = _ca_as_own_cert(tmp_path)
    odd = _TlsFront(both, both_key, start_server().addr)
    monkeypatch.setenv("DLOCK_TLS_CA", both)
    with pytest.raises(ConnectError) as e:
        dlock.Client(f"{odd.addr},{_closed_port()}", connect_timeout=5).close()
    _want_tls_error(
        e.value,
        "CA_USED_AS_SERVER_CERTIFICATE",
        f'the server at {odd.addr} presents a CA certificate as its own (its certificate "CN=127.0.0.1" has '
        "basic constraints CA:TRUE",
        "): make a CA and a server certificate signed by it (dlock-server cert create-ca, then create-node), "
        "give the server the node's and the clients the CA's",
    )
    # What the message says to do serves.
    ca, cert, key = _dlock_server_certs(tmp_path)
    server = start_server("--tls-cert", cert, "--tls-key", key)
    monkeypatch.setenv("DLOCK_TLS_CA", ca)
    with dlock.Client(server.addr) as client:
        assert client.ping() >= 0
    # A context that verifies nothing checks nothing more either.
    loose = ssl.create_default_context()
    loose.check_hostname = False
    loose.verify_mode = ssl.CERT_NONE
    with dlock.Client(odd.addr, ssl_context=loose) as client:
        assert client.ping() >= 0


def test_no_tls_guess_where_tls_is_not_the_cause(monkeypatch):
    # A connection closed unanswered, or refused, is no sign of TLS.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: List[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.delenv("DLOCK_TLS_CA", raising=False)
    try:
        for addr in ("127.0.0.1:%d" % listener.getsockname()[1], _closed_port()):
            with pytest.raises(ConnectError) as e:
                dlock.Client(addr, connect_timeout=2)
            assert "TLS" not in str(e.value) and "tls" not in str(e.value), e.value
            assert not isinstance(e.value, dlock.TLSError), e.value
        assert accepted, "the closing listener was reached"
    finally:
        listener.close()


def test_looks_like_tls():
    from dlock._tls import looks_like_tls

    for head, want in [
        (b"\x15\x03\x03\x00\x02", True),
        (b"\x16\x03\x01", True),
        (b"\x16\x03\x04", True),
        (b"\x16\x03\x05", False),
        (b"\x17\x03\x03", False),
        (b"\x15\x02\x00", False),
        (b"\x00\x00\x00\x10", False),
        (b"\x15\x03", False),
    ]:
        assert looks_like_tls(head) is want, head


def test_is_ca_reads_basic_constraints(tmp_path):
    from dlock._tls import is_ca

    def der(path: str) -> bytes:
        return ssl.PEM_cert_to_DER_cert(Path(path).read_text())

    ca, node, _ = _dlock_server_certs(tmp_path)
    both, _ = _ca_as_own_cert(tmp_path)
    authority = trustme.CA()
    leaf = authority.issue_cert("127.0.0.1")
    assert is_ca(der(ca)) and is_ca(der(both)) and is_ca(ssl.PEM_cert_to_DER_cert(authority.cert_pem.bytes().decode()))
    assert not is_ca(der(node))
    assert not is_ca(ssl.PEM_cert_to_DER_cert(leaf.cert_chain_pems[0].bytes().decode()))
    for junk in (b"", b"\x30", b"\x30\x82\xff\xff", b"\x30\x03\x30\x01\x00", bytes(range(256))):
        assert not is_ca(junk)


def test_a_tls_record_split_across_reads_is_still_told_and_frames_still_decode():
    from dlock._proto import dlock_pb2 as pb
    from dlock.dial import Stream
    from dlock.framing import encode

    class Transport:
        aborted = False

        def get_extra_info(self, name: str) -> Any:
            return None

        def abort(self) -> None:
            self.aborted = True

    # A TLS alert (the server's answer to a plain Hello), one byte a read.
    stream, transport = Stream(), Transport()
    stream.connection_made(transport)  # type: ignore[arg-type]
    for byte in b"\x15\x03\x03\x00\x02\x02\x32":
        stream.data_received(bytes([byte]))
    assert stream.speaks_tls and stream.gone and transport.aborted
    # A frame, one byte a read: decoded as ever.
    stream, transport = Stream(), Transport()
    stream.connection_made(transport)  # type: ignore[arg-type]
    frame = encode(pb.Response(request_id=7))
    for byte in frame + frame:
        stream.data_received(bytes([byte]))
    assert not stream.speaks_tls and stream.gone is None and not transport.aborted
    assert [pb.Response.FromString(b).request_id for b in stream._frames] == [7, 7]


def test_a_tls_client_at_a_tls_peer_port_is_told_to_give_a_client_port(start_cluster, tmp_path):
    # A cluster node's TLS peer port (--peer-listen) names its own TLS
    # protocol and refuses "dlock", which this client offers, before it asks
    # for a client certificate: the error says so in the Rust client's
    # words, not tried on the other node. The client port (--listen), with
    # the same files, takes the same client. One node: the peer port's TLS
    # answers before any election.
    ca, cert, key = _dlock_server_certs(tmp_path)
    cluster = start_cluster(
        1, "--tls-cert", cert, "--tls-key", key, "--peer-tls-cert", cert, "--peer-tls-key", key, "--peer-tls-ca", ca
    )
    peer = cluster._peers[0]
    want = (
        f"the server at {peer} refuses dlock's TLS protocol name (",
        "): it is no dlock client port, most likely a cluster node's peer port (its --peer-listen): "
        "give a client port instead (a node's --listen)",
    )
    with pytest.raises(ConnectError) as e:
        dlock.Client(f"{peer},{_closed_port()}", tls_ca=ca, connect_timeout=5)
    _want_tls_error(e.value, "NOT_A_CLIENT_PORT", *want)
    assert "certificate" not in str(e.value)
    assert isinstance(e.value.__cause__, ssl.SSLError), repr(e.value.__cause__)
    # A context of the user's is used as given: one that offers "dlock" is
    # told the same (one that offers nothing is asked for a certificate).
    own = ssl.create_default_context(cafile=ca)
    own.set_alpn_protocols(["dlock"])

    async def body() -> None:
        with pytest.raises(ConnectError) as e:
            await dlock.aio.connect(peer, ssl_context=own, connect_timeout=5)
        _want_tls_error(e.value, "NOT_A_CLIENT_PORT", *want)

    run(body())
    with dlock.Client(cluster.addrs[0], tls_ca=ca, connect_timeout=5) as client:
        assert client.ping() >= 0
