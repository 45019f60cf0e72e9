"""A recording, fault-injecting HTTP proxy in front of moto (see ``conftest.py``)."""

from __future__ import annotations

import gzip
import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from xml.sax.saxutils import escape


@dataclass
class WireRequest:
    """One HTTP request as botocore sent it, and what the proxy answered."""

    protocol: str           # "json" or "query"
    attempt: int            # botocore's amz-sdk-request attempt number
    gzipped: bool
    body: bytes             # uncompressed
    wire_bytes: int         # as sent (compressed when gzipped)
    action: str
    datums: list[dict[str, Any]] = field(default_factory=list)
    namespace: str = ""
    status: int = 0


def _query_datums(form: dict[str, list[str]]) -> tuple[str, list[dict[str, Any]]]:
    members: dict[int, dict[str, Any]] = {}
    for key, values in form.items():
        parts = key.split(".")
        if parts[:2] != ["MetricData", "member"]:
            continue
        datum = members.setdefault(int(parts[2]), {})
        rest = parts[3:]
        value = values[0]
        if rest[0] in ("Values", "Counts"):
            datum.setdefault(rest[0], {})[int(rest[2])] = float(value)
        elif rest[0] == "Dimensions":
            datum.setdefault("Dimensions", {}).setdefault(int(rest[2]), {})[rest[3]] = value
        elif rest[0] == "StatisticValues":
            datum.setdefault("StatisticValues", {})[rest[1]] = float(value)
        else:
            datum[rest[0]] = value
    out = []
    for i in sorted(members):
        d = members[i]
        for k in ("Values", "Counts"):
            if k in d:
                d[k] = [d[k][j] for j in sorted(d[k])]
        if "Dimensions" in d:
            d["Dimensions"] = [d["Dimensions"][j] for j in sorted(d["Dimensions"])]
        out.append(d)
    return form.get("Namespace", [""])[0], out


def parse_request(headers: dict[str, str], raw: bytes) -> WireRequest:
    gzipped = headers.get("content-encoding", "") == "gzip"
    body = gzip.decompress(raw) if gzipped else raw
    ctype = headers.get("content-type", "")
    attempt = int(headers.get("amz-sdk-request", "attempt=1").split("attempt=")[1].split(";")[0])
    if ctype.startswith("application/x-amz-json"):
        action = headers.get("x-amz-target", "").rsplit(".", 1)[-1]
        req = WireRequest("json", attempt, gzipped, body, len(raw), action)
        if action == "PutMetricData":
            payload = json.loads(body)
            req.namespace = payload.get("Namespace", "")
            req.datums = payload.get("MetricData", [])
        return req
    if ctype.startswith("application/x-www-form-urlencoded"):
        form = urllib.parse.parse_qs(body.decode(), keep_blank_values=True)
        action = form.get("Action", [""])[0]
        req = WireRequest("query", attempt, gzipped, body, len(raw), action)
        if action == "PutMetricData":
            req.namespace, req.datums = _query_datums(form)
        return req
    raise AssertionError(
        f"botocore sent CloudWatch a {ctype!r} body: teach the proxy this protocol "
        f"(see botocore's PRIORITY_ORDERED_SUPPORTED_PROTOCOLS)"
    )


def error_response(protocol: str, status: int, code: str, message: str
                   ) -> tuple[int, dict[str, str], bytes]:
    """An AWS error as CloudWatch sends it in ``protocol``: JSON 1.0 with
    ``x-amzn-query-error`` (CloudWatch is awsQueryCompatible), or a query ``ErrorResponse``."""
    kind = "Sender" if status < 500 else "Receiver"
    if protocol == "json":
        body = json.dumps({"__type": f"com.amazonaws.cloudwatch#{code}",
                           "message": message}).encode()
        return status, {"Content-Type": "application/x-amz-json-1.0",
                        "x-amzn-query-error": f"{code};{kind}",
                        "x-amzn-RequestId": "proxy-0000"}, body
    body = (f"<ErrorResponse xmlns=\"http://monitoring.amazonaws.com/doc/2010-08-01/\">"
            f"<Error><Type>{kind}</Type><Code>{escape(code)}</Code>"
            f"<Message>{escape(message)}</Message></Error>"
            f"<RequestId>proxy-0000</RequestId></ErrorResponse>").encode()
    return status, {"Content-Type": "text/xml"}, body


def success_response(protocol: str) -> tuple[int, dict[str, str], bytes]:
    """PutMetricData's empty success answer in ``protocol``."""
    if protocol == "json":
        return 200, {"Content-Type": "application/x-amz-json-1.0",
                     "x-amzn-RequestId": "proxy-0000"}, b"{}"
    body = (b'<PutMetricDataResponse xmlns="http://monitoring.amazonaws.com/doc/2010-08-01/">'
            b"<ResponseMetadata><RequestId>proxy-0000</RequestId></ResponseMetadata>"
            b"</PutMetricDataResponse>")
    return 200, {"Content-Type": "text/xml"}, body


#: What the proxy does with a PutMetricData request: pass it to moto, fail it, or accept
#: it without passing it on.
Fault = str  # "pass" | "throttle" | "503" | "accept" | "reject"


class WireProxy:
    """An HTTP proxy in front of moto that records every request and, while ``plan()``
    says so, answers PutMetricData with a fault instead of passing it on."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.requests: list[WireRequest] = []
        self.plan: Callable[[WireRequest], Fault] = lambda req: "pass"
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                proxy._handle(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    def put_requests(self, ok: bool | None = None) -> list[WireRequest]:
        with self._lock:
            return [r for r in self.requests if r.action == "PutMetricData"
                    and (ok is None or (r.status == 200) == ok)]

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length", "0"))
        raw = handler.rfile.read(length)
        headers = {k.lower(): v for k, v in handler.headers.items()}
        req = parse_request(headers, raw)
        fault = self.plan(req) if req.action == "PutMetricData" else "pass"
        if fault == "throttle":
            status, out_headers, body = error_response(req.protocol, 400, "Throttling",
                                                       "Rate exceeded")
        elif fault == "reject":  # refused for its content, as CloudWatch does a whole request
            status, out_headers, body = error_response(
                req.protocol, 400, "InvalidParameterValue",
                "The parameter MetricData.member.1.Timestamp must specify a time no more "
                "than two hours in the future.")
        elif fault == "503":
            status, out_headers, body = 503, {"Content-Type": "text/plain"}, b"Slow Down"
        elif fault == "accept":  # answer success without storing (moto is slow with 100k+)
            status, out_headers, body = success_response(req.protocol)
        else:
            status, out_headers, body = self._forward(handler, headers, req.body)
        req.status = status
        with self._lock:
            self.requests.append(req)
        handler.send_response(status)
        for k, v in out_headers.items():
            handler.send_header(k, v)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _forward(self, handler: BaseHTTPRequestHandler, headers: dict[str, str], body: bytes
                 ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port,
                                          timeout=30)
        try:
            send = {k: v for k, v in headers.items()
                    if k not in ("content-encoding", "content-length", "host", "connection")}
            send["Content-Length"] = str(len(body))
            conn.request("POST", handler.path, body=body, headers=send)
            response = conn.getresponse()
            data = response.read()
            keep = {k: v for k, v in response.getheaders()
                    if k.lower() in ("content-type", "x-amzn-requestid", "x-amzn-query-error",
                                     "x-amzn-query-mode")}
            return response.status, keep, data
        finally:
            conn.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
