"""HTTP client of the Prometheus mode: form POSTs to a Prometheus-compatible API, with the
authentication that managed and secured Prometheus servers ask for.

- :class:`BearerAuth`: ``Authorization: Bearer <token>`` from a file (a Kubernetes Secret or
  projected service-account token, Azure Monitor's managed-identity token, a proxy's token).
  The file is re-read when it changes (inode, size or mtime: a Secret volume swaps a symlink),
  at least every :data:`REREAD_SECONDS`, and once more after a 401, so a rotated token is
  picked up without a restart.
- :class:`BasicAuth`: a user and a password, the password from a file (re-read as above) or
  given by the caller (the CLI takes it from an environment variable, never from a flag).
- :class:`SigV4Auth`: AWS Signature Version 4, as Amazon Managed Service for Prometheus
  (service ``aps``) requires, signed by botocore with its default credential chain
  (environment, web identity/IRSA, EKS Pod Identity, profiles, instance profile). botocore
  is imported only when this class is used: +65 ms and +5 MiB of RSS in the dashboard
  process, 59 µs to sign a query (docs/dashboard.md#managed-prometheus).
- :class:`TlsConfig`: a CA bundle to trust, a client certificate and key (re-loaded when
  their files change), and the name to verify the server's certificate against.

The HTTP stack is the standard library's ``urllib``: one connection per query, as before.
A pooled keep-alive client (httpx2) saves the TLS handshake, measured at 1.4 ms per query
on loopback (2.0 vs 0.6 ms), i.e. ~20 ms for a 15-query page: not worth a second HTTP stack
or the stale-connection failures pools bring.

No credential is logged or put into an error message: error texts from the server are cut to
one line and have every secret value of the request removed.
"""

from __future__ import annotations

import base64
import email.message
import functools
import http.client
import importlib
import json
import logging
import os
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol

from gpuscope.dashboard.data.source import DataError

log = logging.getLogger(__name__)

#: A secret file is re-read at least this often even when its metadata looks unchanged
#: (a rewrite within the file system's mtime granularity keeps inode, size and mtime).
REREAD_SECONDS = 60.0
#: A secret file larger than this is refused (a token is a few KiB at most).
MAX_SECRET = 64 * 1024
#: A server's error text is cut to this many characters (one line) in a DataError.
MAX_DETAIL = 300

#: The largest answer read from the store, in bytes: a 5,000-node fleet page's largest is a
#: few MiB (docs/benchmarks.md); past this a query fails with one line (an answer without
#: end, from a broken proxy or a server that is not Prometheus, would exhaust the memory).
MAX_ANSWER_BYTES = 256 << 20
#: Amazon Managed Service for Prometheus: the region is the host's second label.
AMP_HOST = re.compile(r"^aps-workspaces(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")


class CredentialError(DataError):
    """A credential or TLS file that cannot be used (missing, unreadable, empty, malformed),
    or no AWS credentials: ``str()`` is one line naming the file (or flag), never its
    content. At start-up the CLI shows it and exits; later it is a DataError like any."""


def reject_credentials_in_url(url: str) -> None:
    """ValueError when ``url`` carries ``user:password@``: it would end up in logs, the page
    header and error messages. The auth flags take credentials from files instead."""
    if urllib.parse.urlsplit(url).username is not None:
        raise ValueError("the URL must not hold credentials (user:password@); use the "
                         "basic-auth user and password-file options instead")


def reject_query_in_url(url: str) -> None:
    """ValueError when ``url`` has a query (``?…``) or a fragment (``#…``): the API paths
    are put after it (``url + "/api/v1/query"``), so they would land inside the query. A
    path prefix (``http://host/prometheus``) is fine."""
    if "?" in url or "#" in url:  # userinfo, the one other place for them, is refused
        raise ValueError(f"expected a URL without a query or fragment (?... or #...): the "
                         f"API paths go after it, got {url!r}")


def amp_region(url: str) -> str | None:
    """The AWS region of an Amazon Managed Service for Prometheus URL
    (``https://aps-workspaces.<region>.amazonaws.com/workspaces/ws-…``), else None."""
    host = urllib.parse.urlsplit(url).hostname or ""
    match = AMP_HOST.match(host)
    return match.group(1) if match else None


# -- secret files -----------------------------------------------------------------------------
class SecretFile:
    """A secret kept in a file: its stripped content, re-read when the file changes.

    ``what`` names the file in errors (the CLI passes its flag). Thread-safe: the fleet
    page's queries run concurrently."""

    def __init__(self, path: str, what: str = "secret file", *,
                 reread_seconds: float = REREAD_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.what = what
        self.reread_seconds = reread_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._value: str | None = None
        self._stat: tuple[int, int, int, int] | None = None
        self._read_at = 0.0

    @property
    def current(self) -> str | None:
        """The secret last read (None before the first read), for redaction."""
        return self._value

    def _fail(self, reason: str) -> CredentialError:
        return CredentialError(f"{self.what} {self.path}: {reason}")

    def _load(self) -> str:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                raw = f.read(MAX_SECRET + 1)
        except OSError as exc:
            raise self._fail(exc.strerror or type(exc).__name__) from None
        if len(raw) > MAX_SECRET:
            raise self._fail(f"is larger than {MAX_SECRET // 1024} KiB: not a secret")
        try:
            value = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise self._fail("not UTF-8 text") from None
        if not value:
            raise self._fail("is empty")
        # A header value cannot hold line breaks or other control characters.
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise self._fail("holds a line break or another control character")
        self._value = value
        self._stat = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self._read_at = self._clock()
        return value

    def get(self) -> str:
        """The current secret; CredentialError when the file cannot be read (a later read
        that fails does not fall back to the old secret: the file is the truth)."""
        with self._lock:
            if self._value is None or self._clock() - self._read_at >= self.reread_seconds:
                return self._load()
            try:
                st = os.stat(self.path)
            except OSError as exc:
                raise self._fail(exc.strerror or type(exc).__name__) from None
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != self._stat:
                return self._load()
            return self._value

    def reload(self) -> bool:
        """Read the file again now; True when the secret changed."""
        with self._lock:
            old = self._value
            return self._load() != old


# -- authentication ---------------------------------------------------------------------------
class Auth(Protocol):
    """Adds credentials to one request."""

    def check(self) -> None:
        """Load what the credentials need now (start-up); CredentialError if impossible."""

    def apply(self, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        """Add the credentials to ``headers`` (in place) for this exact request."""

    def refresh(self, sent: Mapping[str, str]) -> bool:
        """After a 401 to a request with headers ``sent``: reload the credentials; True
        when they differ from those sent (a retry may succeed)."""

    def secrets(self) -> Iterable[str]:
        """The secret values in use, to be removed from any text shown to the user."""

    def describe(self) -> str:
        """What it sends, for the start-up log: never a secret."""


class BearerAuth:
    """``Authorization: Bearer <token>``, the token read from ``token_file``."""

    def __init__(self, token_file: str | SecretFile) -> None:
        self.token = (token_file if isinstance(token_file, SecretFile)
                      else SecretFile(token_file, "bearer token file"))

    def _token(self) -> str:
        token = self.token.get()
        if not token.isascii():  # HTTP sends header values as Latin-1; tokens are ASCII
            raise CredentialError(f"{self.token.what} {self.token.path}: holds characters "
                                  "other than ASCII")
        return token

    def check(self) -> None:
        self._token()

    def apply(self, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        headers["Authorization"] = f"Bearer {self._token()}"

    def refresh(self, sent: Mapping[str, str]) -> bool:
        # Compared with what was sent, not with the previous read: another query may
        # have read the new token between this one's send and its 401.
        self.token.reload()
        return sent.get("Authorization") != f"Bearer {self.token.current}"

    def secrets(self) -> Iterable[str]:
        value = self.token.current
        return (value,) if value else ()

    def describe(self) -> str:
        return f"bearer token from {self.token.path}"


class BasicAuth:
    """HTTP basic auth (RFC 7617): ``user`` and a password from a file or given."""

    def __init__(self, user: str, password: str | SecretFile) -> None:
        if ":" in user or any(ord(c) < 0x20 for c in user):
            raise ValueError("the basic-auth user must not contain ':' or control characters")
        if not user:
            raise ValueError("the basic-auth user is empty")
        if isinstance(password, str) and not password:
            raise ValueError("the basic-auth password is empty")
        self.user = user
        self.password = password

    def _password(self) -> str:
        return self.password.get() if isinstance(self.password, SecretFile) else self.password

    def check(self) -> None:
        self._password()

    def apply(self, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        pair = f"{self.user}:{self._password()}".encode()
        headers["Authorization"] = f"Basic {base64.b64encode(pair).decode('ascii')}"

    def refresh(self, sent: Mapping[str, str]) -> bool:
        if not isinstance(self.password, SecretFile):
            return False
        self.password.reload()
        headers: dict[str, str] = {}
        self.apply("POST", "", headers, b"")
        return sent.get("Authorization") != headers["Authorization"]

    def secrets(self) -> Iterable[str]:
        value = (self.password.current if isinstance(self.password, SecretFile)
                 else self.password)
        if not value:
            return ()
        encoded = base64.b64encode(f"{self.user}:{value}".encode()).decode("ascii")
        return (value, encoded)

    def describe(self) -> str:
        where = (f"from {self.password.path}" if isinstance(self.password, SecretFile)
                 else "from the environment")
        return f"basic auth as {self.user!r}, password {where}"


class SigV4Auth:
    """AWS Signature Version 4 over each request (method, URL, headers, body), by botocore,
    for ``service`` (``aps``: Amazon Managed Service for Prometheus) in ``region``.

    Credentials come from botocore's default chain and are refreshed by botocore before
    they expire (IRSA web identity, Pod Identity, instance profile). ``region`` None takes
    botocore's (``AWS_DEFAULT_REGION``, the profile's). ``session`` is a
    ``botocore.session.Session`` to use instead of a new one (tests, profiles)."""

    def __init__(self, region: str | None = None, *, service: str = "aps",
                 session: Any = None) -> None:
        # Imported here, only when SigV4 is chosen: botocore costs the dashboard 65 ms and
        # 5 MiB (105 ms and 20 MiB in a bare interpreter).
        # importlib: botocore ships no type information (its objects are Any here).
        try:
            auth_mod = importlib.import_module("botocore.auth")
            awsrequest = importlib.import_module("botocore.awsrequest")
            exceptions = importlib.import_module("botocore.exceptions")
            session_mod = importlib.import_module("botocore.session")
        except ImportError:
            raise CredentialError(
                "SigV4 needs botocore, which is not installed "
                "(pip install 'gpuscope[dashboard]', or botocore)") from None
        # botocore logs the canonical request at debug level, and with it the session
        # token (a signed header): keep its debug lines out of --log-level debug.
        logging.getLogger("botocore").setLevel(max(logging.INFO,
                                                   logging.getLogger("botocore").level))
        self._auth_mod = auth_mod
        self._request_cls = awsrequest.AWSRequest
        self._errors: type[Exception] = exceptions.BotoCoreError
        self._session = session if session is not None else session_mod.Session()
        self.service = service
        self.region = region
        self._credentials: Any = None
        self._lock = threading.Lock()
        self._last: Any = None  # the frozen credentials of the latest signature

    def check(self) -> None:
        if self.region is None:
            region = self._session.get_config_variable("region")
            if not region:
                raise CredentialError(
                    "no AWS region: give one, or use the workspace URL "
                    "(aps-workspaces.<region>.amazonaws.com), or set AWS_REGION")
            self.region = str(region)
        self._creds()

    def _creds(self) -> Any:
        with self._lock:
            if self._credentials is None:
                try:
                    creds = self._session.get_credentials()
                except self._errors as exc:
                    raise CredentialError(f"AWS credentials: {exc}") from None
                if creds is None:
                    raise CredentialError(
                        "no AWS credentials found (environment, web identity/IRSA, "
                        "Pod Identity, ~/.aws, instance profile)")
                self._credentials = creds
            return self._credentials

    def apply(self, method: str, url: str, headers: dict[str, str], body: bytes) -> None:
        if self.region is None:
            self.check()
        try:
            frozen = self._creds().get_frozen_credentials()  # refreshes when near expiry
        except self._errors as exc:
            raise CredentialError(f"AWS credentials: {exc}") from None
        self._last = frozen
        request = self._request_cls(method=method, url=url, data=body, headers=dict(headers))
        self._auth_mod.SigV4Auth(frozen, self.service, self.region).add_auth(request)
        headers.clear()
        headers.update((str(k), str(v)) for k, v in request.headers.items())

    def refresh(self, sent: Mapping[str, str]) -> bool:
        return False  # botocore refreshes credentials itself; AWS's 403 is final

    def secrets(self) -> Iterable[str]:
        frozen = self._last
        if frozen is None:
            return ()
        return tuple(s for s in (frozen.secret_key, frozen.token) if s)

    def describe(self) -> str:
        creds = self._credentials
        method = getattr(creds, "method", None) or "?"
        # The access key id is not a secret (it is in every request's Authorization header)
        # and tells which identity the dashboard runs as.
        key = getattr(creds, "access_key", None) if creds is not None else None
        return (f"AWS SigV4 for {self.service} in {self.region}, credentials: {method}"
                + (f" ({key})" if key else ""))


# -- TLS --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS towards the server: ``ca_file`` (PEM bundle trusted instead of the system's),
    ``cert_file``/``key_file`` (client certificate, both or neither), ``server_name`` (the
    name the server's certificate must carry, and sent as SNI, when the URL's host is not
    it). ``names`` labels the files in errors (the CLI passes its flags)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    names: tuple[str, str, str] = ("CA file", "client certificate", "client key")

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both its certificate and key file")

    def describe(self) -> str:
        parts = [f"CA {self.ca_file}" if self.ca_file else "system CAs"]
        if self.cert_file:
            parts.append(f"client certificate {self.cert_file}")
        if self.server_name:
            parts.append(f"server name {self.server_name}")
        return ", ".join(parts)

    def files(self) -> tuple[str, ...]:
        return tuple(p for p in (self.ca_file, self.cert_file, self.key_file) if p)

    def context(self) -> ssl.SSLContext:
        """A verifying client context; CredentialError naming the file that is wrong."""
        ca_name, cert_name, key_name = self.names
        for path, name in ((self.ca_file, ca_name), (self.cert_file, cert_name),
                           (self.key_file, key_name)):
            if path is not None:
                try:
                    with open(path, "rb"):
                        pass
                except OSError as exc:
                    raise CredentialError(f"{name} {path}: {exc.strerror or exc}") from None
        if self.ca_file is None:
            ctx = ssl.create_default_context()
        else:
            # Only the given CA: a private CA replaces the system bundle (as Prometheus'
            # own tls_config ca_file does), so a public certificate for the name is refused.
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                ctx.load_verify_locations(cafile=self.ca_file)
            except (ssl.SSLError, ValueError):
                raise CredentialError(f"{ca_name} {self.ca_file}: no PEM certificate in it"
                                      ) from None
        if self.cert_file is not None and self.key_file is not None:
            key_file = self.key_file

            def refuse_password() -> str:
                # Called by OpenSSL for an encrypted key; without it OpenSSL asks for the
                # pass phrase on the terminal (at start-up, and at each reload).
                raise CredentialError(f"{key_name} {key_file}: encrypted private keys are "
                                      "not supported")

            try:
                ctx.load_cert_chain(self.cert_file, self.key_file, password=refuse_password)
            except (ssl.SSLError, ValueError) as exc:
                reason = getattr(exc, "reason", None) or "not a matching PEM certificate/key"
                raise CredentialError(
                    f"{cert_name} {self.cert_file} / {key_name} {self.key_file}: {reason}"
                ) from None
        return ctx


class _TlsState:
    """The SSL context of a TlsConfig, rebuilt when one of its files changes (a client
    certificate renewed by cert-manager, a rotated CA bundle)."""

    def __init__(self, config: TlsConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._ctx: ssl.SSLContext | None = None
        self._stats: tuple[tuple[int, int, int, int], ...] | None = None

    def _signature(self) -> tuple[tuple[int, int, int, int], ...] | None:
        """The files' identities; None when one is missing (context() then names it)."""
        out = []
        for path in self.config.files():
            try:
                st = os.stat(path)
            except OSError:
                return None
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def context(self) -> ssl.SSLContext:
        with self._lock:
            sig = self._signature()
            if self._ctx is None or sig is None or sig != self._stats:
                self._ctx = self.config.context()
                self._stats = sig
            return self._ctx


class _HTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection whose certificate check and SNI use ``server_name`` instead of
    the URL's host (the Host header stays the URL's)."""

    def __init__(self, host: str, *, server_name: str, context: ssl.SSLContext,
                 **kwargs: Any) -> None:
        super().__init__(host, context=context, **kwargs)
        self._server_name = server_name
        self._ssl_context = context

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP (and a proxy's CONNECT tunnel)
        self.sock = self._ssl_context.wrap_socket(self.sock, server_hostname=self._server_name)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, tls: _TlsState) -> None:
        super().__init__()
        self.tls = tls

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        ctx = self.tls.context()
        server_name = self.tls.config.server_name
        if server_name is None:
            return self.do_open(http.client.HTTPSConnection, req, context=ctx)
        return self.do_open(functools.partial(_HTTPSConnection, server_name=server_name),
                            req, context=ctx)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: urllib would send the credentials (and our Host header)
    on to the new location, another host maybe, and turn the POST into a GET without the
    query. A 3xx becomes a DataError naming the location instead."""

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int,
                         msg: str, headers: email.message.Message,
                         newurl: str) -> urllib.request.Request | None:
        return None


# -- the client -------------------------------------------------------------------------------
#: The HTTP statuses of a server that has no Prometheus query API at the URL's path.
_NOT_AN_API = frozenset({404, 405, 501})
_NOT_AN_API_HINT = ("(no Prometheus query API at this URL: give the base URL of its /api/v1/ "
                    "paths, e.g. http://prometheus:9090 or Mimir's https://mimir/prometheus; "
                    "an exporter's address goes to --targets)")


class PromApi:
    """POSTs form-encoded queries to ``url`` + path and returns the answer's ``data``.

    Each failure is one :class:`DataError` line prefixed with ``description`` (default
    ``Prometheus <url>``): ``HTTP <code> <the server's error>``, ``unreachable: <reason>``,
    ``TLS …``, ``answer is not JSON``, ``query failed: <error>``. After a 401, the auth
    reloads its secret and, when it changed, the query is sent once more."""

    def __init__(self, url: str, *, timeout: float = 10.0, auth: Auth | None = None,
                 tls: TlsConfig | None = None, description: str | None = None,
                 user_agent: str | None = None,
                 max_answer_bytes: int = MAX_ANSWER_BYTES) -> None:
        reject_credentials_in_url(url)
        reject_query_in_url(url)
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_answer_bytes = max_answer_bytes
        self.auth = auth
        self.tls = tls
        self.description = description or f"Prometheus {self.url}"
        self.user_agent = user_agent
        handlers: list[urllib.request.BaseHandler] = [_NoRedirects()]
        self._tls = _TlsState(tls) if tls is not None else None
        if self._tls is not None:
            handlers.append(_HTTPSHandler(self._tls))
        self._opener = urllib.request.build_opener(*handlers)

    def check(self) -> None:
        """Load credentials and TLS files now (start-up): CredentialError, one line."""
        self.check_tls()
        if self.auth is not None:
            self.auth.check()

    def check_tls(self) -> None:
        """Load the TLS files now: CredentialError naming the file."""
        if self._tls is not None:
            self._tls.context()

    def _redact(self, text: str) -> str:
        text = " ".join(str(text).split())  # one line
        secrets = tuple(self.auth.secrets()) if self.auth is not None else ()
        for secret in sorted(secrets, key=len, reverse=True):
            if len(secret) >= 4:
                text = text.replace(secret, "<redacted>")
        return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL] + "…"

    def _request(self, path: str, body: bytes) -> tuple[urllib.request.Request, dict[str, str]]:
        url = self.url + path
        parts = urllib.parse.urlsplit(url)
        default_port = 443 if parts.scheme == "https" else 80
        # Set Host ourselves so that what SigV4 signs is exactly what is sent.
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        if parts.port is not None and parts.port != default_port:
            host = f"{host}:{parts.port}"
        headers = {"Host": host, "Content-Type": "application/x-www-form-urlencoded",
                   "Accept": "application/json"}
        if self.user_agent:
            headers["User-Agent"] = self.user_agent
        if self.auth is not None:
            self.auth.apply("POST", url, headers, body)
        return urllib.request.Request(url, data=body, method="POST", headers=headers), headers

    def post_form(self, path: str, params: Mapping[str, str],
                  decode: Callable[[bytes], Any] = json.loads) -> Any:
        """POST ``params`` form-encoded to ``url + path``; the answer's ``data``. ``decode``:
        the answer's JSON to Python (a faster, typed decoder for large answers); it raises
        ValueError on what is not JSON."""
        body = urllib.parse.urlencode(params).encode()
        for attempt in (1, 2):
            try:
                req, sent = self._request(path, body)
            except CredentialError as exc:
                raise DataError(f"{self.description}: {exc}") from None
            try:
                with self._opener.open(req, timeout=self.timeout) as resp:
                    # Read up to the cap: a server that streams without end (or a huge
                    # answer) costs one failed query, not the process's memory.
                    raw = resp.read(self.max_answer_bytes + 1)
                if len(raw) > self.max_answer_bytes:
                    raise DataError(f"{self.description}: answer larger than "
                                    f"{self.max_answer_bytes >> 20} MiB: not read")
                break
            except urllib.error.HTTPError as exc:
                if (exc.code == 401 and attempt == 1 and self.auth is not None
                        and self.auth.refresh(sent)):
                    log.info("%s: HTTP 401, credentials reloaded, retrying once",
                             self.description)
                    exc.close()
                    continue
                detail = self._detail(exc)
                if 300 <= exc.code < 400:
                    where = self._redact(exc.headers.get("Location") or "?")
                    detail = f"redirect to {where} not followed: use that URL"
                elif exc.code in _NOT_AN_API:
                    # A Prometheus UI page's URL (…/graph), a prefix left out (Mimir's
                    # …/prometheus), or an exporter's address (it answers POST with 501).
                    detail = (f"{detail} " if detail else "") + _NOT_AN_API_HINT
                raise DataError(f"{self.description}: HTTP {exc.code} {detail}".strip()
                                ) from None
            except CredentialError as exc:  # a TLS file gone or broken since start-up
                raise DataError(f"{self.description}: {exc}") from None
            except ssl.SSLCertVerificationError as exc:
                raise DataError(f"{self.description}: TLS: server certificate not trusted: "
                                f"{exc.verify_message or exc.reason}") from None
            except urllib.error.URLError as exc:
                raise self._unreachable(exc.reason) from None
            except (TimeoutError, OSError) as exc:
                raise self._unreachable(exc) from None
            except http.client.HTTPException as exc:  # a malformed or cut-short answer
                raise DataError(f"{self.description}: bad HTTP answer: "
                                f"{type(exc).__name__}") from None
            except ValueError as exc:  # a URL or header http.client refuses to send
                raise DataError(f"{self.description}: cannot send the query: "
                                f"{self._redact(str(exc))}") from None
        try:
            payload = decode(raw)
        except ValueError:
            raise DataError(f"{self.description}: answer is not JSON") from None
        if not isinstance(payload, dict) or payload.get("status") != "success":
            error = payload.get("error") if isinstance(payload, dict) else payload
            raise DataError(f"{self.description}: query failed: {self._redact(str(error))}")
        return payload["data"]

    def _unreachable(self, reason: object) -> DataError:
        if isinstance(reason, ssl.SSLCertVerificationError):
            return DataError(f"{self.description}: TLS: server certificate not trusted: "
                             f"{reason.verify_message or reason.reason}")
        if isinstance(reason, ssl.SSLError):
            why = str(reason.reason or reason)
            ours = self.tls is not None and self.tls.cert_file is not None
            if "ALERT" in why and "CERTIFICATE" in why:  # the server's alert about ours
                why += (" (the server does not accept our client certificate)" if ours
                        else " (the server wants a client certificate)")
            elif isinstance(reason, ssl.SSLEOFError) and not ours:
                # TLS 1.3: the client certificate is checked after our side of the
                # handshake; the server's alert or its hang-up may come first.
                why += " (the server hung up: does it want a client certificate?)"
            return DataError(f"{self.description}: TLS: {why}")
        return DataError(f"{self.description} unreachable: {self._redact(str(reason))}")

    def _detail(self, exc: urllib.error.HTTPError) -> str:
        """The server's reason: Prometheus' ``error``, AWS's ``message``, else the body's
        first line; redacted and cut to one short line."""
        try:
            raw = exc.read(1 << 16)
        except (OSError, ValueError, http.client.HTTPException):
            return ""
        try:
            body = json.loads(raw)
        except ValueError:
            # A plain-text reason (a proxy's "invalid token"); not an HTML error page.
            text = raw.decode("utf-8", "replace").strip()
            plain = (exc.headers.get("Content-Type") or "").startswith("text/plain")
            return self._redact(text.splitlines()[0]) if text and plain else ""
        if isinstance(body, dict):
            for key in ("error", "message", "Message"):
                if isinstance(body.get(key), str):
                    return self._redact(body[key])
        return ""

