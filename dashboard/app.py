"""The Dash application: layout, callbacks and the HTTP server around them."""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import urllib.parse
from pathlib import Path

from dash import Dash
from dash.development.base_component import Component
from flask import has_request_context, request
from werkzeug.serving import BaseWSGIServer, make_server

from gpuscope.dashboard import links
from gpuscope.dashboard.callbacks import register_callbacks
from gpuscope.dashboard.layout import layout
from gpuscope.dashboard.service import WINDOWS, DashboardService


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

    def healthz() -> tuple[str, int, dict[str, str]]:
        # For probes: answers without credentials when --basic-auth-file is on.
        return "ok\n", 200, {"Content-Type": "text/plain; charset=utf-8"}

    app.server.add_url_rule("/healthz", "healthz", healthz)
    register_callbacks(app, service)
    return app


class DashboardServer:
    """Serves the app with werkzeug's threaded server from a background thread."""

    def __init__(self, app: Dash, host: str, port: int) -> None:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        # Bind here: werkzeug reports a busy port by printing and exiting the process; an
        # OSError from bind() lets the CLI say it in one line.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._socket.bind((host, port))
            self._socket.listen(128)
        except OSError:
            self._socket.close()
            raise
        self._httpd: BaseWSGIServer = make_server(
            host, port, app.server, threaded=True, fd=self._socket.fileno()
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
