"""PID → container resolution from ``/proc/<pid>/cgroup``, against a fake /proc tree.

The cgroup files below are shaped after real nodes: cgroup v1 with the cgroupfs driver
(docker-era and containerd nodes), cgroup v1 with the systemd driver, cgroup v2 with the
systemd driver (containerd, cri-o with its conmon sibling), kind's nested hierarchy and a
reader inside a private cgroup namespace (relative paths).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuscope.exporter.kubernetes import cgroups
from gpuscope.exporter.kubernetes.cgroups import (
    UNKNOWN_OWNER,
    ContainerRef,
    PidResolver,
    is_procfs,
    parse_cgroup,
)

# Real-looking identifiers: 64-hex container IDs and version-4 pod UIDs.
CID_A = "4f1c9a2be8d7c6b5a49382716f5e4d3c2b1a0f9e8d7c6b5a4938271605f4e3d2"
CID_B = "a3e2c1d0b9f8e7d6c5b4a3928170f6e5d4c3b2a1908f7e6d5c4b3a2918071f6e"
CID_C = "0b7d5e3f1a9c8b7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d"
CID_D = "e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8"
CID_E = "5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d"
CID_F = "72f5b1e9c3a84d06b7e2f91c5a3d8e4b6f0a2c7d9e1b3f5a8c4d6e0b2f7a9c1d"
CID_KIND_NODE = "d41d8cd98f00b204e9800998ecf8427e0a1b2c3d4e5f60718293a4b5c6d7e8f9"
UID_BURSTABLE = "7c3b5a1e-9f2d-4c8b-a1e3-5d6f7a8b9c0d"
UID_BESTEFFORT = "2f8e6d4c-1b3a-4e5f-9a7b-c8d6e4f2a0b1"
UID_GUARANTEED = "b5d9e1f3-7a2c-4d6e-8f0a-1c3e5a7b9d2f"
UID_SYSTEMD = "e04c7a39-5b1d-4f8e-a6c2-3d9b0f7e1a54"
UID_CRIO = "91a3c5e7-2b4d-4f6a-8c0e-1d3f5a7b9c2e"
UID_STATIC = "6c8b3a3d0b2f5c6e8e5e5a0c0d0b0e0f"  # static pod: kubelet config hash

V1_CONTROLLERS = [
    "12:pids",
    "11:hugetlb",
    "10:net_cls,net_prio",
    "9:perf_event",
    "8:cpu,cpuacct",
    "7:memory",
    "6:devices",
    "5:freezer",
    "4:blkio",
    "3:cpuset",
]


def v1_file(path: str) -> str:
    """A cgroup v1 file: rdma at the root first (as on real nodes), then every controller."""
    lines = ["13:rdma:/"]
    lines += [f"{c}:{path}" for c in V1_CONTROLLERS]
    lines += ["2:misc:/", f"1:name=systemd:{path}", "0::/"]
    return "\n".join(lines) + "\n"


def systemd_pod(qos: str, uid: str) -> str:
    escaped = uid.replace("-", "_")
    if qos == "guaranteed":
        return f"/kubepods.slice/kubepods-pod{escaped}.slice"
    return f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{escaped}.slice"


# name → (cgroup file text, expected ref)
CASES: dict[str, tuple[str, ContainerRef | None]] = {
    "v1-cgroupfs-burstable": (
        v1_file(f"/kubepods/burstable/pod{UID_BURSTABLE}/{CID_A}"),
        ContainerRef(UID_BURSTABLE, CID_A, ""),
    ),
    "v1-cgroupfs-besteffort": (
        v1_file(f"/kubepods/besteffort/pod{UID_BESTEFFORT}/{CID_B}"),
        ContainerRef(UID_BESTEFFORT, CID_B, ""),
    ),
    "v1-cgroupfs-guaranteed": (
        v1_file(f"/kubepods/pod{UID_GUARANTEED}/{CID_C}"),
        ContainerRef(UID_GUARANTEED, CID_C, ""),
    ),
    "v1-cgroupfs-crio": (
        v1_file(f"/kubepods/burstable/pod{UID_CRIO}/crio-{CID_D}"),
        ContainerRef(UID_CRIO, CID_D, "cri-o"),
    ),
    "v1-systemd-containerd": (
        v1_file(f"{systemd_pod('burstable', UID_SYSTEMD)}/cri-containerd-{CID_A}.scope"),
        ContainerRef(UID_SYSTEMD, CID_A, "containerd"),
    ),
    "v1-systemd-docker": (
        v1_file(f"{systemd_pod('besteffort', UID_BESTEFFORT)}/docker-{CID_E}.scope"),
        ContainerRef(UID_BESTEFFORT, CID_E, "docker"),
    ),
    "v2-systemd-containerd-burstable": (
        f"0::{systemd_pod('burstable', UID_SYSTEMD)}/cri-containerd-{CID_B}.scope\n",
        ContainerRef(UID_SYSTEMD, CID_B, "containerd"),
    ),
    "v2-systemd-containerd-guaranteed": (
        f"0::{systemd_pod('guaranteed', UID_GUARANTEED)}/cri-containerd-{CID_C}.scope\n",
        ContainerRef(UID_GUARANTEED, CID_C, "containerd"),
    ),
    "v2-systemd-crio": (
        f"0::{systemd_pod('burstable', UID_CRIO)}/crio-{CID_D}.scope\n",
        ContainerRef(UID_CRIO, CID_D, "cri-o"),
    ),
    "v2-systemd-crio-conmon": (
        f"0::{systemd_pod('burstable', UID_CRIO)}/crio-conmon-{CID_D}.scope\n",
        None,
    ),
    "v2-systemd-docker": (
        f"0::{systemd_pod('besteffort', UID_BESTEFFORT)}/docker-{CID_E}.scope\n",
        ContainerRef(UID_BESTEFFORT, CID_E, "docker"),
    ),
    "v2-cgroupfs": (
        f"0::/kubepods/besteffort/pod{UID_BESTEFFORT}/{CID_F}\n",
        ContainerRef(UID_BESTEFFORT, CID_F, ""),
    ),
    # The exporter itself in a private cgroup namespace rooted at its own container scope
    # (burstable): a besteffort pod is two levels up and across.
    "v2-namespace-relative": (
        f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod"
        f"{UID_BESTEFFORT.replace('-', '_')}.slice/cri-containerd-{CID_A}.scope\n",
        ContainerRef(UID_BESTEFFORT, CID_A, "containerd"),
    ),
    "v2-namespace-relative-same-qos": (
        f"0::/../kubepods-burstable-pod{UID_SYSTEMD.replace('-', '_')}.slice/"
        f"cri-containerd-{CID_B}.scope\n",
        ContainerRef(UID_SYSTEMD, CID_B, "containerd"),
    ),
    "v1-namespace-relative-cgroupfs": (
        v1_file(f"/../../besteffort/pod{UID_BESTEFFORT}/{CID_F}"),
        ContainerRef(UID_BESTEFFORT, CID_F, ""),
    ),
    # kind: the node is a docker container; kubelet runs with its own slice.
    "v2-kind-host-view": (
        f"0::/system.slice/docker-{CID_KIND_NODE}.scope/kubelet.slice/kubelet-kubepods.slice/"
        f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod"
        f"{UID_BESTEFFORT.replace('-', '_')}.slice/cri-containerd-{CID_C}.scope\n",
        ContainerRef(UID_BESTEFFORT, CID_C, "containerd"),
    ),
    # k3d / k3s in docker with the cgroupfs driver, cgroup v1.
    "v1-k3s-in-docker": (
        v1_file(f"/docker/{CID_KIND_NODE}/kubepods/burstable/pod{UID_BURSTABLE}/{CID_E}"),
        ContainerRef(UID_BURSTABLE, CID_E, ""),
    ),
    "v2-static-pod": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_STATIC}.slice/"
        f"cri-containerd-{CID_F}.scope\n",
        ContainerRef(UID_STATIC, CID_F, "containerd"),
    ),
    # A container that made sub-cgroups of its own (systemd inside, or a nested runtime).
    "v2-container-subcgroup": (
        f"0::{systemd_pod('burstable', UID_SYSTEMD)}/cri-containerd-{CID_A}.scope/init.scope\n",
        ContainerRef(UID_SYSTEMD, CID_A, "containerd"),
    ),
    # cgroup v2 marks a removed cgroup; the process is still there (zombie, exiting).
    "v2-deleted": (
        f"0::{systemd_pod('burstable', UID_SYSTEMD)}/cri-containerd-{CID_B}.scope (deleted)\n",
        ContainerRef(UID_SYSTEMD, CID_B, "containerd"),
    ),
    # Hybrid mode: unified line first and at the root, v1 controllers carry the path.
    "hybrid-unified-first": (
        f"0::/\n4:memory:/kubepods/burstable/pod{UID_BURSTABLE}/{CID_A}\n",
        ContainerRef(UID_BURSTABLE, CID_A, ""),
    ),
    # The kubelet on the systemd driver, containerd's runc on cgroupfs (SystemdCgroup = false,
    # containerd's default before 2.0; kubeadm's kubelet default is systemd): runc takes the
    # systemd-style cgroupsPath "<pod slice>:cri-containerd:<id>" as one directory name
    # under its own cgroup (v1: the shim's, containerd.service; v2: that cgroup's parent).
    "v1-driver-mismatch": (
        v1_file("/system.slice/containerd.service/kubepods-besteffort-pod"
                f"{UID_BESTEFFORT.replace('-', '_')}.slice:cri-containerd:{CID_A}"),
        ContainerRef(UID_BESTEFFORT, CID_A, "containerd"),
    ),
    "v2-driver-mismatch-guaranteed": (
        f"0::/system.slice/kubepods-pod{UID_GUARANTEED.replace('-', '_')}.slice:"
        f"cri-containerd:{CID_C}\n",
        ContainerRef(UID_GUARANTEED, CID_C, "containerd"),
    ),
    "v2-driver-mismatch-subcgroup": (
        f"0::/system.slice/kubepods-burstable-pod{UID_SYSTEMD.replace('-', '_')}.slice:"
        f"cri-containerd:{CID_B}/init.scope\n",
        ContainerRef(UID_SYSTEMD, CID_B, "containerd"),
    ),
    "driver-mismatch-short-id": (
        f"0::/system.slice/kubepods-pod{UID_GUARANTEED.replace('-', '_')}.slice:"
        f"cri-containerd:{CID_C[:12]}\n",
        None,
    ),
    "host-sshd": ("0::/system.slice/sshd.service\n", None),
    "host-init": ("0::/init.scope\n", None),
    "host-user-session": ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
    "host-v1": (v1_file("/system.slice/containerd.service"), None),
    "docker-outside-k8s": (f"0::/system.slice/docker-{CID_E}.scope\n", None),
    "pod-cgroup-itself": (f"0::{systemd_pod('burstable', UID_SYSTEMD)}\n", None),
    "conmon-in-pod-cgroupfs": (f"0::/kubepods/burstable/pod{UID_CRIO}\n", None),
    "root": ("0::/\n", None),
    "empty": ("", None),
    "garbage": ("\x00\xff not a cgroup file\n:::\n12\n", None),
    "short-id": (f"0::/kubepods/burstable/pod{UID_BURSTABLE}/{CID_A[:12]}\n", None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_parse_cgroup(name: str) -> None:
    text, expected = CASES[name]
    assert parse_cgroup(text) == expected


def test_uid_normalised_to_dashes_and_lowercase() -> None:
    text = (
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{UID_BESTEFFORT.upper().replace('-', '_')}.slice/"
        f"cri-containerd-{CID_A.upper()}.scope\n"
    )
    assert parse_cgroup(text) == ContainerRef(UID_BESTEFFORT, CID_A, "containerd")


# --- PidResolver against a /proc tree ------------------------------------------------------


def stat_line(pid: int, comm: str, start: int) -> str:
    """A /proc/<pid>/stat line; ``comm`` may hold spaces and parentheses like the real one."""
    after = [
        "S",
        "1",
        str(pid),
        str(pid),
        "0",
        "-1",
        "4194560",
        "2741",
        "0",
        "0",
        "0",
        "123",
        "45",
        "0",
        "0",
        "20",
        "0",
        "12",
        "0",
        str(start),
        "2147483648",
        "9000",
    ]
    return f"{pid} ({comm}) " + " ".join(after) + "\n"


def write_proc(root: Path, pid: int, cgroup: str, start: int, comm: str = "python3") -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(cgroup)
    (d / "stat").write_text(stat_line(pid, comm, start))


def remove_proc(root: Path, pid: int) -> None:
    for f in (root / str(pid)).iterdir():
        f.unlink()
    (root / str(pid)).rmdir()


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    for pid, name in enumerate(sorted(CASES), start=1000):
        write_proc(root, pid, CASES[name][0], start=50_000 + pid)
    return root


def test_resolve_every_format_from_proc_tree(proc: Path) -> None:
    resolver = PidResolver(str(proc))
    pids = list(range(1000, 1000 + len(CASES)))
    got = resolver.resolve(pids)
    expected = {pid: CASES[name][1] for pid, name in enumerate(sorted(CASES), start=1000)}
    assert dict(got) == expected
    stats = resolver.stats()
    assert stats.cache_misses == len(CASES)
    assert stats.read_errors == 0
    assert stats.cached_pids == len(CASES)


def test_cache_hit_does_not_reread_cgroup(proc: Path) -> None:
    resolver = PidResolver(str(proc))
    first = resolver.resolve([1000])
    # Same process (same start time): a changed file must not be re-read.
    (proc / "1000" / "cgroup").write_text("0::/init.scope\n")
    assert resolver.resolve([1000]) == first
    assert resolver.stats().cache_hits == 1


def test_pid_reuse_rereads(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    pid = 4242
    write_proc(root, pid, CASES["v2-systemd-crio"][0], start=100, comm="python3 (train)")
    resolver = PidResolver(str(root))
    assert resolver.resolve([pid])[pid] == ContainerRef(UID_CRIO, CID_D, "cri-o")
    # The process exits and the PID is handed to a new process in another pod.
    write_proc(root, pid, CASES["v2-systemd-containerd-guaranteed"][0], start=900)
    assert resolver.resolve([pid])[pid] == ContainerRef(UID_GUARANTEED, CID_C, "containerd")
    # ... and then to a host process.
    write_proc(root, pid, "0::/system.slice/sshd.service\n", start=1200, comm="sshd")
    assert resolver.resolve([pid])[pid] is None
    assert resolver.stats().cache_misses == 3


def test_pid_gone_is_evicted_and_its_owner_unknown(proc: Path) -> None:
    resolver = PidResolver(str(proc))
    resolver.resolve([1000, 1001, 1002])
    assert resolver.stats().cached_pids == 3
    # 1001 is no longer asked for: evicted even though its /proc entry still exists.
    resolver.resolve([1000, 1002])
    assert resolver.stats().cached_pids == 2
    # 1002 exits: asked for, it resolves to None and leaves the cache.
    remove_proc(proc, 1002)
    got = resolver.resolve([1000, 1002])
    assert got[1002] is UNKNOWN_OWNER  # not a host process: its owner is not known
    stats = resolver.stats()
    assert stats.cached_pids == 1
    assert stats.vanished == 1
    assert stats.read_errors == 0
    # The PID never existed at all.
    assert resolver.resolve([999_999])[999_999] is UNKNOWN_OWNER
    assert resolver.stats().cached_pids == 0


def test_missing_cgroup_file_and_bad_stat(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    (root / "10").mkdir(parents=True)
    (root / "10" / "stat").write_text(stat_line(10, "x", 5))  # no cgroup file: gone
    write_proc(root, 11, CASES["v2-systemd-docker"][0], start=7)
    (root / "11" / "stat").write_text("garbage")  # unparsable stat: error, still resolved
    resolver = PidResolver(str(root))
    got = resolver.resolve([10, 11])
    assert got[10] is UNKNOWN_OWNER
    assert got[11] == ContainerRef(UID_BESTEFFORT, CID_E, "docker")
    stats = resolver.stats()
    assert stats.vanished == 1
    assert stats.read_errors == 1  # the unparsable stat (no second read without a start)
    assert stats.cached_pids == 0  # no start time, no cache


def test_unreadable_is_a_directory(proc: Path) -> None:
    # Reading a directory raises IsADirectoryError (an OSError): counted as a read error.
    # It stands in for a permission error, which root (as CI runs) would not get.
    target = proc / "1000" / "cgroup"
    target.unlink()
    target.mkdir()
    resolver = PidResolver(str(proc))
    assert resolver.resolve([1000])[1000] is UNKNOWN_OWNER
    assert resolver.stats().read_errors == 1


def test_real_proc_self_does_not_raise() -> None:
    resolver = PidResolver()
    got = resolver.resolve([os.getpid()])
    assert os.getpid() in got


def test_files_longer_than_one_read_and_non_utf8_comm(tmp_path: Path) -> None:
    # The resolver reads with os.read: a cgroup file larger than its read size is read to
    # the end (the container line comes last here), and a comm that is not UTF-8 does not
    # stop the start time being parsed (nor does an undecodable byte stop the cgroup parse).
    root = tmp_path / "proc"
    filler = "".join(f"{i}:ctl{i}:/system.slice/some-{'x' * 60}.service\n" for i in range(300))
    assert len(filler) > 3 * 8192
    write_proc(root, 77, "", start=10)
    (root / "77" / "cgroup").write_bytes(
        filler.encode() + b"\xff\n" + CASES["v2-systemd-crio"][0].encode()
    )
    (root / "77" / "stat").write_bytes(
        stat_line(77, "py", 10).replace("(py)", "(p\xff)").encode("latin-1")
    )
    resolver = PidResolver(str(root))
    assert resolver.resolve([77])[77] == ContainerRef(UID_CRIO, CID_D, "cri-o")
    assert resolver.resolve([77])[77] == ContainerRef(UID_CRIO, CID_D, "cri-o")
    stats = resolver.stats()
    assert (stats.cache_misses, stats.cache_hits, stats.read_errors) == (1, 1, 0)


# --- held stat files on a real procfs -------------------------------------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for child in made:
        child.kill()
        child.wait(timeout=5)


def spawn(children: list[subprocess.Popen[bytes]], n: int) -> list[int]:
    for _ in range(n):
        children.append(subprocess.Popen(["sleep", "60"]))
    return [c.pid for c in children[-n:]]


def test_real_proc_holds_stat_files_and_skips_path_reads(
    children: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    pids = spawn(children, 3)
    fds_before = open_fds()
    resolver = PidResolver("/proc")  # procfs, detected from the mount table
    first = resolver.resolve(pids)
    assert set(first) == set(pids)
    stats = resolver.stats()
    assert (stats.cache_misses, stats.cached_pids, stats.held_fds) == (3, 3, 3)
    assert open_fds() == fds_before + 3

    # A cache hit is one pread on the held file: no path is opened at all.
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, *args: int, **kwargs: int) -> int:
        opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    assert resolver.resolve(pids) == first
    monkeypatch.undo()
    assert opened == []
    assert resolver.stats().cache_hits == 3

    resolver.close()
    assert open_fds() == fds_before
    assert resolver.stats().held_fds == 0
    assert resolver.resolve(pids) == first  # still works after close(), reopening


def test_real_proc_reaped_process_is_looked_up_afresh(
    children: list[subprocess.Popen[bytes]],
) -> None:
    # The reuse check on a held file: once its process is reaped (what must happen before
    # the PID can be reused), the read fails and the PID is looked up by path again.
    pids = spawn(children, 2)
    fds_before = open_fds()
    resolver = PidResolver("/proc")
    resolver.resolve(pids)
    assert resolver.stats().held_fds == 2
    children[0].kill()
    children[0].wait(timeout=5)
    got = resolver.resolve(pids)
    assert got[pids[0]] is UNKNOWN_OWNER  # gone: no /proc entry any more
    stats = resolver.stats()
    assert stats.vanished == 1
    assert (stats.cached_pids, stats.held_fds) == (1, 1)
    assert stats.cache_hits == 1  # the live one
    assert open_fds() == fds_before + 1  # the dead process's file was closed
    resolver.resolve([])  # nothing asked for: everything evicted, every file closed
    assert open_fds() == fds_before
    assert resolver.stats().held_fds == 0


def test_real_proc_hit_is_a_read_that_succeeds(
    children: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # On procfs the held file is bound to its process: a read that succeeds is that process,
    # so a hit parses nothing (the start time is read only when a PID is looked up).
    pids = spawn(children, 2)
    resolver = PidResolver("/proc")
    first = resolver.resolve(pids)

    def no_parse(stat: bytes) -> int:
        raise AssertionError("a hit on procfs parsed the stat file")

    monkeypatch.setattr(cgroups, "_start_time", no_parse)
    assert resolver.resolve(pids) == first
    assert resolver.stats().cache_hits == 2
    resolver.close()


def test_held_files_are_capped(children: list[subprocess.Popen[bytes]]) -> None:
    pids = spawn(children, 4)
    resolver = PidResolver("/proc", max_held_fds=2)
    first = resolver.resolve(pids)
    stats = resolver.stats()
    assert (stats.cached_pids, stats.held_fds) == (4, 2)
    # PIDs past the cap use path reads, with the same answers and the same cache.
    assert resolver.resolve(pids) == first
    assert resolver.stats().cache_hits == 4
    resolver.close()


def test_fake_trees_hold_files_and_notice_removed_or_replaced_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tree that is not procfs (a copy, the tests' and the benchmark's fake trees) holds
    # the stat files too; a held regular file would go on reading a removed or replaced
    # file's old contents, so a file no longer linked sends the PID back to a path lookup.
    root = tmp_path / "proc"
    for pid in (1, 2, 3):
        write_proc(root, pid, CASES["v2-systemd-crio"][0], start=100 + pid)
    resolver = PidResolver(str(root))
    first = resolver.resolve([1, 2, 3])
    assert resolver.stats().held_fds == 3
    # A hit is an fstat and a pread on the held file: no path is opened.
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, *args: int, **kwargs: int) -> int:
        opened.append(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    assert resolver.resolve([1, 2, 3]) == first
    monkeypatch.undo()
    assert opened == []
    # PID 2's process exits and a new one in another pod gets the PID, its files written
    # to new inodes renamed over the old ones (as a copy tool would): the new one is seen,
    # although the old file's contents (start time included) are unchanged.
    new = tmp_path / "new"
    write_proc(new, 2, CASES["v2-systemd-containerd-guaranteed"][0], start=102)
    for name in ("stat", "cgroup"):
        os.replace(new / "2" / name, root / "2" / name)
    # PID 3's process exits: its entry is removed.
    remove_proc(root, 3)
    got = resolver.resolve([1, 2, 3])
    assert got[1] == first[1]
    assert got[2] == ContainerRef(UID_GUARANTEED, CID_C, "containerd")
    assert got[3] is UNKNOWN_OWNER
    stats = resolver.stats()
    assert (stats.cached_pids, stats.held_fds, stats.vanished) == (2, 2, 1)
    resolver.close()
    assert resolver.stats().held_fds == 0


def test_fake_tree_stat_rewritten_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A tree that is not procfs, its stat file rewritten in place (same inode): the same
    # start time with other fields changed is the same process (a hit, cgroup not re-read,
    # the new bytes remembered so that the next hit parses nothing); another start time is
    # a new process behind the PID.
    root = tmp_path / "proc"
    write_proc(root, 7, CASES["v2-systemd-crio"][0], start=500, comm="python3")
    resolver = PidResolver(str(root))
    first = resolver.resolve([7])[7]
    assert first == ContainerRef(UID_CRIO, CID_D, "cri-o")
    ino = (root / "7" / "stat").stat().st_ino
    (root / "7" / "stat").write_text(stat_line(7, "renamed", 500))
    (root / "7" / "cgroup").write_text("0::/init.scope\n")  # not read on a hit
    assert (root / "7" / "stat").stat().st_ino == ino
    assert resolver.resolve([7])[7] == first
    assert (resolver.stats().cache_hits, resolver.stats().cache_misses) == (1, 1)
    parsed: list[bytes] = []
    real_start_time = cgroups._start_time

    def counting(stat: bytes) -> int:
        parsed.append(stat)
        return real_start_time(stat)

    monkeypatch.setattr(cgroups, "_start_time", counting)
    assert resolver.resolve([7])[7] == first
    assert parsed == []  # the same bytes as last read: nothing to parse
    (root / "7" / "stat").write_text(stat_line(7, "python3", 900))
    assert resolver.resolve([7])[7] is None  # a new process: its cgroup is the host's
    assert resolver.stats().cache_misses == 2
    resolver.close()


def test_hold_fds_false_reads_by_path(proc: Path) -> None:
    resolver = PidResolver(str(proc), hold_fds=False)
    resolver.resolve(list(range(1000, 1000 + len(CASES))))
    assert resolver.stats().held_fds == 0


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/proc", True),
        ("/proc/1", True),
        ("/host/proc", True),
        ("/host/proc/self", True),
        ("/host/procfake", False),
        ("/", False),
        ("/mnt/with space", True),
        ("/tmp", False),
    ],
)
def test_is_procfs_reads_the_mount_table(tmp_path: Path, path: str, expected: bool) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "23 22 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
        "24 22 0:23 / /tmp rw - tmpfs tmpfs rw\n"
        "25 22 0:22 / /host/proc rw,nosuid - proc proc rw\n"
        "26 22 0:22 / /mnt/with\\040space rw - proc proc rw\n"
        "garbage line\n"
    )
    # realpath() of a path that does not exist here is the path itself.
    assert is_procfs(path, mountinfo=str(table)) is expected


def test_is_procfs_unreadable_table_is_false(tmp_path: Path) -> None:
    assert is_procfs("/proc", mountinfo=str(tmp_path / "absent")) is False
    assert is_procfs("/proc") is True  # this machine's own table
