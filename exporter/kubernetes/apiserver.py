"""Pod and node names from the Kubernetes API server, for this node only.

What it gives the attribution code: for every pod on this node (list + watch of the pods
with ``fieldSelector=spec.nodeName=<node>``) its namespace, name, labels, owner references,
``workload`` and the container-ID → container-name map; and this node's instance type, zone
and capacity type (``GET /api/v1/nodes/<node>``). :meth:`PodMetadataWatcher.snapshot`
returns the latest immutable view at once; the network work runs in background daemon
threads, and an API-server outage keeps the last names.

The parts:

- configuration (:func:`load_config`): ``--kubeconfig FILE``, else the in-cluster service
  account, else :class:`MetadataDisabled` (names off, one warning); a kubeconfig that cannot
  be used raises :class:`KubeConfigError` (the CLI's one error line and exit 2);
- the HTTP client (:mod:`gpuscope.exporter.kubernetes.apiclient`): lightkube, imported only
  here and only when names are on (it costs ~7 MiB of RSS);
- what objects mean (:mod:`gpuscope.exporter.kubernetes.workload`): pure functions;
- here: keeping a resource in sync (:class:`_ListWatch`, one thread per watched resource,
  so a second one such as DRA ResourceSlices is one more instance), the node poller, and the
  snapshot.

The list/watch protocol follows the Kubernetes API concepts page ("Efficient detection of
changes") and client-go's reflector: list (paginated with ``limit``/``continue``), watch from
the list's ``resourceVersion`` with bookmarks and a jittered ``timeoutSeconds``; a watch the
server ends is resumed from the last ``resourceVersion`` seen (an event's or a bookmark's);
``410 Gone`` relists at once; a broken, silent or refused watch relists after an exponential
backoff with jitter that only a watch that worked resets. Lists are consistent reads (no
``resourceVersion=0``): since Kubernetes 1.31 the API server serves them from its watch cache
too, and they never go back in time after a 410.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

# The data types live in a module of their own, without this client, for the code that only
# reads them (attribution, the simulated source); re-exported here as before. So do the pure
# functions that read API objects.
from gpuscope.exporter.kubernetes.metadata import (
    MetadataSnapshot,
    NodeInfo,
    OwnerRef,
    PodInfo,
    WatcherStats,
)
from gpuscope.exporter.kubernetes.workload import (
    derive_workload,
    node_info_from_labels,
    pod_from_json,
)

if TYPE_CHECKING:
    from lightkube import SingleConfig
    from lightkube.core.resource import Resource

    from gpuscope.exporter.kubernetes.apiclient import ApiClient

__all__ = [
    "DEFAULT_SERVICEACCOUNT_DIR",
    "ApiStatusError",
    "ClientClosed",
    "KubeConfigError",
    "MetadataDisabled",
    "MetadataSnapshot",
    "NodeInfo",
    "OwnerRef",
    "PodInfo",
    "PodMetadataWatcher",
    "WatchExpired",
    "WatcherStats",
    "derive_workload",
    "load_config",
    "node_info_from_labels",
    "pod_from_json",
]

log = logging.getLogger(__name__)

DEFAULT_SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# --------------------------------------------------------------------------------------
# Configuration and errors
# --------------------------------------------------------------------------------------


class KubeConfigError(ValueError):
    """A kubeconfig that was asked for explicitly cannot be used (one line, for exit 2)."""


@dataclass(frozen=True, slots=True)
class MetadataDisabled:
    """No API server configuration: pod and node names are off. ``reason`` is one line for
    the single warning the caller logs."""

    reason: str


class ApiStatusError(Exception):
    """The API server answered with an error status (or a watch ``ERROR`` event)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class WatchExpired(Exception):
    """``410 Gone``: the resourceVersion is older than the API server keeps; relist."""


class ClientClosed(Exception):
    """The client was closed (the watcher is stopping)."""


def load_config(
    kubeconfig: str | None = None,
    *,
    serviceaccount_dir: str = DEFAULT_SERVICEACCOUNT_DIR,
) -> SingleConfig | MetadataDisabled:
    """``--kubeconfig FILE`` if given (its current context), else the in-cluster service
    account, else :class:`MetadataDisabled`. lightkube reads both; it is imported only when
    one exists.

    A kubeconfig that was given but cannot be used raises :class:`KubeConfigError`.
    """
    if kubeconfig:
        from gpuscope.exporter.kubernetes import apiclient

        return apiclient.from_kubeconfig(kubeconfig)
    env = os.environ
    if not (env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT")):
        return MetadataDisabled(
            "pod metadata disabled: no --kubeconfig and not running in a cluster "
            "(KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT unset)"
        )
    token_file = os.path.join(serviceaccount_dir, "token")
    if not os.path.isfile(token_file):
        return MetadataDisabled(
            f"pod metadata disabled: in-cluster but {token_file} is missing "
            "(automountServiceAccountToken: false?)"
        )
    from lightkube import ConfigError

    from gpuscope.exporter.kubernetes import apiclient

    try:
        return apiclient.in_cluster(serviceaccount_dir)
    except ConfigError as e:
        return MetadataDisabled(f"pod metadata disabled: in-cluster configuration: {e}")


# --------------------------------------------------------------------------------------
# Keeping one resource in sync
# --------------------------------------------------------------------------------------


# A watch open at least this long (seconds) worked: its end, clean or not, resets the backoff.
_WATCH_WORKED_S = 1.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ListWatchStats:
    """One watched resource's counters and last results. ``success``: the last list or
    watch attempt is healthy (False from the first failure until the next successful list);
    ``duration_seconds``: the last list."""

    lists_total: int = 0
    list_errors_total: int = 0
    watch_errors_total: int = 0
    events_total: int = 0
    relists_gone_total: int = 0
    success: bool = False
    duration_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class _Timing:
    watch_timeout_s: float
    watch_read_timeout_s: float
    backoff_initial_s: float
    backoff_max_s: float
    page_size: int


class _ListWatch(Generic[T]):
    """Keep the objects of one resource that match a field selector, by key, in a thread.

    :meth:`run` lists, then watches from the list's ``resourceVersion``. A watch the server
    ends is resumed from the last ``resourceVersion``; ``410 Gone`` relists at once (after a
    backoff when it happens again straight after a list); a broken stream, a read timeout
    or an error status relists after an exponential backoff with jitter, which only a watch
    that worked (stayed open or delivered events) resets: a successful list does not, so a
    watch that fails at once every time makes the relists back off too. Failures keep the
    last known objects. ``on_change`` runs (on this thread) after every change of objects or
    counters.
    """

    def __init__(
        self,
        api: ApiClient,
        resource: type[Resource],
        *,
        name: str,
        fields: str,
        parse: Callable[[Mapping[str, Any]], tuple[str, T] | None],
        timing: _Timing,
        stop: threading.Event,
        on_change: Callable[[], None],
        clock: Callable[[], float],
        rng: random.Random,
        unserved_retry_s: float | None = None,
    ) -> None:
        self.name = name
        # For an optional resource: a list answered 404 (not served: an older cluster) or
        # 403 (not allowed: RBAC not granted) is retried only this often, not on the backoff
        # of a failing API server (which would be a request every 30 s from every node).
        self._unserved_retry_s = unserved_retry_s
        self._unserved_logged = False
        self.synced = threading.Event()
        self._api = api
        self._resource = resource
        self._fields = fields
        self._parse = parse
        self._t = timing
        self._stop = stop
        self._on_change = on_change
        self._clock = clock
        self._rng = rng
        self._lock = threading.Lock()
        self._items: dict[str, T] = {}
        self._updated_at: float | None = None
        self._stats = ListWatchStats()
        self._failing = False

    def view(self) -> tuple[Mapping[str, T], float | None, ListWatchStats]:
        """A copy of the objects, when they last changed, and the counters."""
        with self._lock:
            return MappingProxyType(dict(self._items)), self._updated_at, self._stats

    def _count(self, **changes: Any) -> None:
        """Counters (``name=delta`` for ints, values for the rest), then ``on_change``."""
        with self._lock:
            updated: dict[str, Any] = {}
            for key, value in changes.items():
                current = getattr(self._stats, key)
                is_count = isinstance(current, int) and not isinstance(current, bool)
                updated[key] = current + value if is_count else value
            self._stats = replace(self._stats, **updated)
        self._on_change()

    def _backoff(self, current: float) -> float:
        """Sleep ``current`` (±20 % jitter, so a DaemonSet's pods do not retry in step);
        return the next delay."""
        self._stop.wait(current * (0.8 + 0.4 * self._rng.random()))
        return min(current * 2.0, self._t.backoff_max_s)

    def run(self) -> None:
        initial = self._t.backoff_initial_s
        backoff = initial
        resource_version: str | None = None
        gone_streak = 0
        while not self._stop.is_set():
            if resource_version is None:
                try:
                    resource_version = self._list()
                    # The backoff is not reset here but by a watch that works: with a watch
                    # that fails at once (a proxy that breaks watches, a 500 from an unhealthy
                    # watch cache), resetting here would relist at the first delay forever.
                except ClientClosed:
                    return
                except Exception as e:
                    if self._stop.is_set():
                        return
                    if (self._unserved_retry_s is not None and isinstance(e, ApiStatusError)
                            and e.status in (403, 404)):
                        self._unserved(e)
                        continue
                    self._failed("list", e, list_errors_total=1)
                    backoff = self._backoff(backoff)
                    continue
            started = self._clock()
            try:
                resource_version, events = self._watch(resource_version)
            except ClientClosed:
                return
            except WatchExpired:
                # Routine: the watch window moved past our resourceVersion.
                log.debug("%s watch expired (410 Gone); relisting", self.name)
                resource_version = None
                self._count(relists_gone_total=1)
                gone_streak += 1
                if gone_streak > 1:  # 410 again straight after a fresh list: slow down
                    backoff = self._backoff(backoff)
                continue
            except Exception as e:
                if self._stop.is_set():
                    return
                if self._clock() - started >= _WATCH_WORKED_S:
                    backoff = initial  # it worked for a while, then broke
                self._failed("watch", e, watch_errors_total=1)
                resource_version = None
                backoff = self._backoff(backoff)
                continue
            gone_streak = 0
            if events == 0 and self._clock() - started < _WATCH_WORKED_S:
                backoff = self._backoff(backoff)  # ended empty at once: pause, do not spin
            else:
                backoff = initial

    def _unserved(self, error: ApiStatusError) -> None:
        """An optional resource the API server does not serve (404) or lets us read (403):
        no objects, healthy, asked again after ``unserved_retry_s``."""
        why = ("not served by this API server" if error.status == 404
               else "not allowed by RBAC (list/watch needed)")
        if not self._unserved_logged:
            log.log(logging.INFO if error.status == 404 else logging.WARNING,
                    "%s %s: off, asking again every %.0f s (%s)", self.name, why,
                    self._unserved_retry_s, error)
            self._unserved_logged = True
        with self._lock:
            self._items = {}
            self._updated_at = self._clock()
        self.synced.set()
        self._count(lists_total=1, success=True, duration_seconds=0.0)
        assert self._unserved_retry_s is not None
        self._stop.wait(self._unserved_retry_s)

    def _failed(self, what: str, error: Exception, **counts: int) -> None:
        detail = str(error) or type(error).__name__
        if not self._failing:
            log.warning("%s %s failed (keeping the last known %s): %s",
                        self.name, what, self.name, detail)
        else:
            log.debug("%s %s failed again: %s", self.name, what, detail)
        self._failing = True
        self._count(success=False, **counts)

    def _list(self) -> str:
        started = self._clock()
        items: dict[str, T] = {}
        resource_version = ""
        for page_version, page in self._api.list(
            self._resource, fields=self._fields, page_size=self._t.page_size
        ):
            resource_version = page_version  # the same on every page
            for obj in page:
                if (parsed := self._parse(obj)) is not None:
                    items[parsed[0]] = parsed[1]
        if not resource_version:
            raise ApiStatusError(200, f"{self.name} list without metadata.resourceVersion")
        with self._lock:
            self._items = items
            self._updated_at = self._clock()
        if self._failing:
            log.info("%s list recovered: %d %s", self.name, len(items), self.name)
        self._failing = False
        self.synced.set()
        self._count(lists_total=1, success=True, duration_seconds=self._clock() - started)
        return resource_version

    def _watch(self, resource_version: str) -> tuple[str, int]:
        """Follow one watch until the server ends it; returns the last resourceVersion
        and how many events (bookmarks included) arrived."""
        # The server ends the watch after timeoutSeconds; jittered so that the pods of a
        # DaemonSet do not come back in step.
        timeout = int(self._t.watch_timeout_s * (1.0 + 0.5 * self._rng.random()))
        events = 0
        with self._api.watch(
            self._resource,
            fields=self._fields,
            resource_version=resource_version,
            timeout_s=max(1, timeout),
            read_timeout_s=self._t.watch_read_timeout_s,
        ) as stream:
            for kind, obj in stream:
                resource_version = self._apply(kind, obj, resource_version)
                events += 1
        return resource_version, events

    def _apply(self, kind: str, obj: Mapping[str, Any], resource_version: str) -> str:
        meta = obj.get("metadata")
        new_rv = str((meta.get("resourceVersion") if isinstance(meta, dict) else None)
                     or resource_version)
        if kind == "BOOKMARK":
            return new_rv
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise ApiStatusError(200, f"unexpected watch event type {kind!r}")
        parsed = self._parse(obj)
        with self._lock:
            if parsed is not None:
                if kind == "DELETED":
                    self._items.pop(parsed[0], None)
                else:
                    self._items[parsed[0]] = parsed[1]
            self._updated_at = self._clock()
        self._count(events_total=1)
        return new_rv


def _pod_entry(obj: Mapping[str, Any]) -> tuple[str, PodInfo] | None:
    pod = pod_from_json(obj)
    return (pod.uid, pod) if pod is not None else None


def _slice_entry(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]] | None:
    """A ResourceSlice kept as it came (``dra.py`` reads it), by name."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return (name, obj) if isinstance(name, str) and name else None


# --------------------------------------------------------------------------------------
# The watcher
# --------------------------------------------------------------------------------------


class PodMetadataWatcher:
    """Keep the pods of one node and the node's labels, in background daemon threads.

    ``gpuscope-kube-pods`` keeps the pods with ``spec.nodeName=<node>`` (:class:`_ListWatch`);
    ``gpuscope-kube-node`` GETs the Node every ``node_refresh_s`` (``node_retry_s`` after a
    failure). Failures keep the last known pods and node. Every request has a timeout:
    ``request_timeout_s`` for connecting and for each read, except a watch's reads, which
    wait up to ``watch_read_timeout_s`` (default: longer than the server keeps a watch open)
    so that a stream gone silent ends.

    Raises :class:`KubeConfigError` when the configuration's TLS material or credentials
    cannot be loaded, ``ValueError`` without a node name.
    """

    def __init__(
        self,
        config: SingleConfig,
        node_name: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        request_timeout_s: float = 10.0,
        watch_timeout_s: float = 300.0,
        watch_read_timeout_s: float | None = None,
        node_refresh_s: float = 300.0,
        node_retry_s: float = 60.0,
        token_refresh_s: float = 60.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        page_size: int = 500,
        rng: random.Random | None = None,
        resource_slices: bool = True,
        unserved_retry_s: float = 600.0,
    ) -> None:
        if not node_name:
            raise ValueError("node_name is required (pods are listed for this node only)")
        from gpuscope.exporter.kubernetes import apiclient

        self._node_name = node_name
        self._clock = clock
        self._node_refresh_s = node_refresh_s
        self._node_retry_s = node_retry_s
        self._api = apiclient.ApiClient(
            config, request_timeout_s=request_timeout_s, token_refresh_s=token_refresh_s,
            clock=clock,
        )
        self._nodes = apiclient.Nodes
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        timing = _Timing(
            watch_timeout_s=watch_timeout_s,
            # The server ends a watch after timeoutSeconds (up to 1.5x with our jitter); this
            # only catches a stream gone silent (a half-open connection, a stuck proxy).
            watch_read_timeout_s=watch_read_timeout_s
            if watch_read_timeout_s is not None
            else watch_timeout_s * 1.5 + 30.0,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            page_size=page_size,
        )
        self._pods: _ListWatch[PodInfo] = _ListWatch(
            self._api, apiclient.Pods, name="pods", fields=f"spec.nodeName={node_name}",
            parse=_pod_entry, timing=timing, stop=self._stop, on_change=self._publish,
            clock=clock, rng=rng or random.Random(),
        )
        # DRA: this node's ResourceSlices (resource.k8s.io/v1, Kubernetes 1.34+). Optional:
        # an API server that does not serve them, or RBAC that does not allow them, turns
        # DRA attribution off and is asked again every ``unserved_retry_s``.
        self._slices: _ListWatch[Mapping[str, Any]] | None = None
        if resource_slices:
            self._slices = _ListWatch(
                self._api, apiclient.ResourceSlices, name="resourceslices",
                fields=f"spec.nodeName={node_name}", parse=_slice_entry, timing=timing,
                stop=self._stop, on_change=self._publish, clock=clock,
                rng=rng or random.Random(), unserved_retry_s=unserved_retry_s,
            )
        self._node: NodeInfo | None = None
        self._node_updated_at: float | None = None
        self._node_stats = WatcherStats()  # only its node_* fields are used
        self._node_failing = False
        self._snapshot = MetadataSnapshot()

    # -- public ------------------------------------------------------------------------

    def start(self) -> None:
        if self._threads:
            return
        loops = [(self._pods.run, "kube-pods"), (self._run_node, "kube-node")]
        if self._slices is not None:
            loops.append((self._slices.run, "kube-resourceslices"))
        for target, name in loops:
            t = threading.Thread(target=target, name=f"gpuscope-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads, aborting any request in flight."""
        self._stop.set()
        self._api.close()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> PodMetadataWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def snapshot(self) -> MetadataSnapshot:
        """The latest view; never blocks on the network."""
        return self._snapshot

    def wait_synced(self, timeout: float) -> bool:
        """Wait until the first pod list has succeeded (for readiness and tests)."""
        return self._pods.synced.wait(timeout)

    # -- state -------------------------------------------------------------------------

    def _publish(self) -> None:
        """Swap in a new snapshot (from either thread)."""
        with self._lock:
            pods, pods_updated_at, p = self._pods.view()
            stats = replace(
                self._node_stats,
                pod_lists_total=p.lists_total,
                pod_list_errors_total=p.list_errors_total,
                watch_errors_total=p.watch_errors_total,
                watch_events_total=p.events_total,
                relists_gone_total=p.relists_gone_total,
                pods_success=p.success,
                pods_duration_seconds=p.duration_seconds,
            )
            slices: tuple[Mapping[str, Any], ...] = ()
            if self._slices is not None:
                items, _, sl = self._slices.view()
                slices = tuple(items.values())
                stats = replace(
                    stats,
                    resourceslices_success=sl.success,
                    resourceslices_duration_seconds=sl.duration_seconds,
                    resourceslices_errors_total=sl.list_errors_total + sl.watch_errors_total,
                )
            self._snapshot = MetadataSnapshot(
                resource_slices=slices,
                pods=pods,
                node=self._node,
                synced=self._pods.synced.is_set(),
                pods_updated_at=pods_updated_at,
                node_updated_at=self._node_updated_at,
                stats=stats,
            )

    # -- node --------------------------------------------------------------------------

    def _run_node(self) -> None:
        while not self._stop.is_set():
            ok = self._refresh_node()
            if self._stop.wait(self._node_refresh_s if ok else self._node_retry_s):
                return

    def _refresh_node(self) -> bool:
        started = self._clock()
        try:
            doc = self._api.get(self._nodes, self._node_name)
        except Exception as e:
            if self._stop.is_set():
                return False
            if not self._node_failing:
                log.warning("GET node %s failed (keeping the last known labels): %s",
                            self._node_name, str(e) or type(e).__name__)
            self._node_failing = True
            self._node_done(started, ok=False)
            return False
        meta = doc.get("metadata")
        labels = meta.get("labels") if isinstance(meta, dict) else None
        node = node_info_from_labels(
            {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
        )
        with self._lock:
            self._node = node
            self._node_updated_at = self._clock()
        self._node_failing = False
        self._node_done(started, ok=True)
        return True

    def _node_done(self, started: float, *, ok: bool) -> None:
        with self._lock:
            s = self._node_stats
            self._node_stats = replace(
                s,
                node_requests_total=s.node_requests_total + 1,
                node_errors_total=s.node_errors_total + (0 if ok else 1),
                node_success=ok,
                node_duration_seconds=self._clock() - started,
            )
        self._publish()
