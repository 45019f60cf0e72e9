"""The embedded mode's targets: which exporters to scrape (``--targets [NODE=]URL,...``),
one scrape of a target (:func:`scrape`: its page read and parsed, its state kept), and the
node an exporter states its series are of (:func:`stated_node`)."""

from __future__ import annotations

import logging
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from gpuscope.dashboard.data.promql import node_key
from gpuscope.dashboard.data.source import InvalidFilter, validate_node

#: One sample of a scrape: its name, labels and value.
Sample = tuple[str, Mapping[str, str], float]
#: The largest exporter page a scrape reads, in bytes (one is kilobytes to a few MiB).
MAX_SCRAPE_BYTES = 64 << 20
#: The label of ``gpu_node_info`` in which an exporter states its own node's name (it cannot
#: use ``node``: Prometheus' scrape config adds that one). The store turns it into ``node``.
NODE_NAME_LABEL = "node_name"
#: ``gpu_node_info{cluster}``: the cluster an exporter states (its ``--cluster-name``).
CLUSTER_NAME_LABEL = "cluster"

# (The embedded store's logger: its scrapes are what it logs of its targets.)
log = logging.getLogger("gpuscope.dashboard.data.embedded")


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


@dataclass(slots=True)
class TargetState:
    """What the embedded store knows of a target between scrapes."""

    target: Target
    node: str  # the node its series are stored under, as of the last scrape
    last_success: float | None = None  # when the last scrape that answered began (seconds)
    last_error: str = ""
    clash: str = ""  # why ``node`` is not the name the exporter states, if it is not


def parse_page(text: str) -> list[Sample]:
    """The samples of one scrape in the Prometheus text format."""
    return [(s.name, s.labels, s.value)
            for family in text_string_to_metric_families(text) for s in family.samples]


def scrape(opener: urllib.request.OpenerDirector, state: TargetState, timeout: float,
           ) -> list[Sample] | None:
    """One scrape of ``state``'s target: its samples, or None where it failed (the error
    kept in ``state`` and logged when the target goes down, not at every interval; its
    recovery logged once). ``last_success`` is the caller's to set (when it began)."""
    target = state.target
    try:
        req = urllib.request.Request(target.url, headers={"Accept": "text/plain"})
        with opener.open(req, timeout=timeout) as resp:
            raw = resp.read(MAX_SCRAPE_BYTES + 1)
        if len(raw) > MAX_SCRAPE_BYTES:
            # An exporter's page is kilobytes; a target that streams without end costs
            # its scrape, not the dashboard's memory.
            raise ValueError(f"answer larger than {MAX_SCRAPE_BYTES >> 20} MiB")
        samples = parse_page(raw.decode("utf-8"))
    except Exception as exc:  # any failure marks the target down; the loop goes on
        was_up = not state.last_error
        state.last_error = str(getattr(exc, "reason", exc)) or type(exc).__name__
        log.log(logging.WARNING if was_up else logging.DEBUG, "scrape of %s failed: %s",
                target.url, state.last_error)
        return None
    if state.last_error:
        log.info("scrape of %s answers again", target.url)
    state.last_error = ""
    return samples


def stated_node(samples: Iterable[Sample]) -> str | None:
    """The node an exporter states in ``gpu_node_info{node_name}``, or None (an older
    exporter, or an empty label): its key ``cluster/node`` where the exporter states its
    cluster too (``gpu_node_info{cluster}``, ``--cluster-name``), as a store holding several
    clusters keys it (:func:`~.promql.node_key`)."""
    for name, labels, _ in samples:
        if name == "gpu_node_info" and labels.get(NODE_NAME_LABEL):
            return node_key(labels.get(CLUSTER_NAME_LABEL, ""), labels[NODE_NAME_LABEL])
    return None
