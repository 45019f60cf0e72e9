"""The strict scenario validator: the mapping YAML gives becomes a :class:`Scenario`, or a
:class:`ScenarioError` whose message is one line naming the file and the key path."""

from __future__ import annotations

import difflib
import functools
import hashlib
import math
import re
import uuid as uuid_module
from collections.abc import Callable, Mapping
from typing import NoReturn, TypeVar

from gpuscope.exporter.model import THROTTLE_REASONS, MpsRole, ProcessKind
from gpuscope.exporter.sources.scenario.model import (
    DEVICE_FIELDS,
    SCENARIO_VERSION,
    ActivitySpec,
    CapacityType,
    ContainerRef,
    ContainerSpec,
    DeviceRef,
    EccFault,
    Fault,
    GpuSpec,
    Lifetime,
    LostFault,
    MigSliceSpec,
    NodeSpec,
    NotSupportedFault,
    NvmlDownFault,
    PodSpec,
    ProcessSpec,
    QosClass,
    RemappedRows,
    RowRemapFault,
    Scenario,
    ScenarioError,
    Window,
    XidFault,
    one_line,
)
from gpuscope.exporter.sources.scenario.patterns import (
    BurstyPattern,
    ConstantPattern,
    RandomPattern,
    SinePattern,
    SteppedPattern,
    UtilizationPattern,
)


def scenario_from_dict(data: object, source: str = "<scenario>") -> Scenario:
    """Validate an already-parsed scenario (the mapping YAML would give)."""
    return _Parser(source).scenario(data)


T = TypeVar("T")

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtp]i?b|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
}
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_FREQ_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(hz|khz|mhz|ghz)\s*$", re.IGNORECASE)
_FREQ_UNITS = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}
_POWER_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*w\s*$", re.IGNORECASE)
_PERCENT_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$")
_PROFILE_RE = re.compile(r"^([1-9][0-9]{0,3})g\.([1-9][0-9]{0,5})gb(?:\+[a-z0-9]+)?\Z")
_GPU_UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_MIG_UUID_RE = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_UID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_CONTAINER_ID_RE = re.compile(r"^[0-9a-f]{64}\Z")
_PCI_RE = re.compile(r"^[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]\Z")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?\Z")
_WORKLOAD_RE = re.compile(r"^[A-Za-z][A-Za-z0-9]*/[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?\Z")
_PLAIN_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_DEVREF_RE = re.compile(r"^([0-9]{1,9})(?:/([0-9]{1,9})|::([0-9]{1,9}))?\Z")
# Bounds on numbers, so that every scenario the loader accepts can be played and exported:
# NVML's counters and sizes are unsigned 64-bit; a scenario lasts at most _MAX_DURATION
# seconds (~31 years) at a resolution of at most 1 ms (the smallest unit of the format), so
# no pattern, lifetime, window or XID arithmetic leaves the finite floats.
_MAX_UINT64 = 2**64 - 1
_MAX_UINT32 = 2**32 - 1  # NVML's unsigned int: remapped rows, errors of one ECC event
_MAX_DURATION = 1e9
_MIN_POSITIVE_DURATION = 0.001
_MAX_GPUS = 1024
_CAPACITY_TYPES: tuple[CapacityType, ...] = ("on-demand", "spot")
_QOS: tuple[QosClass, ...] = ("guaranteed", "burstable", "besteffort")
_KINDS: tuple[ProcessKind, ...] = ("compute", "graphics")
_MPS_ROLES: tuple[MpsRole, ...] = ("server", "client")

# Model name fragment -> the architecture name NVML/nvidia-smi report (exporter/sources/nvml/ uses
# the same spelling), so simulated data carries the CloudWatch ``arch`` a real node would.
_ARCHITECTURES = (
    ("B200", "Blackwell"), ("GB200", "Blackwell"), ("H100", "Hopper"), ("H200", "Hopper"),
    ("H800", "Hopper"), ("GH200", "Hopper"), ("L40", "Ada Lovelace"), ("L4", "Ada Lovelace"),
    ("RTX 40", "Ada Lovelace"), ("A100", "Ampere"), ("A800", "Ampere"), ("A10", "Ampere"),
    ("A30", "Ampere"), ("A40", "Ampere"), ("A16", "Ampere"), ("RTX A", "Ampere"),
    ("T4", "Turing"), ("V100", "Volta"), ("P100", "Pascal"), ("K80", "Kepler"),
)

# GPUs whose NVML has GPM (Hopper and newer): their scenario entries default to ``gpm: true``.
_GPM_ARCHITECTURES = ("Hopper", "Blackwell")
# GPUs whose NVML has a row remapper (nvmlDeviceGetRemappedRows: Ampere and newer): their
# entries report one (no row remapped) unless they say otherwise.
_ROW_REMAP_ARCHITECTURES = ("Ampere", "Ada Lovelace", "Hopper", "Blackwell")
_DEFAULT_ACTIVITY = ActivitySpec()

# Defaults of a GPU entry: an A100-SXM4-80GB (power in W, temperature in C).
_DEFAULT_GPU: dict[str, object] = {
    "model": "NVIDIA A100-SXM4-80GB",
    "memory_total": 80 * 2**30,
    "memory_reserved": 0,
    "power_limit": 400.0,
    "power_idle": 60.0,
    "temperature_idle": 32.0,
    "temperature_busy": 72.0,
    "sm_clock_idle": 210e6,
    "sm_clock_busy": 1410e6,
    "memory_clock": 1593e6,
    "memory_utilization_factor": 0.5,
}


def derived_uuid(seed: int, *parts: object) -> str:
    """A UUID-formatted string that depends only on the seed and ``parts``."""
    digest = hashlib.sha256("/".join(["gpuscope", str(seed), *map(str, parts)]).encode())
    return str(uuid_module.UUID(bytes=digest.digest()[:16], version=4))


def derived_seed(seed: int, *parts: object) -> int:
    """A 31-bit integer seed that depends only on the node seed and ``parts``."""
    digest = hashlib.sha256("/".join(["seed", str(seed), *map(str, parts)]).encode())
    return int.from_bytes(digest.digest()[:4], "big") & 0x7FFFFFFF


def guess_architecture(model: str) -> str | None:
    """The architecture name NVML would report for a model name, when it is a known one."""
    for needle, arch in _ARCHITECTURES:
        if needle in model:
            return arch
    return None


def _size_text(n: int) -> str:
    """Bytes as a human-readable size for messages: '80GiB', '39.75GiB', '512MiB'."""
    if n > _MAX_UINT64:
        return "more than 16EiB"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.4g}{unit}" if n % scale else f"{n // scale}{unit}"
    return f"{n} bytes"


def _show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, int) and value.bit_length() > 64:
        return "a huge integer" if value > 0 else "a huge negative integer"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Parser:
    """Turns the loaded YAML into the dataclasses, raising one-line ScenarioErrors."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.seed = 0

    # -- error and primitive helpers -----------------------------------------------------
    def fail(self, path: str, message: str) -> NoReturn:
        where = f"{path}: " if path else ""
        raise ScenarioError(one_line(f"{self.source}: {where}{message}"))

    def mapping(
        self,
        value: object,
        path: str,
        allowed: tuple[str, ...],
        required: tuple[str, ...] = (),
    ) -> dict[str, object]:
        if not isinstance(value, dict):
            self.fail(path, f"expected a mapping, got {_show(value)}")
        for key in value:
            if not isinstance(key, str):
                self.fail(path, f"keys must be strings, got {_show(key)}")
            if key not in allowed:
                hint = difflib.get_close_matches(key[:100], allowed, n=1)
                suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
                # A key that is not a plain word (empty, spaces, a megabyte) is quoted.
                name = key if _PLAIN_KEY_RE.fullmatch(key) else _show(key)
                sub = f"{path}.{name}" if path else name
                self.fail(
                    sub, f"unknown key{suggestion} (expected one of: {', '.join(allowed)})"
                )
        for key in required:
            if key not in value:
                self.fail(path, f"missing required key '{key}'")
        return value

    def seq(self, value: object, path: str) -> list[object]:
        if not isinstance(value, list):
            self.fail(path, f"expected a list, got {_show(value)}")
        return value

    def string(self, value: object, path: str, *, empty: bool = False) -> str:
        if not isinstance(value, str):
            self.fail(path, f"expected a string, got {_show(value)}")
        if not empty and not value.strip():
            self.fail(path, "must not be empty")
        return value

    def integer(
        self, value: object, path: str, minimum: int | None = None,
        maximum: int = _MAX_UINT64,
    ) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"expected an integer, got {_show(value)}")
        if minimum is not None and value < minimum:
            self.fail(path, f"must be >= {minimum}, got {_show(value)}")
        if value > maximum:
            self.fail(path, f"must be <= {maximum}, got {_show(value)}")
        return value

    def boolean(self, value: object, path: str) -> bool:
        if not isinstance(value, bool):
            self.fail(path, f"expected true or false, got {_show(value)}")
        return value

    def number(
        self,
        value: object,
        path: str,
        minimum: float | None = None,
        maximum: float | None = None,
        what: str = "a number",
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(path, f"expected {what}, got {_show(value)}")
        try:
            result = float(value)
        except OverflowError:
            result = math.inf
        if not math.isfinite(result):
            self.fail(path, f"expected a finite number, got {_show(value)}")
        if minimum is not None and result < minimum:
            self.fail(path, f"must be >= {minimum:g}, got {result:g}")
        if maximum is not None and result > maximum:
            self.fail(path, f"must be <= {maximum:g}, got {result:g}")
        return result

    def ratio(self, value: object, path: str) -> float:
        """A ratio 0..1, or a percentage string like ``'93%'``."""
        if isinstance(value, str):
            m = _PERCENT_RE.match(value)
            if not m:
                self.fail(path, f"expected a ratio 0..1 or a percentage like '90%', "
                                f"got {_show(value)}")
            value = float(m.group(1)) / 100.0
        return self.number(value, path, 0.0, 1.0, "a ratio 0..1")

    def size(self, value: object, path: str) -> int:
        """Bytes: an integer, or a string like ``'80GiB'``, ``'40GB'``, ``'512MiB'``."""
        size: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                self.fail(path, f"must be >= 0, got {_show(value)}")
            size = value
        elif isinstance(value, str):
            m = _SIZE_RE.match(value)
            if m:
                unit = (m.group(2) or "b").lower()
                number = float(m.group(1)) * _SIZE_UNITS[unit]
                size = round(number) if math.isfinite(number) else _MAX_UINT64 + 1
        if size is None:
            self.fail(path, f"expected a size like '80GiB', got {_show(value)}")
        if size > _MAX_UINT64:
            self.fail(path, f"must be less than 16EiB (2^64 bytes), got {_show(value)}")
        return size

    def duration(self, value: object, path: str, *, positive: bool = False) -> float:
        """Seconds: a number, or a string like ``'90s'``, ``'5m'``, ``'1h30m'``."""
        seconds: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                seconds = float(value)
            except OverflowError:
                seconds = math.inf
        elif isinstance(value, str):
            text = value.replace(" ", "")
            parts = _DURATION_PART_RE.findall(text)
            if parts and "".join(n + u for n, u in parts) == text:
                seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
        if seconds is None or not math.isfinite(seconds):
            self.fail(path, f"expected seconds or a duration like '90s', '5m', '1h30m', "
                            f"got {_show(value)}")
        if seconds < 0 or (positive and seconds == 0):
            self.fail(path, f"must be {'> 0' if positive else '>= 0'} seconds, "
                            f"got {_show(value)}")
        if positive and seconds < _MIN_POSITIVE_DURATION:
            self.fail(path, f"must be at least 1ms, got {_show(value)}")
        if seconds > _MAX_DURATION:
            self.fail(path, f"must be at most {_MAX_DURATION:g} seconds, got {_show(value)}")
        return seconds

    def frequency(self, value: object, path: str) -> float:
        """Hertz, from a string like ``'1410MHz'`` (a bare number is ambiguous: rejected)."""
        if isinstance(value, str):
            m = _FREQ_RE.match(value)
            if m:
                hertz = float(m.group(1)) * _FREQ_UNITS[m.group(2).lower()]
                if math.isfinite(hertz):
                    return hertz
        self.fail(path, f"expected a frequency like '1410MHz', got {_show(value)}")

    def watts(self, value: object, path: str) -> float:
        """Watts: a number or a string like ``'400W'``."""
        if isinstance(value, str):
            m = _POWER_RE.match(value)
            if not m:
                self.fail(path, f"expected watts like 400 or '400W', got {_show(value)}")
            value = float(m.group(1))
        return self.number(value, path, 0.0, what="watts like 400 or '400W'")

    def choice(self, value: object, path: str, options: tuple[T, ...]) -> T:
        for option in options:
            if value == option:
                return option
        self.fail(path, f"expected one of {', '.join(map(str, options))}, got {_show(value)}")

    def fields(self, value: object, path: str) -> frozenset[str]:
        items = self.seq(value, path)
        result: set[str] = set()
        for i, item in enumerate(items):
            name = self.string(item, f"{path}[{i}]")
            if name not in DEVICE_FIELDS:
                hint = difflib.get_close_matches(name, DEVICE_FIELDS, n=1)
                suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
                self.fail(f"{path}[{i}]", f"unknown field {name!r}{suggestion} "
                                          f"(expected one of: {', '.join(DEVICE_FIELDS)})")
            result.add(name)
        return frozenset(result)

    def devref(self, value: object, path: str) -> DeviceRef:
        if isinstance(value, int) and not isinstance(value, bool):
            text = str(value)
        elif isinstance(value, str):
            text = value.strip()
        else:
            text = ""
        m = _DEVREF_RE.match(text)
        if not m:
            self.fail(path, f"expected a device like 0, '0/1' (MIG slice) or '0::1' "
                            f"(time-slicing replica), got {_show(value)}")
        gi = int(m.group(2)) if m.group(2) is not None else None
        replica = int(m.group(3)) if m.group(3) is not None else None
        return DeviceRef(int(m.group(1)), gi, replica)

    # -- sections --------------------------------------------------------------------------
    def scenario(self, data: object) -> Scenario:
        if data is None:
            self.fail("", "empty scenario; expected a mapping with at least 'gpus'")
        top = self.mapping(
            data, "", ("version", "description", "node", "gpus", "processes", "pods", "faults"),
            ("gpus",),
        )
        if "version" in top:
            version = self.integer(top["version"], "version")
            if version != SCENARIO_VERSION:
                self.fail("version", f"unsupported scenario version {_show(version)} "
                                     f"(this gpuscope reads version {SCENARIO_VERSION})")
        description = self.string(top.get("description", ""), "description", empty=True)
        node = self.node(top.get("node", {}))
        self.seed = node.seed
        gpus = self.gpus(top["gpus"])
        pods = self.pods(top.get("pods", []), gpus)
        processes = self.processes(top.get("processes", []), gpus, pods)
        faults = self.faults(top.get("faults", []), gpus)
        return Scenario(node, gpus, processes, pods, faults, description, self.source)

    def node(self, value: object) -> NodeSpec:
        path = "node"
        m = self.mapping(
            value, path,
            ("name", "instance_type", "zone", "capacity_type", "driver_version", "seed"),
        )

        def optional(key: str) -> str | None:
            raw = m.get(key)
            return None if raw is None else self.string(raw, f"{path}.{key}")

        return NodeSpec(
            name=self.string(m.get("name", "gpuscope-sim"), f"{path}.name"),
            instance_type=optional("instance_type"),
            zone=optional("zone"),
            capacity_type=self.choice(
                m.get("capacity_type", "on-demand"), f"{path}.capacity_type", _CAPACITY_TYPES
            ),
            driver_version=self.version_string(m.get("driver_version", "550.90.07"),
                                               f"{path}.driver_version"),
            seed=self.integer(m.get("seed", 0), f"{path}.seed", 0),
        )

    def version_string(self, value: object, path: str) -> str:
        if isinstance(value, int | float) and not isinstance(value, bool):
            self.fail(path, f"expected a string (quote it, e.g. '550.90.07'), got {_show(value)}")
        return self.string(value, path)

    def idle_busy(self, value: object, path: str, conv: Callable[[object, str], float],
                  defaults: tuple[object, object] | None) -> tuple[float, float]:
        m = self.mapping(value, path, ("idle", "busy"), () if defaults else ("idle", "busy"))
        d_idle, d_busy = defaults if defaults else (None, None)
        idle = conv(m.get("idle", d_idle), f"{path}.idle")
        busy = conv(m.get("busy", d_busy), f"{path}.busy")
        return idle, busy

    _GPU_KEYS = (
        "count", "model", "architecture", "uuid", "pci_bus_id", "memory_total",
        "memory_reserved", "power_limit", "power_idle", "temperature", "sm_clock",
        "memory_clock", "fan_speed", "memory_utilization_factor", "base_utilization", "ecc",
        "remapped_rows", "unsupported", "mig", "gpm", "throttle", "mps_client_utilization",
    )

    def gpus(self, value: object) -> tuple[GpuSpec, ...]:
        result: list[GpuSpec] = []
        uuids: dict[str, str] = {}
        for i, entry in enumerate(self.seq(value, "gpus")):
            path = f"gpus[{i}]"
            m = self.mapping(entry, path, self._GPU_KEYS)
            count = self.integer(m.get("count", 1), f"{path}.count", 1)
            if len(result) + count > _MAX_GPUS:
                self.fail(f"{path}.count", f"a scenario has at most {_MAX_GPUS} GPUs, this "
                                           f"entry brings it to {len(result) + count}")
            for key in ("uuid", "pci_bus_id"):
                if count > 1 and key in m:
                    self.fail(f"{path}.{key}", f"cannot be set on an entry with count {count} "
                                               "(each GPU needs its own)")
            for _ in range(count):
                gpu = self.gpu(m, path, len(result))
                for dev_uuid in (gpu.uuid, *(s.uuid for s in gpu.mig)):
                    if dev_uuid in uuids:
                        self.fail(path, f"uuid {dev_uuid} is already used by {uuids[dev_uuid]}")
                    uuids[dev_uuid] = f"gpu {gpu.index}"
                result.append(gpu)
        return tuple(result)

    def gpu(self, m: dict[str, object], path: str, index: int) -> GpuSpec:
        d = _DEFAULT_GPU
        model = self.string(m.get("model", d["model"]), f"{path}.model")
        arch_raw = m.get("architecture")
        architecture = (
            guess_architecture(model) if arch_raw is None
            else self.string(arch_raw, f"{path}.architecture")
        )
        if "uuid" in m:
            gpu_uuid = self.string(m["uuid"], f"{path}.uuid")
            if not _GPU_UUID_RE.match(gpu_uuid):
                self.fail(f"{path}.uuid", f"expected 'GPU-' and a lowercase UUID, "
                                          f"got {_show(gpu_uuid)}")
        else:
            gpu_uuid = "GPU-" + derived_uuid(self.seed, "gpu", index)
        if "pci_bus_id" in m:
            pci = self.string(m["pci_bus_id"], f"{path}.pci_bus_id")
            if not _PCI_RE.match(pci):
                self.fail(f"{path}.pci_bus_id", f"expected a PCI address like "
                                                f"'00000000:10:1C.0', got {_show(pci)}")
        else:
            pci = f"{index // 240:08X}:{0x10 + index % 240:02X}:00.0"
        total = self.size(m.get("memory_total", d["memory_total"]), f"{path}.memory_total")
        if total == 0:
            self.fail(f"{path}.memory_total", "must be > 0")
        reserved = self.size(m.get("memory_reserved", d["memory_reserved"]),
                             f"{path}.memory_reserved")
        if reserved > total:
            self.fail(f"{path}.memory_reserved", "must not exceed memory_total")
        limit = self.watts(m.get("power_limit", d["power_limit"]), f"{path}.power_limit")
        if limit == 0:
            self.fail(f"{path}.power_limit", "must be > 0 watts")
        idle_power = self.watts(m.get("power_idle", d["power_idle"]), f"{path}.power_idle")
        if idle_power > limit:
            self.fail(f"{path}.power_idle",
                      f"must not exceed power_limit ({limit:g} W), got {idle_power:g}")

        def celsius(v: object, p: str) -> float:
            return self.number(v, p, -40.0, 130.0, "degrees celsius")

        t_idle, t_busy = self.idle_busy(
            m.get("temperature", {}), f"{path}.temperature", celsius,
            (d["temperature_idle"], d["temperature_busy"]),
        )
        sm_idle, sm_busy = self.idle_busy(
            m.get("sm_clock", {}), f"{path}.sm_clock", self.frequency,
            (f"{d['sm_clock_idle']}Hz", f"{d['sm_clock_busy']}Hz"),
        )
        mem_clock = self.frequency(m.get("memory_clock", f"{d['memory_clock']}Hz"),
                                   f"{path}.memory_clock")
        fan_idle: float | None = None
        fan_busy: float | None = None
        if m.get("fan_speed") is not None:
            fan_idle, fan_busy = self.idle_busy(m["fan_speed"], f"{path}.fan_speed",
                                                self.ratio, None)
        mem_factor = self.number(
            m.get("memory_utilization_factor", d["memory_utilization_factor"]),
            f"{path}.memory_utilization_factor", 0.0, 10.0,
        )
        base = self.ratio(m.get("base_utilization", 0.0), f"{path}.base_utilization")
        ecc = self.mapping(m.get("ecc", {}), f"{path}.ecc", ("corrected", "uncorrected"))
        unsupported = self.fields(m.get("unsupported", []), f"{path}.unsupported")
        mig: tuple[MigSliceSpec, ...] = ()
        if m.get("mig") is not None:
            mig = self.mig(m["mig"], f"{path}.mig", index, model, total - reserved)
        gpm = architecture in _GPM_ARCHITECTURES
        if m.get("gpm") is not None:
            gpm = self.boolean(m["gpm"], f"{path}.gpm")
        throttle = self.throttle(m.get("throttle", {}), f"{path}.throttle", index)
        remapped = self.remapped_rows(m.get("remapped_rows"), f"{path}.remapped_rows",
                                      architecture, unsupported)
        mps_clients = self.boolean(m.get("mps_client_utilization", False),
                                   f"{path}.mps_client_utilization")
        return GpuSpec(
            index=index,
            uuid=gpu_uuid,
            model=model,
            architecture=architecture,
            pci_bus_id=pci,
            memory_total_bytes=total,
            memory_reserved_bytes=reserved,
            power_limit_watts=limit,
            power_idle_watts=idle_power,
            temperature_idle_celsius=t_idle,
            temperature_busy_celsius=t_busy,
            sm_clock_idle_hertz=sm_idle,
            sm_clock_busy_hertz=sm_busy,
            memory_clock_hertz=mem_clock,
            fan_idle_ratio=fan_idle,
            fan_busy_ratio=fan_busy,
            memory_utilization_factor=mem_factor,
            base_utilization=base,
            ecc_corrected_errors=self.integer(ecc.get("corrected", 0), f"{path}.ecc.corrected",
                                              0),
            ecc_uncorrected_errors=self.integer(ecc.get("uncorrected", 0),
                                                f"{path}.ecc.uncorrected", 0),
            unsupported=unsupported,
            mig=mig,
            gpm=gpm,
            throttle=throttle,
            remapped_rows=remapped,
            mps_client_utilization=mps_clients,
        )

    def remapped_rows(
        self, value: object, path: str, architecture: str | None, unsupported: frozenset[str]
    ) -> RemappedRows | None:
        """``{correctable, uncorrectable}``: the GPU has a row remapper with these rows
        remapped. Left out: one with none remapped on Ampere and newer, none before; with
        ``row_remapping`` in ``unsupported``, none at all."""
        if "row_remapping" in unsupported:
            if value is not None:
                self.fail(path, "cannot be set on a GPU whose 'unsupported' lists "
                                "row_remapping")
            return None
        if value is None:
            return RemappedRows() if architecture in _ROW_REMAP_ARCHITECTURES else None
        m = self.mapping(value, path, ("correctable", "uncorrectable"))
        return RemappedRows(
            self.integer(m.get("correctable", 0), f"{path}.correctable", 0, _MAX_UINT32),
            self.integer(m.get("uncorrectable", 0), f"{path}.uncorrectable", 0, _MAX_UINT32),
        )

    def throttle(
        self, value: object, path: str, gpu_index: int
    ) -> tuple[tuple[str, UtilizationPattern], ...]:
        """``{reason: ratio or pattern}``: seconds of throttling per second of scenario time."""
        m = self.mapping(value, path, THROTTLE_REASONS)
        result: list[tuple[str, UtilizationPattern]] = []
        for reason in THROTTLE_REASONS:
            if m.get(reason) is not None:
                seed = functools.partial(derived_seed, self.seed, "throttle", gpu_index, reason)
                result.append((reason, self.pattern(m[reason], f"{path}.{reason}", seed)))
        return tuple(result)

    _ACTIVITY_RATIOS = ("sm", "tensor", "dram", "graphics", "occupancy", "power")
    _ACTIVITY_RATES = ("pcie_rx", "pcie_tx", "nvlink_rx", "nvlink_tx")

    def activity(self, value: object, path: str) -> ActivitySpec:
        """Per unit of the process's utilization: activity ratios, traffic (a size per
        second at utilization 1, e.g. '2GiB'), share of the busy power."""
        m = self.mapping(value, path, (*self._ACTIVITY_RATIOS, *self._ACTIVITY_RATES))
        defaults = ActivitySpec()
        kwargs: dict[str, float] = {}
        for key in self._ACTIVITY_RATIOS:
            if m.get(key) is not None:
                kwargs[key] = self.ratio(m[key], f"{path}.{key}")
        for key in self._ACTIVITY_RATES:
            if m.get(key) is not None:
                kwargs[key] = float(self.size(m[key], f"{path}.{key}"))
        return ActivitySpec(
            sm=kwargs.get("sm", defaults.sm),
            tensor=kwargs.get("tensor", defaults.tensor),
            dram=kwargs.get("dram", defaults.dram),
            graphics=kwargs.get("graphics", defaults.graphics),
            occupancy=kwargs.get("occupancy", defaults.occupancy),
            pcie_rx=kwargs.get("pcie_rx", defaults.pcie_rx),
            pcie_tx=kwargs.get("pcie_tx", defaults.pcie_tx),
            nvlink_rx=kwargs.get("nvlink_rx", defaults.nvlink_rx),
            nvlink_tx=kwargs.get("nvlink_tx", defaults.nvlink_tx),
            power=kwargs.get("power", defaults.power),
        )

    def mig(
        self, value: object, path: str, gpu_index: int, model: str, available: int
    ) -> tuple[MigSliceSpec, ...]:
        slices: list[MigSliceSpec] = []
        items = self.seq(value, path)
        if not items:
            self.fail(path, "must list at least one slice (leave 'mig' out for a GPU "
                            "without MIG mode)")
        seen: set[int] = set()
        used = 0
        for i, entry in enumerate(items):
            p = f"{path}[{i}]"
            m = self.mapping(
                entry, p,
                ("profile", "gpu_instance_id", "memory", "utilization_supported", "uuid",
                 "unsupported"),
                ("profile", "gpu_instance_id"),
            )
            profile = self.string(m["profile"], f"{p}.profile")
            pm = _PROFILE_RE.match(profile)
            if not pm:
                self.fail(f"{p}.profile", f"expected a MIG profile like '3g.40gb', "
                                          f"got {_show(profile)}")
            gi = self.integer(m["gpu_instance_id"], f"{p}.gpu_instance_id", 0)
            if gi in seen:
                self.fail(f"{p}.gpu_instance_id", f"gpu_instance_id {gi} is used twice")
            seen.add(gi)
            memory = (
                self.size(m["memory"], f"{p}.memory") if "memory" in m
                else int(pm.group(2)) * 2**30
            )
            used += memory
            if used > available:
                self.fail(f"{p}.memory", f"the slices' memory adds up to {_size_text(used)}, "
                                         f"more than the GPU's memory_total minus "
                                         f"memory_reserved ({_size_text(available)})")
            if "uuid" in m:
                mig_uuid = self.string(m["uuid"], f"{p}.uuid")
                if not _MIG_UUID_RE.match(mig_uuid):
                    self.fail(f"{p}.uuid", f"expected 'MIG-' and a lowercase UUID, "
                                           f"got {_show(mig_uuid)}")
            else:
                mig_uuid = "MIG-" + derived_uuid(self.seed, "mig", gpu_index, gi)
            slices.append(MigSliceSpec(
                gpu_instance_id=gi,
                profile=profile,
                index=f"{gpu_index}/{gi}",
                uuid=mig_uuid,
                memory_total_bytes=memory,
                compute_slices=int(pm.group(1)),
                utilization_supported=self.boolean(
                    m.get("utilization_supported", False), f"{p}.utilization_supported"
                ),
                unsupported=self.fields(m.get("unsupported", []), f"{p}.unsupported"),
            ))
        slices.sort(key=lambda s: s.gpu_instance_id)
        return tuple(slices)

    def existing_device(
        self, ref: DeviceRef, path: str, gpus: tuple[GpuSpec, ...], *, allocation: bool
    ) -> None:
        """Check that ``ref`` names a device that exists and fits its use."""
        if ref.gpu >= len(gpus):
            self.fail(path, f"no GPU {ref.gpu} (the scenario has {len(gpus)} GPUs, "
                            f"0..{len(gpus) - 1})")
        gpu = gpus[ref.gpu]
        if ref.gpu_instance_id is not None:
            if not gpu.mig_enabled:
                self.fail(path, f"GPU {ref.gpu} is not in MIG mode (it has no 'mig' slices)")
            if gpu.slice(ref.gpu_instance_id) is None:
                ids = ", ".join(str(s.gpu_instance_id) for s in gpu.mig)
                self.fail(path, f"GPU {ref.gpu} has no MIG slice with gpu_instance_id "
                                f"{ref.gpu_instance_id} (it has {ids})")
        elif gpu.mig_enabled:
            what = "allocate" if allocation else "run processes on"
            self.fail(path, f"GPU {ref.gpu} is in MIG mode; {what} one of its slices, "
                            f"e.g. '{ref.gpu}/{gpu.mig[0].gpu_instance_id}'")
        if ref.replica is not None and not allocation:
            self.fail(path, f"a process runs on a device, not on a time-slicing replica; "
                            f"use {ref.gpu}")

    def pods(self, value: object, gpus: tuple[GpuSpec, ...]) -> tuple[PodSpec, ...]:
        result: list[PodSpec] = []
        names: set[tuple[str, str]] = set()
        uids: set[str] = set()
        container_ids: set[str] = set()
        # device index -> (holder, kind): kind "whole" or the replica numbers in use
        holders: dict[str, tuple[str, str]] = {}
        for i, entry in enumerate(self.seq(value, "pods")):
            path = f"pods[{i}]"
            m = self.mapping(entry, path,
                             ("namespace", "name", "uid", "workload", "qos", "containers"),
                             ("namespace", "name", "containers"))
            ns = self.string(m["namespace"], f"{path}.namespace")
            if not _DNS_LABEL_RE.match(ns):
                self.fail(f"{path}.namespace", f"not a valid namespace name: {_show(ns)}")
            name = self.string(m["name"], f"{path}.name")
            if not _DNS_SUBDOMAIN_RE.match(name):
                self.fail(f"{path}.name", f"not a valid pod name: {_show(name)}")
            if (ns, name) in names:
                self.fail(f"{path}.name", f"pod {ns}/{name} is listed twice")
            names.add((ns, name))
            if "uid" in m:
                uid = self.string(m["uid"], f"{path}.uid")
                if not _UID_RE.match(uid):
                    self.fail(f"{path}.uid", f"expected a lowercase UUID, got {_show(uid)}")
            else:
                uid = derived_uuid(self.seed, "pod", ns, name)
            if uid in uids:
                self.fail(f"{path}.uid", f"uid {uid} is used by another pod")
            uids.add(uid)
            workload = self.string(m.get("workload", ""), f"{path}.workload", empty=True)
            if workload and not _WORKLOAD_RE.match(workload):
                self.fail(f"{path}.workload", f"expected '<Kind>/<name>' like "
                                              f"'PyTorchJob/ddp-run', got {_show(workload)}")
            qos = self.choice(m.get("qos", "guaranteed"), f"{path}.qos", _QOS)
            containers: list[ContainerSpec] = []
            cnames: set[str] = set()
            citems = self.seq(m["containers"], f"{path}.containers")
            if not citems:
                self.fail(f"{path}.containers", "a pod needs at least one container")
            for j, centry in enumerate(citems):
                cpath = f"{path}.containers[{j}]"
                cm = self.mapping(centry, cpath, ("name", "id", "gpus"), ("name",))
                cname = self.string(cm["name"], f"{cpath}.name")
                if not _DNS_LABEL_RE.match(cname):
                    self.fail(f"{cpath}.name", f"not a valid container name: {_show(cname)}")
                if cname in cnames:
                    self.fail(f"{cpath}.name", f"container {cname!r} is listed twice")
                cnames.add(cname)
                if "id" in cm:
                    cid = self.string(cm["id"], f"{cpath}.id")
                    if not _CONTAINER_ID_RE.match(cid):
                        self.fail(f"{cpath}.id", f"expected 64 lowercase hex digits, "
                                                 f"got {_show(cid)}")
                else:
                    cid = hashlib.sha256(
                        f"gpuscope/{self.seed}/container/{ns}/{name}/{cname}".encode()
                    ).hexdigest()
                if cid in container_ids:
                    self.fail(f"{cpath}.id", "container id is used by another container")
                container_ids.add(cid)
                refs: list[DeviceRef] = []
                holder = f"{ns}/{name}/{cname}"
                for k, raw in enumerate(self.seq(cm.get("gpus", []), f"{cpath}.gpus")):
                    rpath = f"{cpath}.gpus[{k}]"
                    ref = self.devref(raw, rpath)
                    self.existing_device(ref, rpath, gpus, allocation=True)
                    if ref in refs:
                        self.fail(rpath, f"device {ref} is listed twice")
                    self.claim(holders, ref, holder, rpath)
                    refs.append(ref)
                containers.append(ContainerSpec(cname, cid, tuple(refs)))
            result.append(PodSpec(ns, name, uid, workload, qos, tuple(containers)))
        return tuple(result)

    def claim(
        self, holders: dict[str, tuple[str, str]], ref: DeviceRef, holder: str, path: str
    ) -> None:
        """A whole device goes to one container; a replica of a time-sliced GPU to one
        container; a GPU is either allocated whole or as replicas."""
        key = ref.device_index
        if ref.replica is None:
            if key in holders:
                self.fail(path, f"device {ref} is already allocated to {holders[key][0]}")
            holders[key] = (holder, "whole")
            return
        rkey = str(ref)
        if key in holders and holders[key][1] == "whole":
            self.fail(path, f"GPU {ref.gpu} is already allocated whole to {holders[key][0]}")
        if rkey in holders:
            self.fail(path, f"replica {ref} is already allocated to {holders[rkey][0]}")
        holders[key] = (holder, "replicas")
        holders[rkey] = (holder, "replica")

    def processes(
        self, value: object, gpus: tuple[GpuSpec, ...], pods: tuple[PodSpec, ...]
    ) -> tuple[ProcessSpec, ...]:
        containers = {
            ContainerRef(p.namespace, p.name, c.name) for p in pods for c in p.containers
        }
        result: list[ProcessSpec] = []
        on_device: set[tuple[int, str]] = set()
        mps_roles: dict[tuple[int, str], int] = {}  # (GPU, "server") -> its pid
        pid_pod: dict[int, ContainerRef | None] = {}
        memory: dict[str, int] = {}
        for i, entry in enumerate(self.seq(value, "processes")):
            path = f"processes[{i}]"
            m = self.mapping(
                entry, path,
                ("pid", "gpu", "kind", "memory", "utilization", "start", "stop", "every",
                 "activity", "pod", "mps"),
                ("pid", "gpu"),
            )
            pid = self.integer(m["pid"], f"{path}.pid", 1)
            ref = self.devref(m["gpu"], f"{path}.gpu")
            self.existing_device(ref, f"{path}.gpu", gpus, allocation=False)
            if (pid, ref.device_index) in on_device:
                self.fail(f"{path}.pid", f"pid {pid} is already listed on device {ref}")
            on_device.add((pid, ref.device_index))
            kinds = self.kinds(m.get("kind", "compute"), f"{path}.kind")
            mem = self.size(m.get("memory", "512MiB"), f"{path}.memory")
            gpu = gpus[ref.gpu]
            if ref.gpu_instance_id is not None:
                sl = gpu.slice(ref.gpu_instance_id)
                assert sl is not None
                capacity = sl.memory_total_bytes
            else:
                capacity = gpu.memory_total_bytes - gpu.memory_reserved_bytes
            memory[ref.device_index] = memory.get(ref.device_index, 0) + mem
            if memory[ref.device_index] > capacity:
                self.fail(f"{path}.memory", f"the processes on device {ref} need "
                                            f"{_size_text(memory[ref.device_index])}, more "
                                            f"than its {_size_text(capacity)}")
            pattern = self.pattern(
                m.get("utilization", 0.0), f"{path}.utilization",
                functools.partial(derived_seed, self.seed, "process", pid, ref.device_index),
            )
            lifetime = self.lifetime(m, path)
            pod: ContainerRef | None = None
            if m.get("pod") is not None:
                text = self.string(m["pod"], f"{path}.pod")
                parts = text.split("/")
                if len(parts) != 3 or not all(parts):
                    self.fail(f"{path}.pod", f"expected 'namespace/pod/container', "
                                             f"got {_show(text)}")
                pod = ContainerRef(*parts)
                if pod not in containers:
                    self.fail(f"{path}.pod", f"no container {pod} in 'pods'")
            if pid in pid_pod and pid_pod[pid] != pod:
                self.fail(f"{path}.pod", f"pid {pid} is listed elsewhere with pod "
                                         f"{pid_pod[pid] or 'none'}; one process lives in one "
                                         "container")
            pid_pod[pid] = pod
            activity = (
                self.activity(m["activity"], f"{path}.activity") if m.get("activity") is not None
                else _DEFAULT_ACTIVITY
            )
            mps: MpsRole | None = None
            if m.get("mps") is not None:
                mps = self.choice(m["mps"], f"{path}.mps", _MPS_ROLES)
                if ref.gpu_instance_id is not None:
                    self.fail(f"{path}.mps", "MPS runs on a whole GPU, not on a MIG slice")
                if "compute" not in kinds:
                    self.fail(f"{path}.mps", "an MPS process is a compute process")
                if mps == "server" and (ref.gpu, "server") in mps_roles:
                    self.fail(f"{path}.mps", f"GPU {ref.gpu} already has an MPS server "
                                             f"(pid {mps_roles[(ref.gpu, 'server')]})")
                if mps == "server":
                    mps_roles[(ref.gpu, "server")] = pid
            result.append(ProcessSpec(pid, ref, kinds, mem, pattern, lifetime, pod, activity,
                                      mps))
        return tuple(result)

    def kinds(self, value: object, path: str) -> tuple[ProcessKind, ...]:
        items = value if isinstance(value, list) else [value]
        if not items:
            self.fail(path, "must name at least one of compute, graphics")
        kinds: list[ProcessKind] = []
        for k, item in enumerate(items):
            p = path if not isinstance(value, list) else f"{path}[{k}]"
            kind = self.choice(item, p, _KINDS)
            if kind in kinds:
                self.fail(p, f"{kind} is listed twice")
            kinds.append(kind)
        return tuple(sorted(kinds, key=_KINDS.index))

    def lifetime(self, m: dict[str, object], path: str) -> Lifetime:
        start = self.duration(m.get("start", 0), f"{path}.start")
        stop: float | None = None
        if m.get("stop") is not None:
            stop = self.duration(m["stop"], f"{path}.stop")
            if stop <= start:
                self.fail(f"{path}.stop", f"must be after start ({start:g} s), got {stop:g}")
        period: float | None = None
        on: float | None = None
        if m.get("every") is not None:
            ep = f"{path}.every"
            em = self.mapping(m["every"], ep, ("period", "on"), ("period", "on"))
            period = self.duration(em["period"], f"{ep}.period", positive=True)
            on = self.duration(em["on"], f"{ep}.on", positive=True)
            if on > period:
                self.fail(f"{ep}.on", f"must not exceed period ({period:g} s), got {on:g}")
        return Lifetime(start, stop, period, on)

    _PATTERN_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
        "constant": (("value",), ("value",)),
        "stepped": (("steps", "repeat"), ("steps",)),
        "bursty": (("low", "high", "period", "duty", "phase"), ("high", "period", "duty")),
        "random": (("low", "high", "interval", "smooth", "seed"), ("low", "high")),
        "sine": (("low", "high", "period", "phase"), ("low", "high", "period")),
    }

    def pattern(
        self, value: object, path: str, default_seed: Callable[[], int]
    ) -> UtilizationPattern:
        if not isinstance(value, dict):
            if isinstance(value, list):
                self.fail(path, "expected a ratio or a mapping with 'pattern', got a list")
            return ConstantPattern(self.ratio(value, path))
        name = value.get("pattern")
        if name is None:
            self.fail(path, f"missing required key 'pattern' (one of: "
                            f"{', '.join(self._PATTERN_KEYS)})")
        kind = self.choice(name, f"{path}.pattern", tuple(self._PATTERN_KEYS))
        allowed, required = self._PATTERN_KEYS[kind]
        m = self.mapping(value, path, ("pattern", *allowed), required)
        if kind == "constant":
            return ConstantPattern(self.ratio(m["value"], f"{path}.value"))
        if kind == "stepped":
            steps_raw = self.seq(m["steps"], f"{path}.steps")
            if not steps_raw:
                self.fail(f"{path}.steps", "needs at least one [t_seconds, value] step")
            steps: list[tuple[float, float]] = []
            for j, step in enumerate(steps_raw):
                sp = f"{path}.steps[{j}]"
                if not isinstance(step, list) or len(step) != 2:
                    self.fail(sp, f"expected [t_seconds, value], got {_show(step)}")
                t = self.duration(step[0], f"{sp}[0]")
                if steps and t <= steps[-1][0]:
                    self.fail(f"{sp}[0]", f"step times must increase; {t:g} s follows "
                                          f"{steps[-1][0]:g} s")
                steps.append((t, self.ratio(step[1], f"{sp}[1]")))
            repeat: float | None = None
            if m.get("repeat") is not None:
                repeat = self.duration(m["repeat"], f"{path}.repeat", positive=True)
                if repeat <= steps[-1][0]:
                    self.fail(f"{path}.repeat", f"must be longer than the last step's time "
                                                f"({steps[-1][0]:g} s), got {repeat:g}")
            return SteppedPattern(tuple(steps), repeat)
        low = self.ratio(m.get("low", 0.0), f"{path}.low")
        high = self.ratio(m.get("high", 1.0), f"{path}.high")
        if low > high:
            self.fail(f"{path}.low", f"must not exceed high ({high:g}), got {low:g}")
        if kind == "bursty":
            return BurstyPattern(
                low, high,
                self.duration(m["period"], f"{path}.period", positive=True),
                self.ratio(m["duty"], f"{path}.duty"),
                self.duration(m.get("phase", 0), f"{path}.phase"),
            )
        if kind == "random":
            seed = (
                self.integer(m["seed"], f"{path}.seed", 0) if m.get("seed") is not None
                else default_seed()
            )
            return RandomPattern(
                low, high,
                self.duration(m.get("interval", 10), f"{path}.interval", positive=True),
                seed,
                self.boolean(m.get("smooth", False), f"{path}.smooth"),
            )
        return SinePattern(
            low, high,
            self.duration(m["period"], f"{path}.period", positive=True),
            self.duration(m.get("phase", 0), f"{path}.phase"),
        )

    _FAULT_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
        "lost": (("gpu", "at", "for", "every"), ("gpu",)),
        "xid": (("gpu", "at", "code", "every", "count"), ("gpu", "code")),
        "ecc": (("gpu", "at", "every", "count", "corrected", "uncorrected"), ("gpu",)),
        "row_remap": (
            ("gpu", "at", "for", "every", "correctable", "uncorrectable", "pending", "failed"),
            ("gpu",),
        ),
        "nvml_down": (("at", "for", "every"), ()),
        "not_supported": (("gpu", "fields", "at", "for", "every"), ("gpu", "fields")),
    }

    def faults(self, value: object, gpus: tuple[GpuSpec, ...]) -> tuple[Fault, ...]:
        result: list[Fault] = []
        for i, entry in enumerate(self.seq(value, "faults")):
            path = f"faults[{i}]"
            if not isinstance(entry, dict):
                self.fail(path, f"expected a mapping, got {_show(entry)}")
            if "type" not in entry:
                self.fail(path, f"missing required key 'type' (one of: "
                                f"{', '.join(self._FAULT_KEYS)})")
            kind = self.choice(entry["type"], f"{path}.type", tuple(self._FAULT_KEYS))
            allowed, required = self._FAULT_KEYS[kind]
            m = self.mapping(entry, path, ("type", *allowed), required)
            if kind == "nvml_down":
                result.append(NvmlDownFault(self.window(m, path)))
                continue
            ref = self.devref(m["gpu"], f"{path}.gpu")
            self.fault_device(ref, f"{path}.gpu", gpus, slices_ok=kind == "not_supported")
            if kind == "not_supported":
                result.append(NotSupportedFault(
                    ref, self.fields(m["fields"], f"{path}.fields"), self.window(m, path)
                ))
                continue
            if kind == "lost":
                result.append(LostFault(ref.gpu, self.window(m, path)))
                continue
            if kind == "row_remap":
                result.append(self.row_remap(m, path, ref.gpu, gpus[ref.gpu]))
                continue
            if kind == "ecc":
                result.append(self.ecc_fault(m, path, ref.gpu))
                continue
            code = self.integer(m["code"], f"{path}.code", 1)
            at, every, count = self.events(m, path)
            result.append(XidFault(ref.gpu, code, at, every, count))
        return tuple(result)

    def events(
        self, m: dict[str, object], path: str
    ) -> tuple[float, float | None, int | None]:
        """``at`` (0), ``every`` (none) and ``count`` (1 without ``every``, unlimited with
        it) of an event fault (``xid``, ``ecc``)."""
        every: float | None = None
        if m.get("every") is not None:
            every = self.duration(m["every"], f"{path}.every", positive=True)
        count: int | None = None
        if m.get("count") is not None:
            count = self.integer(m["count"], f"{path}.count", 1)
        elif every is None:
            count = 1
        return self.duration(m.get("at", 0), f"{path}.at"), every, count

    def ecc_fault(self, m: dict[str, object], path: str, gpu: int) -> EccFault:
        if "corrected" not in m and "uncorrected" not in m:
            self.fail(path, "needs 'uncorrected' or 'corrected': the errors each event adds")
        corrected = self.integer(m.get("corrected", 0), f"{path}.corrected", 0, _MAX_UINT32)
        uncorrected = self.integer(m.get("uncorrected", 0), f"{path}.uncorrected", 0,
                                   _MAX_UINT32)
        if corrected == uncorrected == 0:
            self.fail(path, "adds no error: set 'uncorrected' or 'corrected' to 1 or more")
        at, every, count = self.events(m, path)
        return EccFault(gpu, at, every, count, corrected, uncorrected)

    def row_remap(
        self, m: dict[str, object], path: str, index: int, gpu: GpuSpec
    ) -> RowRemapFault:
        if gpu.remapped_rows is None:
            why = (
                "its 'unsupported' lists row_remapping" if "row_remapping" in gpu.unsupported
                else f"architecture {gpu.architecture or 'unknown'}: NVML has one on Ampere "
                     "and newer; give its entry 'remapped_rows: {}' to add one"
            )
            self.fail(f"{path}.gpu", f"GPU {index} has no row remapper ({why})")
        fault = RowRemapFault(
            index,
            self.window(m, path),
            self.integer(m.get("correctable", 0), f"{path}.correctable", 0, _MAX_UINT32),
            self.integer(m.get("uncorrectable", 0), f"{path}.uncorrectable", 0, _MAX_UINT32),
            self.boolean(m.get("pending", False), f"{path}.pending"),
            self.boolean(m.get("failed", False), f"{path}.failed"),
        )
        if not (fault.correctable or fault.uncorrectable or fault.pending or fault.failed):
            self.fail(path, "changes nothing: set 'pending', 'failed', 'correctable' or "
                            "'uncorrectable'")
        return fault

    def fault_device(
        self, ref: DeviceRef, path: str, gpus: tuple[GpuSpec, ...], *, slices_ok: bool
    ) -> None:
        if ref.replica is not None:
            self.fail(path, f"faults hit a device, not a time-slicing replica; use {ref.gpu}")
        if ref.gpu_instance_id is not None and not slices_ok:
            self.fail(path, f"this fault hits a whole GPU; use {ref.gpu}")
        if ref.gpu >= len(gpus) or ref.gpu_instance_id is not None:
            self.existing_device(ref, path, gpus, allocation=False)

    def window(self, m: dict[str, object], path: str) -> Window:
        at = self.duration(m.get("at", 0), f"{path}.at")
        duration: float | None = None
        if m.get("for") is not None:
            duration = self.duration(m["for"], f"{path}.for", positive=True)
        every: float | None = None
        if m.get("every") is not None:
            every = self.duration(m["every"], f"{path}.every", positive=True)
            if duration is None:
                self.fail(f"{path}.every", "a repeating window needs 'for'")
            if duration >= every:
                self.fail(f"{path}.for", f"must be shorter than every ({every:g} s), "
                                         f"got {duration:g}")
        return Window(at, duration, every)
