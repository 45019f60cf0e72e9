"""The dashboard's HTTP server (:class:`gpuscope.dashboard.app.DashboardServer`): the address
it binds, IPv6 and IPv4."""

from __future__ import annotations

import errno
import socket

import pytest
import requests
from dash import Dash, html

from gpuscope.dashboard import app as app_module
from gpuscope.dashboard.app import DashboardServer
from tests.ports import has_ipv6


def _app() -> Dash:
    app = Dash(__name__)
    app.layout = html.Div("ok")
    return app


def test_every_address_is_ipv6_and_ipv4_on_one_socket() -> None:
    # `--listen [::]:8050` (the Deployment's): an IPv6-only cluster's probes reach the pod's
    # IPv6 address, and IPv4 clients the same socket, whatever bindv6only says.
    server = DashboardServer(_app(), "::", 0)
    server.start()
    try:
        urls = [f"http://127.0.0.1:{server.port}/"]
        if has_ipv6():  # (else it fell back to IPv4: the next test's case)
            urls.append(f"http://[::1]:{server.port}/")
        for url in urls:
            answer = requests.get(url, timeout=10)
            assert answer.status_code == 200, url
            # The program's name, not werkzeug's and Python's versions.
            assert answer.headers["Server"] == "gpuscope-dashboard"
    finally:
        server.stop()


def test_without_ipv6_every_address_is_every_ipv4_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernel booted with ipv6.disable=1: an AF_INET6 socket cannot be made at all.
    real = socket.socket

    def no_ipv6(family: int = socket.AF_INET, *args: object, **kw: object) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(app_module.socket, "socket", no_ipv6)
    server = DashboardServer(_app(), "::", 0)
    monkeypatch.setattr(app_module.socket, "socket", real)
    server.start()
    try:
        assert requests.get(f"http://127.0.0.1:{server.port}/", timeout=10).status_code == 200
    finally:
        server.stop()
    # An address given as such is taken as given: no IPv6 for "::1" is an error.
    monkeypatch.setattr(app_module.socket, "socket", no_ipv6)
    with pytest.raises(OSError):
        DashboardServer(_app(), "::1", 0)


#: What every answer of the dashboard says to the browser: never framed by another page
#: (clickjacking), no content sniffing, the page's URL (its state: namespace, pod names) not
#: sent on to another site that a link leads to.
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "Referrer-Policy": "same-origin",
}


@pytest.mark.parametrize("with_auth", [False, True])
def test_every_answer_carries_the_security_headers(with_auth: bool) -> None:
    from gpuscope.dashboard import auth
    from gpuscope.dashboard.app import create_app
    from gpuscope.dashboard.prices import bundled_prices
    from gpuscope.dashboard.service import DashboardService
    from tests.dashboard.test_service import Clock, Counting

    clock = Clock()
    service = DashboardService(Counting(clock), bundled_prices(), monotonic=clock)
    try:
        app = create_app(service)
        headers = {}
        if with_auth:
            users = auth.parse_credentials(
                [f"alice:{auth.hash_password('pw', iterations=auth.MIN_ITERATIONS)}"])
            auth.install(app.server, auth.BasicAuth(users))
            headers = {"Authorization": "Basic YWxpY2U6cHc="}  # alice:pw
        client = app.server.test_client()
        answers = [client.get("/", headers=headers), client.get("/_dash-layout", headers=headers),
                   client.get("/healthz"), client.get("/no-such-page", headers=headers),  # the page
                   client.post("/_dash-update-component", json={}, headers=headers)]
        if with_auth:
            answers.append(client.get("/"))  # the 401
        assert [a.status_code for a in answers] == [200, 200, 200, 200, 400] + (
            [401] if with_auth else [])
        for answer in answers:
            for name, value in SECURITY_HEADERS.items():
                assert answer.headers.get(name) == value, (answer.request.path, name)
    finally:
        service.close()
