"""The fleet's devices as units of capacity: the whole GPUs of each node, which GPU each MIG
slice belongs to, and its share of that GPU's compute slices (its share of the GPU's price);
:func:`fleet_of` makes them once a page.

A profile names its compute slices: ``3g.40gb`` is 3 of the GPU's 7 (A100, H100, H200,
B200), 4 (A30, RTX PRO 6000 Blackwell) or 2 (RTX PRO 5000 and 4500 Blackwell); a
compute-instance profile ``1c.3g.40gb`` is 1 of them. A GPU whose slices
add up to more than the model's count is divided by their sum instead, so shares never add
up to more than the whole GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuscope.dashboard.series import GpuInfo, GpuRef

_COMPUTE_INSTANCE = re.compile(r"^(\d+)c\.\d+g\.")
_GPU_INSTANCE = re.compile(r"^(\d+)g\.")


def compute_slices(profile: str) -> int | None:
    """Compute slices of a MIG profile (``3g.40gb`` -> 3, ``1c.3g.40gb`` -> 1,
    ``1g.10gb+me`` -> 1); None for an unknown form."""
    match = _COMPUTE_INSTANCE.match(profile) or _GPU_INSTANCE.match(profile)
    if match is None:
        return None
    n = int(match.group(1))
    return n if n > 0 else None


#: Compute slices of a whole GPU, by a part of its model's name (upper case), where it is
#: not 7 (A100, H100, H200, H20, GH200, B200, GB200): NVIDIA's MIG user guide, "Supported
#: GPUs" ("Max Number of Instances"). In PromQL a space of the name matches any character.
SLICES_BY_MODEL: tuple[tuple[str, int], ...] = (
    ("A30", 4),
    ("RTX PRO 6000", 4),
    ("RTX PRO 5000", 2),
    ("RTX PRO 4500", 2),
)


def slices_per_gpu(model: str) -> int:
    """Compute slices of a whole GPU of this model (:data:`SLICES_BY_MODEL`, else 7)."""
    upper = model.upper()
    return next((n for part, n in SLICES_BY_MODEL if part in upper), 7)


def mig_slices(gpus: Mapping[GpuRef, GpuInfo]) -> dict[GpuRef, list[GpuInfo]]:
    """The slices of every GPU in MIG mode, by the parent GPU's ref."""
    out: dict[GpuRef, list[GpuInfo]] = {}
    for info in gpus.values():
        if not info.is_physical:
            out.setdefault(GpuRef(info.node, info.parent_uuid), []).append(info)
    return out


def slice_shares(gpus: Mapping[GpuRef, GpuInfo],
                 slices_of: Mapping[GpuRef, list[GpuInfo]] | None = None
                 ) -> dict[GpuRef, float]:
    """Each MIG slice's share of its GPU (0..1); a slice of an unknown profile gets an even
    share of what the known ones leave. ``slices_of``: :func:`mig_slices` of ``gpus``, when
    the caller has it."""
    out: dict[GpuRef, float] = {}
    for parent, slices in (mig_slices(gpus) if slices_of is None else slices_of).items():
        parent_info = gpus.get(parent)
        model = parent_info.model if parent_info is not None else slices[0].model
        counts = {s.ref: compute_slices(s.mig_profile) for s in slices}
        known = sum(n for n in counts.values() if n is not None)
        total = max(slices_per_gpu(model), known)
        unknown = [ref for ref, n in counts.items() if n is None]
        rest = max(0.0, 1.0 - known / total)
        for ref, n in counts.items():
            out[ref] = n / total if n is not None else rest / len(unknown)
    return out


def physical_gpus(gpus: Mapping[GpuRef, GpuInfo]) -> dict[str, list[GpuInfo]]:
    """Whole GPUs (not MIG slices) per node."""
    by_node: dict[str, list[GpuInfo]] = {}
    for info in gpus.values():
        if info.is_physical:
            by_node.setdefault(info.node, []).append(info)
    return by_node


@dataclass(frozen=True, slots=True)
class Fleet:
    """What the fleet's inventory says, made once per page (each is a pass over every
    device: 35,000 on a 5,000-node fleet): the whole GPUs per node, the slices of each GPU
    in MIG mode, each slice's share of its GPU; and how many whole GPUs each node has of
    which ``by_node`` lists only some (``FleetData.partial_nodes``: the others are busy)."""

    by_node: Mapping[str, list[GpuInfo]]
    slices: Mapping[GpuRef, list[GpuInfo]]
    shares: Mapping[GpuRef, float]
    whole: Mapping[str, int] = field(default_factory=dict)

    def gpus_on(self, node: str) -> int:
        """Whole GPUs on ``node``, those not listed included."""
        return self.whole.get(node) or len(self.by_node.get(node, ()))

    def unlisted(self) -> int:
        """The whole GPUs of the nodes in ``whole`` that ``by_node`` does not list (busy)."""
        return sum(max(0, n - len(self.by_node.get(node, ()))) for node, n in self.whole.items())


def fleet_of(gpus: Mapping[GpuRef, GpuInfo], whole: Mapping[str, int] | None = None) -> Fleet:
    """:class:`Fleet` of ``gpus``; ``whole``: the GPUs of the nodes ``gpus`` lists some
    of (``FleetData.partial_nodes``)."""
    slices = mig_slices(gpus)
    return Fleet(physical_gpus(gpus), slices, slice_shares(gpus, slices), dict(whole or {}))


#: The largest compute-slice count a profile's name is read for in PromQL (no label value
#: is read as a number there: each count is matched by name).
MAX_PROMQL_SLICES = 8
_SLICES_BY = "node, uuid, parent_uuid"
_INFO = 'gpu_info{parent_uuid!=""'


def compute_slices_promql() -> str:
    """:func:`compute_slices` of every MIG slice of a known profile as PromQL (``gpu_info``'s
    ``mig_profile``), by ``node, uuid, parent_uuid``: recorded
    (``uuid:gpu_mig_compute_slices:count``) for :func:`slice_share_promql`."""
    def named(n: int) -> str:
        return (f'(max by ({_SLICES_BY}) ({_INFO}, mig_profile=~"{n}c\\\\.[0-9]+g\\\\..*"}})'
                f' or max by ({_SLICES_BY}) ({_INFO}, mig_profile=~"{n}g\\\\..*"}}))'
                f" * 0 + {n}")
    return " or ".join(named(n) for n in range(1, MAX_PROMQL_SLICES + 1))


def slice_share_promql(known: str) -> str:
    """Each MIG slice's share of its GPU (:func:`slice_shares`) as PromQL, by ``node,
    uuid``, from ``known`` (:func:`compute_slices_promql`'s answer, by ``node, uuid,
    parent_uuid``) and ``gpu_info``'s ``model``: its compute slices over the model's count
    (:func:`slices_per_gpu`) or the GPU's slices' sum where more; a slice of an unknown
    profile an even share of what the known ones leave."""
    on = "on (node, parent_uuid)"
    every = f"max by ({_SLICES_BY}) ({_INFO}}})"
    unknown = f"({every} unless on (node, uuid) {known})"
    # One matcher per count (no model's name holds parts of two counts).
    parts: dict[int, list[str]] = {}
    for part, n in SLICES_BY_MODEL:
        parts.setdefault(n, []).append(part.replace(" ", "."))
    counts = "".join(
        f'(max by (node, parent_uuid) ({_INFO}, model=~"(?i).*({"|".join(names)}).*"}})'
        f" * 0 + {n}) or {on} "
        for n, names in parts.items())
    model = f"({counts}(count by (node, parent_uuid) ({every}) * 0 + 7))"
    summed = f"(sum by (node, parent_uuid) ({known}) or {on} ({model} * 0))"
    total = f"(clamp_min({summed} - {on} {model}, 0) + {on} {model})"
    rest = (f"(clamp_min(1 - {summed} / {on} {total}, 0)"
            f" / {on} count by (node, parent_uuid) ({unknown}))")
    return (f"max by (node, uuid) (({known} / {on} group_left () {total})"
            f" or on (node, uuid) ({unknown} * 0 + {on} group_left () {rest}))")
