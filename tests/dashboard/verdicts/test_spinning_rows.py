"""The spinning table's rows of runs the store summarised: their verdict comes with the run
(its length, its utilization's mean), what they show beyond it (SM, tensor and DRAM activity,
or power against its limit) is read for the rows shown (:class:`RowWork`), of their nodes,
over the whole history or over the runs that began within it."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gpuscope.dashboard.data.source import DataError
from gpuscope.dashboard.series import GpuInfo, GpuRef, Window
from gpuscope.dashboard.verdicts.page import PageContext
from gpuscope.dashboard.verdicts.spinning import (
    RowWork,
    Spinning,
    SpinningRow,
    spinning_data,
    spinning_rows,
    work_means,
)


def row(node: str, uuid: str) -> SpinningRow:
    return SpinningRow(node=node, gpu="0", uuid=uuid, pods=(), workloads=(), signal="",
                       utilization=1.0, sm=None, tensor=None, dram=None, power_ratio=None,
                       since=0.0, seconds=3600.0, required_seconds=1800.0,
                       history_seconds=3600.0, price_per_hour=10.0, price_basis="on-demand")


class Store:
    def __init__(self, means: Mapping[GpuRef, Mapping[str, float]]) -> None:
        self.means = means
        self.calls: list[tuple[set[str], set[str]]] = []
        self.fails = False

    def __call__(self, whole: Collection[str], trailing: Collection[str]
                 ) -> dict[GpuRef, Mapping[str, float]]:
        self.calls.append((set(whole), set(trailing)))
        if self.fails:
            raise DataError("502 Bad Gateway")
        return {g: m for g, m in self.means.items() if g.node in {*whole, *trailing}}


A, B, C = GpuRef("a", "GPU-a"), GpuRef("b", "GPU-b"), GpuRef("c", "GPU-c")
MEANS = {A: {"utilization": 1.0, "sm": 0.1, "tensor": 0.0, "dram": 0.02},
         B: {"power_ratio": 0.3}, C: {"sm": 0.5, "tensor": 0.1, "dram": 0.1}}


def test_work_means_say_which_signal_judged_the_run() -> None:
    assert work_means(MEANS[A]) == {"signal": "gpm", "sm": 0.1, "tensor": 0.0, "dram": 0.02,
                                    "power_ratio": None}
    assert work_means(MEANS[B]) == {"signal": "power", "sm": None, "tensor": None,
                                    "dram": None, "power_ratio": 0.3}
    assert work_means({"utilization": 1.0})["signal"] == ""


def test_the_rows_shown_read_their_signals_and_only_theirs() -> None:
    store = Store(MEANS)
    work = RowWork(store, trailing=frozenset({B}))
    rows = (row("a", "GPU-a"), row("b", "GPU-b"), row("c", "GPU-c"))
    out, problem = work(rows, 2)
    assert problem is None
    # A spun over the whole history, B since within it: asked by the form of each.
    assert store.calls == [({"a"}, {"b"})]
    assert (out[0].signal, out[0].sm, out[0].dram) == ("gpm", 0.1, 0.02)
    assert (out[1].signal, out[1].power_ratio) == ("power", 0.3)
    assert out[2] is rows[2]
    cells = spinning_data(out)
    assert cells[0]["work"] == "SM 10%, tensor 0%, DRAM 2%"
    assert cells[1]["work"] == "power 30% of its limit"
    assert cells[2]["work"].startswith("not read")
    # The rest when shown; nothing again for what is read.
    more, _ = work(out, 10)
    assert store.calls[1] == ({"c"}, set()) and more[2].signal == "gpm"
    again, _ = work(more, 10)
    assert again is more and len(store.calls) == 2


def test_a_store_that_fails_leaves_the_rows_unread_and_says_so() -> None:
    store = Store(MEANS)
    store.fails = True
    rows = (row("a", "GPU-a"),)
    out, problem = RowWork(store)(rows, 50)
    assert out == rows and problem is not None and "502 Bad Gateway" in problem


def test_rows_of_one_price_come_in_node_and_gpu_order() -> None:
    # A hung 8-GPU job (the demo's gpt-sft): every GPU at the same $/hour. The table listed
    # them by UUID (GPU 4, 2, 0, 7, ...); an SRE reads a node's GPUs 0 to 7, and GPU 10
    # after GPU 9.
    uuids = {str(i): f"GPU-{u}" for i, u in enumerate(
        ("e1", "9a", "3c", "ff", "05", "77", "c2", "4b", "aa", "01", "10"))}
    refs = {i: GpuRef("n", u) for i, u in uuids.items()}
    ctx = PageContext(Window(0.0, 3600.0, 60.0), 0.0,
                      gpus={r: GpuInfo("n", i, r.uuid, "H100") for i, r in refs.items()},
                      gpu_price={"n": 6.88})
    spinning = {r: Spinning(r, "gpm", True, 0.0, 3600.0, 1800.0, 3600.0, 1.0, sm=0.1,
                            tensor=0.0, dram=0.0) for r in refs.values()}
    rows = spinning_rows(spinning, ctx, {}, {})
    assert [r.gpu for r in rows] == [str(i) for i in range(11)]
