"""The API server failing under the pod/node metadata watcher: 500s on every request after a
watch was cut mid-stream, and a watch endpoint that keeps answering 500 while lists work.

``tests/exporter/kubernetes/test_apiserver.py``'s ``FakeApi`` over real HTTP, with one addition
made here: it
answers ``500 InternalError`` (the API server's Status body) to the request kinds a test
names. What must hold (docs/attribution.md, Faults): the last known names are kept, the
watcher relists once the server is back, its retries back off (exponentially, up to the cap,
never a tight loop), and no thread or connection is left behind.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from itertools import pairwise
from typing import Any

import pytest

from gpuscope.exporter.kubernetes.apiserver import NodeInfo, PodMetadataWatcher
from tests.exporter.kubernetes import test_apiserver as test_kube
from tests.exporter.kubernetes.test_apiserver import (
    CID,
    UID_A,
    UID_C,
    FakeApi,
    make_watcher,
    pod_json,
    seed,
    wait_until,
)

BACKOFF_INITIAL = 0.05
BACKOFF_MAX = 0.4


class Failing:
    """Which requests the fake API server answers with 500, and when each kind arrived."""

    def __init__(self) -> None:
        self.kinds: set[str] = set()  # "list", "watch", "node"
        self.seen: list[tuple[str, float, int]] = []  # (kind, monotonic time, status)
        self.lock = threading.Lock()

    def times(self, kind: str, since: float = 0.0, status: int | None = None) -> list[float]:
        with self.lock:
            return [t for k, t, s in self.seen
                    if k == kind and t >= since and status in (None, s)]


def _kind(path: str) -> str:
    if path.startswith("/api/v1/nodes/"):
        return "node"
    if path.startswith("/apis/resource.k8s.io/"):
        return "resourceslices"  # not served by this API server (404): asked once
    return "watch" if "watch=true" in path or "watch=1" in path else "list"


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> Failing:
    state = Failing()
    plain = test_kube._handler

    def handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
        base: Any = plain(api)

        class Handler(base):  # type: ignore[misc,valid-type]
            def do_GET(self) -> None:
                kind = _kind(self.path)
                fail = kind in state.kinds
                with state.lock:
                    state.seen.append((kind, time.monotonic(), 500 if fail else 200))
                if fail:
                    self._status(500, "InternalError",
                                 "Internal error occurred: etcdserver: request timed out")
                    return
                super().do_GET()

        return Handler

    monkeypatch.setattr(test_kube, "_handler", handler)
    return state


@pytest.fixture
def api(failing: Failing) -> Iterator[FakeApi]:
    server = FakeApi()
    seed(server)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def watcher(api: FakeApi) -> Iterator[PodMetadataWatcher]:
    w = make_watcher(api.url, backoff_initial_s=BACKOFF_INITIAL, backoff_max_s=BACKOFF_MAX,
                     node_refresh_s=0.05, node_retry_s=0.05)
    w.start()
    assert w.wait_synced(5)
    wait_until(lambda: len(api.watches()) == 1 and w.snapshot().node is not None,
               what="watch and node")
    yield w
    w.stop(2)


def watcher_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("gpuscope-kube"))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def assert_backoff(times: list[float], what: str) -> None:
    """Consecutive attempts: never closer than the first delay's jitter allows, growing, and
    never further apart than the cap (+20 % jitter, + scheduling slack)."""
    gaps = [b - a for a, b in pairwise(times)]
    assert len(gaps) >= 3, (what, gaps)
    assert min(gaps) >= BACKOFF_INITIAL * 0.8 - 0.01, (what, gaps)
    assert max(gaps) <= BACKOFF_MAX * 1.2 + 0.25, (what, gaps)
    assert max(gaps) >= BACKOFF_MAX * 0.8 - 0.01, (what, gaps)  # it reached the cap


def test_500s_after_a_cut_watch_keep_names_back_off_and_relist(
    api: FakeApi, watcher: PodMetadataWatcher, failing: Failing
) -> None:
    w = watcher
    threads, fds = watcher_threads(), open_fds()
    assert threads == ["gpuscope-kube-node", "gpuscope-kube-pods", "gpuscope-kube-resourceslices"]
    names = dict(w.snapshot().pods)
    node = w.snapshot().node

    # The API server starts failing every request, and the open watch is cut mid-stream.
    failing.kinds = {"list", "watch", "node"}
    outage = time.monotonic()
    api.watch_actions.put(("drop", None))
    # Meanwhile a pod arrives that no event will announce: only a relist can find it.
    api.put(pod_json("late-arrival", UID_C, containers=[("main", CID[2])]))
    time.sleep(1.5)

    snap = w.snapshot()
    stats = snap.stats
    assert dict(snap.pods) == names and snap.node == node == NodeInfo(
        "p4d.24xlarge", "us-east-1a", "spot")  # the last known names are kept
    assert not stats.pods_success and not stats.node_success
    assert stats.watch_errors_total == 1 and stats.pod_list_errors_total >= 4
    # ResourceSlices are not served here (DRA off: healthy), so their part stays 1.
    assert {p.name: p.success for p in snap.parts()} == {
        "kube_pods": False, "kube_node": False, "kube_resourceslices": True}
    assert_backoff(failing.times("list", outage), "pod list retries")
    assert watcher_threads() == threads
    assert open_fds() <= fds + 2

    failing.kinds = set()  # the API server is back
    back = time.monotonic()
    wait_until(lambda: UID_C in w.snapshot().pods and w.snapshot().stats.pods_success
               and w.snapshot().stats.node_success, what="relist after the outage")
    assert w.snapshot().pods[UID_C].name == "late-arrival"
    assert all(w.snapshot().pods[uid] == pod for uid, pod in names.items())
    wait_until(lambda: bool(failing.times("watch", back, 200)), what="a new watch")
    assert watcher_threads() == threads
    assert open_fds() <= fds + 2


def test_watch_answering_500_while_lists_work_backs_off(
    api: FakeApi, watcher: PodMetadataWatcher, failing: Failing
) -> None:
    """A proxy in front of the API server that breaks watches (or an API server whose
    watch cache is unhealthy): lists work, every watch answers 500. Each failed watch
    means a relist, so the relists must back off like any other failure, not go on at
    the first retry delay forever (on a 1,000-node DaemonSet: 1,000 LISTs a second)."""
    w = watcher
    threads = watcher_threads()
    failing.kinds = {"watch"}
    started = time.monotonic()
    api.watch_actions.put(("drop", None))
    time.sleep(1.5)
    lists = failing.times("list", started)
    assert_backoff(lists, "relists after failed watches")
    assert len(lists) <= 8, len(lists)  # 0.05 + 0.1 + 0.2 + 0.4 + 0.4 ... in 1.5 s
    snap = w.snapshot()
    assert UID_A in snap.pods and snap.stats.watch_errors_total >= 4
    assert watcher_threads() == threads

    # Watches work again: the watcher settles on one watch, no more relists.
    failing.kinds = set()
    back = time.monotonic()
    wait_until(lambda: bool(failing.times("watch", back, 200)), what="a working watch")
    settled = time.monotonic()
    time.sleep(0.5)
    assert failing.times("list", settled) == []
    api.put(pod_json("late-arrival", UID_C, containers=[("main", CID[2])]), event="ADDED")
    wait_until(lambda: UID_C in w.snapshot().pods, what="an event on the working watch")
