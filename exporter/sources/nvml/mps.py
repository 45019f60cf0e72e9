"""CUDA MPS (Multi-Process Service) as NVML shows it: the MPS process list, which process is
the MPS server, and which of two behaviours per-process utilization has.

Under MPS the clients' kernels run in one GPU context owned by ``nvidia-cuda-mps-server``.
What NVML reports (measured on an H200, driver 580.159.04, nvidia-ml-py 13.615.71, an MPS
control daemon, two PyTorch clients; ``bench/real_gpu_check.py --mps``):

- ``nvmlDeviceGetComputeRunningProcesses_v3`` lists the server *and* every client, each with
  its own memory (the server's own context: 66 MiB);
- ``nvmlDeviceGetMPSComputeRunningProcesses_v3`` (Volta and newer) lists the clients only,
  with the same bytes: merged by PID, a client's memory is counted once;
- ``nvmlDeviceGetProcessUtilization`` gives samples for the server's PID only, carrying the
  clients' work (SM 92-99 %), none for the clients. NVML does not document whether a driver
  may give per-client samples instead, so both behaviours are handled (:class:`MpsBehaviour`).

The server is recognised by its name (``<proc-root>/<pid>/comm``: ``nvidia-cuda-mps``, the
kernel's 15 characters of ``nvidia-cuda-mps-server``; then ``cmdline`` tells the server from
the control daemon, ``nvidia-cuda-mps-control``, which holds no GPU context); where the name
cannot be read (no ``--proc-root``, no host PID namespace), by its place in the lists: a
compute process absent from the MPS list of a device whose MPS list names clients.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from gpuscope.exporter.sources.nvml import calls

MPS_SERVER = "nvidia-cuda-mps-server"
# The kernel keeps 15 characters of an executable's name as its comm (TASK_COMM_LEN 16): the
# server and the control daemon (nvidia-cuda-mps-control) both read "nvidia-cuda-mps".
_MPS_COMM = MPS_SERVER[:15]


def mps_compute_processes(handle: object) -> calls.Processes:
    """nvmlDeviceGetMPSComputeRunningProcesses_v3: the processes with an MPS compute context
    (the MPS clients), as (host PID, used bytes); raised as ``NVMLLibraryMismatchError`` when
    the driver lacks ``_v3`` (as the compute and graphics lists are)."""
    return calls._running_processes_v3("nvmlDeviceGetMPSComputeRunningProcesses_v3", handle)


def mps_compute_processes_v2(handle: object) -> calls.Processes:
    """nvmlDeviceGetMPSComputeRunningProcesses_v2 (drivers before the ``_v3`` calls)."""
    return calls._running_processes("nvmlDeviceGetMPSComputeRunningProcesses_v2", handle)


def _argv0(cmdline: bytes) -> str:
    return os.path.basename(cmdline.split(b"\0", 1)[0].decode("utf-8", "replace"))


class ProcessNames:
    """Whether a host PID is the MPS server, read once per PID from ``<proc_root>/<pid>``
    and kept while the PID stays on some device's process list (:meth:`retain`).

    ``proc_root`` ``None`` reads nothing: every answer is ``None`` (unknown). A PID reused by
    another process between two sampling rounds keeps the old answer; the server's PID
    changes only when the control daemon starts a new server, after its clients are gone."""

    def __init__(self, proc_root: str | None) -> None:
        self._prefix = None if proc_root is None else os.path.join(proc_root, "")
        self._known: dict[int, bool | None] = {}

    @property
    def enabled(self) -> bool:
        """Whether names are read at all (a proc root was given)."""
        return self._prefix is not None

    def is_mps_server(self, pid: int) -> bool | None:
        """True for ``nvidia-cuda-mps-server``, False for any other process, ``None`` when the
        process's name cannot be read (gone, no such file under the proc root, no access, no
        proc root)."""
        if self._prefix is None:
            return None
        if pid in self._known:
            return self._known[pid]
        answer = self._read(pid)
        self._known[pid] = answer
        return answer

    def _read(self, pid: int) -> bool | None:
        comm = self._file(pid, "comm")
        if comm is None:
            return None
        if comm.rstrip(b"\n").decode("utf-8", "replace") != _MPS_COMM:
            return False
        cmdline = self._file(pid, "cmdline")
        if not cmdline:
            # A kernel thread or an unreadable cmdline: the comm is the server's or the
            # control daemon's, and the control daemon holds no GPU context.
            return True
        return _argv0(cmdline) == MPS_SERVER

    def _file(self, pid: int, name: str) -> bytes | None:
        try:
            with open(f"{self._prefix}{pid}/{name}", "rb") as f:
                return f.read(4096)
        except OSError:
            return None

    def retain(self, pids: Iterable[int]) -> None:
        """Forget every PID not in ``pids`` (those no device lists any more)."""
        if not self._known:
            return
        keep = set(pids)
        for pid in self._known.keys() - keep:
            del self._known[pid]


class MpsBehaviour:
    """Which of the two per-process utilization behaviours one device has under MPS, learnt
    from the samples: ``True`` once NVML gave a sample for an MPS client (then for good: a
    driver that reports clients does so whenever they run), ``False`` while only other
    processes (the server) had samples, ``None`` before any sample was seen."""

    __slots__ = ("reported",)

    def __init__(self) -> None:
        self.reported: bool | None = None

    def learn(self, clients: Iterable[int], sampled: Iterable[int]) -> bool | None:
        """Update from one round: ``clients`` the MPS clients listed, ``sampled`` the PIDs
        with utilization samples this round. Returns what is known now."""
        if self.reported:
            return True
        clients = set(clients)
        sampled = set(sampled)
        if not clients or not sampled:
            return self.reported  # no client, or an idle round: nothing to learn
        self.reported = not clients.isdisjoint(sampled)
        return self.reported

