"""Pod and node metadata from the API server: configuration (kubeconfig, in-cluster),
authentication (token, token file rotation, exec plugin, client certificates), TLS, and the
list/watch/node loops, against a fake API server over real HTTP(S).

The fake serves what the watcher asks a real API server for: ``GET /api/v1/pods`` lists
(field selector honoured, ``limit``/``continue`` pagination), watches as chunked JSON lines
(ADDED, MODIFIED, DELETED, BOOKMARK, ERROR 410, a clean end or a dropped connection), and
``GET /api/v1/nodes/<name>``. It checks the bearer token like the API server does (401).
Every wait is bounded. What objects mean (workloads, containers, node labels) is tested in
``test_workload.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml
from lightkube import KubeConfig, SingleConfig
from lightkube.config.models import Cluster, User

from gpuscope.exporter.kubernetes.apiserver import (
    KubeConfigError,
    MetadataDisabled,
    NodeInfo,
    PodMetadataWatcher,
    load_config,
)
from tests.conftest import REPO
from tests.pki import TestCA
from tests.ports import free_port

NODE = "ip-10-0-12-34.ec2.internal"
OTHER_NODE = "ip-10-0-99-1.ec2.internal"
TOKEN = "eyJhbGciOiJSUzI1NiIsImtpZCI6InRlc3QifQ.sa-token-1"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
CID = [
    "4f1c9a2be8d7c6b5a49382716f5e4d3c2b1a0f9e8d7c6b5a4938271605f4e3d2",
    "a3e2c1d0b9f8e7d6c5b4a3928170f6e5d4c3b2a1908f7e6d5c4b3a2918071f6e",
    "0b7d5e3f1a9c8b7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d",
    "e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8",
    "5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d",
]
UID_A = "7c3b5a1e-9f2d-4c8b-a1e3-5d6f7a8b9c0d"
UID_B = "2f8e6d4c-1b3a-4e5f-9a7b-c8d6e4f2a0b1"
UID_C = "b5d9e1f3-7a2c-4d6e-8f0a-1c3e5a7b9d2f"
UID_OTHER = "e04c7a39-5b1d-4f8e-a6c2-3d9b0f7e1a54"

NODE_LABELS = {
    "kubernetes.io/hostname": NODE,
    "node.kubernetes.io/instance-type": "p4d.24xlarge",
    "topology.kubernetes.io/zone": "us-east-1a",
    "eks.amazonaws.com/capacityType": "SPOT",
    "nvidia.com/gpu.present": "true",
}


def pod_json(
    name: str,
    uid: str,
    *,
    node: str = NODE,
    namespace: str = "ml",
    labels: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    containers: list[tuple[str, str]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """A Pod object as the API server returns it (the parts the watcher reads, plus noise)."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "1",
            "creationTimestamp": "2026-07-20T10:00:00Z",
            "labels": labels or {},
            "ownerReferences": owners or [],
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-07-20T09:59:00Z"},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": n, "image": "nvcr.io/nvidia/pytorch:24.05-py3"} for n, _ in containers
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.12.77",
            "containerStatuses": [
                {
                    "name": n,
                    "containerID": f"containerd://{cid}",
                    "ready": True,
                    "restartCount": 0,
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                }
                for n, cid in containers
            ],
        },
    }


def rs_owner(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": name,
        "uid": "0d9a8c1e-3f4b-4a5c-9d6e-7f8a9b0c1d2e",
        "controller": True,
        "blockOwnerDeletion": True,
    }


# --------------------------------------------------------------------------------------
# Fake API server
# --------------------------------------------------------------------------------------


def is_watch(query: dict[str, str]) -> bool:
    return query.get("watch") in ("1", "true")  # the API server takes both


def go_json(doc: Any) -> bytes:
    """JSON as the API server writes it (Go's encoding/json): non-ASCII characters as raw
    UTF-8, except U+2028 and U+2029 (escaped, as are control characters below U+0020)."""
    text = json.dumps(doc, ensure_ascii=False)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode()


@dataclass
class Seen:
    path: str
    query: dict[str, str]
    headers: dict[str, str]


class FakeApi:
    """A minimal API server: pods (list, watch), nodes (get), bearer-token auth."""

    def __init__(self, *, port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self.port = port
        self.tls = tls
        self.token: str | None = TOKEN
        self.old_tokens: set[str] = set()  # also accepted (a rotated token not yet expired)
        self.pods: dict[str, dict[str, Any]] = {}
        self.node_labels = dict(NODE_LABELS)
        self.rv = 1000
        self.seen: list[Seen] = []
        self.unauthorized = 0
        self.watch_actions: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.watch_statuses: list[int] = []  # answer the next watch requests with these
        self.list_gate: threading.Event | None = None  # set → list requests wait on it
        self.watch_connection_close = False  # answer watches with "Connection: close"
        self.watch_end_at_once = False  # end every watch cleanly, before any event
        self.drop_kept_alive = False  # close a connection at its second request, unanswered
        # DRA ResourceSlices (resource.k8s.io/v1): None = not served (404, a cluster before
        # 1.34), else these objects; resource_slices_status answers lists with an error.
        self.resource_slices: list[dict[str, Any]] | None = None
        self.resource_slices_status: int | None = None
        # Answer the slices' watches (not their lists) with this status: a broken watch.
        self.resource_slices_watch_status: int | None = None
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self.connections: set[socket.socket] = set()  # open client connections

    # -- state changes -----------------------------------------------------------------

    def _bump(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        pod = json.loads(json.dumps(pod))
        pod["metadata"]["resourceVersion"] = str(self.rv)
        return pod

    def put(self, pod: dict[str, Any], event: str | None = None) -> None:
        with self.lock:
            pod = self._bump(pod)
            self.pods[pod["metadata"]["uid"]] = pod
        if event:
            self.watch_actions.put(("event", {"type": event, "object": pod}))

    def delete(self, uid: str, event: bool = True) -> None:
        with self.lock:
            pod = self._bump(self.pods.pop(uid))
        if event:
            self.watch_actions.put(("event", {"type": "DELETED", "object": pod}))

    def bookmark(self, rv: str) -> None:
        self.watch_actions.put(
            (
                "event",
                {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": "Pod",
                        "apiVersion": "v1",
                        "metadata": {
                            "resourceVersion": rv,
                            "annotations": {"k8s.io/initial-events-end": "true"},
                        },
                    },
                },
            )
        )

    def gone(self) -> None:
        self.error_event(410, "Expired", "too old resource version: 1001 (1500)")

    def error_event(self, code: int, reason: str, message: str) -> None:
        self.watch_actions.put(
            (
                "event",
                {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": message,
                        "reason": reason,
                        "code": code,
                    },
                },
            )
        )

    # -- requests seen -----------------------------------------------------------------

    def lists(self) -> list[Seen]:
        with self.lock:
            return [
                s for s in self.seen if s.path == "/api/v1/pods" and not is_watch(s.query)
            ]

    def watches(self) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if is_watch(s.query) and s.path == "/api/v1/pods"]

    def slice_requests(self) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path == SLICES_PATH]

    def node_gets(self) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path.startswith("/api/v1/nodes/")]

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> FakeApi:
        self.stopping.clear()
        httpd = _QuietServer(("127.0.0.1", self.port), _handler(self))
        httpd.daemon_threads = True
        if self.tls is not None:
            httpd.socket = self.tls.wrap_socket(httpd.socket, server_side=True)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        """Go down: refuse new connections, break the streams in flight and close the idle
        keep-alive connections, as an API server that goes away does. Down from the first
        line on: the listening socket stays open until ``server_close()`` (for as long as
        this thread is descheduled on a busy machine), and a request that gets in meanwhile
        is cut unanswered (``do_GET``), never served."""
        self.stopping.set()
        with self.lock:
            connections = list(self.connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that aborts (stop(), read timeouts) leaves the handler writing to a
        # closed socket: expected here. Anything else is a bug in the fake: show it.
        if not isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError)):
            super().handle_error(request, client_address)


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked transfer for watches

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            self.served = 0
            with api.lock:
                api.connections.add(self.connection)

        def finish(self) -> None:
            with api.lock:
                api.connections.discard(self.connection)
            with contextlib.suppress(OSError):
                super().finish()

        def _json(self, status: int, doc: dict[str, Any]) -> None:
            body = go_json(doc)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._json(
                code,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": message,
                    "reason": reason,
                    "code": code,
                },
            )

        def do_GET(self) -> None:
            if api.stopping.is_set():
                # stop() has begun: answer nothing. Serving a list here (the listener is
                # still open until server_close()) would let the watcher sync again and
                # open a watch that stop() then cuts: an outage that looked like two
                # (issue 13's flaky watch_errors_total == 2).
                self._drop()
                return
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            with api.lock:
                api.seen.append(Seen(url.path, query, dict(self.headers.items())))
            self.served += 1
            if api.drop_kept_alive and self.served > 1:
                self._drop()
                return
            accepted = {f"Bearer {t}" for t in {api.token, *api.old_tokens} if t is not None}
            if api.token is not None and self.headers.get("Authorization") not in accepted:
                with api.lock:
                    api.unauthorized += 1
                self._status(401, "Unauthorized", "Unauthorized")
                return
            if url.path == "/api/v1/pods":
                selector = query.get("fieldSelector", "")
                node = selector.removeprefix("spec.nodeName=") if selector else None
                if is_watch(query):
                    self._watch(query)
                else:
                    self._list(query, node)
            elif url.path == SLICES_PATH and (
                    api.resource_slices is not None or api.resource_slices_status):
                self._slices(query)
            elif url.path.startswith("/api/v1/nodes/"):
                name = urllib.parse.unquote(url.path.rsplit("/", 1)[1])
                if name != NODE:
                    self._status(404, "NotFound", f'nodes "{name}" not found')
                    return
                self._json(
                    200,
                    {
                        "kind": "Node",
                        "apiVersion": "v1",
                        "metadata": {
                            "name": NODE,
                            "uid": "5d1c9e2f-0a3b-4c5d-8e6f-7a8b9c0d1e2f",
                            "labels": api.node_labels,
                        },
                        "status": {"capacity": {"nvidia.com/gpu": "8"}},
                    },
                )
            else:
                self._status(404, "NotFound", "the server could not find the requested resource")

        def _list(self, query: dict[str, str], node: str | None) -> None:
            if api.list_gate is not None:
                api.list_gate.wait(10)
            with api.lock:
                items = [
                    p for p in api.pods.values() if node is None or p["spec"]["nodeName"] == node
                ]
                rv = str(api.rv)
            start = int(query.get("continue", "0"))
            limit = int(query.get("limit", "0")) or len(items) or 1
            page = items[start : start + limit]
            meta: dict[str, Any] = {"resourceVersion": rv}
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            self._json(
                200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page}
            )

        def _slices(self, query: dict[str, str]) -> None:
            if api.resource_slices_status:
                self._status(api.resource_slices_status, "Forbidden",
                             'resourceslices.resource.k8s.io is forbidden: User '
                             '"system:serviceaccount:gpuscope:gpuscope-exporter" cannot list '
                             'resource "resourceslices" in API group "resource.k8s.io"')
                return
            if is_watch(query) and api.resource_slices_watch_status:
                self._status(api.resource_slices_watch_status, "InternalError",
                             "an error on the server has prevented the request from succeeding")
                return
            if is_watch(query):  # an idle watch: open until the server goes down
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                while not api.stopping.wait(0.02):
                    pass
                self._drop()
                return
            selector = query.get("fieldSelector", "").removeprefix("spec.nodeName=")
            with api.lock:
                items = [s for s in api.resource_slices or ()
                         if not selector or s["spec"].get("nodeName") == selector]
                rv = str(api.rv)
            self._json(200, {"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                             "metadata": {"resourceVersion": rv}, "items": items})

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _watch(self, query: dict[str, str]) -> None:
            with api.lock:
                status = api.watch_statuses.pop(0) if api.watch_statuses else None
            if status == 410:
                self._status(410, "Expired", "too old resource version")
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            if api.watch_connection_close:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
            if api.watch_end_at_once:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
            while True:
                if api.stopping.is_set():
                    self._drop()
                    return
                try:
                    action, arg = api.watch_actions.get(timeout=0.02)
                except queue.Empty:
                    continue
                if action == "event":
                    self._chunk(go_json(arg) + b"\n")
                elif action == "close":  # the server's timeoutSeconds: a clean end
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    self.close_connection = True
                    return
                elif action == "drop":  # connection lost mid-stream
                    self._drop()
                    return

        def _drop(self) -> None:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    return Handler


@pytest.fixture
def api() -> Iterator[FakeApi]:
    server = FakeApi().start()
    yield server
    server.stop()


def wait_until(pred: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}")


def token_config(url: str, token: str = TOKEN, **cluster: Any) -> SingleConfig:
    """A configuration with a static bearer token, as lightkube builds one."""
    config = KubeConfig.from_one(cluster=Cluster(server=url, **cluster), user=User(token=token))
    single = config.get()
    assert single is not None
    return single


def make_watcher(url: str, **kw: Any) -> PodMetadataWatcher:
    config = kw.pop("config", None) or token_config(url)
    node = kw.pop("node_name", NODE)
    defaults: dict[str, Any] = dict(
        request_timeout_s=2.0,
        backoff_initial_s=0.02,
        backoff_max_s=0.2,
        node_retry_s=0.05,
    )
    defaults.update(kw)
    return PodMetadataWatcher(config, node, **defaults)


@pytest.fixture
def watcher_factory() -> Iterator[Callable[..., PodMetadataWatcher]]:
    made: list[PodMetadataWatcher] = []

    def factory(url: str, **kw: Any) -> PodMetadataWatcher:
        w = make_watcher(url, **kw)
        made.append(w)
        w.start()
        return w

    yield factory
    for w in made:
        w.stop(2.0)


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


def write_kubeconfig(
    path: Path, server: str, user: dict[str, Any], cluster_extra: dict[str, Any] | None = None
) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "gpu-admin@prod",
        "clusters": [
            {"name": "staging", "cluster": {"server": "https://staging.invalid"}},
            {"name": "prod", "cluster": {"server": server, **(cluster_extra or {})}},
        ],
        "contexts": [
            {
                "name": "gpu-admin@prod",
                "context": {"cluster": "prod", "user": "gpu-admin", "namespace": "ml"},
            }
        ],
        "users": [
            {"name": "someone-else", "user": {"token": "wrong"}},
            {"name": "gpu-admin", "user": user},
        ],
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_kubeconfig_current_context_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    path = write_kubeconfig(
        tmp_path / "config",
        "https://api.prod.example:6443",
        {
            "tokenFile": "certs/token",
            "client-certificate": "certs/c.crt",
            "client-key": "/abs/c.key",
            "exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                     "command": "./bin/get-token", "args": ["--profile", "gpu"]},
        },
        {"certificate-authority": "certs/ca.crt"},
    )
    cfg = load_config(str(path))
    assert isinstance(cfg, SingleConfig)
    assert (cfg.context_name, cfg.cluster.server) == (
        "gpu-admin@prod", "https://api.prod.example:6443"
    )
    assert cfg.user is not None and cfg.user.exec is not None
    # Resolved against the kubeconfig's directory, as kubectl does (lightkube resolves the
    # certificate paths itself when it loads them: the TLS tests use relative ones).
    assert cfg.user.token_file == str(tmp_path / "certs" / "token")
    assert cfg.user.exec.command == str(tmp_path / "bin" / "get-token")
    assert cfg.abs_file(cfg.user.client_key or "") == "/abs/c.key"
    assert cfg.abs_file(cfg.cluster.certificate_auth or "") == tmp_path / "certs" / "ca.crt"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("current-context"), "No current context"),
        (lambda d: d.update({"current-context": "nope"}), "Context 'nope' not found"),
        (
            lambda d: d["contexts"][0]["context"].update({"cluster": "gone"}),
            "no cluster or user named 'gone'",
        ),
        (lambda d: d.pop("clusters"), "no 'clusters' list"),
        (
            lambda d: d["users"][1].update({"user": {"auth-provider": {"name": "oidc"}}}),
            "auth-provider is not supported",
        ),
        (
            lambda d: d["users"][1].update({"user": {"exec": {
                "apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}}}),
            "exec apiVersion 'client.authentication.k8s.io/v1' is not supported",
        ),
        (
            lambda d: d["clusters"][1]["cluster"].update({"server": "ftp://x"}),
            "is not http(s)://host",
        ),
        (lambda d: d["clusters"][1].update({"cluster": {"server": 7}}), "Expected `str`"),
        # urlsplit's ValueError (a traceback, exit 1), and a port httpx2 would wrap round.
        (
            lambda d: d["clusters"][1]["cluster"].update({"server": "https://[::1"}),
            "API server URL 'https://[::1' is not http(s)://host",
        ),
        (
            lambda d: d["clusters"][1]["cluster"].update({"server": "https://10.0.0.1:99999"}),
            "API server URL 'https://10.0.0.1:99999' has a bad port",
        ),
    ],
    ids=["no-current-context", "unknown-context", "undefined-cluster", "no-clusters",
         "auth-provider", "exec-v1", "not-http", "malformed", "bad-ipv6", "bad-port"],
)
def test_kubeconfig_errors(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], Any], message: str
) -> None:
    path = write_kubeconfig(tmp_path / "config", "https://x", {"token": "t"})
    doc = yaml.safe_load(path.read_text())
    mutate(doc)
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeConfigError, match=re.escape(message)) as info:
        load_config(str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_kubeconfig_unreadable(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="not found"):
        load_config(str(tmp_path / "missing"))
    (tmp_path / "bad").write_text("clusters: [\n")
    with pytest.raises(KubeConfigError, match=r"kubeconfig .*bad"):
        load_config(str(tmp_path / "bad"))
    # PyYAML recurses once a level: a RecursionError traceback, exit 1.
    (tmp_path / "deep").write_text("[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(KubeConfigError, match=r"kubeconfig .*deep: nested too deeply"):
        load_config(str(tmp_path / "deep"))


@pytest.mark.parametrize("text", ["", "[]\n", "hello\n", "clusters: 5\n",
                                  "clusters: [5]\n", "contexts: x\nclusters: []\n"],
                         ids=["empty", "list", "string", "clusters-int", "cluster-int",
                              "contexts-string"])
def test_kubeconfig_not_of_its_shape_says_what_it_expects(tmp_path: Path, text: str) -> None:
    """Not "'NoneType' object has no attribute 'get'": what a kubeconfig is."""
    (tmp_path / "config").write_text(text)
    with pytest.raises(KubeConfigError) as info:
        load_config(str(tmp_path / "config"))
    assert str(info.value).startswith(f"kubeconfig {tmp_path / 'config'}: not a kubeconfig: "
                                      "expected a mapping with clusters, contexts and users "
                                      "lists of mappings")


def service_account(directory: Path, token: str, ca: bytes | None = b"pem") -> Path:
    directory.mkdir()
    (directory / "token").write_text(token)
    (directory / "namespace").write_text("gpuscope")
    if ca is not None:
        (directory / "ca.crt").write_bytes(ca)
    return directory


def test_in_cluster_config_and_names_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    off = load_config(None, serviceaccount_dir=str(empty))
    assert isinstance(off, MetadataDisabled)
    assert "metadata disabled" in off.reason and "KUBERNETES_SERVICE_HOST" in off.reason

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "172.20.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    off = load_config(None, serviceaccount_dir=str(empty))  # no token mounted
    assert isinstance(off, MetadataDisabled) and "automountServiceAccountToken" in off.reason
    (empty / "token").write_text(TOKEN)  # a token, but not the rest of the mount
    off = load_config(None, serviceaccount_dir=str(empty))
    assert isinstance(off, MetadataDisabled) and "namespace" in off.reason
    no_ca = service_account(tmp_path / "no-ca", TOKEN, ca=None)
    off = load_config(None, serviceaccount_dir=str(no_ca))
    assert isinstance(off, MetadataDisabled) and "ca.crt is missing" in off.reason

    sa = service_account(tmp_path / "sa", TOKEN)
    cfg = load_config(None, serviceaccount_dir=str(sa))
    assert isinstance(cfg, SingleConfig) and cfg.user is not None
    assert cfg.cluster.server == "https://172.20.0.1:443"
    assert cfg.cluster.certificate_auth == str(sa / "ca.crt")
    assert cfg.user.token_file == str(sa / "token")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1")
    v6 = load_config(None, serviceaccount_dir=str(sa))
    assert isinstance(v6, SingleConfig) and v6.cluster.server == "https://[fd00:10:96::1]:443"


def test_names_off_does_not_load_lightkube(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from gpuscope.exporter.kubernetes.apiserver import MetadataDisabled, load_config\n"
        "assert isinstance(load_config(None), MetadataDisabled)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules}"
        " & {'lightkube', 'httpx2', 'httpcore2', 'msgspec', 'anyio'}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("kubeconfig", "fragment"),
    [
        ("missing", "--kubeconfig: kubeconfig {tmp}/missing: Configuration file"),
        ("missing-ca", "--kubeconfig: kubeconfig {tmp}/missing-ca (context gpu-admin@prod): "
                       "certificate-authority {tmp}/no-such-ca.crt does not exist"),
        ("bad-ca", "--kubeconfig: TLS or credentials of kubeconfig {tmp}/bad-ca"),
    ],
    ids=["missing-file", "missing-ca", "bad-ca"],
)
def test_cli_bad_kubeconfig_is_one_line_and_exit_2(
    tmp_path: Path, kubeconfig: str, fragment: str
) -> None:
    write_kubeconfig(tmp_path / "missing-ca", "https://127.0.0.1:6443", {"token": TOKEN},
                     {"certificate-authority": "no-such-ca.crt"})
    (tmp_path / "not-a-ca.crt").write_text("not a certificate\n")
    write_kubeconfig(tmp_path / "bad-ca", "https://127.0.0.1:6443", {"token": TOKEN},
                     {"certificate-authority": "not-a-ca.crt"})
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.exporter", "--kubeconfig", str(tmp_path / kubeconfig),
         "--node-name", NODE],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("gpuscope-exporter: error: " + fragment.format(tmp=tmp_path))


def test_bad_tls_material_and_arguments(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=r"certificate-authority .*missing-ca\.crt does"):
        PodMetadataWatcher(
            token_config("https://127.0.0.1:1", certificate_auth=str(tmp_path / "missing-ca.crt")),
            NODE,
        )
    garbage = KubeConfig.from_one(
        cluster=Cluster(server="https://127.0.0.1:1"),
        user=User(client_cert_data="bm90IGEgY2VydA==", client_key_data="bm90IGEga2V5"),
    ).get()
    assert garbage is not None
    with pytest.raises(KubeConfigError, match="TLS or credentials"):
        PodMetadataWatcher(garbage, NODE)
    with pytest.raises(KubeConfigError, match="not http"):
        PodMetadataWatcher(token_config("ftp://x"), NODE)
    with pytest.raises(ValueError, match="node_name"):
        PodMetadataWatcher(token_config("http://x"), "")


# --------------------------------------------------------------------------------------
# Watcher against the fake API server
# --------------------------------------------------------------------------------------


def seed(api: FakeApi) -> None:
    api.put(
        pod_json(
            "llm-serve-7d9f8b6c5d-x2k9p",
            UID_A,
            labels={"pod-template-hash": "7d9f8b6c5d"},
            owners=[rs_owner("llm-serve-7d9f8b6c5d")],
            containers=[("server", CID[0]), ("envoy", CID[1])],
        )
    )
    api.put(pod_json("elsewhere", UID_OTHER, node=OTHER_NODE, containers=[("x", CID[4])]))


def test_list_watch_bookmark_and_rewatch(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    w = watcher_factory(api.url)
    assert w.wait_synced(5)
    snap = w.snapshot()
    assert set(snap.pods) == {UID_A}  # the other node's pod is filtered by the selector
    pod = snap.pods[UID_A]
    assert (pod.namespace, pod.name, pod.workload) == (
        "ml",
        "llm-serve-7d9f8b6c5d-x2k9p",
        "Deployment/llm-serve",
    )
    assert snap.container_name(UID_A, CID[1]) == "envoy"
    first = api.lists()[0]
    assert first.path == "/api/v1/pods"  # all namespaces
    assert first.query["fieldSelector"] == f"spec.nodeName={NODE}"
    assert first.query["limit"] == "500"
    assert "resourceVersion" not in first.query  # a consistent list
    assert first.headers["Authorization"] == f"Bearer {TOKEN}"
    assert first.headers["User-Agent"].startswith("gpuscope-exporter/")

    wait_until(lambda: len(api.watches()) == 1, what="watch request")
    watch = api.watches()[0]
    assert watch.query["fieldSelector"] == f"spec.nodeName={NODE}"
    assert watch.query["allowWatchBookmarks"] == "true"
    assert watch.query["resourceVersion"] == str(api.rv)
    assert 300 <= int(watch.query["timeoutSeconds"]) <= 450  # jittered
    assert watch.headers["Authorization"] == f"Bearer {TOKEN}"

    api.put(
        pod_json(
            "ddp-run-worker-0",
            UID_B,
            owners=[
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "ddp-run",
                    "uid": "u",
                    "controller": True,
                }
            ],
            containers=[("pytorch", CID[2])],
        ),
        event="ADDED",
    )
    # The serving pod's container restarted: a new container ID for the same name.
    restarted = pod_json(
        "llm-serve-7d9f8b6c5d-x2k9p",
        UID_A,
        labels={"pod-template-hash": "7d9f8b6c5d", "canary": "true"},
        owners=[rs_owner("llm-serve-7d9f8b6c5d")],
        containers=[("server", CID[3]), ("envoy", CID[1])],
    )
    api.put(restarted, event="MODIFIED")
    wait_until(
        lambda: (
            UID_B in w.snapshot().pods and w.snapshot().container_name(UID_A, CID[3]) == "server"
        ),
        what="events",
    )
    assert w.snapshot().pods[UID_B].workload == "PyTorchJob/ddp-run"
    assert w.snapshot().pods[UID_A].labels["canary"] == "true"

    api.delete(UID_B)
    wait_until(lambda: UID_B not in w.snapshot().pods, what="DELETED")
    deleted_rv = str(api.rv)
    api.watch_actions.put(("close", None))  # the server's timeoutSeconds: a clean end
    wait_until(lambda: len(api.watches()) == 2, what="re-watch")
    assert api.watches()[1].query["resourceVersion"] == deleted_rv  # resumed from the event
    api.bookmark("987654")
    api.watch_actions.put(("close", None))
    wait_until(lambda: len(api.watches()) == 3, what="re-watch after a bookmark")
    assert api.watches()[2].query["resourceVersion"] == "987654"  # resumed from the bookmark
    assert len(api.lists()) == 1  # a clean end is not a relist
    stats = w.snapshot().stats
    assert stats.watch_events_total == 3 and stats.watch_errors_total == 0
    assert stats.pods_success and stats.pod_lists_total == 1


def test_watch_event_with_a_unicode_line_break_in_a_string(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    # Go's encoding/json writes U+0085 (NEL, what "…" becomes when cp1252 text is read
    # as Latin-1) raw; U+2028/U+2029 escaped. Each watch event is one line ending in "\n":
    # a line split at a NEL is two halves that are not JSON, and every event of the pod failed
    # the watch (a relist after a backoff, its names stale and kube_pods failing meanwhile).
    seed(api)
    w = watcher_factory(api.url)
    assert w.wait_synced(5)
    wait_until(lambda: len(api.watches()) == 1, what="watch request")
    pod = pod_json(
        "llm-serve-7d9f8b6c5d-x2k9p",
        UID_A,
        labels={"pod-template-hash": "7d9f8b6c5d"},
        owners=[rs_owner("llm-serve-7d9f8b6c5d")],
        containers=[("server", CID[3]), ("envoy", CID[1])],
    )
    pod["metadata"]["annotations"]["description"] = "Llama 3\u0085 \u2028\x1c\x0b served"
    api.put(pod, event="MODIFIED")
    wait_until(lambda: w.snapshot().container_name(UID_A, CID[3]) == "server"
               or w.snapshot().stats.watch_errors_total > 0, what="the event")
    stats = w.snapshot().stats
    assert stats.watch_errors_total == 0 and stats.pods_success
    assert w.snapshot().container_name(UID_A, CID[3]) == "server"
    assert len(api.watches()) == 1 and len(api.lists()) == 1


def test_node_info_fetched_and_refreshed(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    w = watcher_factory(api.url, node_refresh_s=0.05)
    wait_until(lambda: w.snapshot().node is not None, what="node")
    assert w.snapshot().node == NodeInfo("p4d.24xlarge", "us-east-1a", "spot")
    assert api.node_gets()[0].path == f"/api/v1/nodes/{NODE}"
    assert api.node_gets()[0].headers["Authorization"] == f"Bearer {TOKEN}"
    api.node_labels["eks.amazonaws.com/capacityType"] = "ON_DEMAND"
    wait_until(
        lambda: w.snapshot().node == NodeInfo("p4d.24xlarge", "us-east-1a", "on-demand"),
        what="node refresh",
    )
    parts = {p.name: p for p in w.snapshot().parts()}
    assert parts["kube_node"].success and parts["kube_node"].duration_seconds >= 0


def test_node_not_found_is_an_error(api: FakeApi) -> None:
    with make_watcher(api.url, node_name="no-such-node") as w:
        wait_until(lambda: w.snapshot().stats.node_errors_total >= 2, what="404s")
        snap = w.snapshot()
        assert snap.node is None and not snap.stats.node_success
        assert snap.stats.node_requests_total == snap.stats.node_errors_total
        assert w.wait_synced(5)  # the pods are not affected


def test_gone_event_and_gone_status_relist(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    w = watcher_factory(api.url, page_size=1)
    api.put(pod_json("second", UID_B, containers=[("main", CID[2])]))
    assert w.wait_synced(5)
    wait_until(lambda: len(api.watches()) == 1)
    # While the watch is broken, a pod goes away without an event reaching us.
    api.delete(UID_B, event=False)
    api.watch_statuses.append(410)  # the next watch request is answered 410 itself
    api.gone()
    wait_until(lambda: w.snapshot().stats.relists_gone_total == 2, what="two 410s")
    wait_until(lambda: len(api.lists()) >= 3 and UID_B not in w.snapshot().pods, what="relist")
    for relist in api.lists()[1:]:
        assert "resourceVersion" not in relist.query
    assert all(s.query["limit"] == "1" for s in api.lists())
    assert w.snapshot().stats.watch_errors_total == 0


def test_watch_error_event_relists(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    w = watcher_factory(api.url)
    assert w.wait_synced(5)
    wait_until(lambda: len(api.watches()) == 1)
    api.error_event(500, "InternalError", "etcdserver: request timed out")
    wait_until(lambda: len(api.lists()) == 2 and len(api.watches()) == 2, what="relist")
    stats = w.snapshot().stats
    assert stats.watch_errors_total == 1 and stats.relists_gone_total == 0


def test_pagination(api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]) -> None:
    for i, uid in enumerate((UID_A, UID_B, UID_C)):
        api.put(pod_json(f"p{i}", uid, containers=[("c", CID[i])]))
    w = watcher_factory(api.url, page_size=2)
    assert w.wait_synced(5)
    assert set(w.snapshot().pods) == {UID_A, UID_B, UID_C}
    lists = api.lists()
    assert len(lists) == 2 and lists[1].query["continue"] == "2"
    assert "resourceVersion" not in lists[1].query  # continue carries it


def test_watch_disconnect_relists(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    w = watcher_factory(api.url)
    assert w.wait_synced(5)
    wait_until(lambda: len(api.watches()) == 1)
    api.put(pod_json("new", UID_C, containers=[("c", CID[2])]))  # no event: stream breaks
    api.watch_actions.put(("drop", None))
    wait_until(lambda: len(api.lists()) == 2 and UID_C in w.snapshot().pods, what="relist")
    stats = w.snapshot().stats
    assert stats.watch_errors_total == 1 and stats.pod_lists_total == 2 and stats.pods_success


def test_watch_ending_at_once_does_not_spin(api: FakeApi) -> None:
    seed(api)
    api.watch_end_at_once = True  # a broken proxy: every watch ends cleanly, empty, at once
    w = make_watcher(api.url, backoff_initial_s=0.05, backoff_max_s=0.2)
    with w:
        assert w.wait_synced(5)
        time.sleep(1.0)
        watches = len(api.watches())
    assert 3 <= watches <= 9, watches  # 0.05 + 0.1 + 0.2 + 0.2 ... (±20 %), not hundreds
    assert len(api.lists()) == 1  # a clean end resumes, it does not relist


def test_api_down_at_start_then_back(watcher_factory: Callable[..., PodMetadataWatcher]) -> None:
    port = free_port()
    w = watcher_factory(f"http://127.0.0.1:{port}")
    wait_until(lambda: w.snapshot().stats.pod_list_errors_total >= 2, what="list errors")
    snap = w.snapshot()
    assert not snap.synced and not snap.pods and snap.node is None
    assert not snap.stats.pods_success and snap.stats.node_errors_total >= 1
    assert {p.name: p.success for p in snap.parts()} == {
        "kube_pods": False, "kube_node": False, "kube_resourceslices": False}
    api = FakeApi(port=port)
    seed(api)
    api.start()
    try:
        assert w.wait_synced(5)
        wait_until(lambda: w.snapshot().node is not None, what="node after outage")
        assert set(w.snapshot().pods) == {UID_A} and w.snapshot().stats.pods_success
    finally:
        w.stop(2)
        api.stop()


def test_api_down_after_list_keeps_last_names(
    watcher_factory: Callable[..., PodMetadataWatcher],
) -> None:
    api = FakeApi()
    seed(api)
    api.start()
    w = watcher_factory(api.url, node_refresh_s=0.05)
    try:
        assert w.wait_synced(5)
        wait_until(lambda: w.snapshot().node is not None)
        wait_until(lambda: len(api.watches()) == 1)
        api.stop()
        wait_until(
            lambda: (
                w.snapshot().stats.pod_list_errors_total >= 2
                and w.snapshot().stats.node_errors_total >= 1
            ),
            what="errors while down",
        )
        snap = w.snapshot()
        # One cut, one watch error: after a broken watch the watcher relists (it does not
        # re-watch from its resourceVersion), so the retries while down are list errors;
        # a second watch error needs a list that succeeded, i.e. a server that was up.
        assert snap.stats.watch_errors_total == 1
        assert not snap.stats.pods_success and not snap.stats.node_success
        assert snap.pods[UID_A].name == "llm-serve-7d9f8b6c5d-x2k9p"  # kept
        assert snap.node == NodeInfo("p4d.24xlarge", "us-east-1a", "spot")  # kept
        api.start()  # back, same port
        wait_until(
            lambda: w.snapshot().stats.pods_success and w.snapshot().stats.node_success,
            what="recovery",
        )
        assert w.snapshot().pods[UID_A].workload == "Deployment/llm-serve"
    finally:
        w.stop(2)
        api.stop()


def test_idle_watch_outlives_request_timeout_and_stops_fast(api: FakeApi) -> None:
    seed(api)
    api.watch_connection_close = True
    w = make_watcher(api.url, request_timeout_s=0.3)
    w.start()
    try:
        assert w.wait_synced(5)
        wait_until(lambda: len(api.watches()) == 1)
        time.sleep(0.8)  # a quiet watch, longer than the request timeout: not an error
        assert w.snapshot().stats.watch_errors_total == 0 and len(api.watches()) == 1
        api.put(pod_json("late", UID_C, containers=[("c", CID[2])]), event="ADDED")
        wait_until(lambda: UID_C in w.snapshot().pods, what="event on the quiet watch")
    finally:
        t0 = time.perf_counter()
        w.stop(5)
        assert time.perf_counter() - t0 < 1.0
    assert not any(t.is_alive() for t in w._threads)


def test_silent_watch_hits_read_timeout_and_relists(api: FakeApi) -> None:
    seed(api)
    w = make_watcher(api.url, watch_read_timeout_s=0.2)
    w.start()
    try:
        assert w.wait_synced(5)
        wait_until(lambda: len(api.lists()) >= 2, what="relist after the read timeout")
        assert w.snapshot().stats.watch_errors_total >= 1
        assert UID_A in w.snapshot().pods
    finally:
        w.stop(2)


def test_snapshot_never_blocks_and_stop_aborts_hung_request(api: FakeApi) -> None:
    api.list_gate = threading.Event()  # the API server accepts and never answers
    w = make_watcher(api.url, request_timeout_s=30.0)
    w.start()
    try:
        wait_until(lambda: len(api.lists()) == 1, what="list in flight")
        t0 = time.perf_counter()
        snap = w.snapshot()
        # The list hangs for 30 s: a snapshot that waited on it would take that long. (A bound
        # of milliseconds would test the host's scheduler, not the watcher; 5 s leaves a busy
        # CI host room and is still far from 30.)
        assert time.perf_counter() - t0 < 5.0
        assert not snap.synced
        t0 = time.perf_counter()
        w.stop(20)  # a stop that waited for the hung list would run into this bound
        assert time.perf_counter() - t0 < 5.0
        assert not any(t.is_alive() for t in w._threads)
    finally:
        api.list_gate.set()


def test_snapshot_is_immutable(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    w = watcher_factory(api.url)
    assert w.wait_synced(5)
    snap = w.snapshot()
    with pytest.raises(TypeError):
        snap.pods["x"] = snap.pods[UID_A]  # type: ignore[index]
    assert isinstance(snap.pods, MappingProxyType)
    api.put(pod_json("later", UID_C, containers=[("c", CID[2])]), event="ADDED")
    wait_until(lambda: UID_C in w.snapshot().pods)
    assert UID_C not in snap.pods  # an old snapshot does not change under its reader


# --------------------------------------------------------------------------------------
# Authentication
# --------------------------------------------------------------------------------------


def test_kubeconfig_token_file_relative_and_reread(
    api: FakeApi, tmp_path: Path, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    (tmp_path / "creds").mkdir()
    token_file = tmp_path / "creds" / "token"
    token_file.write_text(TOKEN + "\n")
    path = write_kubeconfig(tmp_path / "config", api.url, {"tokenFile": "creds/token"})
    cfg = load_config(str(path))
    assert isinstance(cfg, SingleConfig)
    w = watcher_factory(api.url, config=cfg, token_refresh_s=0.0)  # re-read before each request
    assert w.wait_synced(5)
    wait_until(lambda: len(api.watches()) == 1)
    # As on a real cluster, the API server takes the new token before the file holds it and
    # the old one until it expires; the node and slice polls run on their own clock, so a
    # server that refused either token during the swap would count their 401s (CI saw 2).
    api.token, api.old_tokens = "rotated-token-2", {TOKEN}
    # The kubelet swaps a projected token atomically (a symlink flip); a reader never sees
    # the file half written.
    (tmp_path / "creds" / "token.new").write_text("rotated-token-2")
    os.replace(tmp_path / "creds" / "token.new", token_file)
    api.watch_actions.put(("drop", None))
    wait_until(lambda: len(api.watches()) == 2, what="watch after the rotation")
    assert api.unauthorized == 0
    assert api.lists()[-1].headers["Authorization"] == "Bearer rotated-token-2"
    api.old_tokens = set()  # the old token has expired: every later request uses the new one
    api.watch_actions.put(("drop", None))
    wait_until(lambda: len(api.watches()) == 3, what="watch after the old token expired")
    assert api.unauthorized == 0


def test_exec_credential_plugin_runs_again_after_401(
    api: FakeApi, tmp_path: Path, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    api.token = "k8s-aws-v1.exec-token-1"
    # The plugin (like `aws eks get-token`) returns the token of the current "generation" and
    # logs each run.
    generation, runs = tmp_path / "generation", tmp_path / "runs"
    generation.write_text("1")
    script = tmp_path / "get-token.py"
    script.write_text(
        "import json, os, pathlib, sys\n"
        "assert os.environ['AWS_PROFILE'] == 'gpu' and sys.argv[1:] == ['--cluster', 'prod']\n"
        f"n = pathlib.Path({str(generation)!r}).read_text()\n"
        f"with open({str(runs)!r}, 'a') as f:\n"
        "    f.write(n)\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1',\n"
        "  'kind': 'ExecCredential', 'status': {'token': f'k8s-aws-v1.exec-token-{n}',\n"
        "  'expirationTimestamp': '2999-01-01T00:00:00Z'}}))\n"
    )
    path = write_kubeconfig(
        tmp_path / "config",
        api.url,
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": sys.executable,
                "args": [str(script), "--cluster", "prod"],
                "env": [{"name": "AWS_PROFILE", "value": "gpu"}],
                "interactiveMode": "Never",
            }
        },
    )
    cfg = load_config(str(path))
    assert isinstance(cfg, SingleConfig)
    w = watcher_factory(api.url, config=cfg)
    assert w.wait_synced(5)
    wait_until(lambda: len(api.watches()) == 1)
    assert api.lists()[0].headers["Authorization"] == "Bearer k8s-aws-v1.exec-token-1"
    assert api.watches()[0].headers["Authorization"] == "Bearer k8s-aws-v1.exec-token-1"
    wait_until(lambda: w.snapshot().stats.node_success, what="node")
    # Every thread has made its first request (so run the plugin, or reused a token) before
    # the token changes: one that first ran the plugin after the change would take the new
    # token without a 401 (a CI run failed so: unauthorized == 0).
    wait_until(lambda: bool(api.slice_requests() and api.node_gets()),
               what="each thread's first request")
    # Run once per thread at most (lightkube does not serialise the first runs), then reused.
    before = runs.read_text()
    assert before in ("1", "11", "111")  # pods, node and resourceslices threads
    # The token expires: the API server refuses it, the plugin runs again.
    generation.write_text("2")
    api.token = "k8s-aws-v1.exec-token-2"
    api.watch_actions.put(("drop", None))
    wait_until(lambda: len(api.watches()) == 2, what="watch with the new token")
    assert api.unauthorized >= 1 and runs.read_text().startswith(before + "2")
    assert api.lists()[-1].headers["Authorization"] == "Bearer k8s-aws-v1.exec-token-2"
    assert api.watches()[1].headers["Authorization"] == "Bearer k8s-aws-v1.exec-token-2"


# --------------------------------------------------------------------------------------
# HTTPS
# --------------------------------------------------------------------------------------


@dataclass
class Pki:
    ca: bytes
    server_cert: Path
    server_key: Path
    client_cert: bytes
    client_key: bytes


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    tmp = tmp_path / "pki"
    tmp.mkdir()
    ca = TestCA("kubernetes")
    server = ca.issue("kube-apiserver", server=True, sans=["127.0.0.1"])
    client = ca.issue("gpuscope", server=False)
    (tmp / "server.crt").write_bytes(server.cert_pem)
    (tmp / "server.key").write_bytes(server.key_pem)
    return Pki(ca.cert_pem, tmp / "server.crt", tmp / "server.key", client.cert_pem,
               client.key_pem)


def server_tls(p: Pki, require_client_cert: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(p.server_cert), str(p.server_key))
    if require_client_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=p.ca.decode())
    return ctx


@pytest.fixture
def tls_api(pki: Pki) -> Iterator[FakeApi]:
    server = FakeApi(tls=server_tls(pki, require_client_cert=True))
    seed(server)
    server.start()
    yield server
    server.stop()


def test_https_ca_data_token_and_client_cert_data(
    pki: Pki, tls_api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64
    import gc

    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    path = write_kubeconfig(
        tmp_path / "config",
        tls_api.url,
        {
            "token": TOKEN,
            "client-certificate-data": base64.b64encode(pki.client_cert).decode(),
            "client-key-data": base64.b64encode(pki.client_key).decode(),
        },
        {"certificate-authority-data": base64.b64encode(pki.ca).decode()},
    )
    cfg = load_config(str(path))
    assert isinstance(cfg, SingleConfig)
    w = make_watcher(tls_api.url, config=cfg)
    try:
        gc.collect()
        # lightkube hands the *-data to ssl through temporary files: none is left behind.
        assert list(private_tmp.iterdir()) == []
        w.start()
        assert w.wait_synced(5)
        assert set(w.snapshot().pods) == {UID_A}
        assert tls_api.lists()[0].headers["Authorization"] == f"Bearer {TOKEN}"
        wait_until(lambda: w.snapshot().node is not None, what="node over TLS")
    finally:
        w.stop(2)


def test_https_ca_and_client_certificate_files_relative_to_the_kubeconfig(
    pki: Pki, tls_api: FakeApi, tmp_path: Path
) -> None:
    (tmp_path / "kube" / "pki").mkdir(parents=True)
    (tmp_path / "kube" / "pki" / "ca.crt").write_bytes(pki.ca)
    (tmp_path / "kube" / "pki" / "client.crt").write_bytes(pki.client_cert)
    (tmp_path / "kube" / "pki" / "client.key").write_bytes(pki.client_key)
    path = write_kubeconfig(
        tmp_path / "kube" / "config",
        tls_api.url,
        {"token": TOKEN, "client-certificate": "pki/client.crt", "client-key": "pki/client.key"},
        {"certificate-authority": "pki/ca.crt"},
    )
    cfg = load_config(str(path))
    assert isinstance(cfg, SingleConfig)
    with make_watcher(tls_api.url, config=cfg) as w:
        assert w.wait_synced(5)


def test_https_verifies_the_server(pki: Pki, tmp_path: Path) -> None:
    api = FakeApi(tls=server_tls(pki, require_client_cert=False))
    seed(api)
    api.start()
    try:
        # Trusting only the system CAs: the self-made CA is rejected, nothing syncs.
        w = make_watcher(api.url)
        with w:
            wait_until(lambda: w.snapshot().stats.pod_list_errors_total >= 1)
            assert not w.snapshot().synced and not api.lists()
        # insecure-skip-tls-verify accepts it.
        path = write_kubeconfig(
            tmp_path / "config", api.url, {"token": TOKEN}, {"insecure-skip-tls-verify": True}
        )
        cfg = load_config(str(path))
        assert isinstance(cfg, SingleConfig)
        with make_watcher(api.url, config=cfg) as w:
            assert w.wait_synced(5)
    finally:
        api.stop()


def test_in_cluster_over_tls_rereads_the_rotated_token(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kubelet rotates the projected token while the old one is still valid: the next
    request after the refresh interval carries the new token, with no 401 needed; a token the
    API server no longer accepts is re-read at once (one 401)."""
    api = FakeApi(tls=server_tls(pki, require_client_cert=False))
    seed(api)
    api.start()
    sa = service_account(tmp_path / "sa", TOKEN + "\n", ca=pki.ca)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
    cfg = load_config(None, serviceaccount_dir=str(sa))
    assert isinstance(cfg, SingleConfig)
    now = [1000.0]
    w = make_watcher(api.url, config=cfg, clock=lambda: now[0], node_refresh_s=0.02)
    try:
        w.start()
        assert w.wait_synced(5)
        wait_until(lambda: len(api.node_gets()) >= 2, what="node GETs")

        def tokens_since(n: int) -> set[str]:
            return {s.headers["Authorization"] for s in api.node_gets()[n:]}

        (sa / "token").write_text("rotated-token-2")  # the kubelet's atomic swap
        api.token, api.old_tokens = "rotated-token-2", {TOKEN}
        n = len(api.node_gets())
        wait_until(lambda: len(api.node_gets()) >= n + 3, what="node GETs")
        assert tokens_since(n) == {f"Bearer {TOKEN}"}  # read at most once a minute
        now[0] += 61
        n = len(api.node_gets())
        wait_until(lambda: len(api.node_gets()) >= n + 3, what="node GETs")
        assert tokens_since(n + 1) == {"Bearer rotated-token-2"}
        assert api.unauthorized == 0

        # Rotated again, and the old token is refused before the minute is up: one 401,
        # then the file is re-read and the request repeated.
        (sa / "token").write_text("rotated-token-3")
        api.token, api.old_tokens = "rotated-token-3", set()
        wait_until(lambda: api.unauthorized == 1 and tokens_since(len(api.node_gets()) - 1)
                   == {"Bearer rotated-token-3"}, what="re-read after a 401")
        wait_until(lambda: w.snapshot().stats.node_success)
        assert api.unauthorized == 1
        # A token file that cannot be read keeps the last token.
        (sa / "token").unlink()
        now[0] += 61
        n = len(api.node_gets())
        wait_until(lambda: len(api.node_gets()) >= n + 2, what="node GETs")
        assert tokens_since(n) == {"Bearer rotated-token-3"} and w.snapshot().stats.node_success
    finally:
        w.stop(2)
        api.stop()


def test_request_on_a_kept_alive_connection_closed_by_the_server_is_sent_again(
    api: FakeApi,
) -> None:
    from gpuscope.exporter.kubernetes.apiclient import ApiClient, Nodes

    api.drop_kept_alive = True  # as a server or proxy closing idle connections does
    client = ApiClient(token_config(api.url), request_timeout_s=2.0, token_refresh_s=60.0,
                       clock=time.monotonic)
    try:
        for _ in range(3):
            assert client.get(Nodes, NODE)["metadata"]["name"] == NODE
    finally:
        client.close()
    assert len(api.node_gets()) == 5  # the 2nd and 3rd GET: dropped once, then answered


# --------------------------------------------------------------------------------------
# DRA ResourceSlices
# --------------------------------------------------------------------------------------


def nvidia_slice(node: str, devices: list[tuple[str, str]]) -> dict[str, Any]:
    """A ResourceSlice of NVIDIA's DRA driver: ``devices`` are (name, NVML UUID)."""
    return {
        "metadata": {"name": f"{node}-gpu.nvidia.com-x7k2q", "resourceVersion": "7"},
        "spec": {
            "driver": "gpu.nvidia.com", "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": name, "attributes": {
                    "type": {"string": "mig" if uuid.startswith("MIG-") else "gpu"},
                    "uuid": {"string": uuid}}}
                for name, uuid in devices
            ],
        },
    }


def test_resource_slices_of_this_node_reach_the_snapshot(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    from gpuscope.exporter.kubernetes.dra import ClaimResource, DeviceIndex

    gpu = "GPU-5fd4f087-86f3-7a43-b711-4771313afc50"
    api.resource_slices = [nvidia_slice(NODE, [("gpu-0", gpu)]),
                           nvidia_slice(OTHER_NODE, [("gpu-0", "GPU-other")])]
    w = watcher_factory(api.url)
    wait_until(lambda: len(w.snapshot().resource_slices) == 1, what="the node's slice")
    index = DeviceIndex.from_slices(w.snapshot().resource_slices, node_name=NODE)
    assert index.resolve(ClaimResource("gpu.nvidia.com", NODE, "gpu-0")) == gpu
    first = api.slice_requests()[0]
    assert first.query["fieldSelector"] == f"spec.nodeName={NODE}"
    wait_until(lambda: any(is_watch(s.query) for s in api.slice_requests()),
               what="a watch of the slices")


def test_resource_slices_not_served_turn_dra_off_quietly(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A cluster before 1.34 (404): no slices, pods unaffected, no warning, and not asked
    again on the failing-server backoff (every node asking every 30 s would add up)."""
    seed(api)
    w = watcher_factory(api.url, unserved_retry_s=600.0)
    assert w.wait_synced(5)
    time.sleep(0.5)  # ~25 backoff periods of a failing list at this test's timings
    assert len(api.slice_requests()) == 1
    assert w.snapshot().resource_slices == () and UID_A in w.snapshot().pods
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_resource_slices_forbidden_warn_once(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher],
    caplog: pytest.LogCaptureFixture,
) -> None:
    api.resource_slices_status = 403
    w = watcher_factory(api.url, unserved_retry_s=0.05)
    wait_until(lambda: len(api.slice_requests()) >= 3, what="retries")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "resourceslices" in r.getMessage()]
    assert len(warnings) == 1 and "RBAC" in warnings[0].getMessage()
    assert w.snapshot().resource_slices == ()


def test_resource_slices_can_be_left_out(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    api.resource_slices = [nvidia_slice(NODE, [("gpu-0", "GPU-1")])]
    w = watcher_factory(api.url, resource_slices=False)
    assert w.wait_synced(5)
    time.sleep(0.2)
    assert api.slice_requests() == [] and w.snapshot().resource_slices == ()


def test_resource_slices_watch_is_a_part_of_its_own(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    """gpu_exporter_collector_success{collector="kube_resourceslices"}: 1 while the slices
    list and watch work, 0 while the watch fails (it showed only in the log), its failures
    counted; the pods' and the node's parts unaffected."""
    seed(api)
    api.resource_slices = [nvidia_slice(NODE, [("gpu-0", "GPU-1")])]
    w = watcher_factory(api.url)

    def parts() -> dict[str, bool]:
        return {p.name: p.success for p in w.snapshot().parts()}

    wait_until(lambda: parts() == {"kube_pods": True, "kube_node": True,
                                   "kube_resourceslices": True}, what="three good parts")
    assert w.snapshot().stats.resourceslices_errors_total == 0
    api.resource_slices_watch_status = 500
    api.stop()  # breaks the open watch; the next one is answered 500
    api.start()
    # The restart cut the pods' watch too: they relist and recover; the slices' part stays 0.
    wait_until(lambda: w.snapshot().stats.resourceslices_errors_total >= 2
               and parts() == {"kube_pods": True, "kube_node": True,
                               "kube_resourceslices": False}, what="slice watch errors")
    assert len(w.snapshot().resource_slices) == 1  # the last known slices are kept
    api.resource_slices_watch_status = None
    wait_until(lambda: parts()["kube_resourceslices"], what="the slices part recovered")


def test_resource_slices_not_served_or_left_out_are_no_failing_part(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    # Before 1.34 (404) DRA is off, healthy; left out, there is no such part at all.
    seed(api)
    served_not = watcher_factory(api.url, unserved_retry_s=600.0)
    wait_until(lambda: {p.name: p.success for p in served_not.snapshot().parts()}
               == {"kube_pods": True, "kube_node": True, "kube_resourceslices": True},
               what="a healthy DRA part")
    left_out = watcher_factory(api.url, resource_slices=False)
    wait_until(lambda: {p.name: p.success for p in left_out.snapshot().parts()}
               == {"kube_pods": True, "kube_node": True}, what="no DRA part")


def test_an_encrypted_client_key_is_one_line_without_a_prompt(pki: Pki, tmp_path: Path) -> None:
    """lightkube loads the client key without a password callback: OpenSSL asked for the pass
    phrase on the terminal, then "[Errno 22] Invalid argument" where there is none."""
    import base64

    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.client_key, None)
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(b"secret"))
    path = write_kubeconfig(tmp_path / "config", "https://127.0.0.1:1", {
        "client-certificate-data": base64.b64encode(pki.client_cert).decode(),
        "client-key-data": base64.b64encode(encrypted).decode(),
    })
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.exporter", "--kubeconfig", str(path),
         "--node-name", NODE, "--listen", "127.0.0.1:0"],
        cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        start_new_session=True,  # no terminal to prompt on
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"gpuscope-exporter: error: --kubeconfig: kubeconfig {path} "
                             "(context gpu-admin@prod): client-key: encrypted private keys "
                             "are not supported\n")
