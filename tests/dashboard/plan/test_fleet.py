"""The fleet page's plan's own steps (``dashboard/plan/fleet.py``) on hand-built answers: who
used what (``_Users``) and what it asks of the second round, and the nodes idle at the end
(``_idle_nodes_now``). The rounds themselves run against real stores in
``tests/dashboard/test_prometheus_e2e.py`` and ``test_verdict_consistency.py``."""

from __future__ import annotations

from gpuscope.dashboard.plan.answers import Now
from gpuscope.dashboard.plan.fleet import _idle_nodes_now, _Users
from gpuscope.dashboard.series import ContainerRef, GpuInfo, GpuRef, PodInfo
from gpuscope.dashboard.verdicts import Thresholds


def _c(node: str, uuid: str, pod: str, namespace: str = "ml") -> dict[str, str]:
    return {"node": node, "uuid": uuid, "namespace": namespace, "pod": pod,
            "container": "main"}


def test_users_count_sharers_input_candidates_and_the_nodes_of_each_workload() -> None:
    th = Thresholds()
    mid = (th.input_low + th.input_high) / 2
    rows = [
        (_c("eks/n1", "u1", "a-0"), 0.9),
        (_c("eks/n1", "u1", "b-0"), mid),           # u1 shared; b-0 an input candidate
        (_c("eks/n2", "u2", "a-1"), 0.8),
        (_c("eks/n3", "u3", "c-0", "other"), mid),  # another namespace's candidate
        ({"node": "eks/n3", "uuid": "u3", "namespace": "", "pod": "", "container": ""}, 0.5),
    ]
    pods = {p.key: p for p in (PodInfo("eks/n1", "ml", "a-0", "Job/a"),
                               PodInfo("eks/n2", "ml", "a-1", "Job/a"),
                               PodInfo("eks/n1", "ml", "b-0", ""))}
    users = _Users.of(rows, pods, None, th)
    assert users.members == [ContainerRef("eks/n1", "ml", "a-0", "main", "u1"),
                             ContainerRef("eks/n1", "ml", "b-0", "main", "u1"),
                             ContainerRef("eks/n2", "ml", "a-1", "main", "u2"),
                             ContainerRef("eks/n3", "other", "c-0", "main", "u3")]
    assert users.shared == {GpuRef("eks/n1", "u1")}  # the host process is no container
    assert users.input_pods == {"b-0", "c-0"}
    assert users.workload_nodes == {("eks", "ml", "Job/a"): {"eks/n1", "eks/n2"}}
    # A namespace's page: the other namespace's candidate is not asked about.
    assert _Users.of(rows, pods, "ml", th).input_pods == {"b-0"}

    now = Now(idle={GpuRef("eks/n4", "u4")}, spin={GpuRef("eks/n2", "u2")},
              held_nodes={"eks/n5"}, judged={("eks", "ml", "Job/a")},
              slow={("eks", "ml", "Job/a")})
    ask = users.follow_up(now)
    assert (set(ask.idle), set(ask.spinning), set(ask.held)) == ({"eks/n4"}, {"eks/n2"},
                                                                   {"eks/n5"})
    assert set(ask.shared) == {"eks/n1"} and set(ask.shared_devices) == {"u1"}
    assert set(ask.candidates) == set(ask.slow) == {"eks/n1", "eks/n2"}
    assert set(ask.input) == {"b-0", "c-0"} and not ask.idle_nodes


def test_a_node_is_idle_at_the_end_when_every_whole_gpu_or_each_of_its_slices_is() -> None:
    gpus = [GpuInfo("n1", "0", "a"), GpuInfo("n1", "1", "b"),        # idle and spinning
            GpuInfo("n2", "0", "c"), GpuInfo("n2", "1", "d"),        # one busy
            GpuInfo("n3", "0", "e"),                                  # MIG, a slice busy
            GpuInfo("n3", "0/1", "e1", parent_uuid="e"),
            GpuInfo("n3", "0/2", "e2", parent_uuid="e"),
            GpuInfo("n4", "0", "f"),                                  # MIG, every slice idle
            GpuInfo("n4", "0/1", "f1", parent_uuid="f")]
    refs = {info.ref: info for info in gpus}
    now = Now(idle={GpuRef("n1", "a"), GpuRef("n2", "c"), GpuRef("n3", "e1"),
                    GpuRef("n4", "f1")},
              spin={GpuRef("n1", "b")})
    assert _idle_nodes_now(refs, now) == {"n1", "n4"}
    assert _idle_nodes_now({}, now) == set()
