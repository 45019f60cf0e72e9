"""The Prometheus mode's HTTP client against real servers that check credentials.

:class:`CheckServer` answers the Prometheus API on a real socket (HTTP or HTTPS, optionally
requiring a client certificate) and checks each request's credentials: a bearer token, a
basic-auth pair, or an AWS SigV4 signature that it recomputes with botocore's own signer
over the request it received (method, URL, signed headers, body; the credentials it knows
and the date of the request's ``X-Amz-Date``; with IRSA, the keys moto's STS issued).
With ``upstream`` it is an authenticating
proxy in front of a real Prometheus. The end-to-end tests run ``PrometheusData.fleet``
through it and against a real Prometheus serving TLS with a required client certificate.
"""

from __future__ import annotations

import base64
import datetime
import hmac
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import botocore.session
import pytest

from gpuscope.dashboard.data import DataError
from gpuscope.dashboard.data.http import (
    BasicAuth,
    BearerAuth,
    CredentialError,
    PromApi,
    SecretFile,
    SigV4Auth,
    TlsConfig,
    amp_region,
)
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.views import page_view
from tests.conftest import REPO, ExporterProcess, free_port, wait_for
from tests.pki import TestCA
from tests.stores import start_prometheus

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"node": "n"}, "value": [1.0, "1"]}]}}
ACCESS_KEY = "AKIDEXAMPLE12345"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
SESSION_TOKEN = "IQoJb3JpZ2luX2VjEXAMPLE-session-token"


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]  # as sent (names as the client spelled them)
    body: bytes
    scheme: str

    def header(self, name: str) -> str | None:
        for k, v in self.headers.items():
            if k.lower() == name.lower():
                return v
        return None


#: A check: None to let the request through, else (HTTP status, JSON body, or raw bytes
#: sent as text/plain).
Check = Callable[[Received], tuple[int, dict[str, str] | bytes] | None]


@dataclass
class CheckServer:
    """A Prometheus API that checks credentials; ``seen`` holds (Authorization, status)."""

    check: Check
    tls: ssl.SSLContext | None = None
    upstream: str | None = None
    upstream_tls: ssl.SSLContext | None = None
    seen: list[tuple[str | None, int]] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                got = Received("POST", self.path, dict(self.headers.items()), body,
                               "https" if owner.tls else "http")
                owner.received.append(got)
                failed = owner.check(got)
                if failed is not None:
                    status, answer = failed
                else:
                    status, answer = owner.answer(got)
                owner.seen.append((got.header("Authorization"), status))
                raw = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(answer, bytes)
                                 else "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client refusing our certificate: the client side is under test

        self.server = Server(("127.0.0.1", 0), Handler)
        if self.tls is not None:
            # Handshakes happen in the handler threads, not in accept().
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True,
                                                      do_handshake_on_connect=False)
        self.port = self.server.server_port
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def answer(self, got: Received) -> tuple[int, dict[str, str]]:
        if self.upstream is None:
            return 200, VECTOR  # type: ignore[return-value]
        path = got.path[got.path.index("/api/"):]  # without the workspace prefix
        req = urllib.request.Request(self.upstream + path, data=got.body, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        with urllib.request.urlopen(req, timeout=10, context=self.upstream_tls) as resp:
            return resp.status, json.loads(resp.read())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[..., CheckServer]]:
    servers: list[CheckServer] = []

    def start(check: Check, **kwargs: object) -> CheckServer:
        server = CheckServer(check, **kwargs)  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def prom_error(status: int, message: str) -> tuple[int, dict[str, str]]:
    return status, {"status": "error", "errorType": "unauthorized", "error": message}


# -- checks -----------------------------------------------------------------------------------
def bearer_check(expected: Callable[[], str]) -> Check:
    def check(got: Received) -> tuple[int, dict[str, str]] | None:
        sent = got.header("Authorization")
        if sent == f"Bearer {expected()}":
            return None
        # Echoes what it got, as some proxies do: the client must not show it.
        return prom_error(401, f"invalid credentials: {sent}")
    return check


def basic_check(user: str, password: str) -> Check:
    def check(got: Received) -> tuple[int, dict[str, str]] | None:
        sent = got.header("Authorization") or ""
        if sent.startswith("Basic "):
            pair = base64.b64decode(sent.removeprefix("Basic ")).decode()
            if hmac.compare_digest(pair, f"{user}:{password}"):
                return None
        return prom_error(401, f"bad user or password in {sent}")
    return check


SIGV4 = re.compile(r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<day>\d{8})/(?P<region>[^/]+)"
                   r"/(?P<service>[^/]+)/aws4_request, SignedHeaders=(?P<signed>[a-z0-9;-]+), "
                   r"Signature=(?P<signature>[0-9a-f]{64})")


def static_keys(access_key: str) -> tuple[str, str | None] | None:
    """The (secret key, session token) this server knows for ``access_key``."""
    return (SECRET_KEY, SESSION_TOKEN) if access_key == ACCESS_KEY else None


def sigv4_check(region: str, *, keys: Callable[[str], tuple[str, str | None] | None]
                = static_keys, service: str = "aps") -> Check:
    """Amazon's check, redone: the signature botocore's SigV4Auth computes over the request
    as received, with the secret key this server knows, must equal the one sent."""
    def deny(message: str) -> tuple[int, dict[str, str]]:
        return 403, {"message": message}

    def check(got: Received) -> tuple[int, dict[str, str]] | None:
        m = SIGV4.fullmatch(got.header("Authorization") or "")
        if m is None:
            return deny("Missing Authentication Token")
        known = keys(m["key"])
        if known is None:
            return deny("The security token included in the request is invalid.")
        secret, token = known
        if (m["region"], m["service"]) != (region, service):
            return deny(f"Credential should be scoped to a valid region/service, "
                        f"not {m['region']}/{m['service']}")
        amz_date = got.header("X-Amz-Date") or ""
        try:
            when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(
                tzinfo=datetime.UTC)
        except ValueError:
            return deny("bad X-Amz-Date")
        if abs(when.timestamp() - time.time()) > 300 or not amz_date.startswith(m["day"]):
            return deny("Signature expired")
        signed = m["signed"].split(";")
        needed = {"host", "x-amz-date", "content-type"} | ({"x-amz-security-token"}
                                                           if token else set())
        if not needed <= set(signed):
            return deny(f"these headers must be signed: {sorted(needed - set(signed))}")
        if token is not None and got.header("X-Amz-Security-Token") != token:
            return deny("The security token included in the request is invalid.")
        headers = {name: got.header(name) or "" for name in signed}
        request = botocore.awsrequest.AWSRequest(
            method=got.method, url=f"{got.scheme}://{got.header('Host')}{got.path}",
            data=got.body, headers=headers)
        request.context["timestamp"] = amz_date
        signer = botocore.auth.SigV4Auth(
            botocore.credentials.Credentials(m["key"], secret, token), service, region)
        expected = signer.signature(
            signer.string_to_sign(request, signer.canonical_request(request)), request)
        if not hmac.compare_digest(expected, m["signature"]):
            return deny("The request signature we calculated does not match the signature "
                        "you provided. Check your AWS Secret Access Key and signing method.")
        return None
    return check


def open_check(got: Received) -> None:
    return None


# -- PKI --------------------------------------------------------------------------------------
@dataclass
class Pki:
    dir: Path
    ca: Path  # signs the servers' and the client's certificates
    other_ca: Path  # trusted by nobody here
    server: ssl.SSLContext  # 127.0.0.1 and localhost
    named_server: ssl.SSLContext  # only prom.internal
    mtls_server: ssl.SSLContext  # 127.0.0.1, requires a client certificate from ca
    client_cert: Path
    client_key: Path
    server_cert: Path
    server_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def make_pki(d: Path) -> Pki:
    """A CA with server and client certificates, and a CA that signed none of them."""
    ca, other = TestCA("prom-ca"), TestCA("other-ca")

    def write(name: str, data: bytes) -> Path:
        (d / name).write_bytes(data)
        return d / name

    def server_ctx(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        if client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(client_ca)
        return ctx

    leaf = ca.issue("prometheus", server=True, sans=["127.0.0.1", "localhost"])
    named = ca.issue("prom.internal", server=True, sans=["prom.internal"])
    client = ca.issue("gpuscope-dashboard", server=False)
    paths = {n: write(f"{n}.pem", b) for n, b in (
        ("ca", ca.cert_pem), ("other-ca", other.cert_pem), ("server", leaf.cert_pem),
        ("server-key", leaf.key_pem), ("named", named.cert_pem),
        ("named-key", named.key_pem), ("client", client.cert_pem),
        ("client-key", client.key_pem))}
    return Pki(d, paths["ca"], paths["other-ca"],
               server_ctx(paths["server"], paths["server-key"]),
               server_ctx(paths["named"], paths["named-key"]),
               server_ctx(paths["server"], paths["server-key"], paths["ca"]),
               paths["client"], paths["client-key"], paths["server"], paths["server-key"])


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and text, text
    return text


# -- bearer -----------------------------------------------------------------------------------
def test_bearer_token_is_sent_and_a_rotated_file_is_picked_up(
        serve: Callable[..., CheckServer], tmp_path: Path) -> None:
    current = ["token-one"]
    server = serve(bearer_check(lambda: current[0]))
    token = tmp_path / "token"
    token.write_text("token-one\n")  # a trailing newline, as `echo` and Secrets leave it
    api = PromApi(server.url, auth=BearerAuth(str(token)))
    api.check()
    assert api.post_form("/api/v1/query", {"query": "up"}) == VECTOR["data"]

    # Rotation as Kubernetes does it: a new file swapped in under the same name.
    (tmp_path / "token.new").write_text("token-two-longer\n")
    os.replace(tmp_path / "token.new", token)
    current[0] = "token-two-longer"
    api.post_form("/api/v1/query", {"query": "up"})
    assert server.seen == [("Bearer token-one", 200), ("Bearer token-two-longer", 200)]


def test_a_401_rereads_the_token_once(serve: Callable[..., CheckServer], tmp_path: Path
                                      ) -> None:
    current = ["aaaa-1"]
    server = serve(bearer_check(lambda: current[0]))
    token = tmp_path / "token"
    token.write_text("aaaa-1")
    api = PromApi(server.url, auth=BearerAuth(str(token)))
    api.post_form("/api/v1/query", {"query": "up"})
    # Rewritten in place with the same size and mtime: the file looks unchanged, the server
    # already wants the new token; the 401 makes the client re-read it and retry once.
    st = token.stat()
    with token.open("r+") as f:
        f.write("bbbb-2")
    os.utime(token, ns=(st.st_atime_ns, st.st_mtime_ns))
    current[0] = "bbbb-2"
    api.post_form("/api/v1/query", {"query": "up"})
    assert server.seen == [("Bearer aaaa-1", 200), ("Bearer aaaa-1", 401),
                           ("Bearer bbbb-2", 200)]
    # A token the server refuses, unchanged on re-reading: one 401 retry at most, then one
    # line that does not show the token the server echoed back.
    current[0] = "something-else"
    server.seen.clear()
    with pytest.raises(DataError) as info:
        api.post_form("/api/v1/query", {"query": "up"})
    text = one_line(info)
    assert text.startswith(f"Prometheus {server.url}: HTTP 401 invalid credentials: Bearer ")
    assert "bbbb-2" not in text and "<redacted>" in text
    assert server.seen == [("Bearer bbbb-2", 401)]


def test_token_file_missing_or_empty_is_one_line(serve: Callable[..., CheckServer],
                                                 tmp_path: Path) -> None:
    server = serve(bearer_check(lambda: "t0k3n"))
    token = tmp_path / "token"
    auth = BearerAuth(SecretFile(str(token), "--prometheus-bearer-token-file"))
    with pytest.raises(CredentialError) as info:
        auth.check()  # at start-up
    assert one_line(info) == f"--prometheus-bearer-token-file {token}: No such file or directory"
    token.write_text("  \n")
    with pytest.raises(CredentialError, match=r"is empty$"):
        auth.check()
    token.write_text("t0k3n")
    api = PromApi(server.url, auth=auth)
    api.post_form("/api/v1/query", {"query": "up"})
    token.unlink()  # later: a DataError naming the file, like any failed query
    with pytest.raises(DataError) as later:
        api.post_form("/api/v1/query", {"query": "up"})
    assert one_line(later) == (f"Prometheus {server.url}: --prometheus-bearer-token-file "
                               f"{token}: No such file or directory")


def test_the_token_is_reread_every_minute_even_if_the_file_looks_unchanged(
        tmp_path: Path) -> None:
    now = [0.0]
    token = tmp_path / "token"
    token.write_text("cccc")
    secret = SecretFile(str(token), clock=lambda: now[0])
    assert secret.get() == "cccc"
    st = token.stat()
    token.write_text("dddd")
    os.utime(token, ns=(st.st_atime_ns, st.st_mtime_ns))
    now[0] = 59.0
    assert secret.get() == "cccc"  # unchanged metadata, read 59 s ago
    now[0] = 60.0
    assert secret.get() == "dddd"


# -- basic ------------------------------------------------------------------------------------
def test_basic_auth_from_a_file_and_from_a_value(serve: Callable[..., CheckServer],
                                                 tmp_path: Path) -> None:
    server = serve(basic_check("grafana", "s3cret:with:colons"))
    pw = tmp_path / "password"
    pw.write_text("s3cret:with:colons\n")
    for password in (SecretFile(str(pw)), "s3cret:with:colons"):
        api = PromApi(server.url, auth=BasicAuth("grafana", password))
        api.check()
        assert api.post_form("/api/v1/query", {"query": "up"}) == VECTOR["data"]
    wrong = PromApi(server.url, auth=BasicAuth("grafana", "not-it"))
    with pytest.raises(DataError) as info:
        wrong.post_form("/api/v1/query", {"query": "up"})
    text = one_line(info)
    assert "HTTP 401 bad user or password in Basic <redacted>" in text
    assert base64.b64encode(b"grafana:not-it").decode() not in text
    assert [status for _, status in server.seen] == [200, 200, 401]
    with pytest.raises(ValueError, match="must not contain ':'"):
        BasicAuth("a:b", "x")


# -- TLS --------------------------------------------------------------------------------------
def test_tls_with_a_custom_ca(serve: Callable[..., CheckServer], pki: Pki) -> None:
    server = serve(open_check, tls=pki.server)
    api = PromApi(server.url, tls=TlsConfig(ca_file=str(pki.ca)))
    assert api.post_form("/api/v1/query", {"query": "up"}) == VECTOR["data"]

    for tls in (TlsConfig(ca_file=str(pki.other_ca)), None):  # the wrong CA, the system's
        with pytest.raises(DataError) as info:
            PromApi(server.url, tls=tls).post_form("/api/v1/query", {"query": "up"})
        assert one_line(info) == (f"Prometheus {server.url}: TLS: server certificate not "
                                  "trusted: unable to get local issuer certificate")


def test_tls_server_name_and_client_certificate(serve: Callable[..., CheckServer], pki: Pki
                                                ) -> None:
    named = serve(open_check, tls=pki.named_server)  # its certificate says prom.internal
    with pytest.raises(DataError) as info:
        PromApi(named.url, tls=TlsConfig(ca_file=str(pki.ca))).post_form(
            "/api/v1/query", {"query": "up"})
    assert "TLS: server certificate not trusted: IP address mismatch" in one_line(info)
    api = PromApi(named.url, tls=TlsConfig(ca_file=str(pki.ca), server_name="prom.internal"))
    assert api.post_form("/api/v1/query", {"query": "up"}) == VECTOR["data"]
    assert named.received[-1].header("Host") == f"127.0.0.1:{named.port}"  # the URL's host

    mtls = serve(open_check, tls=pki.mtls_server)
    with pytest.raises(DataError) as refused:
        PromApi(mtls.url, tls=TlsConfig(ca_file=str(pki.ca))).post_form(
            "/api/v1/query", {"query": "up"})
    assert one_line(refused).startswith(f"Prometheus {mtls.url}: TLS: ")
    assert "client certificate" in one_line(refused)
    client = TlsConfig(ca_file=str(pki.ca), cert_file=str(pki.client_cert),
                       key_file=str(pki.client_key))
    assert PromApi(mtls.url, tls=client).post_form("/api/v1/query", {"query": "up"}) == \
        VECTOR["data"]


def test_tls_files_are_checked_at_start_up(pki: Pki, tmp_path: Path) -> None:
    names = ("--prometheus-ca-file", "--prometheus-cert-file", "--prometheus-key-file")
    missing = tmp_path / "nope.pem"
    with pytest.raises(CredentialError) as info:
        PromApi("https://p:9090", tls=TlsConfig(ca_file=str(missing), names=names)).check()
    assert one_line(info) == f"--prometheus-ca-file {missing}: No such file or directory"
    with pytest.raises(CredentialError) as info:
        PromApi("https://p:9090", tls=TlsConfig(ca_file=str(pki.client_key),
                                                names=names)).check()
    assert one_line(info) == f"--prometheus-ca-file {pki.client_key}: no PEM certificate in it"
    with pytest.raises(CredentialError) as info:
        PromApi("https://p:9090", tls=TlsConfig(cert_file=str(pki.client_cert),
                                                key_file=str(pki.server_key),
                                                names=names)).check()
    assert one_line(info).startswith(f"--prometheus-cert-file {pki.client_cert} / "
                                     f"--prometheus-key-file {pki.server_key}: ")
    with pytest.raises(ValueError, match="both"):
        TlsConfig(cert_file=str(pki.client_cert))


def test_an_encrypted_client_key_is_one_line_without_a_prompt(pki: Pki, tmp_path: Path
                                                               ) -> None:
    """OpenSSL asked for the pass phrase on the terminal ("Enter PEM pass phrase:"), then an
    OSError traceback where there is none; it would ask again at each reload of the files."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.client_key.read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.dashboard", "--prometheus", "https://127.0.0.1:1",
         "--prometheus-cert-file", str(pki.client_cert),
         "--prometheus-key-file", str(encrypted)],
        cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        start_new_session=True,  # no terminal to prompt on
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"gpuscope-dashboard: error: --prometheus-key-file {encrypted}: "
                             "encrypted private keys are not supported\n")


# -- SigV4 ------------------------------------------------------------------------------------
@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """botocore's default chain sees exactly these credentials (environment), no profile
    and no instance metadata."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_sigv4_signature_verified_by_botocore(aws_env: None, serve: Callable[..., CheckServer]
                                              ) -> None:
    server = serve(sigv4_check("eu-west-1"))
    api = PromApi(server.url + "/workspaces/ws-1234", auth=SigV4Auth("eu-west-1"))
    api.check()
    assert api.post_form("/api/v1/query_range",
                         {"query": 'sum by (node) (rate(x{a="b c"}[5m]))', "start": "1",
                          "end": "2", "step": "1"}) == VECTOR["data"]
    [got] = server.received
    assert got.path == "/workspaces/ws-1234/api/v1/query_range"
    assert got.header("X-Amz-Security-Token") == SESSION_TOKEN
    assert server.seen[0][1] == 200

    # The same request with another secret key, or for another region, is refused.
    wrong = botocore.session.Session()
    wrong.set_credentials(ACCESS_KEY, SECRET_KEY[:-1] + "X", SESSION_TOKEN)
    for auth in (SigV4Auth("eu-west-1", session=wrong), SigV4Auth("us-east-1")):
        with pytest.raises(DataError) as info:
            PromApi(server.url, auth=auth).post_form("/api/v1/query", {"query": "up"})
        text = one_line(info)
        assert text.startswith(f"Prometheus {server.url}: HTTP 403 ")
        assert SECRET_KEY[:-1] not in text and SESSION_TOKEN not in text
    assert [s for _, s in server.seen] == [200, 403, 403]


def test_sigv4_wrong_secret_is_the_signature_mismatch(aws_env: None,
                                                      serve: Callable[..., CheckServer]
                                                      ) -> None:
    server = serve(sigv4_check("eu-west-1"))
    wrong = botocore.session.Session()
    wrong.set_credentials(ACCESS_KEY, "not-the-secret-key", SESSION_TOKEN)
    with pytest.raises(DataError) as info:
        PromApi(server.url, auth=SigV4Auth("eu-west-1", session=wrong)).post_form(
            "/api/v1/query", {"query": "up"})
    assert one_line(info) == (
        f"Prometheus {server.url}: HTTP 403 The request signature we calculated does not "
        "match the signature you provided. Check your AWS Secret Access Key and signing "
        "method.")


def test_sigv4_without_credentials_or_region_is_one_line(
        aws_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    with pytest.raises(CredentialError) as info:
        SigV4Auth("eu-west-1").check()
    assert one_line(info).startswith("no AWS credentials found")
    with pytest.raises(CredentialError) as info:
        SigV4Auth(None).check()
    assert one_line(info).startswith("no AWS region")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    auth = SigV4Auth(None)
    auth.check()
    assert auth.region == "ap-south-1"
    assert "(AKIDEXAMPLE12345)" in auth.describe() and SECRET_KEY not in auth.describe()


def test_region_of_an_amp_workspace_url() -> None:
    assert amp_region("https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1") == \
        "us-west-2"
    assert amp_region("https://aps-workspaces.cn-north-1.amazonaws.com.cn/workspaces/w") == \
        "cn-north-1"
    assert amp_region("https://prometheus.example.com") is None


def test_botocore_is_imported_only_for_sigv4(tmp_path: Path) -> None:
    token = tmp_path / "t"
    token.write_text("x")
    code = (
        "import sys\n"
        "from gpuscope.dashboard.data.http import PromApi, BearerAuth, TlsConfig\n"
        "from gpuscope.dashboard.plan import PrometheusData\n"
        f"PrometheusData('https://p', client=PromApi('https://p', auth=BearerAuth({str(token)!r}),"
        " tls=TlsConfig()))\n"
        "assert 'botocore' not in sys.modules, 'botocore imported'\n"
        "from gpuscope.dashboard.data.http import SigV4Auth\n"
        "SigV4Auth('us-east-1')\n"
        "assert 'botocore' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_credentials_in_the_url_are_refused() -> None:
    with pytest.raises(ValueError, match="must not hold credentials"):
        PrometheusData("https://admin:hunter2@prom.example.com")


def test_a_query_or_fragment_in_the_url_is_refused() -> None:
    """The API paths are put after the URL: ``?x=1`` would carry them into the query."""
    for url in ("https://prom.example.com?x=1", "https://prom.example.com/p#frag"):
        with pytest.raises(ValueError, match="without a query or fragment"):
            PromApi(url)
        with pytest.raises(ValueError, match="without a query or fragment"):
            PrometheusData(url)
    assert PromApi("https://prom.example.com/prometheus/").url == (
        "https://prom.example.com/prometheus")


# -- end to end: the fleet through an authenticating proxy and over mutual TLS ---------------
NODES = {"amp-idle": ("g5.12xlarge", 0.0), "amp-busy": ("p4d.24xlarge", 0.9)}


def openmetrics(end: float, minutes: int = 40, step: float = 15.0) -> str:
    """Two nodes of two GPUs each, one idle, one busy, every ``step`` s for ``minutes``."""
    times = [end - k * step for k in range(int(minutes * 60 / step), -1, -1)]
    out = ["# TYPE gpu_info gauge\n"]
    gpus = [(node, str(g), f"GPU-{node}-{g}") for node in NODES for g in (0, 1)]
    for node, gpu, uuid in gpus:
        lab = (f'driver_version="550",gpu="{gpu}",mig_profile="",model="NVIDIA A10G",'
               f'node="{node}",parent_uuid="",pci_bus_id="",uuid="{uuid}"')
        out += [f"gpu_info{{{lab}}} 1 {t:.3f}\n" for t in times]
    out.append("# TYPE gpu_node_info gauge\n")
    for node, (itype, _) in NODES.items():
        lab = f'capacity_type="on-demand",instance_type="{itype}",node="{node}",zone="z"'
        out += [f"gpu_node_info{{{lab}}} 1 {t:.3f}\n" for t in times]
    out.append("# TYPE gpu_utilization_ratio gauge\n")
    for node, gpu, uuid in gpus:
        lab = f'gpu="{gpu}",node="{node}",uuid="{uuid}"'
        out += [f"gpu_utilization_ratio{{{lab}}} {NODES[node][1]} {t:.3f}\n" for t in times]
    out.append("# TYPE gpu_busy_seconds counter\n")
    for node, gpu, uuid in gpus:
        lab = f'gpu="{gpu}",node="{node}",uuid="{uuid}"'
        out += [f"gpu_busy_seconds_total{{{lab}}} {NODES[node][1] * k * step} {t:.3f}\n"
                for k, t in enumerate(times)]
    out.append("# EOF\n")
    return "".join(out)


@dataclass
class MtlsPrometheus:
    url: str
    end: float  # the data's last timestamp: the dashboard's "now"
    client: TlsConfig


@pytest.fixture(scope="module")
def mtls_prometheus(prometheus_bin: str, promtool: str, pki: Pki,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[MtlsPrometheus]:
    """A real Prometheus serving backfilled data over TLS that requires a client
    certificate from the test CA (its web config's tls_server_config)."""
    tmp = tmp_path_factory.mktemp("mtls-prometheus")
    end = float(int(time.time()) - 60)
    (tmp / "fleet.om").write_text(openmetrics(end))
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics",
                    str(tmp / "fleet.om"), str(tmp / "tsdb")],
                   check=True, capture_output=True, timeout=60)
    (tmp / "prometheus.yml").write_text("global: {scrape_interval: 15s}\nscrape_configs: []\n")
    (tmp / "web.yml").write_text(
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.ca}\n")
    port = free_port()
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}",
         f"--web.config.file={tmp / 'web.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         "--storage.tsdb.retention.time=10y", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    client = TlsConfig(ca_file=str(pki.ca), cert_file=str(pki.client_cert),
                       key_file=str(pki.client_key))
    ctx = client.context()

    def ready() -> bool:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2, context=ctx) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    try:
        wait_for(ready, 60, "Prometheus over mutual TLS")
        yield MtlsPrometheus(url, end, client)
    finally:
        proc.terminate()
        proc.wait(15)
        log.close()


def idle_nodes(prom: PrometheusData, end: float) -> list[tuple[str, float]]:
    view = page_view(prom, 3600, bundled_prices())
    prom.close()
    assert view.kpis.gpus == 4
    return [(r.node, r.price_per_hour) for r in view.idle_rows]


def test_fleet_over_mutual_tls_and_through_a_sigv4_proxy(
        aws_env: None, mtls_prometheus: MtlsPrometheus, serve: Callable[..., CheckServer],
        pki: Pki) -> None:
    m = mtls_prometheus
    expected = [("amp-idle", bundled_prices().per_hour("g5.12xlarge"))]
    # Directly: Prometheus itself checks the client certificate.
    direct = PrometheusData(m.url, clock=lambda: m.end,
                            client=PromApi(m.url, tls=m.client))
    assert idle_nodes(direct, m.end) == expected
    # TLS 1.3 checks the client certificate after the client's handshake: Go's alert or
    # its hang-up arrives first; either way the line says what is likely missing.
    with pytest.raises(DataError, match=r"TLS: .*(\(the server wants a client certificate\)|"
                                        r"does it want a client certificate\?\))$"):
        PrometheusData(m.url, clock=lambda: m.end, client=PromApi(
            m.url, tls=TlsConfig(ca_file=str(pki.ca)))).fleet(3600)

    # Through a proxy that checks SigV4 as Amazon Managed Prometheus does, over TLS.
    proxy = serve(sigv4_check("us-east-1"), tls=pki.server, upstream=m.url,
                  upstream_tls=m.client.context())
    base = proxy.url + "/workspaces/ws-e2e"
    amp = PrometheusData(base, clock=lambda: m.end, client=PromApi(
        base, auth=SigV4Auth("us-east-1"), tls=TlsConfig(ca_file=str(pki.ca))))
    assert idle_nodes(amp, m.end) == expected
    statuses = {s for _, s in proxy.seen}
    assert statuses == {200} and len(proxy.seen) == amp.queries_total >= 6


# -- what any failure looks like (the texts PrometheusData._api gave before) -----------------
@pytest.mark.parametrize(("status", "answer", "expected"), [
    (422, {"status": "error", "errorType": "execution", "error": "parse error at char 4"},
     "HTTP 422 parse error at char 4"),
    (503, b"upstream connect error\nsecond line", "HTTP 503 upstream connect error"),
    (502, b"", "HTTP 502"),
    (200, b"<html>not json</html>", "answer is not JSON"),
    (200, {"status": "error", "error": "too many samples"}, "query failed: too many samples"),
])
def test_failures_are_one_line(serve: Callable[..., CheckServer], status: int,
                               answer: dict[str, str] | bytes, expected: str) -> None:
    server = serve(lambda got: (status, answer))
    with pytest.raises(DataError) as info:
        PromApi(server.url).post_form("/api/v1/query", {"query": "up"})
    assert one_line(info) == f"Prometheus {server.url}: {expected}"


def test_unreachable_and_a_non_ascii_token_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        PromApi("http://127.0.0.1:1", timeout=2).post_form("/api/v1/query", {"query": "up"})
    assert one_line(info) == ("Prometheus http://127.0.0.1:1 unreachable: "
                              "[Errno 111] Connection refused")
    token = tmp_path / "token"
    token.write_text("t\u00f6ken")
    with pytest.raises(CredentialError) as bad:
        BearerAuth(str(token)).check()
    assert one_line(bad) == f"bearer token file {token}: holds characters other than ASCII"


def test_a_replaced_ca_file_is_used_without_a_restart(serve: Callable[..., CheckServer],
                                                      pki: Pki, tmp_path: Path) -> None:
    server = serve(open_check, tls=pki.server)
    ca = tmp_path / "ca.pem"
    ca.write_bytes(pki.other_ca.read_bytes())
    api = PromApi(server.url, tls=TlsConfig(ca_file=str(ca)))
    with pytest.raises(DataError, match="not trusted"):
        api.post_form("/api/v1/query", {"query": "up"})
    (tmp_path / "ca.new").write_bytes(pki.ca.read_bytes())
    os.replace(tmp_path / "ca.new", ca)
    assert api.post_form("/api/v1/query", {"query": "up"}) == VECTOR["data"]


def test_a_401_retries_when_another_query_already_read_the_new_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("old-token")
    auth = BearerAuth(str(token))
    sent: dict[str, str] = {}
    auth.apply("POST", "http://p/api/v1/query", sent, b"")
    token.write_text("new-token")
    assert auth.token.get() == "new-token"  # a concurrent query read it first
    assert auth.refresh(sent)  # still worth a retry: what this query sent is old
    fresh: dict[str, str] = {}
    auth.apply("POST", "http://p/api/v1/query", fresh, b"")
    assert not auth.refresh(fresh)  # a 401 to the current token: no retry


def test_redirects_are_not_followed_with_the_credentials(
        serve: Callable[..., CheckServer], tmp_path: Path) -> None:
    elsewhere = serve(open_check)

    class Redirecting(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(302)
            self.send_header("Location", elsewhere.url + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    redirector = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=redirector.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    try:
        token = tmp_path / "token"
        token.write_text("do-not-forward")
        url = f"http://127.0.0.1:{redirector.server_port}"
        with pytest.raises(DataError) as info:
            PromApi(url, auth=BearerAuth(str(token))).post_form("/api/v1/query",
                                                                {"query": "up"})
        assert one_line(info) == (f"Prometheus {url}: HTTP 302 redirect to "
                                  f"{elsewhere.url}/api/v1/query not followed: use that URL")
        assert elsewhere.received == []
    finally:
        redirector.shutdown()
        redirector.server_close()


def test_sigv4_with_irsa_web_identity_credentials(aws_env: None, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 serve: Callable[..., CheckServer]) -> None:
    """As on EKS with IRSA: only a role ARN and a web identity token file in the
    environment; botocore exchanges the token at STS (moto's, in this process) for
    temporary credentials, and the server checks the signature with the secret that STS
    issued (looked up in moto's STS backend)."""
    from moto.server import ThreadedMotoServer
    from moto.sts.models import sts_backends

    sts = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    sts.start()
    try:
        host, port = sts.get_host_and_port()
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name)
        token = tmp_path / "eks.amazonaws.com" / "serviceaccount" / "token"
        token.parent.mkdir(parents=True)
        token.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6"
                         "Z3B1c2NvcGU6Z3B1c2NvcGUtZGFzaGJvYXJkIn0.c2lnbmF0dXJl")
        role = "arn:aws:iam::123456789012:role/gpuscope-dashboard"
        monkeypatch.setenv("AWS_ROLE_ARN", role)
        monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", f"http://{host}:{port}")
        monkeypatch.setenv("AWS_REGION", "us-east-1")

        def issued(access_key: str) -> tuple[str, str | None] | None:
            for regions in sts_backends.values():
                for backend in regions.values():
                    for r in backend.assumed_roles:
                        if r.access_key_id == access_key and r.role_arn == role:
                            return r.secret_access_key, r.session_token
            return None

        server = serve(sigv4_check("us-east-1", keys=issued))
        auth = SigV4Auth("us-east-1")
        auth.check()
        assert "credentials: assume-role-with-web-identity (ASIA" in auth.describe()
        api = PromApi(server.url + "/workspaces/ws-irsa", auth=auth)
        assert api.post_form("/api/v1/query", {"query": "up"}) == VECTOR["data"]
        assert server.seen[-1][1] == 200
        sent = server.received[-1]
        m = SIGV4.fullmatch(sent.header("Authorization") or "")
        assert m is not None and m["key"].startswith("ASIA")  # temporary credentials
        assert sent.header("X-Amz-Security-Token") == (issued(m["key"]) or ("", ""))[1]
    finally:
        sts.stop()


# -- a URL with no query API behind it (a first setup's usual slips) ---------------------------
NOT_AN_API = ("(no Prometheus query API at this URL: give the base URL of its /api/v1/ paths, "
              "e.g. http://prometheus:9090 or Mimir's https://mimir/prometheus; an exporter's "
              "address goes to --targets)")


def test_a_prometheus_page_url_says_to_give_the_api_base(prometheus_bin: str) -> None:
    """The URL of Prometheus' own UI page (``…/graph``): its 404, with what to give instead."""
    with start_prometheus() as prom, pytest.raises(DataError) as info:
        PrometheusData(prom.url + "/graph", timeout=10).fleet(900)
    assert one_line(info) == (f"Prometheus {prom.url}/graph: HTTP 404 404 page not found "
                              f"{NOT_AN_API}")


def test_an_exporters_address_says_it_goes_to_targets() -> None:
    """A gpuscope exporter's address given as the store: its HTTP server answers the query's
    POST with 501."""
    exporter = ExporterProcess(["--source", "simulated", "--node-name", "n1"])
    try:
        exporter.wait_ready(60)
        with pytest.raises(DataError) as info:
            PrometheusData(exporter.url, timeout=10).fleet(900)
    finally:
        exporter.stop()
    assert one_line(info).startswith(f"Prometheus {exporter.url}: HTTP 501")
    assert one_line(info).endswith(NOT_AN_API)
