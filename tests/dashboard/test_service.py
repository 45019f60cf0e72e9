"""DashboardService's sharing of fleet computations: who computes, who waits, who reuses.

The data source counts its calls and the monotonic clock is the test's own, so ages are
exact and no test sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator, Sequence

import pytest

from gpuscope.dashboard.data import StepQuery
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import (
    FleetData,
    GpuRef,
    NodeDetail,
    PodDetail,
    Series,
    Window,
    WorkloadDetail,
)
from gpuscope.dashboard.service import PREFETCH_KEPT_S, WORKLOAD_REUSES_S, DashboardService
from tests.dashboard.conftest import one_idle_gpu_fleet


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Counting:
    """The one-idle-GPU fleet; each fleet() call is counted and takes ``takes`` seconds
    of the test's clock."""

    description = "counting test source"

    def __init__(self, clock: Clock, takes: float = 0.0) -> None:
        self.clock = clock
        self.takes = takes
        self.calls = 0
        self.gate = threading.Event()
        self.gate.set()
        self.data = one_idle_gpu_fleet()

    def window(self, window_seconds: float) -> Window:
        return self.data.window

    def fleet(self, window_seconds: float, namespace: str | None = None,
              window: Window | None = None) -> FleetData:
        self.calls += 1
        assert self.gate.wait(30)
        self.clock.now += self.takes
        return self.data

    def step_series(self, queries: Sequence[StepQuery], window_seconds: float,
                    window: Window | None = None
                    ) -> dict[StepQuery, list[tuple[dict[str, str], Series]]]:
        """A healthy fleet: the registry's step queries find nothing."""
        return {q: [] for q in queries}

    def node_detail(self, node: str, window_seconds: float) -> NodeDetail:
        raise NotImplementedError

    def pod_detail(self, namespace: str, pod: str, window_seconds: float,
                   cluster: str | None = None) -> PodDetail:
        raise NotImplementedError

    def workload_detail(self, namespace: str, workload: str, window_seconds: float,
                        first: Collection[GpuRef] = (), cluster: str | None = None
                        ) -> WorkloadDetail:
        raise NotImplementedError

    def close(self) -> None:
        pass


Make = Callable[..., tuple[DashboardService, Counting, Clock]]


@pytest.fixture
def make() -> Iterator[Make]:
    """Services on the counting source and the test's clock, ``takes`` seconds a view;
    closed after the test, whether it passed or not."""
    made: list[DashboardService] = []

    def build(takes: float = 0.0) -> tuple[DashboardService, Counting, Clock]:
        clock = Clock()
        source = Counting(clock, takes)
        made.append(DashboardService(source, bundled_prices(), monotonic=clock))
        return made[-1], source, clock

    yield build
    for service in made:
        service.close()


def test_requests_while_computing_share_one_computation(make: Make) -> None:
    service, source, _ = make()
    source.gate.clear()
    service.prefetch()
    answers: list[object] = []
    callers = [threading.Thread(target=lambda: answers.append(service.fleet("1h", None)))
               for _ in range(3)]
    for t in callers:
        t.start()
    source.gate.set()
    for t in callers:
        t.join(30)
    assert source.calls == 1
    assert len(answers) == 3 and len({id(a) for a in answers}) == 1


def test_a_result_is_shared_for_two_seconds_after_it_finished_not_after_it_began(
    make: Make,
) -> None:
    # A 5 s computation: its result is fresh when it finishes, whatever it took.
    service, source, clock = make(takes=5.0)
    first = service.fleet("1h", None)
    clock.now += 1.0
    assert service.fleet("1h", None) is first and source.calls == 1
    clock.now += 1.5  # 2.5 s after it finished
    assert service.fleet("1h", None) is not first and source.calls == 2


def settle(service: DashboardService) -> None:
    """Wait until every computation started has finished, without taking any."""
    for shared in list(service._inflight.values()):
        shared.future.result(30)


def test_the_page_requests_view_waits_for_the_pages_first_callback(make: Make) -> None:
    service, source, clock = make()
    service.prefetch()  # the page's HTML is requested
    settle(service)
    clock.now += 10.0  # its scripts take 10 s to load
    first = service.fleet("1h", None)  # the first callback takes the view computed for it
    assert source.calls == 1
    # Taken once: later callbacks share a result for two seconds only.
    clock.now += 10.0
    assert service.fleet("1h", None) is not first
    assert source.calls == 2


def test_a_prefetched_view_is_kept_up_to_its_limit_only(make: Make) -> None:
    service, source, clock = make()
    service.prefetch()
    settle(service)
    clock.now += PREFETCH_KEPT_S + 1.0
    service.fleet("1h", None)
    assert source.calls == 2
    # A prefetch that finds a fresh view marks it for its page too.
    service.prefetch()
    clock.now += PREFETCH_KEPT_S - 1.0
    service.fleet("1h", None)
    assert source.calls == 2


def test_the_workload_view_reads_a_recent_fleet_view_instead_of_computing_one(make: Make) -> None:
    service, source, clock = make()
    service.fleet("1h", None)
    # Its callback chains on the pickers, seconds after the fleet callback's.
    clock.now += WORKLOAD_REUSES_S - 1.0
    assert service.workload(None, "1h", None) == (None, {}, None)  # no straggler to show
    assert source.calls == 1
    # The fleet callback itself still wants a fresh view past the two seconds.
    service.fleet("1h", None)
    assert source.calls == 2
    clock.now += WORKLOAD_REUSES_S + 1.0
    service.workload(None, "1h", None)
    assert source.calls == 3


def test_the_workload_view_leaves_the_pages_view_to_the_fleet_callback(make: Make) -> None:
    service, source, clock = make()
    service.prefetch()
    settle(service)
    clock.now += 5.0
    service.workload(None, "1h", None)
    clock.now += 5.0
    service.fleet("1h", None)  # still kept for it: 10 s after it finished
    assert source.calls == 1


def test_a_page_request_prefetches_the_view_its_url_names(make: Make) -> None:
    """A link to one cluster's page (``/?cluster=eks-03&window=6h``) starts that view's
    computation as the HTML is served, not the whole fleet's default one as well (in
    Chromium, the cluster's page had taken two computations: 4.4 s)."""
    from gpuscope.dashboard.app import create_app

    service, _, _ = make()
    client = create_app(service).server.test_client()
    assert client.get("/?window=6h&cluster=eks-03&namespace=ml").status_code == 200
    assert client.get("/?window=forever").status_code == 200  # not a window: the default
    assert set(service._inflight) == {("6h", "ml", "eks-03"), ("1h", None, None)}
    assert client.get("/?cluster=%22%7D").status_code == 200  # not a cluster: the fleet's
    assert set(service._inflight) == {("6h", "ml", "eks-03"), ("1h", None, None)}


@pytest.mark.parametrize("body", [
    {}, [], "x", {"output": "nope..children", "outputs": {}, "inputs": []},
    {"output": None, "outputs": {}, "inputs": []},
])
def test_a_malformed_callback_request_is_a_400_and_one_log_line(
        make: Make, body: object, caplog: pytest.LogCaptureFixture) -> None:
    """A body that is none of this page's callbacks (a scanner, a stale tab) was an HTTP 500
    and a traceback in the log (Dash reads ``body["output"]`` unchecked)."""
    from gpuscope.dashboard.app import create_app

    service, _, _ = make()
    client = create_app(service).server.test_client()
    with caplog.at_level("WARNING"):
        answer = client.post("/_dash-update-component", json=body)
    assert answer.status_code == 400 and b"malformed callback request" in answer.data
    assert not any(r.exc_info for r in caplog.records)
    assert [r.levelname for r in caplog.records if r.name.startswith("gpuscope")] == ["WARNING"]
