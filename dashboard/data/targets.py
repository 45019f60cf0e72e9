"""The embedded mode's targets: which exporters to scrape, and the node each one's series go
to (``--targets [NODE=]URL,...``)."""

from __future__ import annotations

import urllib.parse
from collections import Counter
from dataclasses import dataclass

from gpuscope.dashboard.data.source import InvalidFilter, validate_node


@dataclass(frozen=True, slots=True)
class Target:
    """An exporter to scrape.

    ``named``: ``node`` was given for this target (``NODE=URL``, or by code such as the demo)
    and names its series whatever the exporter says. Otherwise ``node`` is only the fallback
    for an exporter that does not state its node name (``gpu_node_info{node_name}``, exporters
    before it): the URL's host, or ``host:port`` when several targets share a host.
    """

    url: str
    node: str
    named: bool = True

    @property
    def address(self) -> str:
        """``host:port`` of the URL (the scheme's default port when it has none)."""
        return _address(self.url)


def _address(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def parse_targets(text: str) -> tuple[Target, ...]:
    """``URL[,URL...]``, each optionally ``NODE=URL``.

    A target's node is, first, the ``NODE=`` hint; else the name the exporter states in
    ``gpu_node_info{node_name}`` (read at every scrape, :class:`EmbeddedData`); else, for an
    exporter that does not state one, the URL's host (``http://10.0.0.5:9463/metrics`` ->
    ``10.0.0.5``), or ``host:port`` when several targets share a host (port-forwards to
    ``127.0.0.1``), so two targets never merge into one node. A URL without a path gets
    ``/metrics``. A ``NODE=`` given to two targets is an error, for the same reason, and so
    is a URL with ``user:password@`` (never sent; the URL is logged and shown on the page).
    """
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise ValueError("expected one or more exporter URLs")
    parsed: list[tuple[str, str, str | None]] = []
    for item in items:
        node: str | None = None
        url = item
        head, sep, rest = item.partition("=")
        if sep and "://" not in head:
            node, url = head.strip(), rest.strip()
        parts = urllib.parse.urlsplit(url)
        if parts.username is not None:  # first: the messages below repeat the URL
            raise ValueError("the URL must not hold credentials (user:password@): the "
                             "exporters are scraped without them, and the URL is logged and "
                             "shown on the page")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http(s) URL such as http://10.0.0.5:9463/metrics, "
                             f"got {url!r}")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise ValueError(f"bad port in {url!r}") from None
        if not parts.path or parts.path == "/":
            url = urllib.parse.urlunsplit(parts._replace(path="/metrics"))
        if any(u == url for _, u, _ in parsed):
            raise ValueError(f"duplicate target {url!r}")
        parsed.append((item, url, node))
    hosts = Counter(urllib.parse.urlsplit(url).hostname for _, url, _ in parsed)
    targets: list[Target] = []
    for item, url, node in parsed:
        host = urllib.parse.urlsplit(url).hostname or ""
        fallback = _address(url) if hosts[host] > 1 else host
        try:
            name = validate_node(node if node is not None else fallback)
        except InvalidFilter as exc:
            raise ValueError(f"{item!r}: {exc}") from None
        if node is not None and any(t.named and t.node == name for t in targets):
            raise ValueError(f"node {name!r} given to two targets: one node per exporter")
        targets.append(Target(url=url, node=name, named=node is not None))
    return tuple(targets)
