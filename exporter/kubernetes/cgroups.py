"""Which pod and container a host process belongs to, read from ``<proc-root>/<pid>/cgroup``.

NVML reports *host* PIDs on each GPU. The kubelet puts every container into a cgroup whose
path names the pod UID and the container ID, so ``/proc/<pid>/cgroup`` is enough to tie a
GPU process to a container without asking the container runtime.

Sources for the path layouts (kubelet ``pkg/kubelet/cm`` cgroup naming, runc/crun systemd
scope naming, ``proc(5)`` and ``cgroups(7)``):

- cgroup v1: one line per hierarchy, ``<id>:<controller,...>:<path>``;
  cgroup v2: a single line ``0::<path>``. A cgroup removed under v2 shows `` (deleted)``.
- cgroupfs driver: ``/kubepods[/burstable|/besteffort]/pod<uid>/<container-id>``
  (guaranteed pods have no QoS level; cri-o names the leaf ``crio-<id>``).
- systemd driver: ``/kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid>.slice/
  <prefix>-<container-id>.scope`` with ``<prefix>`` one of ``cri-containerd`` (containerd),
  ``crio`` (cri-o) and ``docker`` (dockershim / cri-dockerd). systemd escapes ``-`` in unit
  names, so the UID's dashes appear as underscores.
- a kubelet on the systemd driver with a runtime whose runc uses cgroupfs (containerd's
  ``SystemdCgroup = false``, its default before 2.0, beside kubeadm's systemd default):
  runc takes the systemd-style cgroupsPath ``<pod slice>:<prefix>:<container-id>`` as one
  directory name below its own cgroup, e.g. ``/system.slice/containerd.service/
  kubepods-burstable-pod<uid>.slice:cri-containerd:<id>`` (v2: below that cgroup's parent).
- cri-o runs each container's monitor (``conmon``) in a sibling ``crio-conmon-<id>.scope``;
  conmon is not the container, so that scope maps to no container.
- With a private cgroup namespace (the default for containers on cgroup v2) paths are
  relative to the reader's own cgroup, e.g. ``0::/../../kubepods-besteffort-pod<uid>.slice/
  cri-containerd-<id>.scope``; nested clusters (kind, k3s in docker) put the whole tree under
  a prefix such as ``/kubelet.slice/kubelet-kubepods.slice/...`` or ``/docker/<id>/kubepods/
  ...``. So the parser looks for the pod component anywhere in the path instead of anchoring
  at ``/kubepods``.
- Static pods carry the kubelet's config hash as UID: 32 hex digits, no dashes (their mirror
  pods in the API server have another UID; see ``PodInfo.mirror_of``).

The parser returns the container ID as bare lowercase hex, which is how the API server's
``status.containerStatuses[].containerID`` reads once its ``<runtime>://`` prefix is removed.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["ContainerRef", "PidResolver", "ResolverStats", "is_procfs", "parse_cgroup"]

# A pod component: cgroupfs ``pod<uid>``; systemd ``kubepods[-<qos>]-pod<uid>.slice``, also
# with a prefix (kind's ``kubelet-kubepods-...``). The UID is a UUID (dashes, or underscores
# after systemd escaping) or a static pod's 32-hex config hash.
_POD = (
    r"(?:[a-z0-9_.-]*-)?pod"
    r"(?P<uid>[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_]"
    r"[0-9a-fA-F]{12}|[0-9a-fA-F]{32})"
)
_POD_RE = re.compile(rf"^{_POD}(?:\.slice)?$")
# A container component directly below the pod component.
_CONTAINER_RE = re.compile(
    r"^(?:(?P<prefix>cri-containerd|crio|docker)-)?(?P<id>[0-9a-fA-F]{64})(?:\.scope)?$"
)
# One component naming both, ``<pod slice>:<prefix>:<container-id>``: the systemd-style
# cgroupsPath that a kubelet on the systemd driver hands the runtime, taken as a plain
# directory name by a runc on cgroupfs (containerd's ``SystemdCgroup = false``).
_POD_AND_CONTAINER_RE = re.compile(
    rf"^{_POD}\.slice:(?P<prefix>cri-containerd|crio|docker):(?P<id>[0-9a-fA-F]{{64}})$"
)
_RUNTIME_BY_PREFIX = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}
_DELETED_SUFFIX = " (deleted)"


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """The container a process runs in.

    ``pod_uid`` is the dashed UUID form (``1b4e28ba-2fa1-11d2-883f-0016d3cca427``), or the
    32-hex config hash of a static pod. ``container_id`` is 64 lowercase hex digits.
    ``runtime`` is ``containerd``, ``cri-o`` or ``docker`` when the cgroup path names it
    (systemd driver, cri-o), or ``""`` when it does not (cgroupfs driver with containerd or
    docker, whose leaf is the bare ID).
    """

    pod_uid: str
    container_id: str
    runtime: str


#: What :meth:`PidResolver.resolve` answers for a process whose owner it could not read: gone
#: between NVML's listing and the read, an unreadable cgroup file, or a ``/proc`` that hides
#: other users' processes (``hidepid=2``: their directories read as absent). Not a host
#: process: its GPU's allocated containers may be the ones running it, so attribution counts
#: it as a pod process it cannot name (their usage unknown, never 0: not allocated-idle).
UNKNOWN_OWNER = ContainerRef(pod_uid="", container_id="", runtime="")


def _parse_path(path: str) -> ContainerRef | None:
    if path.endswith(_DELETED_SUFFIX):
        path = path[: -len(_DELETED_SUFFIX)]
    parts = [p for p in path.split("/") if p and p != ".."]
    # Search from the leaf upwards: with nesting (kind, k3s in docker) an outer component may
    # look like a container, but the pod component is always the innermost kubepods level.
    for i in range(len(parts) - 1, -1, -1):
        both = _POD_AND_CONTAINER_RE.match(parts[i])
        if both is not None:
            return ContainerRef(
                pod_uid=both.group("uid").replace("_", "-").lower(),
                container_id=both.group("id").lower(),
                runtime=_RUNTIME_BY_PREFIX[both.group("prefix")],
            )
        pod = _POD_RE.match(parts[i]) if i < len(parts) - 1 else None
        if pod is None:
            continue
        leaf = parts[i + 1]
        if leaf.startswith("crio-conmon-"):
            return None
        container = _CONTAINER_RE.match(leaf)
        if container is None:
            # A process directly in the pod cgroup (conmon with conmon_cgroup="pod") or an
            # unknown layout: not a container we can name.
            return None
        prefix = container.group("prefix")
        return ContainerRef(
            pod_uid=pod.group("uid").replace("_", "-").lower(),
            container_id=container.group("id").lower(),
            runtime=_RUNTIME_BY_PREFIX[prefix] if prefix else "",
        )
    return None


def parse_cgroup(text: str) -> ContainerRef | None:
    """Parse the text of ``/proc/<pid>/cgroup`` (v1, v2 or hybrid).

    Returns the pod UID and container ID, or ``None`` for a process outside any pod
    (host services, ``init.scope``, the cri-o conmon monitor) and for text that is not a
    cgroup file. Lines are tried in file order; the first that names a container wins (under
    v1 every controller normally carries the same path; under hybrid mode the unified ``0::``
    line may be just ``/`` while the v1 lines carry the kubepods path).
    """
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[0].strip().isdigit():
            continue
        ref = _parse_path(fields[2].strip())
        if ref is not None:
            return ref
    return None


@dataclass(frozen=True, slots=True)
class ResolverStats:
    """Counters since the resolver was created, for the exporter's self-metrics.

    ``read_errors``: ``cgroup`` or ``stat`` files that exist but could not be read
    (permissions, e.g. ``/proc`` mounted with ``hidepid=1``) or parsed. ``vanished``: PIDs
    with no ``/proc`` entry (the process exited, which is normal; but if every GPU PID
    vanishes, the exporter does not see the host's PID namespace: no ``hostPID`` and no
    host ``/proc`` mounted at ``proc_root``).
    ``cache_hits`` / ``cache_misses``: lookups answered from the cache / by reading files.
    ``held_fds``: ``stat`` files kept open for the reuse check (procfs only, see
    :class:`PidResolver`).
    """

    read_errors: int
    vanished: int
    cache_hits: int
    cache_misses: int
    cached_pids: int
    held_fds: int = 0


class _Gone(Exception):
    """The process behind a PID exited while it was being looked up."""


def _start_time(stat: bytes) -> int:
    # proc(5): field 22 of /proc/<pid>/stat is the start time in clock ticks since boot.
    # Field 2 (comm) is in parentheses and may contain spaces and ')', so split after the
    # last ')': what follows starts at field 3. Bytes: the fields after comm are ASCII, and
    # comm need not be UTF-8.
    rest = stat[stat.rindex(b")") + 2 :].split(None, 22 - 3 + 1)
    return int(rest[22 - 3])


def _unescape_mount_path(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def is_procfs(path: str, mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether ``path`` lies on a ``proc`` filesystem, per the mount table (proc(5),
    ``/proc/<pid>/mountinfo``: the filesystem type follows the `` - `` separator). The
    longest mount point containing ``path`` wins. ``False`` when the table is unreadable."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    target = os.path.realpath(path)
    best, best_type = -1, ""
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        mount_point = _unescape_mount_path(fields[4])
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) > best:
            best, best_type = len(mount_point), right.split()[0]
    return best_type == "proc"


def _default_max_held_fds() -> int:
    # A quarter of the soft open-files limit, at most 1,024: the exporter itself needs a
    # handful (sockets, the NVML device files), and a node with more GPU processes than
    # that falls back to path reads for the rest.
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 0
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(0, min(1024, soft // 4))


# One read takes the whole file: procfs renders ``stat`` and ``cgroup`` in one go and a read
# returns all of it that fits; a read that fills the buffer is followed by more.
_READ_SIZE = 8192


def _read_all(fd: int) -> bytes:
    data = os.read(fd, _READ_SIZE)
    if len(data) == _READ_SIZE:
        chunks = [data]
        while chunk := os.read(fd, _READ_SIZE):
            chunks.append(chunk)
        data = b"".join(chunks)
    return data


# A cached PID: (start time, container, fd of its held stat file or -1, the stat file's
# contents as last read through it: only kept where the tree is not procfs, see _held_same).
_Entry = tuple[int, ContainerRef | None, int, bytes]
_UNCACHED: _Entry = (0, None, -1, b"")


class PidResolver:
    """Resolve host PIDs to containers, caching each answer per process.

    The cache key is ``(pid, start time)`` (``/proc/<pid>/stat`` field 22): PIDs are
    reused, and a new process behind an old PID has a new start time, so its cgroup file is
    read afresh. The cache holds exactly the PIDs of the latest :meth:`resolve` call; pass
    every PID of one sampling round in one call, or PIDs of the other calls are evicted and
    re-read next time. Thread-safe. Never raises for unreadable or missing files.

    The start time is re-read for every PID in every call, cached or not: a PID handed to a
    new process between two rounds (the old one exited within a sampling interval) must not
    have the new process's GPU use charged to the old process's container, another tenant
    perhaps. Cheaper signals are not sound: the mtime/ctime of ``/proc/<pid>`` is when its
    inode was instantiated, not when the process started (and a ``--proc-root`` copy of the
    tree has other semantics still).

    How it is re-read: the ``stat`` file of each cached PID is kept open and re-read with
    ``pread``, which skips the path walk, open and close of every round (2.8 instead of
    4.8 µs per PID on procfs, bench/resolver_bench.py). On a real procfs (detected from the
    mount table) an open file stays bound to the process it was opened for, so once that
    process is reaped (the only way its PID can be reused) the read fails with ESRCH and
    the PID is looked up afresh: a read that succeeds is the check, and its contents are
    not parsed. Elsewhere (a copied tree, the tests' and the benchmark's
    fake trees) a kept-open regular file goes on reading a *removed or replaced* file's old
    contents, so each read there is preceded by an ``fstat``: a file no longer linked
    (``st_nlink == 0``: its process's entry was deleted, or a new file renamed over it)
    counts as gone and the PID is looked up by path; a file rewritten in place is read
    anew through the held descriptor: the same bytes as last time are the same process,
    other bytes are parsed and their start time decides as above.
    ``hold_fds=False`` reads every file by path instead. At most ``max_held_fds`` files are
    held (default: a quarter of the soft open-files limit, at most 1,024); the other PIDs
    use path reads. Call :meth:`close` to release the held files.
    """

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        hold_fds: bool | None = None,
        max_held_fds: int | None = None,
    ) -> None:
        self._proc_root = proc_root
        self._prefix = os.path.join(proc_root, "")  # + "<pid>/<name>" = os.path.join(...)
        self._lock = threading.Lock()
        self._cache: dict[int, _Entry] = {}
        procfs = is_procfs(proc_root)
        self._hold = True if hold_fds is None else hold_fds
        # Not procfs: a held file may have been removed or replaced since (see above).
        self._check_links = not procfs
        self._max_held = _default_max_held_fds() if max_held_fds is None else max_held_fds
        self._held = 0
        self._read_errors = 0
        self._vanished = 0
        self._hits = 0
        self._misses = 0

    def _read(self, pid: int, name: str) -> bytes | None:
        """Read ``<proc_root>/<pid>/<name>``; ``None`` when unreadable (counted).

        Raises :class:`_Gone` when the process no longer exists. ``os.open``/``os.read`` on
        bytes, not ``open()``: this runs for every GPU process in every sampling round, and a
        text-mode file object (buffer, decoder, context manager) cost twice the syscalls.
        """
        try:
            fd = os.open(f"{self._prefix}{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = _read_all(fd)
            finally:
                os.close(fd)
        except (FileNotFoundError, ProcessLookupError):
            # ESRCH: the process died between opening its directory and reading.
            raise _Gone from None
        except OSError:
            self._read_errors += 1
            return None
        return data

    def _parse_start(self, data: bytes | None) -> int | None:
        if data is None:
            return None
        try:
            return _start_time(data)
        except (ValueError, IndexError):
            self._read_errors += 1
            return None

    def _held_read(self, fd: int, size: int = _READ_SIZE) -> bytes | None:
        """The contents of a held ``stat`` file (its first ``size`` bytes); ``None`` once its
        process is gone (procfs: reaped; elsewhere: the file is no longer linked)."""
        try:
            if self._check_links and os.fstat(fd).st_nlink == 0:
                return None  # removed or replaced: look the PID up by path
            return os.pread(fd, size, 0)
        except OSError:
            return None  # ESRCH: reaped, so the PID may now be another process's

    def _held_same(self, pid: int, entry: _Entry) -> bool:
        """Whether the held ``stat`` file of a cached PID still shows the cached process.
        Procfs: the read succeeding is the answer (the file is bound to its process; the
        kernel renders it either way, one byte is copied out). Elsewhere: the contents as
        cached, or, when rewritten, the same start time (the contents then cached anew)."""
        start, ref, fd, seen = entry
        if not self._check_links:
            return bool(self._held_read(fd, 1))
        data = self._held_read(fd)
        if data is None:
            return False
        if data == seen:
            return True
        try:
            if _start_time(data) != start:
                return False
        except (ValueError, IndexError):
            return False
        self._cache[pid] = (start, ref, fd, data)
        return True

    def _held_start(self, fd: int) -> int | None:
        """The start time through a held ``stat`` file; ``None`` when its process is gone
        or the file cannot be parsed (either way the PID is looked up afresh)."""
        data = self._held_read(fd)
        if data is None:
            return None
        try:
            return _start_time(data)
        except (ValueError, IndexError):
            return None

    def _release(self, entry: _Entry | None) -> None:
        if entry is not None and entry[2] >= 0:
            os.close(entry[2])
            self._held -= 1

    def _open_stat(self, pid: int) -> int:
        """Open ``<pid>/stat`` to hold it; -1 when not holding (or the open failed)."""
        if not self._hold or self._held >= self._max_held:
            return -1
        try:
            fd = os.open(f"{self._prefix}{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError):
            raise _Gone from None
        except OSError:
            return -1  # unreadable, or out of fds: the path reads count the error
        self._held += 1
        return fd

    def _lookup(self, pid: int) -> ContainerRef | None:
        cached = self._cache.get(pid)
        if cached is not None and cached[2] >= 0:
            # File held: one pread, no path walk (see _held_same).
            if self._held_same(pid, cached):
                self._hits += 1
                return cached[1]
        elif cached is not None:
            start = self._parse_start(self._read(pid, "stat"))
            if start is not None and start == cached[0]:
                self._hits += 1
                return cached[1]
        self._release(self._cache.pop(pid, None))
        self._misses += 1
        fd = self._open_stat(pid)
        try:
            return self._read_and_cache(pid, fd)
        finally:
            # Kept only when the answer was cached with it; otherwise (not cacheable, gone,
            # any error) it is closed here, the one place that owns a freshly opened file.
            if fd >= 0 and self._cache.get(pid, _UNCACHED)[2] != fd:
                os.close(fd)
                self._held -= 1

    def _read_and_cache(self, pid: int, fd: int) -> ContainerRef | None:
        """Read the start time, the cgroup file and the start time again; cache the answer
        only when both start times agree, i.e. the PID kept one process across the read:
        if it was reused in between, the cgroup text may belong to either process. (An
        unreadable stat file means no cache at all: without a start time reuse cannot be
        detected.) ``fd``: the ``stat`` file to hold (procfs), or -1 to read by path; the
        caller closes it unless it ends up in the cache."""
        held = b""
        if fd >= 0:
            read = self._held_read(fd)
            if read is None:
                raise _Gone  # the process it was opened for is already gone
            held = read
            start = self._parse_start(held)
        else:
            start = self._parse_start(self._read(pid, "stat"))
        data = self._read(pid, "cgroup")
        if data is None:
            return UNKNOWN_OWNER
        ref = parse_cgroup(data.decode("utf-8", "replace"))
        again = None
        # _Gone: it exited just after the read; the answer is still the one NVML saw.
        if start is not None:
            with contextlib.suppress(_Gone):
                again = self._held_start(fd) if fd >= 0 else self._parse_start(
                    self._read(pid, "stat"))
        if start is not None and again == start:
            # The bytes are kept for _held_same on a tree that is not procfs (on procfs the
            # file changes with every read and its success is the check).
            self._cache[pid] = (start, ref, fd, held if self._check_links else b"")
        return ref

    def resolve(self, pids: Iterable[int]) -> Mapping[int, ContainerRef | None]:
        """Map each PID to its container, ``None`` (a host process: its cgroup names no
        pod) or :data:`UNKNOWN_OWNER` (gone, unreadable)."""
        with self._lock:
            out: dict[int, ContainerRef | None] = {}
            for pid in pids:
                if pid in out:
                    continue
                try:
                    out[pid] = self._lookup(pid)
                except _Gone:
                    self._vanished += 1
                    self._release(self._cache.pop(pid, None))
                    out[pid] = UNKNOWN_OWNER
            for stale in self._cache.keys() - out.keys():
                self._release(self._cache.pop(stale))
            return out

    def close(self) -> None:
        """Close the held ``stat`` files and forget every cached PID. The resolver still
        works afterwards (it reopens as it goes); call this when the exporter stops."""
        with self._lock:
            for entry in self._cache.values():
                self._release(entry)
            self._cache.clear()

    def stats(self) -> ResolverStats:
        with self._lock:
            return ResolverStats(
                read_errors=self._read_errors,
                vanished=self._vanished,
                cache_hits=self._hits,
                cache_misses=self._misses,
                cached_pids=len(self._cache),
                held_fds=self._held,
            )
