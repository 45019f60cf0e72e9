"""Pod and node names from the Kubernetes API server, for this node only.

What it gives the attribution code: for every pod on this node (list + watch of
``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>``) its namespace, name, labels,
owner references, ``workload`` and the container-ID → container-name map; and this
node's instance type, zone and capacity type (``GET /api/v1/nodes/<node>``).
:meth:`PodMetadataWatcher.snapshot` returns the latest immutable view at once; the network
work runs in background daemon threads, and an API-server outage keeps the last names.

Sources: the Kubernetes API concepts page ("Efficient detection of changes": list, then
watch from the list's ``resourceVersion``; ``410 Gone`` means relist; bookmarks; chunked
lists with ``limit``/``continue``), client-go's reflector (``resourceVersion=0`` lists
served from the watch cache, a jittered ``timeoutSeconds``, relisting with a consistent
read after 410), client-go's in-cluster config (``KUBERNETES_SERVICE_HOST``/``_PORT`` and
the service-account token, re-read because bound tokens rotate — client-go reloads it every
minute), the kubeconfig format (``clusters``/``users``/``contexts``, ``*-data`` fields
base64, relative paths against the kubeconfig's directory, ``tokenFile``, ``exec``
credential plugins with ``client.authentication.k8s.io`` ``ExecCredential``), and the
well-known labels reference (``node.kubernetes.io/instance-type``,
``topology.kubernetes.io/zone``) plus each provider's node labels for capacity type.

Why not the official ``kubernetes`` package: the exporter is a DaemonSet on every GPU node
with a 35 MB RSS target for the whole process. Measured here (CPython 3.11, fresh
interpreter at 8.6 MiB RSS, ``kubernetes`` 37.0.2): ``import kubernetes.client,
kubernetes.config, kubernetes.watch`` adds 35.2 MiB RSS and ~200 ms, loads ~520 modules,
and installs 126 MB plus urllib3, requests, requests-oauthlib and websocket-client; on top
of ``prometheus_client`` (which the exporter imports anyway) it still adds 22.8 MiB. This
module is ``http.client`` + ``ssl`` + ``json`` (PyYAML, already a dependency, only when a
kubeconfig is read): 12.5 MiB alone (mostly ``ssl`` and ``http.client``), 2.8 MiB on top of
``prometheus_client``; keeping 600 pods adds ~3.5 MiB. The API surface used is three GETs
(pod list, pod watch, node), which does not justify the dependency.

Limits: kubeconfig ``auth-provider`` entries, ``tls-server-name`` and proxies are not
supported; ``exec`` plugins may return a token only (not a client certificate).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import os
import random
import re
import socket
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any

from gpuscope.exporter import __version__

# The data types live in a module of their own, without this client, for the code that only
# reads them (attribution, the simulated source); re-exported here as before.
from gpuscope.exporter.kubernetes.metadata import (
    MetadataSnapshot,
    NodeInfo,
    OwnerRef,
    PodInfo,
    WatcherStats,
)

__all__ = [
    "DEFAULT_SERVICEACCOUNT_DIR",
    "ApiError",
    "ExecCredentialConfig",
    "KubeConfig",
    "KubeConfigError",
    "MetadataDisabled",
    "MetadataSnapshot",
    "NodeInfo",
    "OwnerRef",
    "PodInfo",
    "PodMetadataWatcher",
    "WatcherStats",
    "derive_workload",
    "in_cluster_config",
    "load_config",
    "load_kubeconfig",
    "node_info_from_labels",
    "pod_from_json",
]

log = logging.getLogger(__name__)

DEFAULT_SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_USER_AGENT = f"gpuscope-exporter/{__version__}"


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


class KubeConfigError(ValueError):
    """A kubeconfig that was asked for explicitly cannot be used (one line, for exit 2)."""


_EXEC_API_VERSION = "client.authentication.k8s.io/v1beta1"


@dataclass(frozen=True, slots=True)
class ExecCredentialConfig:
    """A kubeconfig ``users[].user.exec`` credential plugin (e.g. ``aws eks get-token``)."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = _EXEC_API_VERSION


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """Where the API server is and how to authenticate; from a kubeconfig or in-cluster.

    ``ca_data`` is PEM text (``ssl`` takes it from memory); client certificate and key
    ``*_data`` are PEM bytes, written to private temporary files only for the moment
    ``ssl.SSLContext.load_cert_chain`` reads them (it accepts files only).
    """

    server: str
    source: str
    ca_file: str | None = None
    ca_data: str | None = None
    insecure_skip_tls_verify: bool = False
    token: str | None = None
    token_file: str | None = None
    client_cert_file: str | None = None
    client_cert_data: bytes | None = None
    client_key_file: str | None = None
    client_key_data: bytes | None = None
    exec_credential: ExecCredentialConfig | None = None


@dataclass(frozen=True, slots=True)
class MetadataDisabled:
    """No API server configuration: pod and node names are off. ``reason`` is one line for
    the single warning the caller logs."""

    reason: str


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _named(entries: object, name: str, what: str, path: str) -> dict[str, Any]:
    """``clusters``/``users``/``contexts`` are lists of ``{name, <what>: {...}}``."""
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, dict) and entry.get("name") == name:
                return _mapping(entry.get(what))
    raise KubeConfigError(f"kubeconfig {path}: no {what} named {name!r}")


def _b64(value: object, key: str, path: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError as e:
        raise KubeConfigError(f"kubeconfig {path}: {key} is not valid base64") from e


def load_kubeconfig(path: str, context: str | None = None) -> KubeConfig:
    """Read a kubeconfig file; relative file paths in it resolve against its directory.

    Raises :class:`KubeConfigError` when the file is unreadable, malformed, or names an
    authentication method this client does not support.
    """
    # Imported here: in-cluster (the DaemonSet's normal case) never reads YAML.
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise KubeConfigError(f"kubeconfig {path}: {e}") from e
    doc = _mapping(doc)
    base_dir = os.path.dirname(os.path.abspath(path))

    def resolve(p: object) -> str:
        return os.path.join(base_dir, os.path.expanduser(str(p)))

    ctx_name = context or doc.get("current-context")
    if not ctx_name:
        raise KubeConfigError(f"kubeconfig {path}: no current-context")
    ctx = _named(doc.get("contexts"), str(ctx_name), "context", path)
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster")), "cluster", path)
    user = _named(doc.get("users"), str(ctx["user"]), "user", path) if ctx.get("user") else {}

    server = cluster.get("server")
    if not server:
        raise KubeConfigError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server")
    if "auth-provider" in user:
        raise KubeConfigError(
            f"kubeconfig {path}: user auth-provider is not supported (use a token, "
            "tokenFile, client certificate or exec plugin)"
        )
    exec_cfg: ExecCredentialConfig | None = None
    if "exec" in user:
        ex = _mapping(user["exec"])
        command = str(ex.get("command") or "")
        if not command:
            raise KubeConfigError(f"kubeconfig {path}: exec has no command")
        if os.sep in command and not os.path.isabs(command):
            command = resolve(command)  # kubectl: relative to the kubeconfig's directory
        env = tuple(
            (str(e.get("name")), str(e.get("value", "")))
            for e in ex.get("env") or ()
            if isinstance(e, dict) and e.get("name")
        )
        exec_cfg = ExecCredentialConfig(
            command=command,
            args=tuple(str(a) for a in ex.get("args") or ()),
            env=env,
            api_version=str(ex.get("apiVersion") or _EXEC_API_VERSION),
        )

    # kubectl's own key is "tokenFile"; "token-file" is accepted as it is a common typo.
    token_file = user.get("tokenFile") or user.get("token-file")
    return KubeConfig(
        server=str(server).rstrip("/"),
        source=f"kubeconfig {path} (context {ctx_name})",
        ca_file=resolve(cluster["certificate-authority"])
        if cluster.get("certificate-authority")
        else None,
        ca_data=_b64(
            cluster["certificate-authority-data"], "certificate-authority-data", path
        ).decode("ascii", "replace")
        if cluster.get("certificate-authority-data")
        else None,
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        token=str(user["token"]).strip() if user.get("token") else None,
        token_file=resolve(token_file) if token_file else None,
        client_cert_file=resolve(user["client-certificate"])
        if user.get("client-certificate")
        else None,
        client_cert_data=_b64(user["client-certificate-data"], "client-certificate-data", path)
        if user.get("client-certificate-data")
        else None,
        client_key_file=resolve(user["client-key"]) if user.get("client-key") else None,
        client_key_data=_b64(user["client-key-data"], "client-key-data", path)
        if user.get("client-key-data")
        else None,
        exec_credential=exec_cfg,
    )


def in_cluster_config(
    environ: Mapping[str, str] | None = None,
    serviceaccount_dir: str = DEFAULT_SERVICEACCOUNT_DIR,
) -> KubeConfig | MetadataDisabled:
    """The pod's own service account, as client-go's ``rest.InClusterConfig`` finds it."""
    env = os.environ if environ is None else environ
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        return MetadataDisabled(
            "pod metadata disabled: no --kubeconfig and not running in a cluster "
            "(KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT unset)"
        )
    token_file = os.path.join(serviceaccount_dir, "token")
    if not os.path.isfile(token_file):
        return MetadataDisabled(
            f"pod metadata disabled: in-cluster but {token_file} is missing "
            "(automountServiceAccountToken: false?)"
        )
    ca_file = os.path.join(serviceaccount_dir, "ca.crt")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6 service address
    return KubeConfig(
        server=f"https://{host}:{port}",
        source="in-cluster service account",
        ca_file=ca_file if os.path.isfile(ca_file) else None,
        token_file=token_file,
    )


def load_config(
    kubeconfig: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    serviceaccount_dir: str = DEFAULT_SERVICEACCOUNT_DIR,
) -> KubeConfig | MetadataDisabled:
    """``--kubeconfig FILE`` if given, else in-cluster, else :class:`MetadataDisabled`.

    A kubeconfig that was given but cannot be used raises :class:`KubeConfigError`.
    """
    if kubeconfig:
        return load_kubeconfig(kubeconfig)
    return in_cluster_config(environ, serviceaccount_dir)


# --------------------------------------------------------------------------------------
# HTTP client (http.client + ssl + json)
# --------------------------------------------------------------------------------------


class ApiError(Exception):
    """The API server answered with a non-success status (or a watch ERROR event)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class _Closed(Exception):
    """The client was closed (the watcher is stopping)."""


def _ssl_context(config: KubeConfig) -> ssl.SSLContext:
    if config.insecure_skip_tls_verify:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif config.ca_file or config.ca_data:
        ctx = ssl.create_default_context(cafile=config.ca_file, cadata=config.ca_data)
    else:
        ctx = ssl.create_default_context()
    cert_file, key_file = config.client_cert_file, config.client_key_file
    if config.client_cert_data is None and config.client_key_data is None:
        if cert_file:
            ctx.load_cert_chain(cert_file, key_file)
        return ctx
    # ssl loads a certificate chain from files only: write the *-data values to private
    # files (mkstemp creates them 0600 in a 0700 directory), load them, delete them at once.
    tmpdir = tempfile.mkdtemp(prefix="gpuscope-kube-")
    try:
        if config.client_cert_data is not None:
            cert_file = _write_private(tmpdir, "client.crt", config.client_cert_data)
        if config.client_key_data is not None:
            key_file = _write_private(tmpdir, "client.key", config.client_key_data)
        if cert_file:
            ctx.load_cert_chain(cert_file, key_file)
    finally:
        for name in os.listdir(tmpdir):
            os.unlink(os.path.join(tmpdir, name))
        os.rmdir(tmpdir)
    return ctx


def _write_private(directory: str, name: str, data: bytes) -> str:
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


class _Credentials:
    """The ``Authorization`` header: a static token, a token file re-read every
    ``refresh_s`` (bound service-account tokens rotate), or an exec plugin's token cached
    until shortly before its ``expirationTimestamp``. :meth:`invalidate` after a 401."""

    def __init__(
        self,
        config: KubeConfig,
        *,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        refresh_s: float,
        exec_timeout_s: float,
    ) -> None:
        self._config = config
        self._clock = clock
        self._wall_clock = wall_clock
        self._refresh_s = refresh_s
        self._exec_timeout_s = exec_timeout_s
        self._lock = threading.Lock()
        self._token: str | None = config.token
        self._read_at: float | None = None
        self._expires_at: float | None = None  # wall clock, exec plugins only

    def invalidate(self) -> None:
        with self._lock:
            self._read_at = None

    def header(self) -> str | None:
        with self._lock:
            cfg = self._config
            if cfg.token_file:
                now = self._clock()
                if self._read_at is None or now - self._read_at >= self._refresh_s:
                    try:
                        with open(cfg.token_file, encoding="utf-8") as f:
                            self._token = f.read().strip()
                        self._read_at = now
                    except OSError as e:
                        # Keep the previous token: a rotation in progress, or a transient
                        # error; the API server says 401 if it is really stale.
                        log.warning("cannot read token file %s: %s", cfg.token_file, e)
            elif cfg.exec_credential is not None and not cfg.token:
                stale = self._expires_at is not None and self._wall_clock() > self._expires_at
                if self._token is None or self._read_at is None or stale:
                    self._token, self._expires_at = _run_exec(
                        cfg.exec_credential, self._exec_timeout_s
                    )
                    self._read_at = self._clock()
            return f"Bearer {self._token}" if self._token else None


def _run_exec(cfg: ExecCredentialConfig, timeout_s: float) -> tuple[str, float | None]:
    """Run a client-go exec credential plugin; returns the token and when to renew it."""
    import subprocess  # only local kubeconfigs use exec plugins; keep it off start-up

    env = dict(os.environ)
    env.update(cfg.env)
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": cfg.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
    )
    try:
        proc = subprocess.run(
            [cfg.command, *cfg.args],
            env=env,
            capture_output=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ApiError(0, f"exec credential plugin {cfg.command}: {e}") from e
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ApiError(
            0,
            f"exec credential plugin {cfg.command} exited {proc.returncode}: "
            f"{err[-1] if err else ''}",
        )
    try:
        status = _mapping(_mapping(json.loads(proc.stdout)).get("status"))
    except ValueError as e:
        raise ApiError(0, f"exec credential plugin {cfg.command}: bad JSON") from e
    token = status.get("token")
    if not isinstance(token, str) or not token:
        raise ApiError(0, f"exec credential plugin {cfg.command}: no status.token")
    expiry: float | None = None
    stamp = status.get("expirationTimestamp")
    if isinstance(stamp, str):
        with contextlib.suppress(ValueError):
            # Renew a minute early so a request never carries a token about to expire.
            expiry = datetime.fromisoformat(stamp).timestamp() - 60.0
    return token, expiry


class _ApiClient:
    """GET JSON, or open a streaming GET, against one API server. Thread-safe."""

    def __init__(
        self, config: KubeConfig, credentials: _Credentials, request_timeout_s: float
    ) -> None:
        url = urllib.parse.urlsplit(config.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise KubeConfigError(f"API server URL {config.server!r} is not http(s)://host")
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")  # e.g. a Rancher proxy /k8s/clusters/<id>
        try:
            self._ssl = _ssl_context(config) if self._https else None
        except (OSError, ssl.SSLError, ValueError) as e:
            raise KubeConfigError(f"TLS settings of {config.source}: {e}") from e
        self._credentials = credentials
        self._timeout = request_timeout_s
        self._lock = threading.Lock()
        # Open connections and their sockets. The socket is kept apart because
        # http.client drops conn.sock when a response says "Connection: close", while the
        # response still reads from that socket.
        self._open: dict[http.client.HTTPConnection, socket.socket | None] = {}
        self._closed = False

    def close(self) -> None:
        """Abort every open request (wakes threads blocked on a read) and refuse new ones."""
        with self._lock:
            self._closed = True
            conns = list(self._open.items())
        for conn, sock in conns:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _request(
        self, path: str, query: Mapping[str, str]
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse, socket.socket | None]:
        conn: http.client.HTTPConnection
        if self._ssl is not None:
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=self._timeout, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        with self._lock:
            if self._closed:
                raise _Closed
            self._open[conn] = None
        try:
            headers = {"Accept": "application/json", "User-Agent": _USER_AGENT}
            auth = self._credentials.header()
            if auth:
                headers["Authorization"] = auth
            target = self._prefix + path
            if query:
                target += "?" + urllib.parse.urlencode(query)
            conn.request("GET", target, headers=headers)
            sock = conn.sock
            with self._lock:
                self._open[conn] = sock
                if self._closed:  # close() ran while we connected
                    raise _Closed
            resp = conn.getresponse()
            if resp.status != 200:
                body = resp.read(65536)
                if resp.status == 401:
                    self._credentials.invalidate()  # re-read a rotated token next time
                raise ApiError(resp.status, _status_message(body, resp.reason))
            return conn, resp, sock
        except BaseException:
            self._release(conn)
            raise

    def _release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._open.pop(conn, None)
        conn.close()

    def get_json(self, path: str, query: Mapping[str, str]) -> dict[str, Any]:
        conn, resp, _ = self._request(path, query)
        try:
            doc = json.loads(resp.read())
        finally:
            self._release(conn)
        if not isinstance(doc, dict):
            raise ApiError(resp.status, "response is not a JSON object")
        return doc

    @contextlib.contextmanager
    def stream(
        self, path: str, query: Mapping[str, str], read_timeout_s: float
    ) -> Iterator[Iterator[bytes]]:
        """A streaming GET: yields an iterator of non-empty lines (JSON watch events).

        The connect and the response headers use the request timeout; the body then
        uses ``read_timeout_s`` so that a silent, half-open stream ends eventually.
        """
        conn, resp, sock = self._request(path, query)
        try:
            if sock is not None:
                sock.settimeout(read_timeout_s)

            def lines() -> Iterator[bytes]:
                # read1, not readline: HTTPResponse.readline on a chunked body turns a
                # connection dropped mid-stream into a clean EOF, while read1 raises
                # IncompleteRead; a dropped watch must relist, a finished one need not.
                buf = b""
                while True:
                    data = resp.read1(65536)
                    if not data:
                        if resp.length:  # Content-Length body cut short
                            raise http.client.IncompleteRead(buf, resp.length)
                        if buf.strip():
                            yield buf
                        return
                    buf += data
                    if b"\n" not in data:
                        continue
                    *complete, buf = buf.split(b"\n")
                    for line in complete:
                        if line.strip():
                            yield line

            yield lines()
        finally:
            self._release(conn)


def _status_message(body: bytes, reason: str) -> str:
    """The ``message`` of a ``Status`` error body, else the HTTP reason."""
    try:
        doc = json.loads(body)
    except ValueError:
        return reason
    message = doc.get("message") if isinstance(doc, dict) else None
    return str(message) if message else reason


# --------------------------------------------------------------------------------------
# Pods, owners and workloads
# --------------------------------------------------------------------------------------


# Kubeflow training-operator's ``training.kubeflow.org/operator-name`` values → kinds.
_KUBEFLOW_OPERATOR_KINDS = {
    "pytorchjob-controller": "PyTorchJob",
    "tfjob-controller": "TFJob",
    "mpijob-controller": "MPIJob",
    "mpi-operator": "MPIJob",
    "xgboostjob-controller": "XGBoostJob",
    "paddlejob-controller": "PaddleJob",
    "jaxjob-controller": "JAXJob",
}
# A CronJob names its Jobs ``<cronjob>-<scheduled time in minutes since the epoch>``.
# Requiring a plausible minute count (2014..2100) keeps a ``train-20240101`` Job (a date,
# about 20.2 million) from being taken for a CronJob's.
_CRONJOB_SUFFIX = re.compile(r"^(?P<name>.+)-(?P<minutes>\d{8})$")
_CRONJOB_MINUTES = range(23_000_000, 68_400_000)


def _label_workload(labels: Mapping[str, str]) -> str:
    """A workload from well-known labels, for pods whose owners do not settle it."""
    if name := labels.get("jobset.sigs.k8s.io/jobset-name"):
        return f"JobSet/{name}"
    if name := labels.get("leaderworkerset.sigs.k8s.io/name"):
        return f"LeaderWorkerSet/{name}"
    if name := labels.get("training.kubeflow.org/job-name") or labels.get("pytorch-job-name"):
        operator = labels.get("training.kubeflow.org/operator-name", "")
        return f"{_KUBEFLOW_OPERATOR_KINDS.get(operator, 'PyTorchJob')}/{name}"
    if name := labels.get("ray.io/cluster"):
        return f"RayCluster/{name}"
    return ""


def derive_workload(owners: Sequence[OwnerRef], labels: Mapping[str, str]) -> str:
    """``<Kind>/<name>`` of the pod's top owner, or ``""``.

    The pod's controller reference (else its first owner) is walked up without extra API
    calls, since fetching ReplicaSets and Jobs would need RBAC on them and one request per
    owner:

    - ReplicaSet → Deployment when the RS name is ``<deployment>-<pod-template-hash>``
      (the Deployment controller's naming; the pod carries the hash label); Argo Rollouts
      likewise with ``rollouts-pod-template-hash``; else the ReplicaSet itself.
    - ``batch/v1`` Job → JobSet (label ``jobset.sigs.k8s.io/jobset-name``), a Kubeflow
      launcher's job (``training.kubeflow.org/job-name``), or a CronJob when the Job name
      ends in a plausible ``-<scheduled minute>``; else the Job.
    - StatefulSet → LeaderWorkerSet when labelled so; else the StatefulSet.
    - ``Node`` (static mirror pods) → ``""``: a node is not a workload.
    - Any other owner (PyTorchJob, RayCluster, JobSet, DaemonSet, ...) is the top owner.
    - No owner: JobSet, LeaderWorkerSet, Kubeflow and KubeRay labels, then
      ``batch.kubernetes.io/job-name``/``job-name`` (an orphaned Job pod).
    """
    owner = next((o for o in owners if o.controller), owners[0] if owners else None)
    if owner is None:
        if found := _label_workload(labels):
            return found
        job = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")
        return f"Job/{job}" if job else ""
    group = owner.api_version.split("/")[0] if "/" in owner.api_version else ""
    if owner.kind == "ReplicaSet" and group == "apps":
        for hash_label, parent in (
            ("pod-template-hash", "Deployment"),
            ("rollouts-pod-template-hash", "Rollout"),
        ):
            pod_hash = labels.get(hash_label)
            if pod_hash and owner.name.endswith(f"-{pod_hash}"):
                return f"{parent}/{owner.name[: -len(pod_hash) - 1]}"
        return f"ReplicaSet/{owner.name}"
    if owner.kind == "Job" and group == "batch":
        if name := labels.get("jobset.sigs.k8s.io/jobset-name"):
            return f"JobSet/{name}"
        if labels.get("training.kubeflow.org/job-name"):
            return _label_workload(labels)
        m = _CRONJOB_SUFFIX.match(owner.name)
        if m and int(m.group("minutes")) in _CRONJOB_MINUTES:
            return f"CronJob/{m.group('name')}"
        return f"Job/{owner.name}"
    if owner.kind == "StatefulSet" and group == "apps":
        if name := labels.get("leaderworkerset.sigs.k8s.io/name"):
            return f"LeaderWorkerSet/{name}"
        return f"StatefulSet/{owner.name}"
    if owner.kind == "Node":
        return ""
    return f"{owner.kind}/{owner.name}"


def _container_id(raw: object) -> str | None:
    """``containerd://<hex>`` / ``cri-o://<hex>`` / ``docker://<hex>`` → ``<hex>``."""
    if not isinstance(raw, str) or not raw:
        return None
    return raw.rpartition("://")[2].lower() or None


def pod_from_json(obj: Mapping[str, Any]) -> PodInfo | None:
    """A :class:`PodInfo` from a Pod object of the API; ``None`` without a UID."""
    meta = _mapping(obj.get("metadata"))
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return None
    labels = {str(k): str(v) for k, v in _mapping(meta.get("labels")).items()}
    owners = tuple(
        OwnerRef(
            api_version=str(o.get("apiVersion", "")),
            kind=str(o.get("kind", "")),
            name=str(o.get("name", "")),
            uid=str(o.get("uid", "")),
            controller=bool(o.get("controller", False)),
        )
        for o in meta.get("ownerReferences") or ()
        if isinstance(o, dict)
    )
    status = _mapping(obj.get("status"))
    containers: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or ():
            if not isinstance(cs, dict) or not cs.get("name"):
                continue
            name = str(cs["name"])
            # The previous instance of a restarted container may still hold GPU memory for
            # a moment, so its ID keeps the name too.
            last = _mapping(_mapping(cs.get("lastState")).get("terminated"))
            for raw in (last.get("containerID"), cs.get("containerID")):
                if cid := _container_id(raw):
                    containers[cid] = name
    return PodInfo(
        uid=uid,
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        labels=MappingProxyType(labels),
        owners=owners,
        workload=derive_workload(owners, labels),
        containers=MappingProxyType(containers),
    )


# --------------------------------------------------------------------------------------
# Node
# --------------------------------------------------------------------------------------


def _capacity_type(labels: Mapping[str, str]) -> str:
    eks = labels.get("eks.amazonaws.com/capacityType")
    if eks:  # EKS managed node groups: ON_DEMAND, SPOT (CAPACITY_BLOCK is reserved)
        return "spot" if eks.upper() == "SPOT" else "on-demand"
    karpenter = labels.get("karpenter.sh/capacity-type")
    if karpenter:  # spot, on-demand, reserved (billed like on-demand)
        return "spot" if karpenter.lower() == "spot" else "on-demand"
    if any(
        labels.get(k, "").lower() == "true"
        for k in ("cloud.google.com/gke-spot", "cloud.google.com/gke-preemptible")
    ):
        return "spot"
    if labels.get("cloud.google.com/gke-provisioning", "").lower() == "spot":
        return "spot"
    if labels.get("kubernetes.azure.com/scalesetpriority", "").lower() == "spot":
        return "spot"
    lifecycle = labels.get("node.kubernetes.io/lifecycle", "").lower()  # kops, eksctl
    if lifecycle:
        return "spot" if lifecycle == "spot" else "on-demand"
    # GKE and AKS label only spot nodes; any of their own labels without a spot label
    # means a regular (on-demand) node.
    if "cloud.google.com/gke-nodepool" in labels or "kubernetes.azure.com/agentpool" in labels:
        return "on-demand"
    return ""


def node_info_from_labels(labels: Mapping[str, str]) -> NodeInfo:
    """Instance type, zone and capacity type from a Node's labels (current, then
    deprecated beta keys)."""
    return NodeInfo(
        instance_type=labels.get("node.kubernetes.io/instance-type")
        or labels.get("beta.kubernetes.io/instance-type", ""),
        zone=labels.get("topology.kubernetes.io/zone")
        or labels.get("failure-domain.beta.kubernetes.io/zone", ""),
        capacity_type=_capacity_type(labels),
    )


# --------------------------------------------------------------------------------------
# The watcher
# --------------------------------------------------------------------------------------


# A watch open at least this long (seconds) worked: its end, clean or not, resets the backoff.
_WATCH_WORKED_S = 1.0


class _ResourceExpired(Exception):
    """410 Gone: the watch's resourceVersion is older than the API server keeps."""


class PodMetadataWatcher:
    """Keep the pods of one node and the node's labels, in background daemon threads.

    One thread lists pods (``resourceVersion=0`` from the API server's cache; after a
    410 a consistent list, paginated with ``limit``/``continue``) then watches from the
    list's ``resourceVersion`` with bookmarks and a jittered ``timeoutSeconds``. A watch
    the server ends cleanly is resumed from the last ``resourceVersion``; ``410 Gone``
    relists at once; a broken stream, timeout or error status relists after an
    exponential backoff with jitter, which only a watch that worked (stayed open or
    delivered events) resets: a successful list does not, so a watch that fails at once
    every time makes the relists back off too. Another thread GETs the Node every
    ``node_refresh_s`` (``node_retry_s`` after a failure). Failures keep the last known
    pods and node.
    """

    def __init__(
        self,
        config: KubeConfig,
        node_name: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        request_timeout_s: float = 10.0,
        watch_timeout_s: float = 300.0,
        watch_read_timeout_s: float | None = None,
        node_refresh_s: float = 300.0,
        node_retry_s: float = 60.0,
        token_refresh_s: float = 60.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        page_size: int = 500,
        exec_timeout_s: float = 30.0,
        rng: random.Random | None = None,
    ) -> None:
        if not node_name:
            raise ValueError("node_name is required (pods are listed for this node only)")
        self._node_name = node_name
        self._clock = clock
        self._watch_timeout_s = watch_timeout_s
        # The server ends the watch after timeoutSeconds (up to 1.5x with jitter); the read
        # timeout only catches a stream gone silent (half-open connection).
        self._watch_read_timeout_s = (
            watch_read_timeout_s
            if watch_read_timeout_s is not None
            else watch_timeout_s * 1.5 + 30.0
        )
        self._node_refresh_s = node_refresh_s
        self._node_retry_s = node_retry_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._page_size = page_size
        self._rng = rng or random.Random()
        self._credentials = _Credentials(
            config,
            clock=clock,
            wall_clock=wall_clock,
            refresh_s=token_refresh_s,
            exec_timeout_s=exec_timeout_s,
        )
        self._client = _ApiClient(config, self._credentials, request_timeout_s)
        self._selector = f"spec.nodeName={node_name}"

        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pods: dict[str, PodInfo] = {}  # written by the pod thread, under _lock
        self._node: NodeInfo | None = None
        self._pods_updated_at: float | None = None
        self._node_updated_at: float | None = None
        self._stats = WatcherStats()
        self._snapshot = MetadataSnapshot()
        self._pods_failing = False
        self._node_failing = False

    # -- public ------------------------------------------------------------------------

    def start(self) -> None:
        if self._threads:
            return
        for target, name in ((self._run_pods, "kube-pods"), (self._run_node, "kube-node")):
            t = threading.Thread(target=target, name=f"gpuscope-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop both threads, aborting any request in flight."""
        self._stop.set()
        self._client.close()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> PodMetadataWatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def snapshot(self) -> MetadataSnapshot:
        """The latest view; never blocks on the network."""
        return self._snapshot

    def wait_synced(self, timeout: float) -> bool:
        """Wait until the first pod list has succeeded (for readiness and tests)."""
        return self._synced.wait(timeout)

    # -- state -------------------------------------------------------------------------

    def _publish(self, **stats: Any) -> None:
        """Update counters (``name=delta`` for ints, values for the rest) and swap in a
        new snapshot."""
        with self._lock:
            changes: dict[str, Any] = {}
            for key, value in stats.items():
                current = getattr(self._stats, key)
                is_count = isinstance(current, int) and not isinstance(current, bool)
                changes[key] = current + value if is_count else value
            self._stats = _replace_stats(self._stats, changes)
            self._snapshot = MetadataSnapshot(
                pods=MappingProxyType(dict(self._pods)),
                node=self._node,
                synced=self._synced.is_set(),
                pods_updated_at=self._pods_updated_at,
                node_updated_at=self._node_updated_at,
                stats=self._stats,
            )

    def _backoff(self, current: float) -> float:
        """Sleep ``current`` (±20 % jitter, so a DaemonSet's pods do not retry in step);
        return the next delay."""
        self._stop.wait(current * (0.8 + 0.4 * self._rng.random()))
        return min(current * 2.0, self._backoff_max_s)

    # -- pods --------------------------------------------------------------------------

    def _run_pods(self) -> None:
        backoff = self._backoff_initial_s
        resource_version: str | None = None
        consistent = False
        gone_streak = 0
        while not self._stop.is_set():
            if resource_version is None:
                try:
                    resource_version = self._list_pods(consistent)
                    consistent = False
                    # The backoff is not reset here but by a watch that works: with a watch
                    # that fails at once (a proxy that breaks watches, a 500 from an unhealthy
                    # watch cache), resetting here would relist at the first delay forever.
                except _Closed:
                    return
                except Exception as e:
                    if self._stop.is_set():
                        return
                    self._pods_error("pod list", e, pod_list_errors_total=1)
                    backoff = self._backoff(backoff)
                    continue
            try:
                started = self._clock()
                resource_version, events = self._watch(resource_version)
                gone_streak = 0
                if events == 0 and self._clock() - started < _WATCH_WORKED_S:
                    # The server ended an empty watch at once: pause rather than spin.
                    backoff = self._backoff(backoff)
                else:
                    backoff = self._backoff_initial_s
            except _Closed:
                return
            except _ResourceExpired:
                # Routine: the watch window moved past our resourceVersion.
                log.debug("pod watch expired (410 Gone); relisting")
                resource_version, consistent = None, True
                self._publish(relists_gone_total=1)
                gone_streak += 1
                if gone_streak > 1:
                    # 410 again straight after a fresh list: do not hammer the server.
                    backoff = self._backoff(backoff)
            except Exception as e:
                if self._stop.is_set():
                    return
                if self._clock() - started >= _WATCH_WORKED_S:
                    backoff = self._backoff_initial_s  # it worked for a while, then broke
                self._pods_error("pod watch", e, watch_errors_total=1)
                resource_version = None
                backoff = self._backoff(backoff)

    def _pods_error(self, what: str, error: Exception, **counts: int) -> None:
        if not self._pods_failing:
            log.warning("%s failed (keeping the last known pods): %s", what, error)
        else:
            log.debug("%s failed again: %s", what, error)
        self._pods_failing = True
        self._publish(pods_success=False, **counts)

    def _list_pods(self, consistent: bool) -> str:
        started = self._clock()
        query: dict[str, str] = {"fieldSelector": self._selector, "limit": str(self._page_size)}
        if not consistent:
            # Served from the API server's watch cache instead of a quorum read of etcd:
            # what client-go informers do, and what keeps a DaemonSet's relists cheap.
            query["resourceVersion"] = "0"
        pods: dict[str, PodInfo] = {}
        while True:
            doc = self._client.get_json("/api/v1/pods", query)
            for item in doc.get("items") or ():
                if isinstance(item, dict) and (pod := pod_from_json(item)) is not None:
                    pods[pod.uid] = pod
            meta = _mapping(doc.get("metadata"))
            token = meta.get("continue")
            if not token:
                break
            query = {
                "fieldSelector": self._selector,
                "limit": str(self._page_size),
                "continue": str(token),
            }
        resource_version = str(meta.get("resourceVersion") or "")
        if not resource_version:
            raise ApiError(200, "pod list without metadata.resourceVersion")
        with self._lock:  # _publish (both threads) copies _pods under the lock
            self._pods = pods
            self._pods_updated_at = self._clock()
        if self._pods_failing:
            log.info("pod list recovered: %d pods on %s", len(pods), self._node_name)
        self._pods_failing = False
        self._synced.set()
        self._publish(
            pod_lists_total=1, pods_success=True, pods_duration_seconds=self._clock() - started
        )
        return resource_version

    def _watch(self, resource_version: str) -> tuple[str, int]:
        """Follow one watch until the server ends it; returns the last resourceVersion
        and how many events (bookmarks included) arrived."""
        timeout = int(self._watch_timeout_s * (1.0 + 0.5 * self._rng.random()))
        query = {
            "fieldSelector": self._selector,
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(max(1, timeout)),
        }
        events = 0
        try:
            with self._client.stream("/api/v1/pods", query, self._watch_read_timeout_s) as lines:
                for line in lines:
                    resource_version = self._apply_event(json.loads(line), resource_version)
                    events += 1
        except ApiError as e:
            if e.status == 410:
                raise _ResourceExpired from e
            raise
        return resource_version, events

    def _apply_event(self, event: object, resource_version: str) -> str:
        ev = _mapping(event)
        kind = ev.get("type")
        obj = _mapping(ev.get("object"))
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise _ResourceExpired
            raise ApiError(
                int(code) if isinstance(code, int) else 0,
                str(obj.get("message", "watch ERROR event")),
            )
        new_rv = str(_mapping(obj.get("metadata")).get("resourceVersion") or resource_version)
        if kind == "BOOKMARK":
            return new_rv
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            raise ApiError(0, f"unexpected watch event type {kind!r}")
        pod = pod_from_json(obj)
        with self._lock:
            if pod is not None:
                if kind == "DELETED":
                    self._pods.pop(pod.uid, None)
                else:
                    self._pods[pod.uid] = pod
            self._pods_updated_at = self._clock()
        self._publish(watch_events_total=1)
        return new_rv

    # -- node --------------------------------------------------------------------------

    def _run_node(self) -> None:
        while not self._stop.is_set():
            try:
                ok = self._refresh_node()
            except _Closed:
                return
            if self._stop.wait(self._node_refresh_s if ok else self._node_retry_s):
                return

    def _refresh_node(self) -> bool:
        started = self._clock()
        path = "/api/v1/nodes/" + urllib.parse.quote(self._node_name, safe="")
        try:
            doc = self._client.get_json(path, {})
        except _Closed:
            raise
        except Exception as e:
            if self._stop.is_set():
                raise _Closed from e
            if not self._node_failing:
                log.warning(
                    "GET node %s failed (keeping the last known labels): %s", self._node_name, e
                )
            self._node_failing = True
            self._publish(
                node_requests_total=1,
                node_errors_total=1,
                node_success=False,
                node_duration_seconds=self._clock() - started,
            )
            return False
        labels = {
            str(k): str(v) for k, v in _mapping(_mapping(doc.get("metadata")).get("labels")).items()
        }
        with self._lock:
            self._node = node_info_from_labels(labels)
            self._node_updated_at = self._clock()
        self._node_failing = False
        self._publish(
            node_requests_total=1, node_success=True, node_duration_seconds=self._clock() - started
        )
        return True


def _replace_stats(stats: WatcherStats, changes: Mapping[str, Any]) -> WatcherStats:
    return replace(stats, **changes)
