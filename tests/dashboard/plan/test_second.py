"""The second round's queries (``dashboard/plan/second.py``), built for hand-made follow-ups:
which parts a follow-up asks for, how lists are split and named, and what the recording rules
change. The queries run against real stores in ``tests/dashboard/test_prometheus_e2e.py``."""

from __future__ import annotations

from gpuscope.dashboard.data.prometheus import MAX_QUERY_BYTES
from gpuscope.dashboard.plan.runs import FollowUp
from gpuscope.dashboard.plan.second import Round, every_minute, second_round
from gpuscope.dashboard.series import Window
from gpuscope.dashboard.verdicts import Thresholds

WINDOW = Window(start=1000.0, end=4600.0, step=60.0)


def _round(rules: bool = False, namespace: str | None = None) -> Round:
    return Round(WINDOW, "60s", "120s", rules, "cluster", Thresholds(), namespace)


def test_only_what_the_follow_up_names_is_asked() -> None:
    assert second_round(_round(), FollowUp()) == {}
    out = second_round(_round(), FollowUp(idle=["n1"], spinning=["n2"], input=["p-0"]))
    assert set(out) == {"idle_steps", "spinning", "stats"}
    assert 'node=~"n1"' in out["idle_steps"] and 'node=~"n2"' in out["spinning"]
    assert 'pod=~"p-0"' in out["stats"] and "stddev_over_time" in out["stats"]


def test_a_long_list_is_split_under_the_query_limit_and_named_by_part() -> None:
    nodes = [f"node-with-a-long-name-{i:05d}" for i in range(4000)]
    out = second_round(_round(), FollowUp(candidates=nodes))
    parts = sorted(out)
    assert parts[0] == "containers" and len(parts) > 1
    assert parts[1:] == sorted(f"containers#{i}" for i in range(1, len(parts)))
    assert all(len(q.encode()) <= MAX_QUERY_BYTES for q in out.values())
    assert sum(q.count("node-with-a-long-name-") for q in out.values()) == len(nodes)


def test_time_sliced_devices_by_uuid_need_no_sharing_filter_and_by_node_do() -> None:
    by_uuid = second_round(_round(), FollowUp(shared=["n1"], shared_devices=["GPU-1"]))
    assert 'uuid=~"GPU-1"' in by_uuid["shared"] and " @ " not in by_uuid["shared"]
    by_node = second_round(_round(), FollowUp(shared=["n1"]))
    assert ">= 2" in by_node["shared"] and " @ 4600.000" in by_node["shared"]
    assert set(by_node) == {"shared", "shared_containers"}


def test_with_the_rules_the_idle_steps_are_the_recorded_series_asked_without_a_list() -> None:
    ask = FollowUp(idle=["n1", "n2"], held=["n3"])
    listless = second_round(_round(rules=True), ask)
    assert listless["idle_steps"] == every_minute(
        "uuid:gpu_idle_activity:ratio1m", "node, gpu, uuid, signal", "max_over_time", "60s", 1)
    assert '"n1' not in listless["idle_steps"] and '"n3' not in listless["held_idle"]
    by_node = second_round(_round(rules=True), ask, by_node=True)
    assert '"n1' in by_node["idle_steps"] and '"n3' in by_node["held_idle"]


def test_the_evidence_is_asked_only_for_a_time_and_of_the_nodes_given() -> None:
    assert "evidence" not in second_round(_round(), FollowUp(candidates=["n1"]))
    out = second_round(_round(), FollowUp(candidates=["n1"], evidence=["n9"],
                                          evidence_seconds=600.0))
    assert '"n9' in out["evidence"] and '"n1' not in out["evidence"]
    recorded = second_round(_round(rules=True), FollowUp(evidence=["n9"],
                                                         evidence_seconds=600.0))
    assert "/ 10" in recorded["evidence"]  # the mean of ten recorded minutes


def test_a_namespace_keeps_the_candidates_containers_to_its_devices() -> None:
    out = second_round(_round(namespace="research-0"), FollowUp(candidates=["n1"],
                                                                 input=["p-0"]))
    assert 'namespace="research-0"' in out["containers"]
    assert 'namespace="research-0"' in out["stats"]
