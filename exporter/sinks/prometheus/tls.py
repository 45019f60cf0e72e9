"""The exporter's TLS server context (``--tls-cert-file``, ``--tls-key-file``,
``--tls-client-ca-file``; docs/security.md): built from its PEM files, each problem one line
(:class:`TLSError`), and built anew when the files change (:class:`ReloadingContext`:
cert-manager renews a certificate in its Secret, the kubelet swaps the mounted files), so a
renewed certificate is served without a restart."""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class TLSError(Exception):
    """A certificate, key or CA file that cannot be used; ``str()`` is one line."""


def _refuse_password() -> str:
    # Called by OpenSSL for an encrypted key; without it OpenSSL would prompt on the terminal.
    raise TLSError("--tls-key-file: encrypted private keys are not supported")


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TLSError(f"{flag} {path}: {exc.strerror or exc}") from None


def tls_context(
    cert_file: str, key_file: str, client_ca_file: str | None = None
) -> ssl.SSLContext:
    """A server context for TLS 1.2 or newer with this certificate (chain) and key; with
    ``client_ca_file``, a client certificate signed by that CA is required. Files are PEM;
    cert and key may be the same file. Raises :class:`TLSError` with one line."""
    if b"-----BEGIN CERTIFICATE-----" not in _read("--tls-cert-file", cert_file):
        raise TLSError(f"--tls-cert-file {cert_file}: no PEM certificate in it")
    if b"PRIVATE KEY-----" not in _read("--tls-key-file", key_file):
        raise TLSError(f"--tls-key-file {key_file}: no PEM private key in it")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    try:
        ctx.load_cert_chain(cert_file, key_file, password=_refuse_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TLSError(f"--tls-key-file {key_file} is not the key of the certificate in "
                           f"--tls-cert-file {cert_file}") from None
        raise TLSError(f"--tls-cert-file {cert_file}, --tls-key-file {key_file}: cannot load "
                       f"them: {exc.reason or exc}") from None
    except OSError as exc:  # removed or unreadable since it was read above
        raise TLSError(f"--tls-cert-file {cert_file}, --tls-key-file {key_file}: "
                       f"{exc.strerror or exc}") from None
    if client_ca_file is not None:
        _read("--tls-client-ca-file", client_ca_file)
        try:
            ctx.load_verify_locations(cafile=client_ca_file)
        except ssl.SSLError as exc:
            raise TLSError(f"--tls-client-ca-file {client_ca_file}: no usable PEM CA "
                           f"certificate in it ({exc.reason or exc})") from None
        except OSError as exc:
            raise TLSError(f"--tls-client-ca-file {client_ca_file}: "
                           f"{exc.strerror or exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


#: What a file is, for telling a changed one: its inode (the kubelet swaps a Secret's files
#: by a symlink), modification time and size; None where it cannot be read.
_Stamp = tuple[tuple[int, int, int] | None, ...]


class ReloadingContext:
    """:func:`tls_context` of the files, built anew when they change: checked at most every
    ``check_every`` seconds (``clock``: monotonic), by the accept loop of a new connection
    (three ``stat`` calls). Files that changed but cannot be used (a key that is not the new
    certificate's yet, a file half written) leave the previous context in use, logged once
    for that state of the files, and are tried again once they change again. Raises
    :class:`TLSError` at construction where the files cannot be used (a startup error)."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str | None = None,
                 check_every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._args = (cert_file, key_file, client_ca_file)
        self._check_every = check_every
        self._clock = clock
        self._lock = threading.Lock()  # (servers on two ports share one)
        self._stamp = self._files_now()
        self._context = tls_context(*self._args)
        self._checked = clock()
        self._refused: _Stamp | None = None
        #: How many times a renewed certificate was loaded.
        self.reloads = 0

    def _files_now(self) -> _Stamp:
        out: list[tuple[int, int, int] | None] = []
        for path in self._args:
            if path is None:
                continue
            try:
                st = os.stat(path)
            except OSError:
                out.append(None)
            else:
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def context(self) -> ssl.SSLContext:
        """The context to serve a new connection with."""
        with self._lock:
            now = self._clock()
            if now - self._checked < self._check_every:
                return self._context
            self._checked = now
            stamp = self._files_now()
            if stamp == self._stamp or stamp == self._refused:
                return self._context
            try:
                fresh = tls_context(*self._args)
            except TLSError as exc:
                self._refused = stamp
                log.warning("TLS files changed but cannot be used (%s): serving the previous "
                            "certificate until they change again", exc)
                return self._context
            self._context, self._stamp, self._refused = fresh, stamp, None
            self.reloads += 1
            log.info("TLS certificate reloaded from %s", self._args[0])
            return self._context
