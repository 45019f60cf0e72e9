"""The API-server client: lightkube, set up for a long-running watcher on every node.

lightkube does the generic work: kubeconfig and in-cluster configuration
(``KubeConfig.from_file``, ``KubeConfig.from_service_account``), authentication (bearer
token, ``tokenFile``, client certificates, ``exec`` credential plugins, re-reading a token
file or re-running a plugin after a 401), the TLS context (``certificate-authority`` file or
data, ``insecure-skip-tls-verify``), the httpx2 client, the URL and query of each request,
and decoding (msgspec) of lists, objects, watch events and ``Status`` errors.

Added here, because lightkube's ``Client`` does not offer it:

- **One watch request at a time.** ``Client.watch`` reconnects by itself, with no bookmarks
  and no read timeout, so its caller can neither back off nor count anything.
  :meth:`ApiClient.watch` opens one streaming GET (``allowWatchBookmarks``, a jittered
  ``timeoutSeconds`` from the caller, a read deadline) and ends with it; what comes next
  (resume, relist, backoff) is :mod:`gpuscope.exporter.kubernetes.apiserver`'s decision.
- **Token files re-read every minute**, as client-go does. lightkube re-reads only after a
  401, but a rotated bound service-account token does not make the old one fail: the kubelet
  writes a new token at 80 % of its lifetime and the API server goes on accepting the old
  one (for up to a year with ``--service-account-extend-token-expiration``), counting it as
  stale. Relative ``tokenFile`` and ``exec`` command paths resolve against the kubeconfig's
  directory, as kubectl resolves them.
- **A transport** under lightkube's client: lightkube's TLS context, TCP keepalive (a
  half-open watch fails in about a minute, not at the read deadline), a ``User-Agent``, and
  :meth:`ApiClient.close` that shuts down the sockets of requests in flight, so that
  stopping never waits for a timeout.
- **Readable errors** for any status (lightkube's ``raise_for_status`` needs a JSON body).

Objects come back as plain JSON (lightkube's generic, ``dict``-based resources) rather than
lightkube's typed models: :func:`~gpuscope.exporter.kubernetes.workload.pod_from_json` reads
the few fields it needs and tolerates the rest, whereas a typed model rejects a whole list
page for one object missing a field the model requires.

Limits (lightkube's): ``exec`` plugins get no ``KUBERNETES_EXEC_INFO`` and no timeout, and
run again only after a 401; ``auth-provider``, ``tls-server-name`` and proxies are not
supported.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import ssl
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any

import httpx2
import msgspec
import yaml
from lightkube import ConfigError, KubeConfig, SingleConfig
from lightkube.config.client_adapter import BearerTokenFileAuth, ConnectionParams, user_cert
from lightkube.config.models import User
from lightkube.core import decoders
from lightkube.core.generic_client import ALL_NS, BasicRequest, GenericSyncClient
from lightkube.core.resource import NamespacedResource, Resource
from lightkube.generic_resource import (
    GenericGlobalResource,
    GenericNamespacedResource,
    create_api_info,
)

from gpuscope.exporter import __version__
from gpuscope.exporter.kubernetes.apiserver import (
    ApiStatusError,
    ClientClosed,
    KubeConfigError,
    WatchExpired,
)

__all__ = [
    "ApiClient", "Nodes", "Pods", "ResourceSlices", "describe", "from_kubeconfig", "in_cluster",
]

log = logging.getLogger(__name__)

_USER_AGENT = f"gpuscope-exporter/{__version__}"


# --------------------------------------------------------------------------------------
# Resources: what is read, decoded as plain JSON objects (dicts)
# --------------------------------------------------------------------------------------


class Pods(GenericNamespacedResource):
    """``v1`` Pods, listed and watched across namespaces (with a field selector)."""

    _api_info = create_api_info("", "v1", "Pod", "pods", verbs=["global_list", "global_watch"])


class Nodes(GenericGlobalResource):
    """``v1`` Nodes, read one by name."""

    _api_info = create_api_info("", "v1", "Node", "nodes", verbs=["get"])


class ResourceSlices(GenericGlobalResource):
    """``resource.k8s.io/v1`` ResourceSlices (DRA, Kubernetes 1.34+), listed and watched with
    a ``spec.nodeName`` field selector: this node's devices, to map DRA devices to NVML
    UUIDs (:mod:`gpuscope.exporter.kubernetes.dra`)."""

    _api_info = create_api_info(
        "resource.k8s.io", "v1", "ResourceSlice", "resourceslices", verbs=["list", "watch"],
    )


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------

# The ExecCredential versions lightkube's ExecAuth accepts; any other fails at the first
# request, so it is refused here, at start-up.
_EXEC_API_VERSIONS = (
    "client.authentication.k8s.io/v1alpha1",
    "client.authentication.k8s.io/v1beta1",
)


def describe(config: SingleConfig) -> str:
    """Where a configuration came from, for log lines and errors."""
    if config.fname is None:
        return "in-cluster service account"
    return f"kubeconfig {config.fname} (context {config.context_name})"


def from_kubeconfig(path: str) -> SingleConfig:
    """The current context of a kubeconfig file, checked and with relative paths resolved.

    Raises :class:`KubeConfigError` (one line) for anything that would only fail later.
    """
    def fail(reason: str, error: Exception) -> KubeConfigError:
        reason = " ".join(reason.split()) or type(error).__name__  # one line
        return KubeConfigError(f"kubeconfig {path}: {reason}")

    try:
        kubeconfig = KubeConfig.from_file(path)
    except KeyError as e:
        raise fail(f"no {e.args[0]!r} list", e) from e
    except (TypeError, AttributeError) as e:  # lightkube indexing what is not a mapping
        raise fail(f"not a kubeconfig: expected a mapping with clusters, contexts and users "
                   f"lists of mappings ({e})", e) from e
    except RecursionError as e:  # PyYAML recurses once a level
        raise fail("nested too deeply: not a kubeconfig", e) from None
    except (ConfigError, OSError, yaml.YAMLError, msgspec.MsgspecError, ValueError) as e:
        raise fail(str(e), e) from e
    try:
        config = kubeconfig.get()
    except KeyError as e:  # the context names a cluster or user that is not defined
        raise fail(f"no cluster or user named {e.args[0]!r}", e) from e
    except ConfigError as e:
        raise fail(str(e), e) from e
    assert config is not None  # get() without a default raises instead
    user = config.user or User()
    if user.auth_provider is not None:
        raise KubeConfigError(
            f"kubeconfig {path}: user auth-provider is not supported (use a token, "
            "tokenFile, client certificate or exec plugin)"
        )
    changes: dict[str, Any] = {}
    if user.token_file is not None:
        changes["token_file"] = str(config.abs_file(os.path.expanduser(user.token_file)))
    if user.exec is not None:
        if user.exec.apiVersion not in _EXEC_API_VERSIONS:
            raise KubeConfigError(
                f"kubeconfig {path}: exec apiVersion {user.exec.apiVersion!r} is not supported "
                f"(use {' or '.join(_EXEC_API_VERSIONS)})"
            )
        command = user.exec.command
        if os.sep in command and not os.path.isabs(command):  # kubectl: relative to the file
            changes["exec"] = msgspec.structs.replace(
                user.exec, command=str(config.abs_file(command))
            )
    config = config._replace(user=msgspec.structs.replace(user, **changes))
    _check_server(config)
    return config


def in_cluster(serviceaccount_dir: str) -> SingleConfig:
    """The pod's service account (``KUBERNETES_SERVICE_HOST``/``_PORT``, its token, CA and
    namespace files); lightkube's ``ConfigError`` when a file is missing."""
    config = KubeConfig.from_service_account(serviceaccount_dir).get()
    assert config is not None
    ca = config.cluster.certificate_auth
    if ca is not None and not os.path.isfile(ca):
        raise ConfigError(f"{ca} is missing")
    return config


def _check_server(config: SingleConfig) -> None:
    server = config.cluster.server
    try:
        url = urllib.parse.urlsplit(server)  # ValueError: an unclosed IPv6 bracket
    except ValueError:
        url = None
    if url is None or url.scheme not in ("http", "https") or not url.hostname:
        raise KubeConfigError(f"{describe(config)}: API server URL {server!r} is not "
                              "http(s)://host")
    try:
        url.port  # noqa: B018 - raises on a port past 65535 (httpx2 would wrap it round)
    except ValueError:
        raise KubeConfigError(f"{describe(config)}: API server URL {server!r} has a bad "
                              "port") from None


class _EncryptedKey(Exception):
    pass


def _refuse_password() -> str:
    # Called by OpenSSL for an encrypted key: without it OpenSSL asks on the terminal.
    raise _EncryptedKey


def _check_client_key(config: SingleConfig) -> None:
    """Refuse an encrypted client key: lightkube loads it with no password callback, and
    OpenSSL then asks for the pass phrase on the terminal. Other faults are left to the
    load itself, which names them."""
    cert = user_cert(config.user or User(), config.abs_file)
    if cert is None:
        return
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(
            *cert, password=_refuse_password)
    except _EncryptedKey:
        raise KubeConfigError(f"{describe(config)}: client-key: encrypted private keys are "
                              "not supported") from None
    except (OSError, ssl.SSLError, ValueError):
        pass


def _check_files(config: SingleConfig) -> None:
    """Name a missing file (ssl's own error does not)."""
    user = config.user or User()
    for key, path, data in (
        ("certificate-authority", config.cluster.certificate_auth,
         config.cluster.certificate_auth_data),
        ("client-certificate", user.client_cert, user.client_cert_data),
        ("client-key", user.client_key, user.client_key_data),
        ("tokenFile", user.token_file, None),
    ):
        if path and not data and not os.path.isfile(found := config.abs_file(path)):
            raise KubeConfigError(f"{describe(config)}: {key} {found} does not exist")


# --------------------------------------------------------------------------------------
# Authentication and transport
# --------------------------------------------------------------------------------------


class _TokenFileAuth(BearerTokenFileAuth):
    """lightkube's token-file authentication (the file is re-read after a 401), also
    re-reading it every ``refresh_s``. A failed re-read keeps the last token."""

    def __init__(self, token_file: str, refresh_s: float, clock: Callable[[], float]) -> None:
        super().__init__(token_file)
        self._refresh_s = refresh_s
        self._clock = clock
        self._read_at = -math.inf

    def _read_token(self) -> str:
        try:
            bearer = super()._read_token()
        except (ConfigError, OSError) as e:
            if self._last_bearer is None:
                raise
            log.warning("cannot read token file %s (keeping the last token): %s",
                        self._token_file, e)
            return self._last_bearer
        self._read_at = self._clock()
        return bearer

    def auth_flow(
        self, request: httpx2.Request
    ) -> Generator[httpx2.Request, httpx2.Response, None]:
        if self._clock() - self._read_at >= self._refresh_s:
            self._last_bearer = self._read_token()
        return super().auth_flow(request)


def _keepalive_options() -> list[tuple[int, int, int]]:
    """TCP keepalive after 30 s idle, then every 10 s, 3 probes (client-go dials with a 30 s
    keepalive): a watch whose peer vanished fails within about a minute."""
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):  # Linux; elsewhere the system's keepalive timing applies
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


class _Transport(httpx2.BaseTransport):
    """httpx2's transport with lightkube's TLS context, TCP keepalive and our User-Agent;
    remembers the socket of every connection (httpcore's ``trace`` extension reports each
    connect and TLS handshake) so that :meth:`close` can shut them down, which wakes a thread
    blocked reading a response (closing a socket does not)."""

    def __init__(self, tls: ssl.SSLContext) -> None:
        self._inner = httpx2.HTTPTransport(
            verify=tls, trust_env=False, socket_options=_keepalive_options()
        )
        self._lock = threading.Lock()
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._closed = False

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        if self._closed:
            raise ClientClosed
        request.headers["User-Agent"] = _USER_AGENT
        request.extensions["trace"] = self._trace
        try:
            return self._inner.handle_request(request)
        except (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError):
            # No response at all: most likely a kept-alive connection that the server (or a
            # proxy) closed while it was idle. A GET is safe to send again, once, on a new
            # connection, as Go's HTTP client does; anything else is the caller's error.
            if request.method != "GET" or self._closed:
                raise
            return self._inner.handle_request(request)

    def _trace(self, event: str, info: Mapping[str, Any]) -> None:
        if event not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        sock = info["return_value"].get_extra_info("socket")
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._sockets.add(sock)
        if closed:  # close() ran while this connection was being made
            _shutdown(sock)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)
        self._inner.close()


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed, or detached by the TLS wrapper
        sock.shutdown(socket.SHUT_RDWR)


class _Lightkube(GenericSyncClient):
    """lightkube's client layer (request building, decoding) over an httpx2 client built
    from lightkube's own connection parameters, with :class:`_Transport` and, for token
    files, :class:`_TokenFileAuth`. ``AdapterClient`` is lightkube's hook for building
    that client."""

    def __init__(
        self,
        config: SingleConfig,
        request_timeout_s: float,
        token_refresh_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._token_refresh_s = token_refresh_s
        self._clock = clock
        super().__init__(
            ConnectionParams(timeout=httpx2.Timeout(request_timeout_s), trust_env=False),
            config,
        )

    def AdapterClient(  # lightkube's hook (and its name)
        self, config: SingleConfig, conn_params: ConnectionParams
    ) -> httpx2.Client:
        if config.user is None:  # a context without a user (a local `kubectl proxy`)
            config = config._replace(user=User())
        params = conn_params.httpx_params(config)  # base_url, TLS context, auth, timeout
        assert config.user is not None
        if config.user.token_file is not None:
            params["auth"] = _TokenFileAuth(
                config.user.token_file, self._token_refresh_s, self._clock
            )
        self.transport = _Transport(params.pop("verify"))
        params["transport"] = self.transport
        self.http = httpx2.Client(**params)
        return self.http


# --------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------

Object = dict[str, Any]


class ApiClient:
    """GET one object, list (paginated) and watch (one request) objects, with lightkube.

    Thread-safe. ``request_timeout_s`` bounds connecting, sending and each read of every
    request; a watch's reads are bounded by the caller's ``read_timeout_s`` instead.
    Raises :class:`KubeConfigError` when the TLS material or credentials cannot be loaded.
    """

    def __init__(
        self,
        config: SingleConfig,
        *,
        request_timeout_s: float,
        token_refresh_s: float,
        clock: Callable[[], float],
    ) -> None:
        _check_server(config)
        _check_files(config)
        _check_client_key(config)
        self._timeout_s = request_timeout_s
        try:
            self._lk = _Lightkube(config, request_timeout_s, token_refresh_s, clock)
        except (OSError, ssl.SSLError, ValueError, ConfigError) as e:
            reason = " ".join(str(e).split()) or type(e).__name__
            raise KubeConfigError(f"TLS or credentials of {describe(config)}: {reason}") from e

    def close(self) -> None:
        """Abort every request in flight (their threads get an error at once) and refuse
        new ones with :class:`ClientClosed`."""
        self._lk.transport.close()
        self._lk.http.close()

    def get(self, resource: type[Resource], name: str) -> Object:
        request = self._lk.prepare_request("get", res=resource, name=name)
        return self._decode(self._send(request).content, resource)

    def list(
        self, resource: type[Resource], *, fields: str, page_size: int
    ) -> Iterator[tuple[str, list[Object]]]:
        """The pages of a list, each with the list's ``resourceVersion`` (``""`` if none);
        the next page is requested once the caller has taken this one."""
        request = self._lk.prepare_request(
            "list", res=resource, namespace=self._all(resource),
            params={"fieldSelector": fields, "limit": page_size},
        )
        while True:
            response = self._send(request)
            cont, rv, items = decoders.decode_list(response.content, resource)
            yield rv or "", items
            if not cont:
                return
            request.params["continue"] = cont

    @contextlib.contextmanager
    def watch(
        self,
        resource: type[Resource],
        *,
        fields: str,
        resource_version: str,
        timeout_s: int,
        read_timeout_s: float,
    ) -> Iterator[Iterator[tuple[str, Object]]]:
        """One watch request: yields an iterator of ``(type, object)`` events, bookmarks
        included, that ends when the server ends the watch. A ``410 Gone`` (as the answer or
        as an ``ERROR`` event) raises :class:`WatchExpired`; a stream cut short raises
        httpx2's ``RemoteProtocolError``."""
        request = self._lk.prepare_request(
            "list", res=resource, namespace=self._all(resource), watch=True,
            params={
                "fieldSelector": fields,
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": timeout_s,
            },
        )
        request.timeout = httpx2.Timeout(self._timeout_s, read=read_timeout_s)
        response = self._send(request, stream=True)
        try:
            yield self._events(response, resource)
        finally:
            response.close()

    def _events(
        self, response: httpx2.Response, resource: type[Resource]
    ) -> Iterator[tuple[str, Object]]:
        for line in _lines(response):
            if not line.strip():
                continue
            event = decoders.decode_watch_event(line)
            if event.type == "ERROR":
                status = decoders.decode_status(event.object)
                if status.code == 410:
                    raise WatchExpired(status.message or "410 Gone")
                raise ApiStatusError(status.code or 0, status.message or "watch ERROR event")
            yield event.type, self._decode(event.object, resource)

    @staticmethod
    def _all(resource: type[Resource]) -> str | None:
        return ALL_NS if issubclass(resource, NamespacedResource) else None

    @staticmethod
    def _decode(data: bytes | msgspec.Raw, resource: type[Resource]) -> Object:
        obj = decoders.decode_object(data, resource)
        if not isinstance(obj, dict):
            raise ApiStatusError(200, f"{resource.__name__}: the response is not a JSON object")
        return obj

    def _send(self, request: BasicRequest, *, stream: bool = False) -> httpx2.Response:
        response = self._lk.http.send(self._lk.build_adapter_request(request), stream=stream)
        if response.status_code == 200:
            return response
        try:
            message = _status_message(response.read(), response.reason_phrase)
        finally:
            response.close()
        if response.status_code == 410:
            raise WatchExpired(message)
        raise ApiStatusError(response.status_code, message)


def _lines(response: httpx2.Response) -> Iterator[bytes]:
    """A watch stream's events: one JSON object a line, split at ``\\n`` only. Not httpx2's
    ``iter_lines()``, which splits as ``str.splitlines()`` does, also at U+0085 (NEL),
    U+2028, U+2029 and a few control characters: Go's encoding/json writes U+0085 raw in a
    string (the others escaped), so one pod with it in a label, an annotation or an
    argument cut its events in two and failed the watch at each of them."""
    buffer = bytearray()
    for chunk in response.iter_bytes():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            buffer += chunk[start:end]
            yield bytes(buffer)
            buffer.clear()
            start = end + 1
        buffer += chunk[start:]
    if buffer:
        yield bytes(buffer)


def _status_message(body: bytes, reason: str) -> str:
    """The ``message`` of a ``Status`` error body, else the HTTP reason."""
    try:
        status = decoders.decode_status(body)
    except msgspec.MsgspecError:
        return reason
    return status.message or reason
