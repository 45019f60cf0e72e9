"""The Dash application: layout, callbacks and the HTTP server around them."""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from dash import Dash
from dash.development.base_component import Component
from flask import Response, has_request_context, request
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from gpuscope.dashboard import links
from gpuscope.dashboard.callbacks import register_callbacks
from gpuscope.dashboard.layout import layout
from gpuscope.dashboard.service import WINDOWS, DashboardService
from gpuscope.exporter.flags import IPV6_UNAVAILABLE

log = logging.getLogger(__name__)


def create_app(service: DashboardService, *, refresh_seconds: float = 30.0) -> Dash:
    app = Dash(
        __name__,
        title="gpuscope",
        update_title="",
        assets_folder=str(Path(__file__).parent / "assets"),
        serve_locally=True,
    )
    def page() -> Component:
        # Dash asks for the layout from the page itself, so the page's URL (a link with the
        # view's state, pasted or clicked) is the request's referrer: the controls start in
        # that state, and a node or pod that is no option yet keeps its place.
        referrer = (request.referrer or "") if has_request_context() else ""
        query = urllib.parse.urlsplit(referrer).query
        # The query string as the page's location has it ("" for none; None where the
        # browser sent no referrer: unknown, and the location then says it).
        search = (f"?{query}" if query else "") if referrer else None
        return layout(source=service.source.description, refresh_seconds=refresh_seconds,
                      state=links.parse_query(query), search=search)

    app.layout = page

    def prefetch_on_page_request() -> None:
        # The page itself is requested a good half second before its first callback (the
        # browser loads the scripts in between): start its view's queries now, the view its
        # URL names (window, namespace, cluster: a link to one cluster's page computes that
        # cluster's view, not the whole fleet's as well).
        if request.path == "/":
            state = links.parse_query(request.query_string.decode("utf-8", "replace"))
            window = state.get("window")
            service.prefetch(window if window in WINDOWS else None, state.get("namespace"),
                             state.get("cluster"))

    app.server.before_request(prefetch_on_page_request)

    def refuse_malformed_callbacks() -> tuple[str, int, dict[str, str]] | None:
        # Dash reads a callback's body without checking it: a body that is not one of this
        # page's callbacks (a scanner, a stale tab of another version) was an HTTP 500 and a
        # traceback in the log for each request. One warning line and a 400 instead.
        if request.method != "POST" or not request.path.endswith("/_dash-update-component"):
            return None
        problem = _callback_problem(request.get_json(silent=True), app.callback_map)
        if problem is None:
            return None
        log.warning("refused a malformed callback request from %s: %s",
                    request.remote_addr, problem)
        return (f"malformed callback request: {problem}\n", 400,
                {"Content-Type": "text/plain; charset=utf-8"})

    app.server.before_request(refuse_malformed_callbacks)

    def healthz() -> tuple[str, int, dict[str, str]]:
        # For probes: answers without credentials when --basic-auth-file is on.
        return "ok\n", 200, {"Content-Type": "text/plain; charset=utf-8"}

    app.server.add_url_rule("/healthz", "healthz", healthz)
    app.server.after_request(_security_headers)
    register_callbacks(app, service)
    return app


#: Headers on every answer (pages, Dash's routes, assets, 400s, and the 401s of
#: ``--basic-auth-file``): no other site may frame the page (clickjacking: its buttons
#: under another page's), no answer is sniffed into another type than it says, and the
#: page's URL (its state: namespace, pod and node names) goes to this origin only, not to
#: a site a link leads to. Dash's layout request needs the referrer, same-origin keeps it.
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "Referrer-Policy": "same-origin",
}


def _security_headers(response: Response) -> Response:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _callback_problem(body: object, callbacks: Mapping[str, object]) -> str | None:
    """What makes ``body`` (a callback request's JSON) not one of ``callbacks``' (Dash's
    ``callback_map``, by output), in a few words; None where its shape is theirs."""
    if not isinstance(body, dict):
        return "not a JSON object"
    output = body.get("output")
    if not isinstance(output, str) or output not in callbacks:
        return "no callback of this page has that output"
    for key in ("inputs", "state", "changedPropIds"):
        if key in body and not isinstance(body[key], list):
            return f"{key} is not a list"
    if "inputs" not in body or "outputs" not in body:
        return "no inputs or outputs"
    if not all(isinstance(i, (dict, list)) for i in (*body["inputs"], *body.get("state", []))):
        return "an input or state is not an object"
    return None


class _Handler(WSGIRequestHandler):
    def version_string(self) -> str:
        """The ``Server`` header: the program's name, not werkzeug's and Python's versions
        (which tell a scanner what to try)."""
        return "gpuscope-dashboard"


class DashboardServer:
    """Serves the app with werkzeug's threaded server from a background thread."""

    def __init__(self, app: Dash, host: str, port: int) -> None:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        # Bind here: werkzeug reports a busy port by printing and exiting the process; an
        # OSError from bind() lets the CLI say it in one line.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._socket = socket.socket(family, socket.SOCK_STREAM)
        except OSError as error:
            # "::" (every IPv6 and IPv4 address) on a kernel without IPv6: every IPv4 one.
            if host != "::" or error.errno not in IPV6_UNAVAILABLE:
                raise
            host, family = "0.0.0.0", socket.AF_INET
            self._socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if host == "::":
                # Dual-stack whatever net.ipv6.bindv6only says (an IPv6-only cluster's pod
                # IP and IPv4 clients on one socket).
                self._socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            self._socket.bind((host, port))
            self._socket.listen(128)
        except OSError:
            self._socket.close()
            raise
        self._httpd: BaseWSGIServer = make_server(
            host, port, app.server, threaded=True, fd=self._socket.fileno(),
            request_handler=_Handler,
        )
        if isinstance(self._httpd, socketserver.ThreadingMixIn):
            # Do not wait for browsers' keep-alive connections when stopping.
            self._httpd.daemon_threads = True
            self._httpd.block_on_close = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="gpuscope-dashboard", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._socket.close()
