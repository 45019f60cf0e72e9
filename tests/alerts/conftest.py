"""Fixtures for the alerting tests: Debian's Alertmanager tools and a real moto server."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

# One way to run a real moto server for the whole suite (the CloudWatch sink tests' fixture).
from tests.exporter.sinks.cloudwatch.conftest import MotoServer
from tests.exporter.sinks.cloudwatch.conftest import moto_server as moto_server


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


@pytest.fixture
def moto(moto_server: MotoServer) -> str:
    """The moto server's URL, with every account's state emptied first."""
    moto_server.reset()
    return moto_server.url


REPO = Path(__file__).resolve().parents[2]
