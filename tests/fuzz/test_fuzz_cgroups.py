"""Fuzzing ``gpuscope.exporter.kubernetes.cgroups``: ``/proc/<pid>/cgroup`` text to (pod UID,
container ID).

``parse_cgroup`` documents no error at all: any text gives a :class:`ContainerRef` or
``None``. :class:`PidResolver` reads the bytes from ``/proc`` and "never raises for
unreadable or missing files". Generated cgroup paths in every layout the module documents
(cgroup v1/v2/hybrid, cgroupfs/systemd drivers, containerd/cri-o/docker, nesting, private
cgroup namespaces) must give back the pod UID and container ID they were built from.
Settings: see ``tests/fuzz/_profile.py``.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass

from hypothesis import example, given
from hypothesis import strategies as st

from gpuscope.exporter.kubernetes.cgroups import (
    UNKNOWN_OWNER,
    ContainerRef,
    PidResolver,
    parse_cgroup,
)
from tests.fuzz._profile import fuzz

_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")
_CID = re.compile(r"[0-9a-f]{64}")
_RUNTIMES = {"", "containerd", "cri-o", "docker"}

HEX = "0123456789abcdefABCDEF"


def well_formed(ref: ContainerRef | None) -> bool:
    return ref is None or (
        _UID.fullmatch(ref.pod_uid) is not None
        and _CID.fullmatch(ref.container_id) is not None
        and ref.runtime in _RUNTIMES
    )


# -- arbitrary input ---------------------------------------------------------------------------

# Text close to the real thing: cgroup-ish punctuation and path words mixed with anything.
_PIECES = st.sampled_from([
    "0::", "4:memory:", "1:name=systemd:", "/", "/..", "kubepods", "kubepods.slice",
    "kubepods-burstable.slice", "-pod", "pod", "_", "-", ".slice", ".scope", "cri-containerd-",
    "crio-", "crio-conmon-", "docker-", " (deleted)", "\n", "\r\n", "\x00", "\u2028", ":",
    "0" * 8, "a" * 32, "f" * 64, "F" * 63, "7c3b5a1e-9f2d-4c8b-a1e3-5d6f7a8b9c0d",
    "7c3b5a1e_9f2d_4c8b_a1e3_5d6f7a8b9c0d", "\ufffd", "\u00b2", "\u0661",
])
CGROUPISH = st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=40).map("".join)


@fuzz(400)
@given(text=st.one_of(st.text(), CGROUPISH))
@example("\x00\xff not a cgroup file\n:::\n12\n")
@example("²::/kubepods/pod" + "a" * 32 + "/" + "f" * 64)  # a non-ASCII digit as hierarchy id
@example("0::" + "/a" * 20_000)  # a long path
@example("0::/" + "x" * 1_000_000)  # a huge line
def test_any_text_gives_none_or_a_well_formed_ref(text: str) -> None:
    assert well_formed(parse_cgroup(text))


@fuzz(200)
@given(data=st.binary(max_size=2048))
@example(b"0::/kubepods/pod" + b"a" * 32 + b"/\xff" + b"f" * 64)
def test_any_bytes_decoded_like_the_resolver_gives_none_or_a_well_formed_ref(
    data: bytes,
) -> None:
    # PidResolver decodes with errors="replace": non-UTF-8 becomes U+FFFD, never an error.
    assert well_formed(parse_cgroup(data.decode("utf-8", "replace")))


@fuzz(100)
@given(cgroup=st.binary(max_size=600), stat=st.binary(max_size=300),
       valid_stat=st.booleans())
@example(cgroup=b"0::/\x00", stat=b"1 (a) S" + b" 1" * 30, valid_stat=False)
@example(cgroup=b"", stat=b"1 (x) " + b"9" * 5000, valid_stat=False)
def test_resolver_never_raises_on_any_file_content(
    cgroup: bytes, stat: bytes, valid_stat: bool,
) -> None:
    if valid_stat:  # reach the cgroup parse with a cacheable start time
        stat = b"4242 (py) S " + b" ".join([b"1"] * 18) + b" 777 " + stat
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "4242"))
        for name, content in (("cgroup", cgroup), ("stat", stat)):
            with open(os.path.join(root, "4242", name), "wb") as f:
                f.write(content)
        resolver = PidResolver(root)
        for _ in range(2):  # second round: the cache path
            out = resolver.resolve([4242, 4243])
            # (4243 has no /proc entry: its owner is unknown, not a host's.)
            assert set(out) == {4242, 4243} and out[4243] is UNKNOWN_OWNER
            assert out[4242] is UNKNOWN_OWNER or well_formed(out[4242])
        stats = resolver.stats()
        assert stats.vanished == 2 and stats.cached_pids <= 1


# -- valid layouts round-trip ------------------------------------------------------------------

V1_CONTROLLERS = ["12:pids", "11:hugetlb", "10:net_cls,net_prio", "7:memory", "6:devices",
                  "4:blkio", "3:cpuset", "1:name=systemd"]


@dataclass(frozen=True)
class Layout:
    uid: str  # as the kubelet writes it: dashed UUID or a static pod's 32-hex hash
    cid: str  # 64 hex, any case
    driver: str  # cgroupfs | systemd
    runtime: str  # containerd | cri-o | docker
    qos: str  # guaranteed | burstable | besteffort
    nesting: str  # none | kind | k3s
    relative: int  # ".." levels of a private cgroup namespace (0: the host's view)
    version: str  # v1 | v2 | hybrid
    deleted: bool
    subcgroup: bool
    noise: tuple[str, ...]  # lines before ours that name no container

    def path(self) -> str:
        uid = self.uid
        outer = "d41d8cd98f00b204e9800998ecf8427e0a1b2c3d4e5f60718293a4b5c6d7e8f9"
        if self.driver == "cgroupfs":
            parts = ["docker", outer] if self.nesting == "k3s" else []
            parts += ["kubepods"] + ([] if self.qos == "guaranteed" else [self.qos])
            pod_at = len(parts)
            parts.append(f"pod{uid}")
            parts.append(f"crio-{self.cid}" if self.runtime == "cri-o" else self.cid)
        else:
            esc = uid.replace("-", "_")
            lead = "kubepods"
            parts = []
            if self.nesting == "kind":
                lead = "kubelet-kubepods"
                parts = ["system.slice", f"docker-{outer}.scope", "kubelet.slice"]
            parts.append(f"{lead}.slice")
            if self.qos != "guaranteed":
                parts.append(f"{lead}-{self.qos}.slice")
            pod_at = len(parts)
            qos = "" if self.qos == "guaranteed" else f"-{self.qos}"
            parts.append(f"{lead}{qos}-pod{esc}.slice")
            prefix = {"containerd": "cri-containerd", "cri-o": "crio", "docker": "docker"}
            parts.append(f"{prefix[self.runtime]}-{self.cid}.scope")
        if self.subcgroup:
            parts.append("init.scope")
        if self.relative:
            # Seen from inside a private cgroup namespace: up some levels, then the path
            # from the pod's parent on (the part shared with the reader's cgroup is cut).
            parts = [".."] * self.relative + parts[max(0, pod_at - 1):]
        return "/" + "/".join(parts) + (" (deleted)" if self.deleted else "")

    def text(self) -> str:
        path = self.path()
        if self.version == "v2":
            lines = ["0::" + path]
        elif self.version == "hybrid":
            lines = ["0::/", *[f"{c}:{path}" for c in V1_CONTROLLERS]]
        else:
            lines = ["13:rdma:/", *[f"{c}:{path}" for c in V1_CONTROLLERS], "0::/"]
        return "\n".join([*self.noise, *lines]) + "\n"

    def expected(self) -> ContainerRef:
        runtime = self.runtime if self.driver == "systemd" else (
            "cri-o" if self.runtime == "cri-o" else "")
        return ContainerRef(self.uid.lower(), self.cid.lower(), runtime)


uids = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.text(alphabet=HEX, min_size=32, max_size=32),  # static pod: config hash
)
cids = st.text(alphabet=HEX, min_size=64, max_size=64)
noise_lines = st.sampled_from([
    "0::/", "0::/init.scope", "13:rdma:/", "0::/system.slice/sshd.service",
    "0::/user.slice/user-1000.slice/session-3.scope", "garbage", ":::", "",
    # A docker container outside Kubernetes and a pod cgroup itself: no container.
    "0::/system.slice/docker-" + "e" * 64 + ".scope",
    "0::/kubepods/burstable/pod7c3b5a1e-9f2d-4c8b-a1e3-5d6f7a8b9c0d",
    "0::/kubepods.slice/kubepods-pod7c3b5a1e_9f2d_4c8b_a1e3_5d6f7a8b9c0d.slice/crio-conmon-"
    + "a" * 64 + ".scope",
])


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    driver = draw(st.sampled_from(["cgroupfs", "systemd"]))
    runtime = draw(st.sampled_from(["containerd", "cri-o", "docker"]))
    nesting = draw(st.sampled_from(["none", "kind" if driver == "systemd" else "k3s"]))
    return Layout(
        uid=draw(uids), cid=draw(cids), driver=driver, runtime=runtime,
        qos=draw(st.sampled_from(["guaranteed", "burstable", "besteffort"])),
        nesting=nesting, relative=draw(st.integers(0, 3)),
        version=draw(st.sampled_from(["v1", "v2", "hybrid"])),
        deleted=draw(st.booleans()), subcgroup=draw(st.booleans()),
        noise=tuple(draw(st.lists(noise_lines, max_size=3))),
    )


@fuzz(400)
@given(layout=layouts())
def test_every_documented_layout_round_trips(layout: Layout) -> None:
    text = layout.text()
    assert parse_cgroup(text) == layout.expected(), text


@fuzz(100)
@given(layout=layouts(), cut=st.integers(1, 63))
def test_a_truncated_container_id_names_no_container(layout: Layout, cut: int) -> None:
    short = Layout(**{**layout.__dict__, "cid": layout.cid[:cut], "noise": ()})
    assert parse_cgroup(short.text()) is None


@fuzz(100)
@given(layout=layouts())
def test_crio_conmon_is_not_the_container(layout: Layout) -> None:
    conmon = Layout(**{**layout.__dict__, "driver": "systemd", "runtime": "cri-o",
                       "subcgroup": False, "noise": ()})
    text = conmon.text().replace("/crio-", "/crio-conmon-")
    assert parse_cgroup(text) is None
