"""The GPU-health verdict on hand-built store answers (no store): what each signal flags, the
first XID of a GPU (its counter appears with it), resets, the near misses (a non-critical XID,
a counter that did not rise in the window), one row per GPU, the namespace filter, the order
by $/hour, and the rows' links."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import yaml

from gpuscope.dashboard import fmt
from gpuscope.dashboard.data import StepQuery
from gpuscope.dashboard.series import GpuInfo, GpuRef, Series, Window
from gpuscope.dashboard.verdicts.health import (
    CRITICAL_XIDS,
    ECC,
    HOLDERS,
    LOST,
    REMAP_FAILED,
    REMAP_PENDING,
    VERDICT,
    XID,
    XID_SEEN,
    GpuHealth,
)
from gpuscope.dashboard.verdicts.page import PageContext

RULE_FILE = Path(__file__).resolve().parents[3] / "alerts" / "gpuscope-rules.yaml"

STEP = 60.0
END = 1_800_003_600.0
WINDOW = Window(END - 3600.0, END, STEP)
T = WINDOW.times()  # 61 steps, T[0] the window's start

A0, A1 = GpuRef("node-a", "GPU-a0"), GpuRef("node-a", "GPU-a1")
B0 = GpuRef("node-b", "GPU-b0")
C0 = GpuRef("node-c", "GPU-c0")


def ctx(namespace: str | None = None, history_start: float = WINDOW.start) -> PageContext:
    gpus = {r: GpuInfo(r.node, r.uuid[-1], r.uuid) for r in (A0, A1, B0, C0)}
    return PageContext(
        window=WINDOW, history_start=history_start, gpus=gpus,
        node_price={"node-a": 55.04, "node-b": 1.006, "node-c": None},
        pods={A0: ("ml/train-0",), B0: ("web/infer-1",)}, namespace=namespace,
    )


def lab(ref: GpuRef, **extra: str) -> dict[str, str]:
    return {"node": ref.node, "uuid": ref.uuid, "gpu": ref.uuid[-1], **extra}


def series(points: Mapping[float, float]) -> Series:
    times = sorted(points)
    return Series(tuple(times), tuple(points[t] for t in times))


Answers = dict[StepQuery, Sequence[tuple[Mapping[str, str], Series]]]


def judge(answers: Answers, c: PageContext | None = None) -> dict[GpuRef, GpuHealth]:
    found = VERDICT.judge(answers, c or ctx())
    return {h.ref: h for h in found}


def test_a_lost_gpu_is_listed_from_its_first_step_and_still_now() -> None:
    found = judge({LOST: [(lab(A1), series({t: 0.0 for t in T[40:]}))]})
    assert list(found) == [A1]
    (p,) = found[A1].problems
    assert p.what.startswith("lost") and p.first == T[40] and p.now
    assert found[A1].price_per_hour == 55.04


def test_xid_79_is_found_at_its_first_count_and_at_a_rise() -> None:
    # GPU a0: its XID 79 counter appears at step 30 with 1 (the first XID since the
    # exporter started). GPU b0: an XID 79 counter already at 2 when the window begins,
    # rising to 3 at step 50.
    found = judge({XID: [
        (lab(A0, xid="79"), series({t: 1.0 for t in T[30:]})),
        (lab(B0, xid="79"), series({t: (2.0 if i < 50 else 3.0) for i, t in enumerate(T)})),
    ]})
    assert found[A0].problems[0].first == T[30] and found[A0].problems[0].count == 1
    assert found[B0].problems[0].first == T[50] and found[B0].problems[0].count == 1
    assert "fallen off the bus" in found[A0].problems[0].what
    assert not found[A0].problems[0].now  # no rise at the latest step


def test_near_misses_are_not_listed() -> None:
    found = judge({
        # XID 13 (an application's error) is not critical.
        XID: [(lab(A0, xid="13"), series({t: float(i) for i, t in enumerate(T)})),
              # A critical XID counted before the window, no rise in it.
              (lab(B0, xid="79"), series({t: 1.0 for t in T}))],
    })
    assert found == {}


def test_uncorrectable_ecc_errors_are_listed_until_the_gpu_is_reset() -> None:
    # The volatile count is since the GPU's last reset: 4 errors from before the window,
    # none in it, still need a reset (as GpuEccUncorrected says); listed while above 0.
    found = judge({ECC: [(lab(C0), series({t: 4.0 for t in T}))]})
    (p,) = found[C0].problems
    assert (p.first, p.count, p.now) == (T[0], 4.0, True)
    assert "since the GPU's last reset" in p.what
    # Reset at step 30 (back to 0, which the store's "> 0" leaves out): no longer now.
    found = judge({ECC: [(lab(C0), series({t: 4.0 for t in T[:30]}))]})
    (p,) = found[C0].problems
    assert (p.last, p.now) == (T[29], False)


def test_a_counter_present_at_the_dashboards_first_scrape_is_not_a_new_event() -> None:
    # Embedded mode, 5 minutes after start: the counter was there at the first scrape (an
    # XID from before the dashboard started): not an event in the window.
    started = T[-5]
    found = judge({XID: [(lab(A0, xid="79"), series({t: 1.0 for t in T[-5:]}))]},
                  ctx(history_start=started))
    assert found == {}


def test_a_counter_reset_counts_from_zero() -> None:
    # An XID counter at 5, the exporter restarts (back to 0), then 2 more.
    values = {t: (5.0 if i < 20 else 0.0 if i < 40 else 2.0) for i, t in enumerate(T)}
    found = judge({XID: [(lab(C0, xid="79"), series(values))]})
    (p,) = found[C0].problems
    assert p.count == 2 and p.first == T[40]
    # The ECC count after a reset: the GPU's count now (2), flagged since the window began.
    found = judge({ECC: [(lab(C0), series(values))]})
    (p,) = found[C0].problems
    assert (p.first, p.count, p.now) == (T[0], 2.0, True)


def test_a_repeat_after_the_exporter_restarted_is_found_by_its_time() -> None:
    # GPU c0's XID 79 was counted before the window (1); the exporter's container restarts
    # at step 20 (no counter until its next event) and counts XID 79 again from 1 at step
    # 30, the value the old counter showed: no rise. Its last event's time says it is new.
    before = WINDOW.start - 3000.0
    event = T[29] + 10.0  # in step 30
    counter = series({t: 1.0 for i, t in enumerate(T) if i < 20 or i >= 30})
    times = series({t: (before if i < 20 else event) for i, t in enumerate(T)
                    if i < 20 or i >= 30})
    assert judge({XID: [(lab(C0, xid="79"), counter)]}) == {}  # the counter alone misses it
    found = judge({XID: [(lab(C0, xid="79"), counter)],
                   XID_SEEN: [(lab(C0, xid="79"), times)]})
    (p,) = found[C0].problems
    assert (p.first, p.last, p.count, p.now) == (T[30], T[30], 1, False)


def test_the_time_tells_a_young_store_s_count_from_before_the_window() -> None:
    # A 7-day window over a store 3 steps old: the counter (1) is there from the store's
    # first sample, which the counter alone cannot place: it lists no event.
    week = Window(END - 7 * 86400.0, END, 3600.0)
    times = week.times()
    young = PageContext(window=week, history_start=times[-3], gpus=ctx().gpus,
                        node_price=ctx().node_price)
    counter = series({t: 1.0 for t in times[-3:]})
    assert judge({XID: [(lab(A0, xid="79"), counter)]}, young) == {}
    old = series({t: week.start - 600.0 for t in times[-3:]})
    assert judge({XID: [(lab(A0, xid="79"), counter)],
                  XID_SEEN: [(lab(A0, xid="79"), old)]}, young) == {}
    # An event 3 days ago (in the window, before the store's data): listed at its step.
    recent = END - 3 * 86400.0 + 5.0
    found = judge({XID: [(lab(A0, xid="79"), counter)],
                   XID_SEEN: [(lab(A0, xid="79"), series({t: recent for t in times[-3:]}))]},
                  young)
    (p,) = found[A0].problems
    assert (p.first, p.count, p.now) == (END - 3 * 86400.0 + 3600.0, 1, False)


def test_several_events_in_one_step_count_as_the_counter_says() -> None:
    # Two XID 79s within step 40: one time (the last), the counter up by 2.
    counter = series({t: (0.0 if i < 40 else 2.0) for i, t in enumerate(T)})
    times = series({t: T[39] + 20.0 for t in T[40:]})
    found = judge({XID: [(lab(A0, xid="79"), counter)], XID_SEEN: [(lab(A0, xid="79"), times)]})
    (p,) = found[A0].problems
    assert (p.first, p.count) == (T[40], 2)


def test_one_row_per_gpu_with_every_problem_earliest_first() -> None:
    found = judge({
        REMAP_PENDING: [(lab(A0), series({t: 1.0 for t in T[10:]}))],
        XID: [(lab(A0, xid="63"), series({t: 1.0 for t in T[12:]}))],
        REMAP_FAILED: [(lab(A0), series({t: 1.0 for t in T[55:]}))],
    })
    assert [p.what.split(" ")[0:2] for p in found[A0].problems] == [
        ["row", "remap"], ["XID", "63:"], ["row", "remap"]]
    assert found[A0].since == T[10]
    rows = VERDICT.rows(tuple(found.values()), ctx(), {"window": "1h"})
    assert len(rows) == 1
    row = rows[0]
    assert "pending" in str(row["what"]) and "failed" in str(row["what"])
    assert str(row["node"]).startswith("[node-a](?window=1h&node=node-a#")
    assert "train-0" in str(row["pods"]) and row["price"] == 55.04


def test_two_gpus_lost_before_the_exporter_started_are_two_rows() -> None:
    # GPUs that NVML could not open when the exporter started (nvmlDeviceGetHandleByIndex
    # answering GPU_IS_LOST, as after an exporter restart on a node whose GPUs fell off the
    # bus) are served with their index and no UUID: gpu_up{gpu="2",uuid=""} 0. Two of them on
    # one node are two broken GPUs, not one.
    found = VERDICT.judge({LOST: [
        ({"node": "node-a", "uuid": "", "gpu": "2"}, series({t: 0.0 for t in T[20:]})),
        ({"node": "node-a", "uuid": "", "gpu": "5"}, series({t: 0.0 for t in T})),
    ]}, ctx())
    assert sorted((h.ref.node, h.gpu, len(h.problems)) for h in found) == [
        ("node-a", "2", 1), ("node-a", "5", 1)]
    rows = VERDICT.rows(found, ctx(), {})
    assert sorted(str(r["gpu"]) for r in rows) == ["2", "5"]
    assert {h.gpu: h.since for h in found} == {"2": T[20], "5": T[0]}


def test_sorted_by_price_and_filtered_by_namespace() -> None:
    answers: Answers = {LOST: [(lab(r), series({T[-1]: 0.0})) for r in (C0, B0, A0)]}
    assert [h.ref for h in VERDICT.judge(answers, ctx())] == [A0, B0, C0]
    assert [h.ref for h in VERDICT.judge(answers, ctx("web"))] == [B0]


@pytest.mark.parametrize("found,expected", [
    ((), "No GPU problems in this window."),
])
def test_note(found: tuple[GpuHealth, ...], expected: str) -> None:
    assert VERDICT.note(found, ctx()) == expected


def test_the_note_counts_gpus_nodes_and_their_price() -> None:
    found = VERDICT.judge({LOST: [(lab(r), series({T[-1]: 0.0})) for r in (A0, A1, B0)]},
                          ctx())
    assert VERDICT.note(found, ctx()) == (
        "3 GPUs with problems on 2 nodes, $56.05/h of nodes that cannot run their jobs in "
        "full.")


def test_the_pods_on_a_broken_gpu_come_from_its_holders_too() -> None:
    # The fleet page's data named no pod on GPU a1 (the Prometheus path asks only for the
    # holders its other findings need); the verdict's own query found the two that held it.
    found = judge({
        LOST: [(lab(A1), series({t: 0.0 for t in T[50:]}))],
        HOLDERS: [(lab(A1, namespace="ml", pod="train-3", container="c"),
                   series({t: 1.0 for t in T[50:]})),
                  (lab(A1, namespace="ml", pod="train-2", container="c"),
                   series({T[50]: 1.0}))],
    })
    assert found[A1].pods == ("ml/train-2", "ml/train-3")
    # ... and a pod the page knew of is kept beside them.
    found = judge({LOST: [(lab(A0), series({T[-1]: 0.0}))],
                   HOLDERS: [(lab(A0, namespace="ml", pod="eval-1", container="c"),
                              series({T[-1]: 1.0}))]})
    assert found[A0].pods == ("ml/eval-1", "ml/train-0")


def test_the_page_and_the_alert_count_the_same_xids_as_critical() -> None:
    # Two answers about one GPU: the GpuXidCritical alert paged for XIDs 120 and 154 while
    # the page's health table did not list them.
    rules = yaml.safe_load(RULE_FILE.read_text())
    expr = next(r["expr"] for g in rules["groups"] for r in g["rules"]
                if r.get("alert") == "GpuXidCritical")
    alternatives = set(re.findall(r'xid=~"([^"]+)"', expr))
    assert len(alternatives) == 1, alternatives
    assert set(next(iter(alternatives)).split("|")) == set(CRITICAL_XIDS)


def test_since_is_never_before_the_history_the_page_has() -> None:
    # A 7-day window (steps of 1h 24m) over a store of 62 minutes: the row remap pending
    # from the store's first step is since its history's start "or earlier", as the idle
    # nodes' rows say; it read 22 minutes before the store held any data.
    week = Window(END - 7 * 86400.0, END, 5040.0)
    began = END - 3720.0
    c = PageContext(window=week, history_start=began,
                    gpus={A0: GpuInfo("node-a", "0", A0.uuid)}, node_price={"node-a": 55.04})
    found = VERDICT.judge({REMAP_PENDING: [(lab(A0), series({END: 1.0}))]}, c)
    [row] = VERDICT.rows(found, c, {"window": "7d"})
    assert row["since"] == f"{fmt.clock(began)} or earlier"
    # Where the history is longer than the window, the window's start (as the idle rows).
    [row] = VERDICT.rows(VERDICT.judge(
        {REMAP_PENDING: [(lab(A0), series({t: 1.0 for t in T}))]}, ctx()), ctx(), {})
    assert row["since"] == f"{fmt.clock(WINDOW.start)} or earlier"
    # A problem that began within the history: the start of its first step, as before.
    [row] = VERDICT.rows(VERDICT.judge(
        {REMAP_PENDING: [(lab(A0), series({t: 1.0 for t in T[30:]}))]}, ctx()), ctx(), {})
    assert row["since"] == fmt.clock(T[29])


def test_an_empty_table_under_a_namespace_filter_says_it_is_that_namespace_s() -> None:
    assert VERDICT.note((), ctx()) == "No GPU problems in this window."
    note = VERDICT.note((), ctx(namespace="research"))
    assert note == "No GPU problems in this window on the GPUs of namespace research."


def test_a_gpu_lost_before_an_exporter_restart_is_one_row_since_it_was_lost() -> None:
    # Lost while the exporter ran (gpu_up{gpu="2",uuid="GPU-…"} 0), then served without its
    # UUID by the exporter that started after it (gpu_up{gpu="2",uuid=""} 0): one GPU, one
    # row, lost since the first step; another node's unnamed GPU 2 stays its own row.
    found = VERDICT.judge({LOST: [
        ({"node": "node-a", "uuid": "GPU-a2", "gpu": "2"}, series({t: 0.0 for t in T[5:20]})),
        ({"node": "node-a", "uuid": "", "gpu": "2"}, series({t: 0.0 for t in T[21:]})),
        ({"node": "node-b", "uuid": "", "gpu": "2"}, series({t: 0.0 for t in T[30:]})),
    ]}, ctx())
    assert sorted((h.ref.node, h.ref.uuid, h.gpu) for h in found) == [
        ("node-a", "GPU-a2", "2"), ("node-b", "gpu 2", "2")]
    a = next(h for h in found if h.ref.node == "node-a")
    assert [(p.first, p.last, p.now) for p in a.problems] == [(T[5], T[-1], True)]
    assert a.since == T[5]
