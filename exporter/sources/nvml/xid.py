"""XID critical errors: counted per (device, XID code) by a daemon thread waiting on NVML
events, and logged without flooding the log during an XID storm."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpuscope.exporter.model import XidCount
from gpuscope.exporter.sources.nvml import calls
from gpuscope.exporter.sources.nvml.calls import Fault, NvmlFault, handle_key, quietly, read

log = logging.getLogger(__name__)

# After an unexpected event-wait error, pause before waiting again so the thread never spins.
_XID_ERROR_PAUSE_SECONDS = 1.0
# A GPU left out of the event set because it was lost is tried again this often.
_XID_RETRY_SECONDS = 30.0
# XID events logged one by one per window; beyond that (an XID storm can be thousands a
# second) they are only counted, and one line per window sums up what was not logged.
_XID_LOG_BURST = 10
_XID_LOG_WINDOW_SECONDS = 60.0


class XidCounts:
    """XID events per (device UUID, XID code) since the source was created (a device gone
    from the node for good forgotten: :meth:`forget`), with the wall-clock time
    (``clock``, seconds) the last of each arrived. Written by the event
    thread, read by the sampler thread."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], tuple[int, float]] = {}

    def add(self, uuid: str, xid: int) -> None:
        now = self._clock()
        with self._lock:
            count, _ = self._counts.get((uuid, xid), (0, now))
            self._counts[(uuid, xid)] = (count + 1, now)

    def uuids(self) -> set[str]:
        """The devices with counts."""
        with self._lock:
            return {uuid for uuid, _ in self._counts}

    def forget(self, uuids: set[str]) -> None:
        """Drop the counts of devices that have left the node for good."""
        with self._lock:
            self._counts = {k: v for k, v in self._counts.items() if k[0] not in uuids}

    def by_device(self) -> dict[str, tuple[XidCount, ...]]:
        with self._lock:
            items = sorted(self._counts.items())
        grouped: dict[str, list[XidCount]] = {}
        for (uuid, xid), (count, last) in items:
            grouped.setdefault(uuid, []).append(XidCount(xid=xid, count=count, last_seen=last))
        return {uuid: tuple(counts) for uuid, counts in grouped.items()}


class XidWatcher:
    """Waits for XID critical-error events on one NVML event set in a daemon thread.

    An event names the physical GPU's handle and, under MIG, the GPU instance it hit; it is
    counted for that MIG slice when the instance is known, else for the GPU.

    A GPU identified after the set was made (it did not answer at nvmlInit) is added with
    :meth:`add_gpu`; the event thread registers it between two waits, so that the set is only
    ever used by one thread (NVML does not say an event set may be registered on while
    another thread waits on it).

    Once a GPU of the set is lost (XID 79, fallen off the bus), the driver answers every wait
    on the set with GPU_IS_LOST, after that GPU's own last events: no event of any other GPU
    would arrive again. The thread then makes a new set with the GPUs that still register,
    frees the old one, and tries the lost GPU again every ``_XID_RETRY_SECONDS`` (it answers
    again after a reset). ``gpus``: the registered GPUs, by handle key: (handle, UUID).
    """

    def __init__(
        self,
        event_set: object,
        gpus: dict[int, tuple[object, str]],
        mig_slices: dict[tuple[int, int], str],
        counts: XidCounts,
        wait_timeout_ms: int,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.event_set = event_set
        self._gpus = {key: uuid for key, (_, uuid) in gpus.items()}
        # Every GPU to watch (registered or left out for now): handle and UUID, by key.
        self._handles = dict(gpus)
        # GPUs left out of the set while lost, tried again from _retry_at (monotonic) on.
        self._left_out: dict[int, tuple[object, str]] = {}
        self._retry_at = 0.0
        self._monotonic = monotonic
        self._failing = False  # the last wait (or rebuild) failed: no event can arrive
        self._mig_slices = mig_slices
        self._counts = counts
        self._wait_timeout_ms = wait_timeout_ms
        self._log = XidLog(monotonic)
        # Writers of the two maps (the sampler thread, the event thread registering a late
        # GPU) replace them whole under this lock; _count reads them without it.
        self._maps_lock = threading.Lock()
        # GPUs to register on the event set before the next wait: (handle, uuid).
        self._pending: list[tuple[object, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuscope-nvml-xid", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def watching(self) -> bool:
        """The thread runs and its last wait did not fail: events can arrive."""
        return self._thread.is_alive() and not self._failing

    def stop(self, timeout: float) -> bool:
        """Ask the thread to stop and wait for it; True when it has ended."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        failing = False  # log the first of a run of failures only
        while not self._stop.is_set():
            try:
                self._register_pending()
                self._retry_left_out()
                event = read(calls.wait_xid, self.event_set, self._wait_timeout_ms)
            except NvmlFault as fault:
                if fault.fault is Fault.DRIVER:
                    # The sampler notices too, shuts NVML down and starts a new watcher.
                    log.warning("XID event thread stopping: %s", fault.error)
                    self._failing = True
                    return
                if fault.fault is Fault.LOST and self._rebuild_safely():
                    failing = self._failing = False
                    continue
                if not failing:
                    log.warning("waiting for XID events failed: %s", fault.error)
                failing = self._failing = True
                self._stop.wait(_XID_ERROR_PAUSE_SECONDS)
                continue
            except Exception:  # a bug must not end XID counting silently
                if not failing:
                    log.exception("XID event thread error")
                failing = self._failing = True
                self._stop.wait(_XID_ERROR_PAUSE_SECONDS)
                continue
            failing = self._failing = False
            if event is not None:
                self._count(*event)
            else:
                self._log.flush()  # a quiet moment: sum up a storm that has ended
        self._log.flush(force=True)

    def _register(self, handle: object, uuid: str, event_set: object, *,
                  quiet: bool = False) -> bool:
        """Register one GPU on ``event_set``; False (logged unless ``quiet``) when it cannot
        (NOT_SUPPORTED, lost, failing); a dead driver raises :class:`NvmlFault`."""
        try:
            registered = read(calls.register_xid_events, handle, event_set)
        except NvmlFault as fault:
            if fault.fault is Fault.DRIVER:
                raise
            registered = False
        if not registered and not quiet:
            log.warning("GPU %s cannot report XID events; not watching it", uuid)
        return bool(registered)

    def _rebuild_safely(self) -> bool:
        """:meth:`_rebuild`, False where it fails (a dead driver too: the next wait says
        so, and the thread stops there)."""
        try:
            return self._rebuild()
        except NvmlFault:
            return False

    def _rebuild(self) -> bool:
        """A GPU of the set is lost and every wait fails: use a new set holding the GPUs that
        still register (the others are tried again later). False, the old set kept, when no
        set can be made or no GPU registers."""
        event_set = read(calls.event_set_create)
        if event_set is None:
            return False
        kept: list[str] = []
        left: dict[int, tuple[object, str]] = {}
        for key, (handle, uuid) in self._handles.items():
            if self._register(handle, uuid, event_set):
                kept.append(uuid)
            else:
                left[key] = (handle, uuid)
        if not kept:
            quietly(calls.event_set_free, event_set)
            return False
        quietly(calls.event_set_free, self.event_set)
        self.event_set = event_set
        self._left_out = left
        self._retry_at = self._monotonic() + _XID_RETRY_SECONDS
        log.warning(
            "a GPU was lost: XID events of %s watched on a new event set; %s tried again "
            "every %.0f s", ", ".join(kept),
            ", ".join(uuid for _, uuid in left.values()) or "none", _XID_RETRY_SECONDS,
        )
        return True

    def _retry_left_out(self) -> None:
        """Register again, when their time has come, the GPUs a rebuild left out."""
        if not self._left_out or self._monotonic() < self._retry_at:
            return
        self._retry_at = self._monotonic() + _XID_RETRY_SECONDS
        for key, (handle, uuid) in list(self._left_out.items()):
            if self._register(handle, uuid, self.event_set, quiet=True):
                del self._left_out[key]
                log.info("GPU %s answers again: watching it for XID events", uuid)

    def set_mig_slices(self, gpu_key: int, slices: dict[int, str]) -> None:
        """A GPU's MIG layout changed: its GPU instance ids and their slices' UUIDs now."""
        with self._maps_lock:
            mapping = {k: v for k, v in self._mig_slices.items() if k[0] != gpu_key}
            mapping.update({(gpu_key, gi): uuid for gi, uuid in slices.items()})
            self._mig_slices = mapping  # one assignment: the event thread sees either map whole

    def add_gpu(self, handle: object, uuid: str, slices: dict[int, str]) -> None:
        """Watch a GPU identified after the set was made (``slices``: its GPU instance ids
        and their slices' UUIDs). Its events count from its registration, which the event
        thread makes before its next wait (within ``wait_timeout_ms``)."""
        key = handle_key(handle)
        self.set_mig_slices(key, slices)
        with self._maps_lock:
            self._pending.append((handle, uuid))

    def _register_pending(self) -> None:
        """Register the GPUs :meth:`add_gpu` queued (event thread only). A GPU that cannot
        register (NOT_SUPPORTED, lost, failing) is logged and skipped, as at start; a dead
        driver raises :class:`NvmlFault` like the wait does."""
        with self._maps_lock:
            pending, self._pending = self._pending, []
        for handle, uuid in pending:
            if not self._register(handle, uuid, self.event_set):
                continue
            self._handles[handle_key(handle)] = (handle, uuid)
            with self._maps_lock:
                self._gpus = {**self._gpus, handle_key(handle): uuid}
            log.info("GPU %s identified late: watching it for XID events", uuid)

    def _count(self, handle: object, xid: int, gpu_instance_id: int) -> None:
        key = handle_key(handle)
        uuid = self._mig_slices.get((key, gpu_instance_id)) or self._gpus.get(key)
        if uuid is None:
            # A handle we did not enumerate (should not happen): ask NVML who it is.
            try:
                uuid = read(calls.uuid, handle)
            except NvmlFault:
                uuid = None
        if uuid is None:
            self._log.event(xid, None)
            return
        self._counts.add(uuid, xid)
        self._log.event(xid, uuid)


class XidLog:
    """Logs XID events one by one up to ``_XID_LOG_BURST`` per ``_XID_LOG_WINDOW_SECONDS``;
    the rest of a window are summed up in one line when it ends, so an XID storm (thousands
    of events a second) neither floods the log nor costs the event thread more than
    counting them does. The counts themselves (``gpu_xid_errors_total``) are never limited.
    Used by the event thread only."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._window_start: float | None = None
        self._logged = 0
        self._suppressed: dict[tuple[str, int], int] = {}  # (uuid or "", xid) -> events

    def event(self, xid: int, uuid: str | None) -> None:
        self.flush()
        if self._window_start is None:
            self._window_start = self._monotonic()
        if self._logged < _XID_LOG_BURST:
            self._logged += 1
            if uuid is None:
                log.warning("XID %d on an unknown device, not counted", xid)
            else:
                log.warning("XID %d on %s", xid, uuid)
            return
        key = (uuid or "", xid)
        self._suppressed[key] = self._suppressed.get(key, 0) + 1

    def flush(self, *, force: bool = False) -> None:
        """End the window once it is over (or now, with ``force``), logging the summary of
        the events it did not log one by one."""
        start = self._window_start
        if start is None:
            return
        elapsed = self._monotonic() - start
        if not force and elapsed < _XID_LOG_WINDOW_SECONDS:
            return
        if self._suppressed:
            detail = ", ".join(
                f"XID {xid} on {uuid or 'an unknown device'}: {n}"
                for (uuid, xid), n in sorted(self._suppressed.items())
            )
            log.warning(
                "%d more XID events in %.0f s, not logged one by one (%s)",
                sum(self._suppressed.values()), elapsed, detail,
            )
        self._window_start = None
        self._logged = 0
        self._suppressed = {}
