"""Starved containers.

- time-slice starvation: >= 2 containers share a device, the device is >= ``busy`` (0.9)
  busy, and a container's share of the summed container utilization is below
  ``share_factor`` (0.5) x its fair share (1/n), for >= ``duration`` (10 min, shortened to
  the window and the history collected).
- input-starved (suspected): a container holds device memory, its mean utilization is in
  (``low``, ``high``) = (0.05, 0.5) and it varies strongly: coefficient of variation
  (stddev / mean of its raw samples) >= ``min_cv`` (0.5), over at least ``min_samples``
  samples. A training loop waiting on its data loader looks like that: bursts of full
  utilization between idle gaps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.dashboard import fmt, ids
from gpuscope.dashboard.links import at_node, node_link, pod_link
from gpuscope.dashboard.series import ContainerRef, GpuRef, Series, UtilStats, Window
from gpuscope.dashboard.verdicts.cells import for_cell
from gpuscope.dashboard.verdicts.common import holds, is_fresh, required_seconds, trailing_run
from gpuscope.dashboard.verdicts.page import Column, Row, Section, State, Table, Threshold

if TYPE_CHECKING:
    from gpuscope.dashboard.verdicts.page import PageContext

BUSY_THRESHOLD = 0.9
SHARE_FACTOR = 0.5
STARVATION_DURATION = 10 * 60.0

INPUT_LOW = 0.05
INPUT_HIGH = 0.5
INPUT_MIN_CV = 0.5
INPUT_MIN_SAMPLES = 10

THRESHOLDS = (
    Threshold("busy_utilization", "ratio",
              "time-slice starvation: on a shared GPU at least this busy, ..."),
    Threshold("share_factor", "factor",
              "... a container gets less than this times its fair share (1/n), ..."),
    Threshold("starvation_duration", "seconds", "... for at least this long"),
    Threshold("input_low", "ratio",
              "input-starved: a container's mean utilization above this, ..."),
    Threshold("input_high", "ratio", "... and below this, ..."),
    Threshold("input_min_cv", "factor",
              "... varying by at least this coefficient of variation (stddev / mean), ..."),
    Threshold("input_min_samples", "count", "... over at least this many samples"),
)


@dataclass(frozen=True, slots=True)
class ShareVerdict:
    """One container on a time-sliced device, at the latest step.

    ``share``: its part of the containers' summed utilization; ``fair_share``: 1/n, or on a
    GPU shared by CUDA MPS the client's active-thread share (1/replicas: NVIDIA's device
    plugin gives each of N replicas 100/N % of the threads);
    ``starved_seconds``: the trailing run of the starvation condition (0 if not starving
    now); ``starved``: that run is at least ``required_seconds`` long.
    """

    ref: ContainerRef
    utilization: float
    share: float | None
    fair_share: float
    sharers: int
    gpu_utilization: float | None
    starved: bool
    starved_since: float | None
    starved_seconds: float
    required_seconds: float
    #: The device is shared by CUDA MPS: ``fair_share`` is the active-thread share.
    mps: bool = False


def timeslice_shares(
    containers: Mapping[ContainerRef, Series],
    gpu_util: Mapping[GpuRef, Series],
    window: Window,
    history_start: float,
    *,
    busy: float = BUSY_THRESHOLD,
    share_factor: float = SHARE_FACTOR,
    duration: float = STARVATION_DURATION,
    fair_shares: Mapping[GpuRef, float] | None = None,
) -> list[ShareVerdict]:
    """A verdict for every container currently on a device shared by >= 2 containers.

    Host processes (empty namespace) are not containers and are left out. ``fair_shares``:
    per device shared by CUDA MPS, each client's active-thread share (1/replicas); it is
    judged against that instead of 1/n: under MPS the clients run at once, each on at most
    its share of the SMs, rather than taking turns.
    """
    fair_shares = fair_shares or {}
    required = required_seconds(duration, window, history_start)
    # The containers by device first, and the steps of those on a shared device only (a
    # large fleet has 10^5 containers, few of them sharing).
    by_gpu: dict[GpuRef, list[tuple[ContainerRef, Series]]] = {}
    for ref, series in containers.items():
        if ref.namespace:
            gpu = ref.gpu
            on = by_gpu.get(gpu)
            if on is None:
                by_gpu[gpu] = [(ref, series)]
            else:
                on.append((ref, series))
    out: list[ShareVerdict] = []
    for gpu, on in by_gpu.items():
        if len(on) < 2:
            continue
        members = {ref: series.at() for ref, series in on}
        gpu_at = gpu_util[gpu].at() if gpu in gpu_util else {}
        # Per step: how many share the device, their summed utilization (added in the
        # members' order, from 0), the device's. One pass over each member's points, not
        # a scan of the members at every step.
        sharers: dict[float, int] = {}
        totals: dict[float, float] = {}
        for values in members.values():
            for t, v in values.items():
                sharers[t] = sharers.get(t, 0) + 1
                totals[t] = totals.get(t, 0) + v
        times = sorted(sharers)
        if not is_fresh(times, window):
            continue
        latest = times[-1]
        # Per step where a member can be starved (shared, the device busy, some use): the
        # members' total and the share under which one is; the same for every member.
        fair_gpu = fair_shares.get(gpu)
        limits: dict[float, tuple[float, float]] = {}
        for t in times:
            n, total, dev = sharers[t], totals[t], gpu_at.get(t)
            if n >= 2 and dev is not None and dev >= busy and total > 0:
                limits[t] = (total, share_factor * (fair_gpu if fair_gpu is not None
                                                    else 1.0 / n))
        for ref, values in members.items():
            if latest not in values:
                continue  # not on the device any more
            own_times = sorted(values)
            flags = [(lim := limits.get(t)) is not None and values[t] / lim[0] < lim[1]
                     for t in own_times]
            run = trailing_run(own_times, flags, window.step, history_start)
            n, total = sharers[latest], totals[latest]
            out.append(ShareVerdict(
                ref=ref,
                utilization=values[latest],
                share=values[latest] / total if total > 0 else None,
                fair_share=fair_shares.get(gpu, 1.0 / n),
                sharers=n,
                gpu_utilization=gpu_at.get(latest),
                starved=holds(run, required),
                starved_since=run.start if run else None,
                starved_seconds=run.seconds if run else 0.0,
                required_seconds=required,
                mps=fair_gpu is not None,
            ))
    out.sort(key=lambda v: (v.ref.node, v.ref.uuid, v.ref.namespace, v.ref.pod, v.ref.container))
    return out


@dataclass(frozen=True, slots=True)
class InputStarved:
    ref: ContainerRef
    mean: float
    stddev: float
    cv: float
    samples: int
    memory_bytes: float


def input_starved(
    stats: Mapping[ContainerRef, UtilStats],
    *,
    low: float = INPUT_LOW,
    high: float = INPUT_HIGH,
    min_cv: float = INPUT_MIN_CV,
    min_samples: int = INPUT_MIN_SAMPLES,
) -> list[InputStarved]:
    """Containers that look input-starved (a suspicion, not a measurement of the cause)."""
    out = []
    for ref, s in stats.items():
        if not ref.namespace or s.samples < min_samples or s.memory_bytes <= 0:
            continue
        if not low < s.mean < high:
            continue
        cv = s.stddev / s.mean
        if cv >= min_cv:
            out.append(InputStarved(ref, s.mean, s.stddev, cv, s.samples, s.memory_bytes))
    out.sort(key=lambda r: (r.ref.namespace, r.ref.pod, r.ref.container, r.ref.uuid))
    return out


def series_stats(series: Series, memory_bytes: float = 0.0) -> UtilStats:
    """Mean and population standard deviation of raw samples."""
    n = len(series.values)
    if n == 0:
        return UtilStats(0.0, 0.0, 0, memory_bytes)
    mean = sum(series.values) / n
    var = sum((v - mean) ** 2 for v in series.values) / n
    return UtilStats(mean, var**0.5, n, memory_bytes)


# -- on the page -----------------------------------------------------------------------------

STARVED_COLUMNS = (
    Column("kind", "Kind"),
    Column("namespace", "Namespace"),
    Column("pod", "Pod", "link"),
    Column("container", "Container"),
    Column("node", "Node", "link"),
    Column("gpu", "GPU"),
    Column("utilization", "Utilization", "percent"),
    Column("for", "For"),
    Column("why", "Why"),
    Column("price", "$/hour held", "money"),
)
SHARE_COLUMNS = (
    Column("node", "Node", "link"),
    Column("gpu", "GPU"),
    Column("gpu_busy", "GPU busy", "percent"),
    Column("container", "Container"),
    Column("utilization", "Utilization", "percent"),
    Column("share", "Share", "percent"),
    Column("fair_share", "Fair share", "percent"),
    Column("starved", "Starved"),
)
SECTION = Section(
    id=ids.SECTION_STARVATION, title="Starved pods",
    intro="Containers starved by time-slicing (share of a busy shared GPU far below their "
          "fair share) and containers suspected to be waiting on input (memory held, low and "
          "strongly varying utilization).",
    tables=(Table(ids.STARVED_PODS_TABLE, ids.STARVED_NOTE, STARVED_COLUMNS, order="price"),
            Table(ids.TIMESLICE_TABLE, ids.TIMESLICE_NOTE, SHARE_COLUMNS,
                  heading="Time-sliced GPUs: each container's share")),
)

# -- its findings as table rows ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StarvedRow:
    """``kind`` is ``time-slice`` or ``input-starved``; ``price_per_hour``: what the container
    holds, in $/hour (its time-slice or MIG slice's share of its node's price; None: unknown
    price)."""

    kind: str
    namespace: str
    pod: str
    container: str
    node: str
    gpu: str
    utilization: float
    detail: str
    seconds: float | None = None
    required_seconds: float | None = None
    price_per_hour: float | None = None


@dataclass(frozen=True, slots=True)
class ShareRow:
    node: str
    gpu: str
    namespace: str
    pod: str
    container: str
    utilization: float
    share: float | None
    fair_share: float
    sharers: int
    gpu_utilization: float | None
    starved: bool
    starving_seconds: float
    required_seconds: float
    mps: bool = False



def share_rows(shares: Iterable[ShareVerdict], ctx: PageContext) -> tuple[ShareRow, ...]:
    """The time-slice shares' rows: each container of ``shares`` the page shows, in order."""
    return tuple(
        ShareRow(
            node=s.ref.node, gpu=ctx.index(s.ref.gpu), namespace=s.ref.namespace,
            pod=s.ref.pod, container=s.ref.container, utilization=s.utilization,
            share=s.share, fair_share=s.fair_share, sharers=s.sharers,
            gpu_utilization=s.gpu_utilization, starved=s.starved,
            starving_seconds=s.starved_seconds, required_seconds=s.required_seconds,
            mps=s.mps,
        )
        for s in shares
        if ctx.wanted(s.ref.namespace)
    )


def _fair_basis(r: ShareRow) -> str:
    """What a row's fair share is taken from: 1/n of its n containers, or on a GPU shared by
    CUDA MPS the clients' active-thread share, 1/replicas (which may or may not be 1/n)."""
    if r.mps and r.fair_share > 0:
        return (f"MPS active-thread share, 1/{round(1.0 / r.fair_share)} replicas; "
                f"{r.sharers} containers")
    return f"{r.sharers} containers"


def starved_rows(shares: Sequence[ShareVerdict], inputs: Iterable[InputStarved],
                 ctx: PageContext,
                 holding: Callable[[ContainerRef], tuple[str, float | None]],
                 ) -> tuple[StarvedRow, ...]:
    """The starvation table's rows, dearest first: the time-sliced containers of ``shares``
    starved now and the input-starved containers of ``inputs``, those the page shows, each
    at the $/hour of what it holds (``holding``)."""
    shown = [s for s in shares if ctx.wanted(s.ref.namespace)]
    rows: list[StarvedRow] = [
        StarvedRow(
            kind="time-slice", namespace=r.namespace, pod=r.pod, container=r.container,
            node=r.node, gpu=r.gpu, utilization=r.utilization,
            detail=(f"share {fmt.pct(r.share)} of the GPU's container load vs fair share "
                    f"{fmt.pct(r.fair_share)} ({_fair_basis(r)}), GPU "
                    f"{fmt.pct(r.gpu_utilization)} busy"),
            seconds=r.starving_seconds, required_seconds=r.required_seconds,
            price_per_hour=holding(s.ref)[1],
        )
        for r, s in zip(share_rows(shown, ctx), shown, strict=True) if r.starved
    ]
    for s in inputs:
        if not ctx.wanted(s.ref.namespace):
            continue
        rows.append(StarvedRow(
            kind="input-starved", namespace=s.ref.namespace, pod=s.ref.pod,
            container=s.ref.container, node=s.ref.node, gpu=ctx.index(s.ref.gpu),
            utilization=s.mean,
            detail=(f"mean {fmt.pct(s.mean)}, varies strongly (CV {s.cv:.2f} over {s.samples} "
                    f"samples) while holding {s.memory_bytes / 2**30:.1f} GiB: suspected "
                    f"waiting on input"),
            price_per_hour=holding(s.ref)[1],
        ))
    rows.sort(key=lambda r: (-(r.price_per_hour or 0.0), r.kind, r.namespace, r.pod,
                             r.container))
    return tuple(rows)


def starved_data(rows: Sequence[StarvedRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "kind": "time-slice starved" if r.kind == "time-slice" else
                    "input-starved (suspected)",
            "namespace": r.namespace, "pod": pod_link(r.namespace, r.pod, at_node(state, r.node)),
            "container": r.container, "node": node_link(r.node, state),
            "gpu": r.gpu, "utilization": r.utilization,
            "for": (for_cell(r.seconds, r.required_seconds)
                    if r.seconds is not None and r.required_seconds is not None else "window"),
            "why": r.detail, "price": r.price_per_hour,
        }
        for r in rows
    ]


def share_data(rows: Sequence[ShareRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "node": node_link(r.node, state), "gpu": r.gpu, "gpu_busy": r.gpu_utilization,
            "container": f"{r.namespace}/{r.pod}/{r.container}", "utilization": r.utilization,
            "share": r.share, "fair_share": r.fair_share,
            "starved": (f"yes, {fmt.duration(r.starving_seconds)}" if r.starved else
                        f"starving {fmt.duration(r.starving_seconds)} of "
                        f"{fmt.duration(r.required_seconds)}" if r.starving_seconds else "no"),
        }
        for r in rows
    ]
