"""Fixtures shared by the PodResources client tests (grpcio and grpc-go kubelets)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def socket_dir(tmp_path: Path) -> Iterator[Path]:
    # sun_path holds 107 bytes; pytest's tmp_path can be longer on some hosts.
    if len(str(tmp_path)) < 80:
        yield tmp_path
        return
    short = Path(tempfile.mkdtemp(prefix="gpuscope-"))
    try:
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)
