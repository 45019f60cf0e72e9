"""The store's answers read into the model (``dashboard/plan/answers.py``), on hand-built
rows shaped as the plan's queries label them."""

from __future__ import annotations

import math

from gpuscope.dashboard.plan.answers import (
    Now,
    bare_nodes,
    gpu_infos,
    idle_steps,
    lag_note,
    node_infos,
    util_stats,
    work_signals_of,
)
from gpuscope.dashboard.series import ContainerRef, GpuRef, NodeInfo, Series, Window


def _gpu(node: str, uuid: str, **more: str) -> dict[str, str]:
    return {"node": node, "uuid": uuid, "gpu": "0", **more}


def test_now_sorts_each_finding_at_the_end_by_its_stat() -> None:
    c = {"node": "n3", "uuid": "u3", "namespace": "ml", "pod": "p", "container": "c"}
    rows = [
        (_gpu("n1", "u1", stat="idle", signal="sm"), 0.01),
        (_gpu("n2", "u2", stat="spin"), 0.97),
        (_gpu("n4", "u4", stat="silent"), 1.0),
        ({**c, "stat": "held_idle", "signal": "utilization"}, 0.0),
        ({"namespace": "ml", "workload": "Job/a", "kind": "slow", "stat": "candidate"}, 2),
        ({"namespace": "ml", "workload": "Job/b", "kind": "stalled", "stat": "candidate"}, 1),
        ({**_gpu("n5", "u5"), "namespace": "ml", "workload": "Job/b", "model": "H100",
          "stat": "stalled"}, 0.1),
        ({"stat": "straggler_rules"}, 3),
    ]
    now = Now.parse(rows)
    assert now.idle == {GpuRef("n1", "u1")} and now.spin == {GpuRef("n2", "u2")}
    assert now.silent == {GpuRef("n4", "u4")}
    assert now.held == {ContainerRef("n3", "ml", "p", "c", "u3")} and now.held_nodes == {"n3"}
    assert now.judged == {("", "ml", "Job/a"), ("", "ml", "Job/b")}
    assert now.slow == {("", "ml", "Job/a")}
    assert now.flagged == {("", "ml", "Job/b", "H100"): {GpuRef("n5", "u5"): "stalled"}}
    assert now.straggler_rules
    assert now.named() == {"n1", "n2", "n3", "n4", "n5"}
    assert not Now.parse([]).straggler_rules and Now.parse([]).named() == set()


def test_node_infos_leave_out_the_stat_rows_and_a_bare_node_takes_its_clusters_info() -> None:
    nodes = node_infos([
        ({"node": "eks-1/a", "instance_type": "p5.48xlarge", "capacity_type": "spot"}, 1),
        ({"node": "b", "instance_type": "g6.xlarge"}, 1),
        ({"stat": "at_start"}, 40),
    ])
    assert set(nodes) == {"eks-1/a", "b"}
    bare_nodes(nodes, {"a", "b"})
    assert nodes == {"a": NodeInfo("a", "p5.48xlarge", "", "spot"),
                     "b": NodeInfo("b", "g6.xlarge")}
    # A node the devices name with its cluster keeps its key.
    kept = node_infos([({"node": "eks-1/a"}, 1)])
    bare_nodes(kept, {"eks-1/a"})
    assert set(kept) == {"eks-1/a"}


def test_statistics_need_the_first_rounds_mean() -> None:
    c = {"node": "n", "namespace": "ml", "pod": "p", "container": "c", "uuid": "u"}
    other = {**c, "pod": "q"}
    rows = [({**c, "stat": "stddev"}, 0.2), ({**c, "stat": "count"}, 240.0),
            ({**c, "stat": "memory"}, 2.0**30), ({**other, "stat": "stddev"}, 0.3)]
    stats = util_stats(rows, {ContainerRef("n", "ml", "p", "c", "u"): 0.4})
    assert list(stats) == [ContainerRef("n", "ml", "p", "c", "u")]
    one = stats[ContainerRef("n", "ml", "p", "c", "u")]
    assert (one.mean, one.stddev, one.samples, one.memory_bytes) == (0.4, 0.2, 240, 2.0**30)


def test_idle_steps_and_work_signals_by_signal() -> None:
    s = Series((60.0, 120.0), (0.0, 0.01))
    busy, signal = idle_steps([(_gpu("n", "u", signal="sm"), s), (_gpu("n", "v"), s)])
    assert busy == {GpuRef("n", "u"): s, GpuRef("n", "v"): s}
    assert signal == {GpuRef("n", "u"): "sm", GpuRef("n", "v"): "utilization"}
    watts = Series((60.0, 120.0), (300.0, 700.0))
    signals = work_signals_of([
        (_gpu("n", "u", signal="utilization"), s), (_gpu("n", "u", signal="sm"), s),
        (_gpu("n", "v", signal="power"), watts), (_gpu("n", "v", signal="limit"), watts),
        (_gpu("n", "w", signal="utilization"), s),
    ], apart={GpuRef("n", "w")})
    assert set(signals.utilization) == {GpuRef("n", "u")}  # w's group was summarised
    assert signals.gpm == frozenset({GpuRef("n", "u")})
    assert signals.power == {GpuRef("n", "v"): watts}
    assert signals.power_limit == {GpuRef("n", "v"): 700.0}  # its last value
    assert signals.power_limits == {GpuRef("n", "v"): watts}  # and each step's


def test_gpu_infos_by_device() -> None:
    gpus = gpu_infos([({"node": "n", "gpu": "3", "uuid": "u", "model": "H100",
                        "parent_uuid": "", "mig_profile": ""}, 1)])
    assert gpus[GpuRef("n", "u")].gpu == "3" and gpus[GpuRef("n", "u")].model == "H100"


def test_the_lag_note_says_where_a_page_served_earlier_ends() -> None:
    window = Window(start=1000.0, end=1600.0, step=60.0)
    rows = [({"stat": "newest"}, 1590.0), ({"node": "n1", "stat": "present"}, 10.0)]
    # Served at the store's newest sample, two steps before the clock's page: says so.
    (note,) = lag_note(rows, window, 60.0, now=1730.0)
    assert note.startswith("The store's newest exporter sample is 2m 20s older than the "
                           "dashboard's clock (") and ": this page ends at " in note
    # The clock's own page (the newest sample within a step's reach): nothing to say.
    assert lag_note(rows, window, 60.0, now=1640.0) == ()
    assert lag_note([({"stat": "newest"}, math.nan)], window, 60.0, now=1730.0) == ()
    # Not served earlier (the store's check failed): the verdicts at the end are missing.
    (note,) = lag_note([({"stat": "newest"}, 1500.0)], window, 60.0, now=1610.0)
    assert note.startswith("The store's newest exporter sample is 1m 40s older than this "
                           "page's end (")
    assert "verdicts that need a point at the last step are missing" in note


def test_the_lag_note_from_a_newest_sample_beyond_the_stores_lookback() -> None:
    # The store had nothing within its lookback of the clock (the first round's read at
    # the clock found no row): the sample that placed the page says how far behind.
    window = Window(start=1000.0, end=1600.0, step=60.0)
    (note,) = lag_note([({"node": "n1", "stat": "present"}, 10.0)], window, 60.0,
                       now=2200.0, far=1590.0)
    assert note.startswith("The store's newest exporter sample is 10m older than the "
                           "dashboard's clock (") and ": this page ends at " in note
    assert lag_note([], window, 60.0, now=2200.0) == ()


def test_the_lag_note_names_the_clusters_whose_data_is_late() -> None:
    window = Window(start=1000.0, end=1600.0, step=60.0)
    rows = [({"cluster": "eu-1", "stat": "newest"}, 1598.0),
            ({"cluster": "us-2", "stat": "newest"}, 1400.0),
            ({"cluster": "us-1", "stat": "newest"}, 1590.0)]
    (note,) = lag_note(rows, window, 60.0, now=1601.0)
    assert note.startswith("Cluster us-2 (3m 20s behind): its newest exporter sample is older "
                           "than this page's end (")
    assert "its nodes' verdicts that need a point at the last step are missing" in note
    rows.append(({"cluster": "ap-1", "stat": "newest"}, 1200.0))
    (note,) = lag_note(rows, window, 60.0, now=1601.0)
    assert note.startswith("Clusters ap-1 (6m 40s behind), us-2 (3m 20s behind): their "
                           "newest exporter samples are older than")
    # Every cluster late: the store's note alone (the page could not be served earlier).
    (note,) = lag_note([(lab, v - 300) for lab, v in rows], window, 60.0, now=1601.0)
    assert note.startswith("The store's newest exporter sample is 5m 02s older than this ")
    # One cluster's data (no cluster label) on time: nothing to say.
    assert lag_note([({"stat": "newest"}, 1590.0)], window, 60.0, now=1601.0) == ()


def test_the_lag_note_names_a_cluster_silent_beyond_the_stores_lookback() -> None:
    # No newest row for eu-2 (nothing within the store's lookback of the clock): its newest
    # sample within the hour (``seen``) names it; a cluster's ``newest`` row wins over its
    # ``seen`` one (a subquery's steps miss the last minute's samples).
    window = Window(start=1000.0, end=1600.0, step=60.0)
    rows = [({"cluster": "eu-1", "stat": "newest"}, 1598.0),
            ({"cluster": "eu-1", "stat": "seen"}, 1560.0),
            ({"cluster": "eu-2", "stat": "seen"}, 900.0)]
    (note,) = lag_note(rows, window, 60.0, now=1601.0)
    assert note.startswith("Cluster eu-2 (11m behind): its newest exporter sample is "
                           "older than this page's end ("), note
    # With no cluster on time the store is behind as a whole: the served page's note only.
    assert lag_note(rows[2:], window, 60.0, now=1601.0) == ()
