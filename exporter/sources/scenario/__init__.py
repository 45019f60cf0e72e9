"""Scenario files for the simulated GPU source: loading, strict validation, typed model.

A scenario describes one simulated node: the node itself, its GPUs (and MIG slices), the
processes that run on them with a utilization *pattern* (and an *activity*: what that
utilization is made of) each, GPM and throttling of the GPUs, the Kubernetes pods and
containers that hold the GPUs, and faults (lost GPUs, XID events, ECC errors, row remaps
pending or failed, NVML going away). The
format is documented in ``docs/scenarios.md``; this package is its reference implementation:
``model`` (the dataclasses), ``patterns``, ``parse`` (the strict validator), ``load`` (YAML
files and the built-in scenario), ``synthetic`` (programmatic scenarios for benchmarks).

Everything is validated up front: an unknown key, a wrong type, a value out of range or a
reference to something that does not exist raises :class:`ScenarioError` whose message is
one line naming the file and the key path, e.g.
``scenario.yaml: gpus[2].memory_total: expected a size like '80GiB', got 'lots'``.

Units in the resulting dataclasses are base units: bytes, seconds (of *scenario time*, which
starts at 0 when the simulated source starts), watts, degrees celsius, hertz, ratios 0..1.
"""

from gpuscope.exporter.sources.scenario.load import (
    DEFAULT_SCENARIO_NAME,
    load_default_scenario,
    load_scenario,
    scenario_from_yaml,
)
from gpuscope.exporter.sources.scenario.model import (
    DEVICE_FIELDS,
    ActivitySpec,
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
    RemappedRows,
    RowRemapFault,
    Scenario,
    ScenarioError,
    Window,
    XidFault,
)
from gpuscope.exporter.sources.scenario.parse import (
    derived_seed,
    derived_uuid,
    guess_architecture,
    scenario_from_dict,
)
from gpuscope.exporter.sources.scenario.patterns import (
    BurstyPattern,
    ConstantPattern,
    RandomPattern,
    SinePattern,
    SteppedPattern,
    UtilizationPattern,
)
from gpuscope.exporter.sources.scenario.synthetic import synthetic_document, synthetic_scenario

__all__ = [
    "DEFAULT_SCENARIO_NAME",
    "DEVICE_FIELDS",
    "ActivitySpec",
    "BurstyPattern",
    "ConstantPattern",
    "ContainerRef",
    "ContainerSpec",
    "DeviceRef",
    "EccFault",
    "Fault",
    "GpuSpec",
    "Lifetime",
    "LostFault",
    "MigSliceSpec",
    "NodeSpec",
    "NotSupportedFault",
    "NvmlDownFault",
    "PodSpec",
    "ProcessSpec",
    "RandomPattern",
    "RemappedRows",
    "RowRemapFault",
    "Scenario",
    "ScenarioError",
    "SinePattern",
    "SteppedPattern",
    "UtilizationPattern",
    "Window",
    "XidFault",
    "derived_seed",
    "derived_uuid",
    "guess_architecture",
    "load_default_scenario",
    "load_scenario",
    "scenario_from_dict",
    "scenario_from_yaml",
    "synthetic_document",
    "synthetic_scenario",
]
