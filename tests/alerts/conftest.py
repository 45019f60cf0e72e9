"""Fixtures for the alerting tests: Debian's Alertmanager tools and a real moto server."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port, wait_for


def debian_tool(*names: str, package: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    # Not a skip: scripts/test installs the Debian package, so a missing binary means the
    # suite was run some other way.
    pytest.fail(f"{names[0]} not found: install Debian's {package} (scripts/test does)")


@pytest.fixture(scope="session")
def amtool() -> str:
    return debian_tool("amtool", package="prometheus-alertmanager")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    # Debian names the binary prometheus-alertmanager; upstream tarballs call it alertmanager.
    return debian_tool("prometheus-alertmanager", "alertmanager", package="prometheus-alertmanager")


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real moto server (``moto_server -H 127.0.0.1 -p PORT``) speaking the AWS HTTP APIs;
    yields its URL. Tests reset it with :func:`moto_reset`."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    # The moto_server script of this interpreter's environment (the same program as
    # `python -m moto.server`, which is the fallback when the script is not beside it).
    script = Path(sys.executable).with_name("moto_server")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "moto.server"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*cmd, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT,
        )

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"moto_server exited {proc.returncode}: {log_path.read_text()}")
        try:
            return requests.get(url + "/moto-api/", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_for(up, 30, "moto_server to listen")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def moto(moto_server: str) -> str:
    """The moto server's URL, with every account's state emptied first."""
    requests.post(moto_server + "/moto-api/reset", timeout=5).raise_for_status()
    return moto_server


REPO = Path(__file__).resolve().parents[2]
