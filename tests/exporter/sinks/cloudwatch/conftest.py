"""A real moto server over HTTP, and a recording/fault-injecting proxy in front of it.

``moto_server`` (session): ``moto_server -H 127.0.0.1 -p <free port>`` as a subprocess,
stopped at the end. ``moto`` (per test): the same server after ``POST /moto-api/reset``.
``proxy`` (per test): :class:`WireProxy` in front of moto — every CloudWatch request the
exporter makes goes through it, so tests see the real wire bodies (size, datums, order),
count requests, and can make it answer ``Throttling`` or 503 for a while.

The proxy also un-gzips request bodies before passing them on: botocore gzips
PutMetricData bodies of 10 KB or more, and moto's server mode decompresses such a body twice
(once in its WSGI layer, once in ``BaseResponse.setup_class``) and answers 500. Real
CloudWatch takes the gzipped body; the proxy records what botocore actually sent.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import free_port, wait_for
from tests.exporter.sinks.cloudwatch.wire import WireProxy

REGION = "us-east-1"


@dataclass
class MotoServer:
    url: str
    proc: subprocess.Popen[bytes]

    def reset(self) -> None:
        requests.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "cloudwatch", region_name=REGION, endpoint_url=self.url,
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )


def _moto_command(port: int) -> list[str]:
    # The moto_server script of the interpreter running the tests (a virtualenv's bin/),
    # else the same entry point through -m (PATH may not include the venv).
    script = Path(sys.executable).with_name("moto_server")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "moto.server"]
    return [*base, "-H", "127.0.0.1", "-p", str(port)]


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto_server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(_moto_command(port), stdout=out, stderr=subprocess.STDOUT)
    server = MotoServer(f"http://127.0.0.1:{port}", proc)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"moto_server exited {proc.returncode}: {log.read_text()}")
        try:
            return requests.get(f"{server.url}/moto-api/", timeout=1).status_code < 500
        except requests.RequestException:
            return False

    try:
        wait_for(up, 60, "moto_server")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def moto(moto_server: MotoServer) -> MotoServer:
    moto_server.reset()
    return moto_server


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials and no shared AWS config: nothing reaches a real account."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ROLE_ARN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_CLOUDWATCH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def proxy(moto: MotoServer) -> Iterator[WireProxy]:
    p = WireProxy(moto.url)
    try:
        yield p
    finally:
        p.close()


