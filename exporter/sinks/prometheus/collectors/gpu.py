"""Device-level series (``gpu_*``) rendered from the latest snapshot."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuscope.exporter.cardinality import ProcessKeys, ProcessSeriesCap
from gpuscope.exporter.metrics import Family, new_family
from gpuscope.exporter.model import DeviceSample, Snapshot

# (metric name, DeviceSample attribute) for the plain per-device values. A None attribute
# (NVML NOT_SUPPORTED, or the device is down) means the series is left out, never 0.
_DEVICE_VALUES: tuple[tuple[str, str], ...] = (
    ("gpu_utilization_ratio", "utilization_ratio"),
    ("gpu_memory_utilization_ratio", "memory_utilization_ratio"),
    ("gpu_memory_used_bytes", "memory_used_bytes"),
    ("gpu_memory_total_bytes", "memory_total_bytes"),
    ("gpu_temperature_celsius", "temperature_celsius"),
    ("gpu_power_watts", "power_watts"),
    ("gpu_power_limit_watts", "power_limit_watts"),
    ("gpu_energy_joules_total", "energy_joules"),
    ("gpu_sm_clock_hertz", "sm_clock_hertz"),
    ("gpu_memory_clock_hertz", "memory_clock_hertz"),
    ("gpu_ecc_corrected_errors_total", "ecc_corrected_errors"),
    ("gpu_ecc_uncorrected_errors_total", "ecc_uncorrected_errors"),
    ("gpu_busy_seconds_total", "busy_seconds"),
    ("gpu_sm_active_seconds_total", "sm_active_seconds"),
    ("gpu_tensor_active_seconds_total", "tensor_active_seconds"),
    ("gpu_dram_active_seconds_total", "dram_active_seconds"),
    ("gpu_graphics_active_seconds_total", "graphics_active_seconds"),
    ("gpu_sm_occupancy_ratio", "sm_occupancy_ratio"),
    ("gpu_pcie_receive_bytes_total", "pcie_receive_bytes"),
    ("gpu_pcie_transmit_bytes_total", "pcie_transmit_bytes"),
    ("gpu_nvlink_receive_bytes_total", "nvlink_receive_bytes"),
    ("gpu_nvlink_transmit_bytes_total", "nvlink_transmit_bytes"),
)


class GpuCollector(Collector):
    """Renders ``gpu_info``, ``gpu_up``, the device values, row remapping, throttle and XID
    counters, MPS (the server's memory, whether clients' utilization is reported) and
    (opt-in) per-process series from ``latest()``; before the first sample it yields
    nothing.

    ``process_cap`` (``--max-process-series``) picks which processes get series when a
    round has more than the cap; without one every process does."""

    def __init__(
        self, latest: Callable[[], Snapshot | None], *, process_metrics: bool = False,
        process_cap: ProcessSeriesCap | None = None,
    ) -> None:
        self._latest = latest
        self._process_metrics = process_metrics
        self._process_cap = process_cap

    def collect(self) -> Iterator[Metric]:
        snap = self._latest()
        if snap is None:
            return
        info = new_family("gpu_info")
        up = new_family("gpu_up")
        values = {name: new_family(name) for name, _ in _DEVICE_VALUES}
        remapped = new_family("gpu_remapped_rows")
        remap_pending = new_family("gpu_row_remap_pending")
        remap_failed = new_family("gpu_row_remap_failed")
        throttle = new_family("gpu_throttle_seconds_total")
        xid = new_family("gpu_xid_errors_total")
        xid_last = new_family("gpu_xid_last_seen_timestamp_seconds")
        mps_server = new_family("gpu_mps_server_memory_used_bytes")
        mps_reported = new_family("gpu_mps_client_utilization_reported")
        proc_util = new_family("gpu_process_utilization_ratio")
        proc_mem = new_family("gpu_process_memory_used_bytes")
        driver = snap.driver_version or ""
        kept: ProcessKeys | None = None
        if self._process_metrics and self._process_cap is not None:
            kept = self._process_cap.kept(snap)
        for dev in snap.devices:
            ids = [dev.index, dev.uuid]
            info.add_metric(
                [*ids, dev.model, driver, dev.pci_bus_id, dev.parent_uuid or "",
                 dev.mig_profile or ""],
                1.0,
            )
            up.add_metric(ids, 1.0 if dev.up else 0.0)
            for name, attr in _DEVICE_VALUES:
                value = getattr(dev, attr)
                if value is not None:
                    values[name].add_metric(ids, float(value))
            remap = dev.row_remapping
            if remap is not None:  # None: no row remapper (pre-Ampere, a MIG slice), or down
                remapped.add_metric([*ids, "correctable"], float(remap.correctable_rows))
                remapped.add_metric([*ids, "uncorrectable"], float(remap.uncorrectable_rows))
                remap_pending.add_metric(ids, 1.0 if remap.pending else 0.0)
                remap_failed.add_metric(ids, 1.0 if remap.failed else 0.0)
            for t in dev.throttle_seconds:
                throttle.add_metric([*ids, t.reason], t.seconds)
            for x in dev.xid_errors:
                xid.add_metric([*ids, str(x.xid)], float(x.count))
                if x.last_seen is not None:
                    xid_last.add_metric([*ids, str(x.xid)], x.last_seen)
            if dev.runs_mps:
                _add_mps(dev, ids, mps_server, mps_reported)
            if self._process_metrics:
                _add_processes(dev, ids, proc_util, proc_mem, kept)
        yield info
        yield up
        yield from values.values()
        yield remapped
        yield remap_pending
        yield remap_failed
        yield throttle
        yield xid
        yield xid_last
        # Only on MPS nodes: no HELP/TYPE lines for families that are always empty elsewhere.
        if mps_server.samples:
            yield mps_server
        if mps_reported.samples:
            yield mps_reported
        if self._process_metrics:
            yield proc_util
            yield proc_mem


def _add_mps(dev: DeviceSample, ids: list[str], server: Family, reported: Family) -> None:
    servers = [p for p in dev.processes if p.mps == "server"]
    if servers:
        memory = [p.memory_used_bytes for p in servers if p.memory_used_bytes is not None]
        if memory:
            server.add_metric(ids, float(sum(memory)))
    if dev.mps_client_utilization_reported is not None:
        reported.add_metric(ids, 1.0 if dev.mps_client_utilization_reported else 0.0)


def _add_processes(
    dev: DeviceSample, ids: list[str], util: Family, mem: Family, kept: ProcessKeys | None
) -> None:
    for proc in dev.processes:
        if kept is not None and (dev.uuid, proc.pid) not in kept:
            continue
        labels = [*ids, str(proc.pid)]
        if proc.sm_utilization_ratio is not None:
            util.add_metric(labels, proc.sm_utilization_ratio)
        if proc.memory_used_bytes is not None:
            mem.add_metric(labels, float(proc.memory_used_bytes))
