"""Security against a live server: join token, admin token, signed and
replay-proof data plane, garbage on the data-plane port, limits, TLS."""

from __future__ import annotations

import datetime
import random
import socket
import stat
import struct
import time
from pathlib import Path

import httpx
import msgpack
import pytest
import torch

from hermes.client.transport import (
    ControlClient,
    DataClient,
    RemoteError,
    ServerUnreachable,
    tls_context,
)
from hermes.common.control_messages import RegisterRequest
from hermes.common.wire import ErrorCode, MsgType
from tests.conftest import ADMIN_TOKEN, JOIN_TOKEN, running_server

pytestmark = pytest.mark.integration


def _register(server, name: str, token: str | None = JOIN_TOKEN, scheme: str = "Bearer") -> httpx.Response:
    headers = {"Authorization": f"{scheme} {token}"} if token is not None else {}
    return server.http.post(server.url + "/v1/workers/register", json={"name": name}, headers=headers)


def _rejected(server, frames: list[bytes], code: ErrorCode) -> dict:
    """The reply is an error with ``code`` and that code's counter went up by exactly one."""
    before = server.error_count(code.value)
    msg = server.exchange(frames)
    assert msg.header.type is MsgType.ERROR, msg.header
    assert msg.header.body["code"] == code.value, msg.header.body
    assert server.error_count(code.value) == before + 1
    return msg.header.body


# ---------------------------------------------------------------------------
# joining


def test_registration_needs_the_join_token(live_server):
    before = live_server.counter("hermes_registrations_total", outcome="unauthorized")
    for token, scheme in ((None, ""), (JOIN_TOKEN, "Basic"), ("wrong-" + JOIN_TOKEN, "Bearer"),
                          (JOIN_TOKEN[:-1], "Bearer")):
        r = _register(live_server, "intruder", token, scheme)
        assert r.status_code == 401, r.text
        assert "join token" in r.json()["detail"]
        assert "token" not in r.json() and r.headers.get("www-authenticate") == "Bearer"
    assert live_server.counter("hermes_registrations_total", outcome="unauthorized") == before + 4
    assert "intruder" not in {w["name"] for w in live_server.workers().values()}
    assert "registration from 127.0.0.1 refused (unauthorized)" in live_server.log_text()
    assert _register(live_server, "welcome").status_code == 200


def test_worker_list_never_shows_secrets(live_server):
    w = live_server.register("discreet")
    text = live_server.get("/v1/workers").text + live_server.get("/v1/summary").text
    assert w.token not in text and JOIN_TOKEN not in text


def test_stop_needs_the_admin_token(server_factory):
    srv = server_factory()
    for headers in ({}, {"Authorization": "Bearer " + JOIN_TOKEN}, {"Authorization": "Bearer wrong"}):
        r = srv.http.post(srv.url + "/v1/stop", headers=headers)
        assert r.status_code == 401, r.text
    assert srv.healthz()["stopping"] is False
    r = srv.http.post(srv.url + "/v1/stop", headers={"Authorization": "Bearer " + ADMIN_TOKEN})
    assert r.status_code == 200 and r.json()["stopping"] is True


def test_generated_admin_token_is_private_to_the_server_user(server_factory):
    srv = server_factory(env={"HERMES_ADMIN_TOKEN": None})
    path = srv.out_dir / "admin.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    assert len(token) >= 32 and token not in srv.log_text()
    assert srv.http.post(srv.url + "/v1/stop").status_code == 401
    assert srv.http.post(srv.url + "/v1/stop", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_insecure_server_lets_anyone_join(server_factory):
    srv = server_factory("--insecure", env={"HERMES_JOIN_TOKEN": None, "HERMES_ADMIN_TOKEN": None})
    assert _register(srv, "anyone", token=None).status_code == 200
    assert "--insecure" in srv.log_text()
    # The data plane is still signed: a worker's secret is still needed there.
    w = srv.register("signed")
    _rejected(srv, w.frames(MsgType.PULL_MODEL, sign=False), ErrorCode.UNAUTHORIZED)
    w.pull()


READS = ("/v1/status", "/v1/workers", "/v1/config", "/v1/summary", "/metrics")


def test_read_endpoints_are_open_by_default(live_server):
    for path in READS + ("/healthz",):
        assert httpx.get(live_server.url + path, timeout=10).status_code == 200, path


def test_protected_reads_need_the_join_or_the_admin_token(server_factory):
    srv = server_factory("--protect-reads", http_kwargs={"headers": {"Authorization": f"Bearer {ADMIN_TOKEN}"}})
    for path in READS:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {JOIN_TOKEN}"}):
            r = httpx.get(srv.url + path, headers=headers, timeout=10)
            assert r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer", (path, r.text)
        for token in (JOIN_TOKEN, ADMIN_TOKEN):
            assert httpx.get(srv.url + path, headers={"Authorization": f"Bearer {token}"},
                             timeout=10).status_code == 200, path
    # Liveness probes need no secret; it tells nothing beyond the version.
    assert httpx.get(srv.url + "/healthz", timeout=10).status_code == 200
    assert srv.counter("hermes_reads_refused_total", endpoint="/v1/status") == 3
    assert "read of /v1/summary from 127.0.0.1 refused" in srv.log_text()
    assert JOIN_TOKEN not in srv.log_text() and ADMIN_TOKEN not in srv.log_text()
    # An agent reads status with its join token.
    control = ControlClient(srv.url, join_token=JOIN_TOKEN, retries=0)
    assert control.status()["model_version"] >= 0
    with pytest.raises(RemoteError):
        ControlClient(srv.url, join_token=None, retries=0).status()


# ---------------------------------------------------------------------------
# the data plane


def test_forged_signature_is_rejected_and_counted(live_server):
    w = live_server.register("forgery-target")
    v0, m0 = w.pull()
    good = w.frames(MsgType.PUSH_UPDATE, torch.ones(w.numel), model_version=v0, shapes=w.shapes,
                    body={"samples": 8})
    forged = list(good)
    forged[1] = bytes(4 * w.numel)  # same length; a signed message has no CRC: only the MAC can tell
    assert msgpack.unpackb(good[0], raw=False)["checksum"] == 0
    body = _rejected(live_server, forged, ErrorCode.UNAUTHORIZED)
    assert "bad signature" in body["message"]
    v1, m1 = w.other_session().pull()
    assert v1 == v0 and torch.equal(m1, m0)


def test_replayed_message_is_rejected_and_counted(live_server):
    w = live_server.register("replay-target")
    v0, m0 = w.pull()
    # Honest-sized (screening is on), a power of two: the fold is exact.
    push = w.frames(MsgType.PUSH_UPDATE, torch.full((w.numel,), 2.0 ** -8), model_version=v0, shapes=w.shapes,
                    body={"samples": 8})
    reply = live_server.exchange(push)
    assert reply.header.body["status"] == "applied"
    body = _rejected(live_server, push, ErrorCode.REPLAY)  # the very same bytes again
    assert "already seen" in body["message"]
    # An older message of the same session is a replay too.
    _rejected(live_server, push, ErrorCode.REPLAY)
    # A message signed correctly but with a stale timestamp (captured long ago).
    old = w.frames(MsgType.PULL_MODEL, ts=int(time.time() * 1000) - 3_600_000)
    assert "timestamp" in _rejected(live_server, old, ErrorCode.REPLAY)["message"]
    v1, m1 = w.pull()
    assert v1 == v0 + 1 and torch.equal(m1, m0 + 2.0 ** -8), "the replayed push was applied twice"
    assert live_server.workers()[w.id]["pushes"] == 1


def test_replies_are_signed_and_checked_by_the_client(live_server):
    reg = live_server.register_raw("reply-checker")
    client = DataClient(live_server.data_address, reg["worker_id"], reg["token"], timeout=5)
    try:
        reply = client.request(MsgType.PULL_MODEL, {"dtype": "float32"})
        assert len(reply.header.mac) == 32 and reply.header.session == client.session
        # A client holding another secret drops the (validly signed) reply as unverifiable.
        imposter = DataClient(live_server.data_address, reg["worker_id"], "not-the-secret" * 3, timeout=1, retries=0)
        with pytest.raises(RemoteError) as ei:
            imposter.request(MsgType.PULL_MODEL, {"dtype": "float32"})
        assert ei.value.code == ErrorCode.UNAUTHORIZED.value
        imposter.close()
    finally:
        client.close()


def _zmtp_greeting() -> bytes:
    return b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31


def _zmtp_ready(socket_type: bytes = b"DEALER") -> bytes:
    name = b"Socket-Type"
    body = b"\x05READY" + bytes([len(name)]) + name + struct.pack(">I", len(socket_type)) + socket_type
    return b"\x04" + bytes([len(body)]) + body


def test_random_bytes_and_truncated_frames_leave_the_server_healthy(live_server):
    w = live_server.register("bystander")
    v0, m0 = w.pull()
    rng = random.Random(2024)
    payloads = [
        rng.randbytes(4096),                                   # not ZMTP at all
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                  # wrong protocol
        _zmtp_greeting()[:7],                                  # truncated greeting
        _zmtp_greeting(),                                      # greeting, then silence
        _zmtp_greeting() + _zmtp_ready()[:5],                  # truncated handshake
        _zmtp_greeting() + _zmtp_ready() + b"\x00\x40" + b"x" * 10,      # frame announced 64 bytes, sent 10
        _zmtp_greeting() + _zmtp_ready() + b"\x02" + struct.pack(">Q", 1 << 40) + b"x",  # a 1 TB frame claimed
        _zmtp_greeting() + _zmtp_ready() + b"\x00\x05hello",   # one complete garbage frame
    ]
    for data in payloads:
        with socket.create_connection(("127.0.0.1", live_server.data_port), timeout=2) as s:
            s.sendall(data)
            time.sleep(0.05)
    for _ in range(20):  # and a quick burst of connect/abort
        with socket.create_connection(("127.0.0.1", live_server.data_port), timeout=2) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.sendall(rng.randbytes(rng.randrange(1, 200)))
    assert live_server.healthz()["status"] == "ok"
    v1, m1 = w.pull()
    assert v1 == v0 and torch.equal(m1, m0)
    assert live_server.error_count(ErrorCode.INTERNAL.value) == 0
    assert "Traceback" not in live_server.log_text()


# ---------------------------------------------------------------------------
# limits


def test_registration_rate_limit_is_enforced_and_reported(server_factory):
    srv = server_factory("--register-rate", "0.2", "--register-burst", "3")  # the fixture's probe took one
    assert _register(srv, "r1").status_code == 200
    assert _register(srv, "r2", token="wrong-token-guess").status_code == 401  # guesses draw from the bucket
    r = _register(srv, "r3")
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1 and "retry in" in r.json()["detail"]
    assert srv.counter("hermes_limit_hits_total", limit="register_rate") == 1
    assert srv.counter("hermes_registrations_total", outcome="rate_limited") == 1
    assert "refused (rate_limited)" in srv.log_text()


def test_max_workers_is_enforced_and_reported(server_factory):
    srv = server_factory("--max-workers", "2")  # the probe is one
    assert _register(srv, "m1").status_code == 200
    r = _register(srv, "m2")
    assert r.status_code == 503 and "max_workers=2" in r.json()["detail"]
    assert srv.counter("hermes_limit_hits_total", limit="max_workers") == 1
    assert _register(srv, "m1").status_code == 200  # a known name rejoins within the limit


def test_agent_refuses_to_send_over_the_servers_limit(server_factory):
    srv = server_factory("--max-message-bytes", "60000")
    reg = srv.register_raw("modest")
    assert reg["max_message_bytes"] == 60000
    client = DataClient(srv.data_address, reg["worker_id"], reg["token"], timeout=5,
                        max_message_bytes=reg["max_message_bytes"])
    try:
        with pytest.raises(RemoteError) as ei:
            client.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=torch.zeros(20_000))
        assert ei.value.code == "too_large" and "60000" in ei.value.message
    finally:
        client.close()


# ---------------------------------------------------------------------------
# TLS


def _cert(tmp: Path, name: str, *, ca=None, client: bool = False):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    issuer_key, issuer = (key, subject) if ca is None else (ca[1], ca[2])
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=1)))
    if ca is None:
        b = b.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    else:
        b = b.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        if client:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        else:
            import ipaddress
            b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                              x509.DNSName("localhost")]), critical=False)
    cert = b.sign(issuer_key, hashes.SHA256())
    cert_path, key_path = tmp / f"{name}.pem", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key, subject, key_path


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    pytest.importorskip("cryptography")
    tmp = tmp_path_factory.mktemp("pki")
    ca_path, ca_key, ca_name, _ = _cert(tmp, "ca")
    ca = (ca_path, ca_key, ca_name)
    server_cert, _, _, server_key = _cert(tmp, "server", ca=ca)
    client_cert, _, _, client_key = _cert(tmp, "client", ca=ca, client=True)
    return {"ca": str(ca_path), "server": (str(server_cert), str(server_key)),
            "client": (str(client_cert), str(client_key))}


def test_tls_control_plane(tmp_path, pki):
    cert, key = pki["server"]
    with running_server(tmp_path, "--ssl-certfile", cert, "--ssl-keyfile", key, scheme="https",
                        http_kwargs={"verify": pki["ca"]}) as srv:
        assert srv.url.startswith("https://")
        # The agent's control client, trusting our CA, registers and heartbeats over TLS.
        control = ControlClient(srv.url, retries=0, join_token=JOIN_TOKEN, ssl_context=tls_context(pki["ca"]))
        reg = control.register(RegisterRequest(name="tls-agent"))
        assert control.heartbeat(reg.worker_id, reg.token).state == "active"
        # Without our CA the certificate is refused at once (no retry loop).
        with pytest.raises(RemoteError) as ei:
            ControlClient(srv.url, retries=3, join_token=JOIN_TOKEN).register(RegisterRequest(name="naive"))
        assert ei.value.code == "tls" and "CERTIFICATE_VERIFY_FAILED" in ei.value.message
        # Plain HTTP to the TLS port does not get in either.
        with pytest.raises(httpx.HTTPError):
            httpx.get(srv.url.replace("https", "http") + "/healthz", timeout=3)


def test_mutual_tls_requires_a_client_certificate(tmp_path, pki):
    cert, key = pki["server"]
    with running_server(tmp_path, "--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-ca-certfile", pki["ca"],
                        scheme="https", http_kwargs={"verify": tls_context(pki["ca"], *pki["client"])}) as srv:
        ok = ControlClient(srv.url, retries=0, join_token=JOIN_TOKEN,
                           ssl_context=tls_context(pki["ca"], *pki["client"]))
        assert ok.register(RegisterRequest(name="mtls-agent")).worker_id
        # Without a client certificate the handshake fails (or the server drops the connection).
        with pytest.raises((RemoteError, ServerUnreachable)):
            ControlClient(srv.url, retries=0, join_token=JOIN_TOKEN, ssl_context=tls_context(pki["ca"])).register(
                RegisterRequest(name="no-cert"))
        assert "no-cert" not in {w["name"] for w in srv.workers().values()}


def test_tls_flags_are_checked_before_start(tmp_path, pki):
    import subprocess
    import sys

    from tests.conftest import _server_env
    cert, _ = pki["server"]
    for args, wanted in ((["--ssl-certfile", cert], "go together"),
                         (["--ssl-certfile", cert, "--ssl-keyfile", str(tmp_path / "nope.key")], "no such file")):
        proc = subprocess.run([sys.executable, "-m", "hermes.server.cli", *args], capture_output=True, text=True,
                              timeout=60, env=_server_env())
        assert proc.returncode == 2 and wanted in proc.stderr, proc.stderr
