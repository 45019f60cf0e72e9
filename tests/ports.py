"""Loopback ports for the servers the tests start, safe with test files running in parallel.

A port found free by binding port 0 and letting it go is free only until something else
takes it: another pytest-xdist worker's server, or the local end of any outgoing connection,
which the kernel takes from the same ephemeral range. With two workers a store or an
exporter started on such a port found it taken (``Address already in use``) one run in
three. So each worker picks from a block of its own below the ephemeral range, where the
kernel hands out no port and no other worker looks, checking each port by binding it.
Outside xdist, or where the ephemeral range leaves no room below it, port 0 as before.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
from collections.abc import Iterator

#: The lowest port handed out, clear of the well-known ports and of the 8000s and 9000s that
#: development servers and exporters like; a port something listens on is skipped anyway.
FIRST = 10_000
_lock = threading.Lock()
_ports: Iterator[int] | None = None


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range for port 0 and outgoing connections (Linux's default if unread)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def worker_block(worker: str | None, workers: str | None, ephemeral_low: int
                 ) -> range | None:
    """The ports of xdist worker ``worker`` (``gw0``, ``gw1``...) of ``workers``, below
    ``ephemeral_low``; None outside xdist or where fewer than 100 ports a worker fit."""
    if not worker or not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    index, count = int(worker[2:]), max(1, int(workers or "1"))
    size = (ephemeral_low - FIRST) // max(count, index + 1)
    if size < 100:
        return None
    start = FIRST + index * size
    return range(start, start + size)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _any_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port() -> int:
    """A loopback TCP port nothing listens on, for a server to bind soon."""
    global _ports
    with _lock:
        if _ports is None:
            block = worker_block(os.environ.get("PYTEST_XDIST_WORKER"),
                                 os.environ.get("PYTEST_XDIST_WORKER_COUNT"),
                                 ephemeral_range()[0])
            if block is None:
                _ports = iter(())
            else:
                # Round the block, starting at a place of this process' own: a port used a
                # moment ago by a run before is not the first one tried.
                offset = os.getpid() % len(block)
                _ports = itertools.cycle([*block[offset:], *block[:offset]])
        for port in itertools.islice(_ports, 200):
            if _bindable(port):
                return port
    return _any_port()


def has_ipv6() -> bool:
    """Whether this machine can bind an IPv6 loopback socket at all (a CI container may
    not): the servers' dual-stack tests then check the IPv4 side alone, the fallback's."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False
