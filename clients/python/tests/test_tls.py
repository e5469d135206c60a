"""TLS from Python against a real server: certificates made in the test
(trustme), never checked in. The right CA and name connect; no CA, a wrong
CA, a wrong name, and a missing client certificate under mutual TLS are
refused promptly with ConnectError."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Tuple

import pytest
import trustme

import dlock
import dlock.aio
from dlock import ConnectError
from conftest import run


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
    with pytest.raises(ConnectError, match="TLS"):
        dlock.Client(server.addr, tls_ca=other, connect_timeout=2)
    # A certificate for another name, signed by the CA the client trusts.
    ca = trustme.CA()
    cert, key = _server_files(tmp_path, ca, "dlock.example")
    misnamed = start_server("--tls-cert", cert, "--tls-key", key)
    with pytest.raises(ConnectError, match="TLS"):
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
