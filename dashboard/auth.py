"""Optional HTTP basic authentication for the dashboard (``--basic-auth-file``).

The credentials file has one ``user:HASH`` per line (blank lines and ``#`` comments are
ignored), where ``HASH`` is ``pbkdf2_sha256$<iterations>$<salt, base64>$<hash, base64>``:
PBKDF2-HMAC-SHA256 from the standard library. Make a line with

    python -m gpuscope.dashboard.auth hash alice            # asks for the password twice
    printf '%s\\n' "$PASSWORD" | python -m gpuscope.dashboard.auth hash alice

Every request needs the credentials (pages, Dash's ``_dash-*`` routes, assets, unknown paths)
except ``/healthz``. A verified (user, password) pair is remembered in memory, under an HMAC
with a per-process random key, for at most :data:`CACHE_SIZE` pairs, so the key derivation
runs once per pair, not on every request. An unknown user costs the same derivation as a
known one. Basic auth sends the password with every request: serve the dashboard over TLS
(an ingress or proxy in front) or through ``kubectl port-forward`` (docs/security.md).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import getpass
import hashlib
import hmac
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.exporter.files import TooLarge, read_text

if TYPE_CHECKING:  # Flask only where the hook is installed: the hash command does not need it
    from flask import Flask

ALGORITHM = "pbkdf2_sha256"
DEFAULT_ITERATIONS = 200_000
MIN_ITERATIONS = 1_000
MAX_ITERATIONS = 10_000_000
SALT_BYTES = 16
REALM = "gpuscope"
#: Verified (user, password) pairs remembered; beyond it the least recently used goes.
CACHE_SIZE = 256
#: Key derivations running at once: a flood of wrong passwords uses at most this many CPUs
#: (users already verified are answered from the cache and do not wait).
CONCURRENT_DERIVATIONS = 2
#: Paths served without credentials (probes).
OPEN_PATHS = frozenset({"/healthz"})

FORMAT = f"{ALGORITHM}$ITERATIONS$SALT$HASH"


class AuthFileError(Exception):
    """A credentials file that cannot be used; ``str()`` is one line naming the file (and
    the line)."""


@dataclass(frozen=True, slots=True)
class PasswordHash:
    iterations: int
    salt: bytes
    digest: bytes

    def encode(self) -> str:
        return (f"{ALGORITHM}${self.iterations}${base64.b64encode(self.salt).decode()}"
                f"${base64.b64encode(self.digest).decode()}")


def _derive(password: str, salt: bytes, iterations: int, length: int) -> bytes:
    return hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations, length)


def hash_password(password: str, *, iterations: int = DEFAULT_ITERATIONS,
                  salt: bytes | None = None) -> str:
    """``pbkdf2_sha256$<iterations>$<salt>$<hash>`` for ``password``, with a random salt."""
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, "
                         f"got {iterations}")
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    return PasswordHash(iterations, salt, _derive(password, salt, iterations, 32)).encode()


def _b64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not base64") from None


def parse_hash(text: str) -> PasswordHash:
    """Parse ``pbkdf2_sha256$<iterations>$<salt>$<hash>``; ValueError with a short reason."""
    parts = text.split("$")
    if len(parts) != 4 or parts[0] != ALGORITHM:
        raise ValueError(f"expected {FORMAT}")
    if not (parts[1].isascii() and parts[1].isdigit()):  # int() refuses superscripts
        raise ValueError(f"iterations must be a whole number, got {parts[1]!r}")
    iterations = int(parts[1])
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, "
                         f"got {iterations}")
    salt, digest = _b64(parts[2], "the salt"), _b64(parts[3], "the hash")
    if len(salt) < 8:
        raise ValueError("the salt must be at least 8 bytes")
    if not 16 <= len(digest) <= 64:
        raise ValueError("the hash must be 16 to 64 bytes")
    return PasswordHash(iterations, salt, digest)


def verify_password(password: str, hashed: PasswordHash) -> bool:
    derived = _derive(password, hashed.salt, hashed.iterations, len(hashed.digest))
    return hmac.compare_digest(derived, hashed.digest)


def parse_credentials(lines: Iterable[str], source: str = "credentials") -> dict[str, PasswordHash]:
    """``{user: hash}`` from ``user:HASH`` lines; :class:`AuthFileError` names the line."""
    users: dict[str, PasswordHash] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        where = f"{source}:{number}"
        if not sep or not user:
            raise AuthFileError(f"{where}: expected user:{FORMAT}")
        if user != user.strip() or any(c.isspace() or not c.isprintable() for c in user):
            raise AuthFileError(f"{where}: the user name must not contain spaces")
        if user in users:
            raise AuthFileError(f"{where}: user {user!r} appears twice")
        try:
            users[user] = parse_hash(hashed.strip())
        except ValueError as exc:
            raise AuthFileError(f"{where}: {exc}") from None
    if not users:
        raise AuthFileError(f"{source}: no user:{FORMAT} line in it")
    return users


#: The largest basic-auth file read, in bytes (a line a user).
MAX_AUTH_FILE_BYTES = 1 << 20


def load_credentials(path: str) -> BasicAuth:
    try:
        text = read_text(path, MAX_AUTH_FILE_BYTES)
    except TooLarge as exc:
        raise AuthFileError(f"{path}: {exc}") from None
    except OSError as exc:
        raise AuthFileError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise AuthFileError(f"{path}: not UTF-8 text") from None
    return BasicAuth(parse_credentials(text.splitlines(), path))


def parse_authorization(header: str | None) -> tuple[str, str] | None:
    """(user, password) from an ``Authorization: Basic ...`` header (RFC 7617, UTF-8), else
    None."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or not token.strip():
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


class BasicAuth:
    """Checks credentials against ``users``, remembering verified pairs (bounded)."""

    def __init__(self, users: Mapping[str, PasswordHash], cache_size: int = CACHE_SIZE) -> None:
        if not users:
            raise ValueError("no users")
        self._users = dict(users)
        # An unknown user is checked against this, so it costs what a known one costs.
        most = max(h.iterations for h in self._users.values())
        self._dummy = PasswordHash(most, os.urandom(SALT_BYTES), os.urandom(32))
        self._cache_key = os.urandom(32)
        self._cache: OrderedDict[bytes, None] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._derivations = threading.BoundedSemaphore(CONCURRENT_DERIVATIONS)

    @property
    def users(self) -> frozenset[str]:
        return frozenset(self._users)

    def _cache_id(self, user: str, password: str) -> bytes:
        message = user.encode("utf-8") + b"\0" + password.encode("utf-8")
        return hmac.new(self._cache_key, message, hashlib.sha256).digest()

    def check(self, user: str, password: str) -> bool:
        key = self._cache_id(user, password)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return True
        hashed = self._users.get(user)
        with self._derivations:
            ok = verify_password(password, hashed or self._dummy) and hashed is not None
        if ok and self._cache_size > 0:
            with self._lock:
                self._cache[key] = None
                self._cache.move_to_end(key)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return ok

    def check_header(self, header: str | None) -> bool:
        found = parse_authorization(header)
        return found is not None and self.check(*found)

    def cached(self) -> int:
        with self._lock:
            return len(self._cache)


def install(server: Flask, auth: BasicAuth, open_paths: frozenset[str] = OPEN_PATHS) -> None:
    """Require ``auth`` on every request to ``server`` except ``open_paths``; runs before any
    other ``before_request`` hook (so an unauthenticated page load starts no queries)."""
    from flask import Response, request

    def require_auth() -> Response | None:
        if request.path in open_paths or auth.check_header(request.headers.get("Authorization")):
            return None
        return Response(
            "authentication required\n", status=401, mimetype="text/plain",
            headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"',
                     "Cache-Control": "no-store"},
        )

    server.before_request_funcs.setdefault(None, []).insert(0, require_auth)


# -- python -m gpuscope.dashboard.auth hash USER
# ------------------------------------------------------
def _read_password(stdin_is_tty: bool) -> str:
    if not stdin_is_tty:
        line = sys.stdin.readline()
        return line.removesuffix("\n").removesuffix("\r")
    first = getpass.getpass("password: ")
    if getpass.getpass("again: ") != first:
        raise ValueError("the passwords differ")
    return first


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuscope.dashboard.auth",
        description="Make a line for gpuscope-dashboard's --basic-auth-file.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser(
        "hash", help="read a password (from the terminal, else one line of stdin) and print "
                     "USER:HASH")
    make.add_argument("user")
    make.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS,
                      help=f"PBKDF2 iterations (default {DEFAULT_ITERATIONS})")
    args = parser.parse_args(argv)
    prog = "python -m gpuscope.dashboard.auth"
    user: str = args.user
    if not user or ":" in user or any(c.isspace() or not c.isprintable() for c in user):
        print(f"{prog}: error: the user name must be non-empty, without ':' or spaces",
              file=sys.stderr)
        return 2
    try:
        password = _read_password(sys.stdin.isatty())
        if not password:
            raise ValueError("empty password")
        line = f"{user}:{hash_password(password, iterations=args.iterations)}"
    except (ValueError, EOFError) as exc:
        print(f"{prog}: error: {exc or 'no password'}", file=sys.stderr)
        return 2
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
