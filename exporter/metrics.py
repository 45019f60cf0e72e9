"""Every Prometheus metric gpuscope exposes, declared once as data.

Collectors build their metric families from this table (kube-state-metrics style), and
``tests/exporter/test_metrics.py`` checks ``docs/metrics.md`` against it, so the docs cannot
drift from the code. Names, types and label sets follow the contract in the design card:
base units, ratios not percents, no ``node``/``hostname`` label (the scrape config adds it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

MetricType = Literal["gauge", "counter"]

DEVICE_LABELS = ("gpu", "uuid")
CONTAINER_LABELS = ("namespace", "pod", "container", "uuid")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: its exposition name (counters include ``_total``), type, help text,
    unit (for the docs), label names in exposition order, and where the value comes from.

    ``optional_labels``: ``(label, condition)`` pairs for labels a series carries only under
    a condition (a flag), after ``labels`` in exposition order; ``condition`` is how
    ``docs/metrics.md`` names it (`` `cluster` only with --cluster-name``)."""

    name: str
    type: MetricType
    help: str
    unit: str
    labels: tuple[str, ...]
    source: str
    optional_labels: tuple[tuple[str, str], ...] = ()


_SPECS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "gpu_info", "gauge",
        "Identity of a GPU or MIG slice; always 1.", "1",
        ("gpu", "uuid", "model", "driver_version", "pci_bus_id", "parent_uuid", "mig_profile"),
        "nvmlDeviceGetName, nvmlDeviceGetUUID, nvmlDeviceGetPciInfo, "
        "nvmlSystemGetDriverVersion, nvmlDeviceGetMigDeviceHandleByIndex",
    ),
    MetricSpec(
        "gpu_up", "gauge",
        "1 when the device answers NVML, 0 when it is lost or failing.", "1",
        DEVICE_LABELS, "any device call; NVML_ERROR_GPU_IS_LOST or an unexpected error gives 0",
    ),
    MetricSpec(
        "gpu_utilization_ratio", "gauge",
        "Fraction of the last sample period in which a kernel ran on the GPU (0..1).", "ratio",
        DEVICE_LABELS, "nvmlDeviceGetUtilizationRates().gpu / 100",
    ),
    MetricSpec(
        "gpu_memory_utilization_ratio", "gauge",
        "Fraction of the last sample period in which device memory was read or written (0..1).",
        "ratio", DEVICE_LABELS, "nvmlDeviceGetUtilizationRates().memory / 100",
    ),
    MetricSpec(
        "gpu_memory_used_bytes", "gauge",
        "Device memory in use.", "bytes", DEVICE_LABELS,
        "nvmlDeviceGetMemoryInfo_v2().used (v1 nvmlDeviceGetMemoryInfo().used where the "
        "driver or pynvml lacks v2, or the device answers it NOT_SUPPORTED)",
    ),
    MetricSpec(
        "gpu_memory_total_bytes", "gauge",
        "Device memory installed (or assigned to the MIG slice).", "bytes", DEVICE_LABELS,
        "nvmlDeviceGetMemoryInfo_v2().total (v1's where v2 is not answered; the same number)",
    ),
    MetricSpec(
        "gpu_temperature_celsius", "gauge",
        "GPU core temperature.", "celsius", DEVICE_LABELS,
        "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
    ),
    MetricSpec(
        "gpu_power_watts", "gauge",
        "Power draw of the board.", "watts", DEVICE_LABELS, "nvmlDeviceGetPowerUsage / 1000",
    ),
    MetricSpec(
        "gpu_power_limit_watts", "gauge",
        "Enforced power limit of the board.", "watts", DEVICE_LABELS,
        "nvmlDeviceGetEnforcedPowerLimit / 1000",
    ),
    MetricSpec(
        "gpu_energy_joules_total", "counter",
        "Energy consumed since the driver was loaded.", "joules", DEVICE_LABELS,
        "nvmlDeviceGetTotalEnergyConsumption / 1000",
    ),
    MetricSpec(
        "gpu_sm_clock_hertz", "gauge",
        "Current SM clock.", "hertz", DEVICE_LABELS, "nvmlDeviceGetClockInfo(NVML_CLOCK_SM) * 1e6",
    ),
    MetricSpec(
        "gpu_memory_clock_hertz", "gauge",
        "Current memory clock.", "hertz", DEVICE_LABELS,
        "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM) * 1e6",
    ),
    MetricSpec(
        "gpu_xid_errors_total", "counter",
        "XID critical error events seen since the exporter started, per XID code.", "events",
        ("gpu", "uuid", "xid"),
        "nvmlEventSetWait on an event set registered for nvmlEventTypeXidCriticalError",
    ),
    MetricSpec(
        "gpu_xid_last_seen_timestamp_seconds", "gauge",
        "Wall-clock time the exporter received the last XID event of this code since it "
        "started: unlike the counter, it tells a new event from an old count after an "
        "exporter restart or a scrape gap.", "seconds",
        ("gpu", "uuid", "xid"),
        "nvmlEventSetWait (the exporter's clock when the event arrived)",
    ),
    MetricSpec(
        "gpu_ecc_corrected_errors_total", "counter",
        "Corrected (single-bit) ECC errors since the driver was loaded.", "errors",
        DEVICE_LABELS,
        "nvmlDeviceGetTotalEccErrors(NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC)",
    ),
    MetricSpec(
        "gpu_ecc_uncorrected_errors_total", "counter",
        "Uncorrected (double-bit) ECC errors since the driver was loaded.", "errors",
        DEVICE_LABELS,
        "nvmlDeviceGetTotalEccErrors(NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)",
    ),
    MetricSpec(
        "gpu_remapped_rows", "gauge",
        "Memory rows the GPU has remapped to spare rows, by the kind of error that retired "
        "them (cause: correctable, uncorrectable); a count the GPU keeps in its InfoROM for "
        "its whole life, not since the exporter started. Ampere and newer.", "rows",
        ("gpu", "uuid", "cause"),
        "nvmlDeviceGetRemappedRows: corrRows (cause=correctable), uncRows "
        "(cause=uncorrectable)",
    ),
    MetricSpec(
        "gpu_row_remap_pending", "gauge",
        "1 when a row remap waits for a GPU reset (the row is not remapped until then), "
        "else 0. Ampere and newer.", "1", DEVICE_LABELS,
        "nvmlDeviceGetRemappedRows: isPending",
    ),
    MetricSpec(
        "gpu_row_remap_failed", "gauge",
        "1 when a row remap failed (no spare row was left: the GPU should be replaced), "
        "else 0. Ampere and newer.", "1", DEVICE_LABELS,
        "nvmlDeviceGetRemappedRows: failureOccurred",
    ),
    MetricSpec(
        "gpu_busy_seconds_total", "counter",
        "Seconds in which a kernel ran on the GPU, integrated from the driver's utilization "
        "samples; rate() is the exact mean utilization over any window.", "seconds",
        DEVICE_LABELS,
        "nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES) / 100 integrated over the sample "
        "timestamps (per-device cursor); where the driver keeps no samples, "
        "nvmlDeviceGetUtilizationRates().gpu / 100 x the sampling interval",
    ),
    MetricSpec(
        "gpu_sm_active_seconds_total", "counter",
        "SM activity (fraction of SMs busy) integrated over time; rate() is the mean SM "
        "activity (about DCGM's SM_ACTIVE). GPM: Hopper and newer.", "seconds", DEVICE_LABELS,
        "nvmlGpmMetricsGet NVML_GPM_METRIC_SM_UTIL / 100 x elapsed (nvmlGpmSampleGet, "
        "nvmlGpmMigSampleGet for a MIG slice)",
    ),
    MetricSpec(
        "gpu_tensor_active_seconds_total", "counter",
        "Tensor-core activity integrated over time; rate() is the mean (about DCGM's "
        "PIPE_TENSOR_ACTIVE). GPM: Hopper and newer.", "seconds", DEVICE_LABELS,
        "nvmlGpmMetricsGet NVML_GPM_METRIC_ANY_TENSOR_UTIL / 100 x elapsed",
    ),
    MetricSpec(
        "gpu_dram_active_seconds_total", "counter",
        "Device-memory bandwidth use (fraction of the peak) integrated over time; rate() is "
        "the mean (about DCGM's DRAM_ACTIVE). GPM: Hopper and newer.", "seconds",
        DEVICE_LABELS, "nvmlGpmMetricsGet NVML_GPM_METRIC_DRAM_BW_UTIL / 100 x elapsed",
    ),
    MetricSpec(
        "gpu_graphics_active_seconds_total", "counter",
        "Graphics/compute engine activity integrated over time; rate() is the mean (about "
        "DCGM's GR_ENGINE_ACTIVE). GPM: Hopper and newer.", "seconds", DEVICE_LABELS,
        "nvmlGpmMetricsGet NVML_GPM_METRIC_GRAPHICS_UTIL / 100 x elapsed",
    ),
    MetricSpec(
        "gpu_sm_occupancy_ratio", "gauge",
        "Resident warps against the SMs' maximum, mean over the last GPM interval (0..1). "
        "GPM: Hopper and newer.", "ratio", DEVICE_LABELS,
        "nvmlGpmMetricsGet NVML_GPM_METRIC_SM_OCCUPANCY / 100",
    ),
    MetricSpec(
        "gpu_pcie_receive_bytes_total", "counter",
        "Bytes received over PCIe (host or peer to this GPU). GPM: Hopper and newer.", "bytes",
        DEVICE_LABELS, "nvmlGpmMetricsGet NVML_GPM_METRIC_PCIE_RX_PER_SEC x 1048576 x elapsed",
    ),
    MetricSpec(
        "gpu_pcie_transmit_bytes_total", "counter",
        "Bytes sent over PCIe by this GPU. GPM: Hopper and newer.", "bytes", DEVICE_LABELS,
        "nvmlGpmMetricsGet NVML_GPM_METRIC_PCIE_TX_PER_SEC x 1048576 x elapsed",
    ),
    MetricSpec(
        "gpu_nvlink_receive_bytes_total", "counter",
        "Bytes received over all NVLinks. GPM: Hopper and newer.", "bytes", DEVICE_LABELS,
        "nvmlGpmMetricsGet NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC x 1048576 x elapsed",
    ),
    MetricSpec(
        "gpu_nvlink_transmit_bytes_total", "counter",
        "Bytes sent over all NVLinks. GPM: Hopper and newer.", "bytes", DEVICE_LABELS,
        "nvmlGpmMetricsGet NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC x 1048576 x elapsed",
    ),
    MetricSpec(
        "gpu_throttle_seconds_total", "counter",
        "Seconds the GPU's clocks were held down since the exporter first read it, per "
        "reason: power, thermal, sync_boost, board_limit, low_utilization, reliability, "
        "app_clocks (any of those), base_clocks (below base clocks); sw_thermal, hw_thermal, "
        "hw_power_brake where the driver gives them.", "seconds", ("gpu", "uuid", "reason"),
        "nvmlDeviceGetFieldValues NVML_FI_DEV_PERF_POLICY_* (74-81) and "
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_*_SLOWDOWN (269-271), ns; else "
        "nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_*).violationTime",
    ),
    MetricSpec(
        "gpu_process_utilization_ratio", "gauge",
        "Mean SM utilization of one process over the last sampling interval (0..1). "
        "Opt-in (--process-metrics): one series per process.", "ratio",
        ("gpu", "uuid", "pid"), "nvmlDeviceGetProcessUtilization().smUtil / 100, averaged",
    ),
    MetricSpec(
        "gpu_process_memory_used_bytes", "gauge",
        "Device memory used by one process. Opt-in (--process-metrics).", "bytes",
        ("gpu", "uuid", "pid"),
        "nvmlDeviceGetComputeRunningProcesses_v3 / nvmlDeviceGetGraphicsRunningProcesses_v3 / "
        "nvmlDeviceGetMPSComputeRunningProcesses_v3 (a PID in several lists counted once)",
    ),
    MetricSpec(
        "gpu_sharing_info", "gauge",
        "How the device's compute is shared between containers (sharing): mig (a GPU in MIG "
        "mode, and its slices), mps (an MPS server or MPS clients run on it), time-sliced "
        "(the kubelet hands out time-slicing replicas GPU-<uuid>::<n>, or the device to "
        "several containers), else exclusive. "
        "Always 1.", "1", ("gpu", "uuid", "sharing"),
        "nvmlDeviceGetMigMode; the MPS server and clients among the device's processes "
        "(nvmlDeviceGetMPSComputeRunningProcesses_v3, /proc/<pid>/comm); kubelet "
        "PodResources v1 List() and GetAllocatableResources() device IDs",
    ),
    MetricSpec(
        "gpu_sharing_replicas", "gauge",
        "For a device the kubelet hands out as replicas <id>::<n> (time-sliced or MPS: "
        "NVIDIA's device plugin with sharing.timeSlicing or sharing.mps), how many replicas "
        "it advertises; under MPS each client's default active-thread percentage is 100 / "
        "this. Where the kubelet does not answer GetAllocatableResources() or does not list "
        "the device there, the highest replica number allocated + 1: a lower bound. Absent "
        "for a device not handed out as replicas.", "replicas", DEVICE_LABELS,
        "kubelet PodResources v1 GetAllocatableResources(): the device's <id>::<n> IDs "
        "counted; else List(): the highest <n> allocated + 1",
    ),
    MetricSpec(
        "gpu_mps_server_memory_used_bytes", "gauge",
        "Device memory held by the MPS server (nvidia-cuda-mps-server): MPS infrastructure, "
        "in no container's memory and not a host process's. Absent where no MPS server "
        "runs.", "bytes", DEVICE_LABELS,
        "nvmlDeviceGetComputeRunningProcesses_v3 of the server's PID (by /proc/<pid>/comm "
        "and cmdline, else: a compute process absent from "
        "nvmlDeviceGetMPSComputeRunningProcesses_v3 beside MPS clients)",
    ),
    MetricSpec(
        "gpu_mps_client_utilization_reported", "gauge",
        "On a device running MPS: 1 when NVML gives per-process utilization samples for the "
        "MPS clients (their containers get their own utilization), 0 when it gives the MPS "
        "server's samples only, which carry every client's work (the clients' containers get "
        "memory and no utilization: unknown). Absent until a sample showed which, and where "
        "no MPS runs.", "1", DEVICE_LABELS,
        "nvmlDeviceGetProcessUtilization: which PIDs have samples, the MPS clients' "
        "(nvmlDeviceGetMPSComputeRunningProcesses_v3) or only others",
    ),
    MetricSpec(
        "container_gpu_allocated", "gauge",
        "1 when the kubelet allocated this device (GPU, MIG slice, or time-slicing replicas "
        "of a GPU) to the container.", "1", CONTAINER_LABELS,
        "kubelet PodResources v1 List(), device IDs resolved to NVML UUIDs",
    ),
    MetricSpec(
        "container_gpu_utilization_ratio", "gauge",
        "Sum of the container's processes' SM utilization on the device over the sampling "
        "interval (0..1); 0 for an allocated device the container does not use; absent "
        "where a process's share is unknown (an MPS client, when NVML gives the MPS server's "
        "samples only).", "ratio",
        CONTAINER_LABELS,
        "nvmlDeviceGetProcessUtilization per PID, PID to container via /proc/<pid>/cgroup",
    ),
    MetricSpec(
        "container_gpu_memory_used_bytes", "gauge",
        "Device memory used by the container's processes on the device.", "bytes",
        CONTAINER_LABELS,
        "nvmlDeviceGetComputeRunningProcesses_v3 / GraphicsRunningProcesses_v3 / "
        "MPSComputeRunningProcesses_v3 per PID (a process in several lists counted once)",
    ),
    MetricSpec(
        "gpu_pod_info", "gauge",
        "A pod that holds a GPU or runs a process on one; workload is <Kind>/<name> of its "
        "top owner. Always 1.", "1", ("namespace", "pod", "uid", "workload"),
        "API server: pods on this node (list + watch), ownerReferences and job labels",
    ),
    MetricSpec(
        "gpu_node_info", "gauge",
        "This node's instance type, zone and capacity type (on-demand or spot), and the "
        "node's name as the exporter knows it (node_name; not node, which the scrape adds). "
        "With --cluster-name also its cluster (cluster); the only series that carries it. "
        "Always 1.",
        "1", ("instance_type", "zone", "capacity_type", "node_name"),
        "API server: this node's labels; --instance-type as a fallback; node_name: "
        "--node-name, else $NODE_NAME, else the simulated scenario's node, else the hostname; "
        "cluster: --cluster-name",
        optional_labels=(("cluster", "--cluster-name"),),
    ),
    MetricSpec(
        "gpu_exporter_attribution_unresolved_devices", "gauge",
        "Allocated device IDs that matched no device NVML reports (last round).", "devices",
        (), "kubelet PodResources v1 List() against NVML UUIDs",
    ),
    MetricSpec(
        "gpu_exporter_attribution_unnamed_processes", "gauge",
        "GPU processes whose pod the exporter cannot name: in a pod the API server has not "
        "named (yet), or whose /proc entry it could not read (exited after NVML listed it, "
        "or hidden by hidepid); counted as host processes, and the containers allocated their "
        "GPU with no process of their own get no usage values (last round).", "processes",
        (), "/proc/<pid>/cgroup and the API server",
    ),
    MetricSpec(
        "gpu_exporter_nvml_up", "gauge",
        "1 when the GPU source (NVML, or the simulated source) is initialised and answering.",
        "1", (), "nvmlInit; retried with backoff while the library or driver is missing",
    ),
    MetricSpec(
        "gpu_exporter_last_sample_timestamp_seconds", "gauge",
        "Wall-clock time the last sampling round finished.", "seconds", (), "exporter clock",
    ),
    MetricSpec(
        "gpu_exporter_collector_success", "gauge",
        "1 when the collector's last run succeeded, 0 when it failed.", "1", ("collector",),
        "exporter",
    ),
    MetricSpec(
        "gpu_exporter_collector_duration_seconds", "gauge",
        "How long the collector's last run took.", "seconds", ("collector",), "exporter",
    ),
    MetricSpec(
        "gpu_exporter_collector_errors_total", "counter",
        "Failures of the collector since the exporter started: sampling rounds in which it "
        "failed (nvml_devices, nvml_processes, xid, simulated, attribution), kubelet List() "
        "and GetAllocatableResources() calls, API-server requests, unreadable /proc files.",
        "errors", ("collector",), "exporter",
    ),
    MetricSpec(
        "gpu_exporter_sampling_interval_seconds", "gauge",
        "Configured sampling interval (--interval).", "seconds", (), "exporter",
    ),
    MetricSpec(
        "gpu_exporter_sampling_rounds_total", "counter",
        "Sampling rounds completed since the exporter started.", "rounds", (), "exporter",
    ),
    MetricSpec(
        "gpu_exporter_missed_rounds_total", "counter",
        "Sampling rounds skipped because a round overran the interval.", "rounds", (),
        "exporter",
    ),
    MetricSpec(
        "gpu_exporter_render_errors_total", "counter",
        "Scrapes of /metrics in which rendering a collector's metrics failed (a bug): its "
        "families were left out of that answer, the others served: gpu, container, "
        "cloudwatch.",
        "errors", ("collector",), "exporter",
    ),
    MetricSpec(
        "gpu_exporter_http_connections_closed_total", "counter",
        "Connections to /metrics, /healthz, /readyz the exporter closed to protect itself "
        "(on --listen and --probe-listen together): evicted (the one idle the longest, for a "
        "new one at --max-connections), refused (a new one at --max-connections, none idle), "
        "timeout (a request's line and headers not in within 10 s of its first byte, a TLS "
        "handshake not done within 10 s, a response not sent within 30 s), too_large "
        "(request line and headers over 64 KiB). Connections idle for 300 s are not counted.",
        "connections", ("reason",), "exporter HTTP server",
    ),
    MetricSpec(
        "gpu_exporter_series_dropped_total", "counter",
        "Label sets left out of /metrics by a cardinality cap, summed over sampling rounds: "
        "gpu_process (--max-process-series), container_gpu (--max-container-series).",
        "series", ("family",), "exporter",
    ),
    MetricSpec(
        "gpu_exporter_cloudwatch_datums_sent_total", "counter",
        "Datums CloudWatch accepted (PutMetricData). Only with --cloudwatch.", "datums", (),
        "CloudWatch sink",
    ),
    MetricSpec(
        "gpu_exporter_cloudwatch_requests_total", "counter",
        "PutMetricData calls made, successful or not (each may include botocore's own "
        "retries). Only with --cloudwatch.", "requests", (), "CloudWatch sink",
    ),
    MetricSpec(
        "gpu_exporter_cloudwatch_request_failures_total", "counter",
        "PutMetricData calls that failed after botocore's retries (throttling, 5xx, network, "
        "credentials, or a rejected request). Only with --cloudwatch.", "requests", (),
        "CloudWatch sink",
    ),
    MetricSpec(
        "gpu_exporter_cloudwatch_datums_dropped_total", "counter",
        "Datums given up on: buffer_full (oldest data beyond --cloudwatch-buffer during an "
        "outage), rejected (CloudWatch refused the request's content), shutdown (not sent "
        "before the shutdown deadline). Only with --cloudwatch.", "datums", ("reason",),
        "CloudWatch sink",
    ),
    MetricSpec(
        "gpu_exporter_cloudwatch_datums_buffered", "gauge",
        "Datums of closed intervals waiting to be sent. Only with --cloudwatch.", "datums", (),
        "CloudWatch sink",
    ),
    MetricSpec(
        "gpu_exporter_cloudwatch_last_success_timestamp_seconds", "gauge",
        "Wall-clock time of the last PutMetricData call CloudWatch accepted. Only with "
        "--cloudwatch, after the first success.", "seconds", (), "CloudWatch sink",
    ),
)

METRICS: Mapping[str, MetricSpec] = {spec.name: spec for spec in _SPECS}


def family_name(spec: MetricSpec) -> str:
    """The name prometheus_client expects for a family: counters without ``_total``."""
    return spec.name.removesuffix("_total") if spec.type == "counter" else spec.name


Family = GaugeMetricFamily | CounterMetricFamily


def label_names(spec: MetricSpec, optional: Collection[str] = ()) -> tuple[str, ...]:
    """The labels of ``spec``'s series in exposition order: its ``labels``, then those of its
    ``optional_labels`` named in ``optional`` (any other name is a programming error)."""
    known = [label for label, _ in spec.optional_labels]
    unknown = set(optional) - set(known)
    if unknown:
        raise ValueError(f"{spec.name} has no optional label {sorted(unknown)[0]!r}")
    return spec.labels + tuple(label for label in known if label in optional)


#: Each table entry's family name and its labels without optional ones, worked out once:
#: the collectors make some 40 families per ``collect()``, and working these out each time
#: was two thirds of :func:`new_family`'s time (the demo's hour of past makes 344,000).
_PLAIN: Mapping[str, tuple[str, tuple[str, ...]]] = {
    name: (family_name(spec), label_names(spec)) for name, spec in METRICS.items()
}


def new_family(name: str, optional: Collection[str] = ()) -> Family:
    """A fresh, empty metric family for the table entry ``name`` (one per ``collect()``),
    with the optional labels named in ``optional`` after the fixed ones."""
    spec = METRICS[name]
    fname, labels = _PLAIN[name]
    if optional:
        labels = label_names(spec, optional)
    if spec.type == "counter":
        return CounterMetricFamily(fname, spec.help, labels=labels)
    return GaugeMetricFamily(fname, spec.help, labels=labels)
