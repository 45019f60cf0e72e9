"""Basic auth in front of the dashboard (``--basic-auth-file``; docs/security.md)."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gpuscope.dashboard import auth as auth_module
from gpuscope.dashboard.auth import (
    AuthFileError,
    BasicAuth,
    hash_password,
    load_credentials,
    parse_authorization,
    parse_credentials,
    parse_hash,
    verify_password,
)
from gpuscope.dashboard.cli import main, parse_config
from tests.conftest import REPO, wait_for
from tests.dashboard.conftest import DashboardProcess

FAST = 1_000  # iterations for unit tests; the real default is 200,000


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- hashing ---------------------------------------------------------------------------------
def test_hash_format_and_verification() -> None:
    line = hash_password("correct horse", iterations=FAST)
    algorithm, iterations, salt, digest = line.split("$")
    assert (algorithm, iterations) == ("pbkdf2_sha256", str(FAST))
    assert len(base64.b64decode(salt)) == 16 and len(base64.b64decode(digest)) == 32
    parsed = parse_hash(line)
    assert verify_password("correct horse", parsed)
    assert not verify_password("correct horse ", parsed)
    assert not verify_password("", parsed)
    assert hash_password("x", iterations=FAST) != hash_password("x", iterations=FAST)  # salted
    assert hash_password("pässwörd").startswith("pbkdf2_sha256$200000$")


def test_hash_matches_stdlib_pbkdf2() -> None:
    import hashlib

    salt = b"0123456789abcdef"
    expected = hashlib.pbkdf2_hmac("sha256", b"pw", salt, FAST, 32)
    assert parse_hash(hash_password("pw", iterations=FAST, salt=salt)).digest == expected
    # Unpadded base64 (as some tools write it) is accepted too.
    unpadded = (f"pbkdf2_sha256${FAST}${base64.b64encode(salt).decode().rstrip('=')}"
                f"${base64.b64encode(expected).decode().rstrip('=')}")
    assert verify_password("pw", parse_hash(unpadded))


@pytest.mark.parametrize(("text", "message"), [
    ("md5$1$abc$def", "expected pbkdf2_sha256$ITERATIONS$SALT$HASH"),
    ("pbkdf2_sha256$1000$c2FsdHNhbHQ=", "expected pbkdf2_sha256$"),
    ("pbkdf2_sha256$many$c2FsdHNhbHQ=$" + "A" * 44, "iterations must be a whole number"),
    ("pbkdf2_sha256$10$c2FsdHNhbHQ=$" + "A" * 44, "iterations must be 1000..10000000"),
    # str.isdigit() takes superscripts that int() refuses ("invalid literal for int()").
    ("pbkdf2_sha256$1000\u00b2$c2FsdHNhbHQ=$" + "A" * 44, "iterations must be a whole number"),
    ("pbkdf2_sha256$1000$!!!$" + "A" * 44, "the salt is not base64"),
    ("pbkdf2_sha256$1000$c2FsdA==$" + "A" * 44, "the salt must be at least 8 bytes"),
    ("pbkdf2_sha256$1000$c2FsdHNhbHQ=$AAAA", "the hash must be 16 to 64 bytes"),
])
def test_bad_hashes(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_hash(text)


# -- the credentials file --------------------------------------------------------------------
def test_file_parsing() -> None:
    alice, bob = hash_password("a", iterations=FAST), hash_password("b", iterations=FAST)
    users = parse_credentials(["# gpuscope users", "", f"alice:{alice}", f"  bob:{bob}  "])
    assert set(users) == {"alice", "bob"}
    assert verify_password("b", users["bob"])


@pytest.mark.parametrize(("lines", "message"), [
    (["# comment", "alice"], "users.txt:2: expected user:pbkdf2_sha256$"),
    ([":HASH"], "users.txt:1: expected user:"),
    (["alice:nothash"], "users.txt:1: expected pbkdf2_sha256$"),
    (["al ice:{h}"], "users.txt:1: the user name must not contain spaces"),
    (["alice:{h}", "", "alice:{h}"], "users.txt:3: user 'alice' appears twice"),
    (["alice:pbkdf2_sha256$5$c2FsdHNhbHQ=$AAAAAAAAAAAAAAAAAAAAAA=="],
     "users.txt:1: iterations must be"),
    (["# nobody"], "users.txt: no user:pbkdf2_sha256$"),
    ([], "users.txt: no user:"),
])
def test_malformed_files_name_the_line(lines: list[str], message: str) -> None:
    h = hash_password("x", iterations=FAST)
    with pytest.raises(AuthFileError) as info:
        parse_credentials([line.format(h=h) for line in lines], "users.txt")
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_load_credentials(tmp_path: Path) -> None:
    path = tmp_path / "users"
    path.write_text(f"alice:{hash_password('a', iterations=FAST)}\n")
    assert load_credentials(str(path)).users == {"alice"}
    with pytest.raises(AuthFileError, match="No such file or directory"):
        load_credentials(str(tmp_path / "missing"))
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(AuthFileError, match="not UTF-8"):
        load_credentials(str(path))


# -- checking requests -----------------------------------------------------------------------
@pytest.mark.parametrize(("header", "expected"), [
    (None, None),
    ("", None),
    ("Bearer abc", None),
    ("Basic", None),
    ("Basic !!!", None),
    ("Basic " + base64.b64encode(b"nocolon").decode(), None),
    ("Basic " + base64.b64encode(b"\xff:\xfe").decode(), None),
    (basic("alice", "pa:ss"), ("alice", "pa:ss")),
    (basic("alice", ""), ("alice", "")),
    ("basic " + base64.b64encode("jürgen:wört".encode()).decode(), ("jürgen", "wört")),
])
def test_parse_authorization(header: str | None, expected: tuple[str, str] | None) -> None:
    assert parse_authorization(header) == expected


def test_check_and_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    users = {"alice": parse_hash(hash_password("a", iterations=FAST)),
             "bob": parse_hash(hash_password("b", iterations=2 * FAST))}
    auth = BasicAuth(users, cache_size=2)
    derivations: list[int] = []
    real = auth_module._derive

    def counting(password: str, salt: bytes, iterations: int, length: int) -> bytes:
        derivations.append(iterations)
        return real(password, salt, iterations, length)

    monkeypatch.setattr(auth_module, "_derive", counting)
    assert auth.check("alice", "a")
    assert auth.check("alice", "a") and auth.check_header(basic("alice", "a"))
    assert derivations == [FAST]  # verified once, then from the cache
    assert not auth.check("alice", "b") and not auth.check("bob", "a")
    assert not auth.check("alice", "a ")
    assert derivations == [FAST, FAST, 2 * FAST, FAST]  # failures are never cached
    assert auth.cached() == 1
    # An unknown user costs a derivation too, at the file's highest iteration count.
    assert not auth.check("mallory", "a")
    assert derivations[-1] == 2 * FAST
    assert not auth.check_header(None) and not auth.check_header("Basic !!!")
    # Bounded: the least recently used pair goes.
    assert auth.check("bob", "b")
    assert auth.check("alice", "a")  # alice is the most recent now
    users["carol"] = parse_hash(hash_password("c", iterations=FAST))
    auth = BasicAuth(users, cache_size=2)
    for user in ("alice", "bob", "carol"):
        assert auth.check(user, user[0])
    assert auth.cached() == 2
    before = len(derivations)
    assert auth.check("alice", "a")  # evicted: verified again
    assert len(derivations) == before + 1


def test_hash_command(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.dashboard.auth",
         "hash", "alice", "--iterations", str(FAST)],
        input="s3cret: with spaces\n", cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    (tmp_path / "users").write_text(line + "\n")
    auth = load_credentials(str(tmp_path / "users"))
    assert auth.check("alice", "s3cret: with spaces") and not auth.check("alice", "s3cret")
    bad = subprocess.run([sys.executable, "-m", "gpuscope.dashboard.auth",
                          "hash", "alice"], input="",
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "error: empty password" in bad.stderr


# -- the real dashboard ----------------------------------------------------------------------
def test_flag_and_environment() -> None:
    assert parse_config(["--demo"], environ={}).basic_auth_file is None
    assert parse_config(["--demo"], environ={"GPUSCOPE_BASIC_AUTH_FILE": "/u"}).basic_auth_file \
        == "/u"


def test_cli_with_a_malformed_file_exits_2_with_one_line(tmp_path: Path) -> None:
    users = tmp_path / "users"
    users.write_text("# users\nalice:secret\n")
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.dashboard", "--prometheus", "http://127.0.0.1:1",
         "--listen", "127.0.0.1:0", "--basic-auth-file", str(users)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")},
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"gpuscope-dashboard: error: --basic-auth-file {users}:2: expected "
        "pbkdf2_sha256$ITERATIONS$SALT$HASH"
    ]


def test_main_with_a_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert main(["--prometheus", "http://127.0.0.1:1", "--basic-auth-file", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == (f"gpuscope-dashboard: error: --basic-auth-file {missing}: "
                   "No such file or directory\n")


@pytest.fixture(scope="module")
def protected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardProcess]:
    tmp = tmp_path_factory.mktemp("auth")
    users = tmp / "users"
    users.write_text(f"alice:{hash_password('wonderland')}\n")  # the default 200,000 rounds
    proc = DashboardProcess(["--prometheus", "http://127.0.0.1:1", "--basic-auth-file",
                             str(users)], tmp / "dashboard.log")

    def healthy() -> bool:
        if proc.proc.poll() is not None:
            raise AssertionError(f"dashboard exited: {proc.log_path.read_text()}")
        try:
            return requests.get(proc.url + "healthz", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_for(healthy, 120, proc.url + "healthz")
        yield proc
    finally:
        proc.stop()


GOOD = ("alice", "wonderland")

PICK_NODE = {
    "output": "node-select.value",
    "outputs": {"id": "node-select", "property": "value"},
    "inputs": [{"id": "fleet-heatmap", "property": "clickData",
                "value": {"points": [{"y": "gpu-node-7"}]}}],
    "changedPropIds": ["fleet-heatmap.clickData"],
    "state": [{"id": "node-select", "property": "value", "value": None}],
}


def assert_refused(r: requests.Response) -> None:
    assert r.status_code == 401, (r.request.url, r.status_code)
    assert r.headers["WWW-Authenticate"].startswith('Basic realm="gpuscope"')
    assert r.text == "authentication required\n"  # nothing of the app


def test_every_route_needs_credentials(protected: DashboardProcess) -> None:
    url = protected.url
    for path in ("", "_dash-layout", "_dash-dependencies", "assets/style.css", "no/such/page"):
        assert_refused(requests.get(url + path, timeout=10))
        assert_refused(requests.get(url + path, auth=("alice", "wrong"), timeout=10))
        assert_refused(requests.get(url + path, auth=("bob", "wonderland"), timeout=10))
    assert_refused(requests.post(url + "_dash-update-component", json=PICK_NODE, timeout=10))
    assert_refused(requests.post(url + "_dash-update-component", json=PICK_NODE,
                                 auth=("alice", "Wonderland"), timeout=10))
    assert_refused(requests.get(url, headers={"Authorization": "Basic !!!"}, timeout=10))


def test_credentials_open_every_route(protected: DashboardProcess) -> None:
    url = protected.url
    page = requests.get(url, auth=GOOD, timeout=10)
    assert page.status_code == 200 and "<title>gpuscope</title>" in page.text
    assert requests.get(url + "_dash-layout", auth=GOOD, timeout=10).status_code == 200
    assert requests.get(url + "assets/style.css", auth=GOOD, timeout=10).status_code == 200
    script = re.search(r'src="/(_dash-component-suites/[^"]+)"', page.text)
    assert script is not None
    assert_refused(requests.get(url + script.group(1), timeout=10))
    assert requests.get(url + script.group(1), auth=GOOD, timeout=10).status_code == 200
    # The heatmap's click callback, as the page itself calls it (its output id carries a
    # suffix: node-select.value is written by the URL's callback too).
    deps = requests.get(url + "_dash-dependencies", auth=GOOD, timeout=10).json()
    pick = next(d for d in deps if any(i["id"] == "fleet-heatmap" for i in d["inputs"])
                and "node-select" in d["output"])  # (not the clientside scroll's)
    r = requests.post(url + "_dash-update-component", auth=GOOD, timeout=10,
                      json={**PICK_NODE, "output": pick["output"]})
    assert r.status_code == 200, r.text
    assert json.loads(r.text)["response"]["node-select"]["value"] == "gpu-node-7"


def test_healthz_stays_open(protected: DashboardProcess) -> None:
    r = requests.get(protected.url + "healthz", timeout=10)
    assert r.status_code == 200 and r.text == "ok\n"
