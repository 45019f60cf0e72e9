"""``/metrics`` over TLS with client certificates (``--tls-*``; docs/security.md).

Certificates are made here with ``cryptography``: a CA, a server certificate for 127.0.0.1, a
client certificate from the same CA, and a client certificate from another CA.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest

from gpuscope.exporter.cli import build_tls
from gpuscope.exporter.config import ConfigError, parse_config
from gpuscope.exporter.flags import StartupError
from gpuscope.exporter.sinks.prometheus import server as server_module
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sinks.prometheus.server import ExporterServer
from gpuscope.exporter.sinks.prometheus.tls import ReloadingContext, TLSError, tls_context
from tests.conftest import REPO, ExporterProcess, free_port, wait_for
from tests.exporter.snapshots import fixed_snapshot
from tests.pki import Issued, TestCA

SERVER_NAME = "gpuscope-exporter.gpuscope.svc"  # as docs/security.md suggests


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    other_client_cert: Path
    other_client_key: Path
    issuer: TestCA  # (the CA itself, to issue a renewed certificate)


def _make_pki(tmp: Path) -> Pki:
    def write(name: str, data: bytes) -> Path:
        path = tmp / name
        path.write_bytes(data)
        return path

    def files(name: str, issued: Issued) -> tuple[Path, Path]:
        return write(f"{name}.crt", issued.cert_pem), write(f"{name}.key", issued.key_pem)

    ca, other = TestCA("gpuscope-ca"), TestCA("other-ca")
    server_cert, server_key = files(
        "exporter", ca.issue("exporter", server=True, sans=["127.0.0.1", SERVER_NAME]))
    client_cert, client_key = files("prometheus", ca.issue("prometheus", server=False))
    other_cert, other_key = files("intruder", other.issue("intruder", server=False))
    return Pki(write("gpuscope-ca.crt", ca.cert_pem), server_cert, server_key, client_cert,
               client_key, write("other-ca.crt", other.cert_pem), other_cert, other_key, ca)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return _make_pki(tmp_path_factory.mktemp("pki"))


@dataclass
class TlsServer:
    url: str
    port: int
    registry: CollectorRegistry


@pytest.fixture
def tls_server(pki: Pki) -> Iterator[TlsServer]:
    snap = fixed_snapshot()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(lambda: snap))
    ctx = tls_context(str(pki.server_cert), str(pki.server_key), str(pki.ca))
    srv = ExporterServer("127.0.0.1", 0, registry, lambda: True, lambda: True, ssl_context=ctx)
    srv.start()
    yield TlsServer(f"https://127.0.0.1:{srv.port}", srv.port, registry)
    srv.stop()


def good_scrape(pki: Pki, url: str, timeout: float = 5) -> requests.Response:
    return requests.get(url + "/metrics", verify=str(pki.ca), timeout=timeout,
                        cert=(str(pki.client_cert), str(pki.client_key)),
                        headers={"Accept-Encoding": "identity"})


def test_scrape_with_client_certificate(pki: Pki, tls_server: TlsServer) -> None:
    r = good_scrape(pki, tls_server.url)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert r.content == generate_latest(tls_server.registry)
    assert requests.get(tls_server.url + "/readyz", verify=str(pki.ca), timeout=5,
                        cert=(str(pki.client_cert), str(pki.client_key))).status_code == 200


def test_tls_1_2_at_least(pki: Pki, tls_server: TlsServer) -> None:
    ctx = tls_context(str(pki.server_cert), str(pki.server_key), str(pki.ca))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert tls_context(str(pki.server_cert), str(pki.server_key)).verify_mode == ssl.CERT_NONE
    client = ssl.create_default_context(cafile=str(pki.ca))
    client.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    client.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=5) as raw, \
            client.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        assert s.version() == "TLSv1.2"


@pytest.mark.parametrize("who", ["no client certificate", "certificate from another CA"])
def test_client_without_a_trusted_certificate_is_refused(
    pki: Pki, tls_server: TlsServer, who: str
) -> None:
    cert = None if who == "no client certificate" else (
        str(pki.other_client_cert), str(pki.other_client_key))
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(tls_server.url + "/metrics", verify=str(pki.ca), cert=cert, timeout=5)
    assert good_scrape(pki, tls_server.url).status_code == 200


def test_plain_http_to_the_tls_port_fails_and_server_keeps_serving(
    pki: Pki, tls_server: TlsServer
) -> None:
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{tls_server.port}/metrics", timeout=5)
    assert good_scrape(pki, tls_server.url).status_code == 200


def test_silent_clients_do_not_block_scrapes(pki: Pki, tls_server: TlsServer) -> None:
    silent = [socket.create_connection(("127.0.0.1", tls_server.port)) for _ in range(3)]
    try:
        time.sleep(0.2)  # the server has accepted them
        began = time.monotonic()
        assert good_scrape(pki, tls_server.url, timeout=2).status_code == 200
        assert time.monotonic() - began < 2.0
    finally:
        for s in silent:
            s.close()


def test_handshake_times_out(
    pki: Pki, tls_server: TlsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "TLS_HANDSHAKE_TIMEOUT", 0.3)
    with socket.create_connection(("127.0.0.1", tls_server.port)) as s:
        s.settimeout(5)
        began = time.monotonic()
        assert s.recv(1024) == b""  # the server gave up and closed the connection
        assert time.monotonic() - began < 3.0


def test_concurrent_scrapes(pki: Pki, tls_server: TlsServer) -> None:
    codes: list[int] = []

    def scrape() -> None:
        codes.append(good_scrape(pki, tls_server.url).status_code)

    threads = [threading.Thread(target=scrape) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert codes == [200] * 8


def test_probe_server_serves_probes_only() -> None:
    registry = CollectorRegistry(auto_describe=False)
    srv = ExporterServer("127.0.0.1", 0, registry, lambda: True, lambda: False,
                         probes_only=True)
    srv.start()
    try:
        url = f"http://127.0.0.1:{srv.port}"
        assert requests.get(url + "/healthz", timeout=5).status_code == 200
        assert requests.get(url + "/readyz", timeout=5).status_code == 503
        for path in ("/metrics", "/", "/other"):
            assert requests.get(url + path, timeout=5).status_code == 404
    finally:
        srv.stop()


def test_a_server_never_started_stops() -> None:
    ExporterServer("127.0.0.1", 0, CollectorRegistry(), lambda: True, lambda: True).stop()


# -- configuration ---------------------------------------------------------------------------
def test_flags_and_environment(pki: Pki) -> None:
    assert parse_config([], environ={}).tls_cert_file is None
    cfg = parse_config([], environ={"GPUSCOPE_TLS_CERT_FILE": "/c.pem",
                                    "GPUSCOPE_TLS_KEY_FILE": "/k.pem",
                                    "GPUSCOPE_TLS_CLIENT_CA_FILE": "/ca.pem"})
    assert (cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file) == (
        "/c.pem", "/k.pem", "/ca.pem")
    assert build_tls(parse_config([], environ={})) is None
    assert parse_config([], environ={}).probe_listen is None
    assert parse_config(["--probe-listen", ":9401"], environ={}).probe_listen == (
        "::", 9401)  # every IPv6 and IPv4 address
    cfg = parse_config(["--tls-cert-file", str(pki.server_cert),
                        "--tls-key-file", str(pki.server_key)], environ={})
    assert isinstance(build_tls(cfg), ReloadingContext)


@pytest.mark.parametrize(("argv", "message"), [
    (["--tls-cert-file", "/c.pem"], "--tls-cert-file and --tls-key-file go together"),
    (["--tls-key-file", "/k.pem"], "--tls-cert-file and --tls-key-file go together"),
    (["--tls-client-ca-file", "/ca.pem"], "--tls-client-ca-file needs --tls-cert-file"),
])
def test_incomplete_flags_are_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(argv, environ={})
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_unusable_files_are_one_line(pki: Pki, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    unreadable = tmp_path / "unreadable.pem"
    unreadable.write_bytes(pki.ca.read_bytes())
    unreadable.chmod(0)
    cert, key = str(pki.server_cert), str(pki.server_key)
    cases = [
        ((str(tmp_path / "missing.crt"), key, None),
         f"--tls-cert-file {tmp_path / 'missing.crt'}: No such file or directory"),
        ((cert, str(tmp_path / "missing.key"), None), "--tls-key-file "),
        ((str(garbage), key, None), f"--tls-cert-file {garbage}: no PEM certificate"),
        ((cert, str(garbage), None), f"--tls-key-file {garbage}: no PEM private key"),
        ((cert, str(pki.client_key), None), "is not the key of the certificate"),
        ((cert, key, str(garbage)), f"--tls-client-ca-file {garbage}: no usable PEM CA"),
        ((cert, key, str(pki.server_key)), "--tls-client-ca-file"),
        ((cert, key, str(tmp_path / "missing-ca.crt")), "--tls-client-ca-file"),
    ]
    if os.geteuid() != 0:  # root reads anything
        cases.append(((cert, key, str(unreadable)), "Permission denied"))
    for args, message in cases:
        with pytest.raises(TLSError) as info:
            tls_context(*args)
        assert message in str(info.value), (args, str(info.value))
        assert "\n" not in str(info.value)
    cfg = parse_config(["--tls-cert-file", str(garbage), "--tls-key-file", key], environ={})
    with pytest.raises(StartupError, match="no PEM certificate"):
        build_tls(cfg)


def test_encrypted_key_is_refused_without_a_prompt(pki: Pki, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.server_key.read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(TLSError, match="encrypted private keys are not supported"):
        tls_context(str(pki.server_cert), str(encrypted))


def test_cli_with_a_bad_certificate_exits_2_with_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.crt"
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.exporter",
         "--source", "simulated", "--listen", "127.0.0.1:0",
         "--tls-cert-file", str(missing), "--tls-key-file", str(missing)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")},
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [f"gpuscope-exporter: error: --tls-cert-file {missing}: "
                     "No such file or directory"], result.stderr


# -- a real Prometheus -----------------------------------------------------------------------
def test_prometheus_scrapes_over_mutual_tls(
    pki: Pki, start_exporter: Callable[..., ExporterProcess], prometheus_bin: str,
    tmp_path: Path,
) -> None:
    probe_port = free_port()
    exp = start_exporter(
        "--source", "simulated", "--interval", "0.5", "--tls-cert-file", str(pki.server_cert),
        "--tls-key-file", str(pki.server_key), "--tls-client-ca-file", str(pki.ca),
        "--probe-listen", f"127.0.0.1:{probe_port}", ready=False,
    )

    def exporter_ready() -> bool:  # as the kubelet sees it: plain HTTP, no certificate
        assert exp.proc.poll() is None, "exporter exited"
        try:
            return requests.get(f"http://127.0.0.1:{probe_port}/readyz",
                                timeout=1).status_code == 200
        except requests.RequestException:
            return False

    wait_for(exporter_ready, 60, "the TLS exporter's plain-HTTP /readyz")
    assert requests.get(f"http://127.0.0.1:{probe_port}/metrics", timeout=5).status_code == 404
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: gpuscope\n"
        "    scheme: https\n"
        f"    tls_config: {{ca_file: '{pki.ca}', cert_file: '{pki.client_cert}',"
        f" key_file: '{pki.client_key}', server_name: {SERVER_NAME}}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exp.port}']}}]\n"
        "  - job_name: no-client-cert\n"
        "    scheme: https\n"
        f"    tls_config: {{ca_file: '{pki.ca}'}}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{exp.port}']}}]\n"
    )
    with (tmp_path / "prometheus.log").open("wb") as log:
        prom = subprocess.Popen(
            [prometheus_bin, f"--config.file={config}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> dict[str, float]:
            try:
                r = requests.get(base + "/api/v1/query", params={"query": "up"}, timeout=2)
                return {s["metric"]["job"]: float(s["value"][1])
                        for s in r.json()["data"]["result"]}
            except (requests.RequestException, ValueError, KeyError):
                return {}

        wait_for(lambda: len(up()) == 2, 60, "Prometheus to scrape both jobs")
        assert up() == {"gpuscope": 1.0, "no-client-cert": 0.0}
        r = requests.get(base + "/api/v1/query", params={"query": "count(gpu_up)"}, timeout=5)
        assert float(r.json()["data"]["result"][0]["value"][1]) > 0
    finally:
        prom.terminate()
        prom.wait(15)


# -- a renewed certificate is served without a restart ------------------------------------------

def served_certificate(pki: Pki, port: int) -> bytes:
    """The DER of the certificate the server presents to a new connection."""
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    ctx.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_a_renewed_certificate_is_served_without_a_restart(
        pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The files swapped as cert-manager and the kubelet do (new files, then a rename): the
    next connection after the check gets the new certificate; a half-done swap (the new
    certificate beside the old key) keeps the old one, logged once, until the key follows."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki.server_cert.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    now = [0.0]
    tls = ReloadingContext(str(cert), str(key), str(pki.ca), check_every=10.0,
                           clock=lambda: now[0])
    registry = CollectorRegistry(auto_describe=False)
    srv = ExporterServer("127.0.0.1", 0, registry, lambda: True, lambda: True, ssl_context=tls)
    srv.start()
    try:
        assert served_certificate(pki, srv.port) == der(pki.server_cert)
        renewed = pki.issuer.issue("exporter", server=True, sans=["127.0.0.1", SERVER_NAME])
        (tmp_path / "new.crt").write_bytes(renewed.cert_pem)
        os.replace(tmp_path / "new.crt", cert)  # the certificate first, the key not yet
        now[0] = 11.0
        with caplog.at_level(logging.WARNING):
            assert served_certificate(pki, srv.port) == der(pki.server_cert)
            now[0] = 22.0
            assert served_certificate(pki, srv.port) == der(pki.server_cert)
        warned = [r.getMessage() for r in caplog.records if "cannot be used" in r.getMessage()]
        assert len(warned) == 1 and "is not the key of the certificate" in warned[0], warned
        (tmp_path / "new.key").write_bytes(renewed.key_pem)
        os.replace(tmp_path / "new.key", key)
        now[0] = 25.0  # within check_every of the last check: not read yet
        assert served_certificate(pki, srv.port) == der(pki.server_cert)
        now[0] = 33.0
        assert served_certificate(pki, srv.port) == ssl.PEM_cert_to_DER_cert(
            renewed.cert_pem.decode())
        assert tls.reloads == 1
    finally:
        srv.stop()
