"""MPS GPUs whose clients cannot be judged: what the page does not know, and why.

Under CUDA MPS (NVIDIA's device plugin with ``sharing.mps``) NVML lists each client process
with its own memory, but some drivers give per-process utilization samples for the MPS
server's PID alone, which carries every client's work (an H200 with driver 580.159 does:
docs/real-gpu.md). The exporter then serves the clients' containers' memory and no
utilization, unknown rather than 0, and says so: ``gpu_mps_client_utilization_reported 0``.

Without a client's utilization, the verdicts that rest on it cannot judge it: time-slice
starvation (a client's share of the GPU against its active-thread share) and allocated-idle
(it holds a share of a GPU and uses none). They leave such clients out rather than guess;
this section lists the GPUs where that happens now, with the clients on them and their
memory, so that an SRE knows where the page is blind. Where NVML does report each client's
samples (``gpu_mps_client_utilization_reported 1``) the clients are judged like any
container, and nothing is listed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpuscope.dashboard import fmt
from gpuscope.dashboard.data.steps import StepQuery
from gpuscope.dashboard.links import at_node, node_link, pod_link
from gpuscope.dashboard.series import GpuRef, index_key
from gpuscope.dashboard.verdicts.cells import first_step_cell
from gpuscope.dashboard.verdicts.page import (
    Column,
    PageContext,
    Row,
    Section,
    State,
    StepAnswers,
    StepVerdict,
    Table,
    device_ref,
)

#: The devices running an MPS server, at each step.
SERVER = StepQuery("gpu_mps_server_memory_used_bytes", "max", ">=", 0.0)
#: Their replicas as the kubelet advertises them (each client's active-thread share is
#: 1/replicas: NVIDIA's device plugin sets 100/N % per client under ``sharing.mps``).
REPLICAS = StepQuery("gpu_sharing_replicas", "max", ">", 0.0, on=(SERVER,))
#: The steps at which a device ran MPS clients whose utilization NVML does not report.
UNREPORTED = StepQuery("gpu_mps_client_utilization_reported", "max", "<", 1.0)
#: The clients' containers on those devices then, and their memory (bytes).
CLIENTS = StepQuery("container_gpu_memory_used_bytes", "max", ">", 0.0,
                    by=("namespace", "pod", "container", "uuid"), on=(UNREPORTED,))


@dataclass(frozen=True, slots=True)
class MpsClient:
    """A container running on an MPS GPU: its pod (``namespace/pod``), container and the
    most device memory it held at the latest step (bytes)."""

    pod: str
    container: str
    memory_bytes: float


@dataclass(frozen=True, slots=True)
class UnjudgedGpu:
    """An MPS GPU whose clients' utilization is not reported at the window's latest step:
    since when (its first such step in the window), its clients, and the GPU's share of its
    node's $/hour (None: unknown price)."""

    ref: GpuRef
    gpu: str
    since: float
    clients: tuple[MpsClient, ...]
    price_per_hour: float | None


class MpsUnjudged(StepVerdict):
    """The MPS GPUs not judged per client (module docstring)."""

    name: ClassVar[str] = "mps-unjudged"
    queries: ClassVar[tuple[StepQuery, ...]] = (UNREPORTED, CLIENTS, REPLICAS)
    section: ClassVar[Section] = Section(
        id="section-mps-unjudged", title="MPS GPUs not judged per client",
        intro="GPUs shared by CUDA MPS where the driver reports utilization for the MPS "
              "server only: each client's memory is known, its use of the GPU is not, so "
              "time-slice starvation and allocated-idle are not judged for these clients "
              "(never taken as 0).",
        tables=(Table("mps-unjudged-table", "mps-unjudged-note", (
            Column("node", "Node", "link"), Column("gpu", "GPU"),
            Column("clients", "Clients", "link"), Column("memory", "Clients' memory"),
            Column("since", "Since (UTC)", csv="since_csv"),
            Column("price", "GPU $/hour", "money"),
        ), order="price"),),
    )

    def judge(self, answers: StepAnswers, ctx: PageContext) -> tuple[UnjudgedGpu, ...]:
        latest = ctx.window.end - 1.5 * ctx.window.step
        now: dict[GpuRef, tuple[str, float]] = {}
        for lab, s in answers.get(UNREPORTED, ()):
            if len(s) and s.times[-1] >= latest:
                ref = device_ref(lab)
                now[ref] = (lab.get("gpu", ""), s.times[0])
        clients: dict[GpuRef, list[MpsClient]] = {}
        for lab, s in answers.get(CLIENTS, ()):
            ref = device_ref(lab)
            if ref in now and len(s) and s.times[-1] >= latest and lab.get("namespace"):
                clients.setdefault(ref, []).append(MpsClient(
                    f"{lab['namespace']}/{lab.get('pod', '')}", lab.get("container", ""),
                    s.values[-1]))
        out = []
        for ref, (index, since) in now.items():
            if ctx.namespace is not None and not any(
                    c.pod.partition("/")[0] == ctx.namespace for c in clients.get(ref, ())):
                continue
            info = ctx.gpus.get(ref)
            out.append(UnjudgedGpu(
                ref=ref, gpu=info.gpu if info is not None else index, since=since,
                clients=tuple(sorted(clients.get(ref, ()), key=lambda c: (c.pod, c.container))),
                price_per_hour=ctx.gpu_price.get(ref.node)))
        out.sort(key=lambda u: (-(u.price_per_hour or 0.0), u.ref.node, index_key(u.gpu)))
        return tuple(out)

    def rows(self, findings: Sequence[UnjudgedGpu], ctx: PageContext, state: State
             ) -> list[Row]:
        return [{
            "node": node_link(u.ref.node, state), "gpu": u.gpu,
            "clients": ", ".join(pod_link(*c.pod.partition("/")[::2], at_node(state, u.ref.node),
                                          text=f"{c.pod.partition('/')[2]}/{c.container}")
                                 for c in u.clients) or "(no container)",
            "memory": ", ".join(fmt.gib(c.memory_bytes) for c in u.clients),
            "since": first_step_cell(u.since, ctx), "price": u.price_per_hour,
            "since_csv": first_step_cell(u.since, ctx, fmt.stamp),
        } for u in findings]

    def note(self, findings: Sequence[UnjudgedGpu], ctx: PageContext) -> str:
        if not findings:
            return ("No MPS GPU without per-client utilization: every MPS client is judged "
                    "like any container.")
        clients = sum(len(u.clients) for u in findings)
        return (f"{len(findings)} MPS GPU{'s' if len(findings) != 1 else ''} with {clients} "
                f"client{'s' if clients != 1 else ''} whose use of the GPU NVML does not "
                f"report: starvation and allocated-idle are not judged for them.")


VERDICT = MpsUnjudged()


def active_thread_shares(answers: StepAnswers) -> dict[GpuRef, float]:
    """Each MPS GPU's clients' active-thread share (1/replicas, at its latest step), for the
    time-slice starvation rule; GPUs whose replicas are not known are left out (judged
    against 1/n)."""
    out: dict[GpuRef, float] = {}
    for lab, s in answers.get(REPLICAS, ()):
        if len(s) and s.values[-1] >= 1:
            out[device_ref(lab)] = 1.0 / s.values[-1]
    return out
