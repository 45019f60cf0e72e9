"""tests/conftest.py: the order in which ``scripts/test`` hands files to its workers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from xdist.scheduler import LoadFileScheduling

from tests.conftest import SLOW_FIRST


class Worker:
    """What the scheduler calls on a worker: the indexes (into the worker's collection) of
    the tests it is sent, batch by batch."""

    shutting_down = False

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)  # (named when collections are compared)
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_the_slow_files_are_handed_out_first(pytestconfig: pytest.Config,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """xdist's loadfile scheduler, with this suite's configuration, gives the first worker
    :data:`SLOW_FIRST`'s first file, collected first, although another file has more tests
    (xdist's default reorder, by number of tests, handed it out after that one)."""
    slow = [f"{SLOW_FIRST[0]}::test_{i}" for i in range(2)]
    many = [f"tests/exporter/test_many.py::test_{i}" for i in range(40)]
    few = ["tests/test_one.py::test_0"]
    collection = slow + many + few
    # Two workers, as ``scripts/test -n 2`` (CI) makes them (xdist turns ``-n 2`` into this).
    monkeypatch.setattr(pytestconfig.option, "tx", ["2*popen"])
    scheduler = LoadFileScheduling(pytestconfig)
    workers = [Worker("gw0"), Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
    for worker in workers:
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    assert [collection[i] for i in workers[0].sent[0]] == slow
    assert [collection[i] for i in workers[1].sent[0]] == many
