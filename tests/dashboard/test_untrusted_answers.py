"""What the dashboard reads from servers it does not control, on real sockets: an answer
that never ends (a broken proxy, a server that is not Prometheus or not an exporter) costs
one query or one scrape up to a cap, not the process's memory; an answer of the wrong shape
is one line, never a traceback."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

import pytest

from gpuscope.dashboard.data import DataError, EmbeddedData, Target
from gpuscope.dashboard.data import embedded as embedded_module
from gpuscope.dashboard.data import targets as targets_module
from gpuscope.dashboard.data.http import PromApi
from gpuscope.dashboard.data.prometheus import PrometheusStore
from tests.conftest import HttpHandler


def endless(h: BaseHTTPRequestHandler) -> None:
    """Headers, then bytes until the client hangs up."""
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.end_headers()
    chunk = b"[" * 65536
    try:
        while True:
            h.wfile.write(chunk)
    except OSError:
        return


def answering(body: object) -> HttpHandler:
    def handle(h: BaseHTTPRequestHandler) -> None:
        raw = json.dumps(body).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)
    return handle


def test_an_endless_answer_fails_its_query_at_the_cap(
        http_server: Callable[[HttpHandler], str]) -> None:
    url = http_server(endless)
    api = PromApi(url, timeout=10.0, max_answer_bytes=4 << 20)
    began = time.monotonic()
    with pytest.raises(DataError) as info:
        api.post_form("/api/v1/query", {"query": "up"})
    assert str(info.value) == f"Prometheus {url}: answer larger than 4 MiB: not read"
    assert time.monotonic() - began < 10


@pytest.mark.parametrize("result", [
    [{"metric": 5, "value": [1.0, "1"]}],            # labels that are not an object
    [{"metric": {"node": "n"}, "value": "1"}],      # a value that is not a pair
    [{"metric": {"node": "n"}, "value": [1.0, "one"]}],  # not a number
    [{"metric": {"node": "n"}}],                    # no value
    [7],
])
def test_a_vector_of_the_wrong_shape_is_one_line(http_server: Callable[[HttpHandler], str],
                                                 result: list[object]) -> None:
    url = http_server(answering({"status": "success",
                            "data": {"resultType": "vector", "result": result}}))
    store = PrometheusStore(url, clock=lambda: 1e9)
    try:
        with pytest.raises(DataError) as info:
            store.instant("up", 1e9)
        assert str(info.value) == (f"Prometheus {url}: malformed answer (not a Prometheus "
                                   "vector)")
    finally:
        store.close()


def test_a_matrix_of_the_wrong_shape_is_one_line(http_server: Callable[[HttpHandler], str]) -> None:
    url = http_server(answering({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"node": "n"}, "values": [[1.0, "1", "extra"]]}]}}))
    store = PrometheusStore(url, clock=lambda: 1e9)
    try:
        with pytest.raises(DataError) as info:
            store.range("up", store.window(3600))
        assert "malformed answer (not a Prometheus matrix)" in str(info.value)
    finally:
        store.close()


def test_an_endless_exporter_page_fails_its_scrape_and_the_rest_goes_on(
        http_server: Callable[[HttpHandler], str], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(targets_module, "MAX_SCRAPE_BYTES", 2 << 20)
    url = http_server(endless) + "/metrics"
    store = EmbeddedData([Target(url, "n1")], interval=1.0, timeout=10.0)
    try:
        with caplog.at_level(logging.DEBUG, logger=embedded_module.__name__):
            store.scrape_once()
            store.scrape_once()
        [note] = [n for n in store.target_notes(time.time()) if "not answering" in n]
        assert "n1" in note and "answer larger than 2 MiB" in note
        # Logged as a warning when it went down, once, not every scrape.
        warned = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and "answer larger than 2 MiB" in warned[0].getMessage()
    finally:
        store.close()
