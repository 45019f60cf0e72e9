"""What every data mode shares: the :class:`DataSource` protocol the views call, its errors,
the validation of user-given names, and the window arithmetic."""


from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from typing import Protocol

from gpuscope.dashboard.data.steps import StepQuery
from gpuscope.dashboard.series import (
    FleetData,
    GpuRef,
    NodeDetail,
    PodDetail,
    Series,
    Window,
    WorkloadDetail,
)

INFO_LOOKBACK = 300.0  # like Prometheus' lookback delta: an info series older than this is gone


class DataError(Exception):
    """The backend failed (unreachable, slow, an error answer); ``str()`` is one line."""


class InvalidFilter(ValueError):
    """A filter value (namespace, node, pod) that is not a valid Kubernetes name."""



# -- names ---------------------------------------------------------------------------

# Kubernetes names: a namespace is a DNS label; pods and nodes are DNS subdomains. Node names
# from --targets hints may also be IP addresses (v4 or v6) or upper case host names. A node
# of a store holding several clusters is keyed ``cluster/node`` (:mod:`.promql`), the
# cluster a label value of letters, digits, ``.``, ``_`` and ``-``.
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_POD = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_CLUSTER = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"
_NODE = re.compile(rf"^({_CLUSTER}/)?[A-Za-z0-9:]([A-Za-z0-9._:-]{{0,251}}[A-Za-z0-9])?$")
# A workload is ``<Kind>/<name>`` of a pod's top owner (kinds are CamelCase identifiers,
# names DNS subdomains).
_WORKLOAD = re.compile(r"^[A-Za-z][A-Za-z0-9]{0,62}/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")

def validate_namespace(value: str) -> str:
    value = value.strip()
    if not _NAMESPACE.match(value):
        raise InvalidFilter(f"not a Kubernetes namespace name: {value[:80]!r}")
    return value


def validate_pod(value: str) -> str:
    value = value.strip()
    if not _POD.match(value):
        raise InvalidFilter(f"not a Kubernetes pod name: {value[:80]!r}")
    return value


def validate_node(value: str) -> str:
    value = value.strip()
    if not _NODE.match(value):
        raise InvalidFilter(f"not a node name: {value[:80]!r}")
    return value


def validate_cluster(value: str) -> str:
    """A cluster's name as a node key holds it (``cluster/node``)."""
    value = value.strip()
    if not re.fullmatch(_CLUSTER, value):
        raise InvalidFilter(f"not a cluster name: {value[:80]!r}")
    return value


def validate_workload(value: str) -> str:
    value = value.strip()
    if not _WORKLOAD.match(value):
        raise InvalidFilter(f"not a workload (Kind/name): {value[:80]!r}")
    return value


# -- windows ---------------------------------------------------------------------------------


def make_window(
    window_seconds: float, end: float, *, min_step: float, max_points: int
) -> Window:
    """A window whose step divides it evenly: ``window / n`` with ``n`` <= ``max_points``
    steps of at least ``min_step`` seconds (Prometheus' and our buckets then coincide)."""
    if window_seconds <= 0:
        raise ValueError("window must be positive")
    n = max(1, min(max_points, math.floor(window_seconds / min_step)))
    end = round(end, 3)  # whole milliseconds: the resolution of Prometheus' timestamps
    return Window(start=end - window_seconds, end=end, step=window_seconds / n)


# -- the protocol ----------------------------------------------------------------------------


class DataSource(Protocol):
    """What the views need, whatever the backend."""

    @property
    def description(self) -> str: ...

    def window(self, window_seconds: float) -> Window:
        """The window of the last ``window_seconds`` now: its end and step, as this store
        makes them (a page's fleet data and step queries share one)."""
        ...

    def fleet(self, window_seconds: float, namespace: str | None = None,
              window: Window | None = None) -> FleetData:
        """The fleet page's data over ``window`` (None: :meth:`window` of
        ``window_seconds`` now)."""
        ...

    def node_detail(self, node: str, window_seconds: float) -> NodeDetail: ...

    def pod_detail(self, namespace: str, pod: str, window_seconds: float,
                   cluster: str | None = None) -> PodDetail:
        """One pod's containers per device (``cluster``: that cluster's pod only, the page
        scoped to it; None: a pod of that name in any cluster, each line naming its node)."""
        ...

    def workload_detail(
        self, namespace: str, workload: str, window_seconds: float,
        first: Collection[GpuRef] = (), cluster: str | None = None,
    ) -> WorkloadDetail:
        """One workload's devices side by side (``first``: kept when there are too many;
        ``cluster``: that cluster's run only, the page scoped to it; None: every
        cluster's)."""
        ...

    def step_series(
        self, queries: Sequence[StepQuery], window_seconds: float,
        window: Window | None = None,
    ) -> dict[StepQuery, list[tuple[dict[str, str], Series]]]:
        """Per query (each once), the series with a kept step in ``window`` (None: the
        window that :meth:`fleet` shows for ``window_seconds`` now; the same steps): each
        series' labels are
        ``node`` and the query's ``by`` labels it has, its points the kept steps only (a
        healthy fleet: every list empty). :mod:`.steps` says what a step is in each store.
        DataError when the store fails."""
        ...

    def close(self) -> None: ...


