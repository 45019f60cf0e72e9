"""tests/ports.py: each pytest-xdist worker's ports are its own, below the kernel's range."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from tests import ports


def test_workers_blocks_are_disjoint_and_below_the_ephemeral_range() -> None:
    blocks = [ports.worker_block(f"gw{i}", "4", 32768) for i in range(4)]
    seen: set[int] = set()
    for block in blocks:
        assert block is not None and len(block) >= 100
        assert block.start >= ports.FIRST and block.stop <= 32768
        assert seen.isdisjoint(block)
        seen.update(block)
    # Outside xdist, or with no room below the kernel's range: port 0, as before.
    assert ports.worker_block(None, None, 32768) is None
    assert ports.worker_block("master", "2", 32768) is None
    assert ports.worker_block("gw0", "2", 10_100) is None


def test_a_port_is_free_in_this_workers_block_and_a_taken_one_is_not_handed_out() -> None:
    port = ports.free_port()
    block = ports.worker_block(os.environ.get("PYTEST_XDIST_WORKER"),
                               os.environ.get("PYTEST_XDIST_WORKER_COUNT"),
                               ports.ephemeral_range()[0])
    if block is not None:  # under xdist (scripts/test)
        assert port in block
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # it was free: this binds
        s.listen()
        assert not ports._bindable(port)
        assert ports.free_port() != port


def test_the_ephemeral_range_is_read_or_linux_default(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("1024\t65000\n")
    assert ports.ephemeral_range(str(f)) == (1024, 65000)
    assert ports.ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
