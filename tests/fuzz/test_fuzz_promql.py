"""Fuzzing PromQL injection through every dashboard input.

The inputs (every ``Input``/``State`` of ``dashboard/callbacks.py``; the page has no other
text box):

- ``namespace-filter.value`` (text box): ``namespace="..."`` in the fleet queries; guarded
  by validate_namespace (else "Namespace filter ignored") and escape_label_value;
- ``window-select.value`` (dropdown): only picks a range/step duration from WINDOWS;
- ``node-select.value`` (dropdown): ``node="..."`` in the node drill-down; validate_node,
  escaped;
- ``pod-select.value`` (dropdown, ``namespace/pod``): ``namespace="...", pod="..."`` in the
  pod drill-down; validate_namespace and validate_pod, escaped;
- ``workload-select.value`` (dropdown, ``namespace/Kind/name``): ``namespace="...",
  workload="..."`` in the workload view; validate_namespace and validate_workload, escaped;
- ``page-url.search`` (the URL's query string, which anyone can write): only sets the
  controls above, whose values are then checked as above;
- ``choices.data`` (a store the fleet callback fills with the window, namespace and cluster
  of the view it shows): only picks which of the service's last views names the dropdowns'
  options (never a new computation, never a query);
- ``node-select.search_value``, ``pod-select.search_value``, ``workload-select.search_value``
  (what is typed in a dropdown): only narrows its options;
- ``fleet-heatmap.clickData`` (a click): its ``y`` becomes ``node-select.value``;
- ``refresh-interval.n_intervals`` (a timer): reaches no query.

Dropdown values are chosen from server-made options in the browser, but a callback request
is plain JSON anyone can send, so every input gets arbitrary JSON here. Label values that
come back *from Prometheus* (node names, UUIDs) go into the second round's regex matchers;
they are fuzzed as well, as the backend's answers.

Property: each callback returns (never raises, no "Internal error"), and every PromQL string
the data layer sends (captured at ``PrometheusData._api``) is, with its string literals
blanked, one of the fixed query shapes, while each literal, decoded with PromQL's rules by
the tokenizer below, is a constant of the code, a validated user value, or (after ``=~``)
a regex that is exactly an alternation of regex-escaped backend values. Invalid filters are
rejected before any query. Settings: ``tests/fuzz/_profile.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpuscope.dashboard import callbacks, ids, sections
from gpuscope.dashboard.data import (
    InvalidFilter,
    make_window,
    selector,
    validate_cluster,
    validate_namespace,
    validate_node,
    validate_pod,
    validate_workload,
)
from gpuscope.dashboard.data.promql import any_of, node_parts
from gpuscope.dashboard.data.steps import STEP_LABEL
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.plan.runs import FollowUp
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.service import WINDOWS, DashboardService
from gpuscope.dashboard.verdicts import Thresholds, registry
from gpuscope.dashboard.verdicts.throttle import THROTTLE_REASONS
from tests.fuzz._profile import fuzz

INJECTIONS = st.sampled_from([
    '"} or vector(1) #', '"}) or vector(1) or up{x="', "\\", '\\"', "a\nb", "a\r\n", "\x00",
    "\x7f", "\u2028", "'", "`", "#", ".*", "a|b", "(?i)x", "[a-z]+", "^$", "{1,2}", "x\\d",
    "ml", "ml-train", " ml ", "ip-10-0-1-1.ec2.internal", "::1", "GPU-1", "ml/p", "ml/p/c",
    "é", "\U0001f600", "a" * 300, "", " ",
])
STRINGS = st.one_of(INJECTIONS, st.text(max_size=30))


# -- a PromQL string-literal tokenizer -------------------------------------------------------

_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
                   "v": "\v", "\\": "\\"}


@dataclass(frozen=True)
class Literal:
    op: str  # the matcher operator right before it (=, !=, =~, !~), or "" (a function arg)
    value: str  # decoded as Prometheus decodes it


def tokenize(query: str) -> tuple[str, list[Literal]]:
    """(the query with every string literal replaced by ``""``, the decoded literals).

    Follows the Prometheus lexer: strings in double or single quotes with the escapes
    ``\\a \\b \\f \\n \\r \\t \\v \\\\``, the quote itself, ``\\uXXXX`` and ``\\UXXXXXXXX``
    (octal and ``\\x`` byte escapes are refused here: the data layer never needs them), no
    raw newline; backquoted raw strings. A ``#`` outside a string starts a comment, which
    could hide the rest of a query: refused."""
    skeleton: list[str] = []
    literals: list[Literal] = []
    i = 0
    while i < len(query):
        c = query[i]
        if c not in "\"'`":
            assert c != "#", f"comment outside a string literal: {query!r}"
            skeleton.append(c)
            i += 1
            continue
        quote, i, out = c, i + 1, []
        while True:
            assert i < len(query), f"unterminated string literal: {query!r}"
            c = query[i]
            if c == quote:
                i += 1
                break
            if quote == "`":
                out.append(c)
                i += 1
                continue
            assert c != "\n", f"raw newline in a string literal: {query!r}"
            if c != "\\":
                out.append(c)
                i += 1
                continue
            assert i + 1 < len(query), f"escape at the end: {query!r}"
            e = query[i + 1]
            if e in _SIMPLE_ESCAPES or e == quote:
                out.append(_SIMPLE_ESCAPES.get(e, quote))
                i += 2
            elif e in "uU":
                n = 4 if e == "u" else 8
                digits = query[i + 2:i + 2 + n]
                assert re.fullmatch(f"[0-9a-fA-F]{{{n}}}", digits), f"bad \\{e}: {query!r}"
                code = int(digits, 16)
                assert code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF, query
                out.append(chr(code))
                i += 2 + n
            else:
                raise AssertionError(f"escape \\{e} in a string literal: {query!r}")
        op = re.search(r"(=~|!~|!=|=)\s*$", "".join(skeleton[-3:]))
        literals.append(Literal(op.group(1) if op else "", "".join(out)))
        skeleton.append('""')
    return "".join(skeleton), literals


#: RE2's metacharacters outside a character class (not "-": see dashboard/data/promql.py).
_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def regex_alternatives(rx: str) -> list[str]:
    """The literal strings an escaped alternation ``a\\.b|c`` matches exactly; fails on any
    unescaped metacharacter (other than the separating ``|``) or needless escape."""
    alternatives, current, i = [], [], 0
    while i < len(rx):
        c = rx[i]
        if c == "\\":
            assert i + 1 < len(rx) and rx[i + 1] in _REGEX_SPECIAL, f"bad escape in {rx!r}"
            current.append(rx[i + 1])
            i += 2
        elif c == "|":
            alternatives.append("".join(current))
            current = []
            i += 1
        else:
            assert c not in _REGEX_SPECIAL, f"unescaped {c!r} in {rx!r}"
            current.append(c)
            i += 1
    alternatives.append("".join(current))
    for alt in alternatives:  # and Python's re (RE2 agrees on escaped punctuation) agrees
        assert re.fullmatch(rx, alt, re.DOTALL)
    return alternatives


def test_tokenizer_on_known_queries() -> None:
    skel, lits = tokenize('up{a="x\\"y", b=~"p\\\\.q|r", c!=""} or f("s", \'t\\\'\')')
    assert skel == 'up{a="", b=~"", c!=""} or f("", "")'
    assert lits == [Literal("=", 'x"y'), Literal("=~", "p\\.q|r"), Literal("!=", ""),
                    Literal("", "s"), Literal("", "t'")]
    assert regex_alternatives("p\\.q|r") == ["p.q", "r"]
    for bad in ('up{a="x', 'up{a="x\ny"}', 'up{a="\\q"}', 'up # x', 'up{a="\\x41"}'):
        with pytest.raises(AssertionError):
            tokenize(bad)
    for bad in ("a.b", "a|b(", "x\\d"):
        with pytest.raises(AssertionError):
            regex_alternatives(bad)



def test_node_lists_escape_only_what_prometheus_reads_as_a_set_of_values() -> None:
    """Prometheus looks a regex of literal alternatives up in its index only if every escape
    in it is of ``.+*?()|[]{}^$`` or a backslash (tsdb's findSetMatches); an escaped hyphen
    sends it to match the regex against every value of the label instead."""
    rx = any_of(["gpu-node-00001", "ip-10-0-0-1.ec2.internal", "a\\b"])
    assert rx == "gpu-node-00001|ip-10-0-0-1\\\\.ec2\\\\.internal|a\\\\\\\\b"
    _, (lit,) = tokenize(f'x{{node=~"{rx}"}}')
    escaped = re.findall(r"\\(.)", lit.value)
    assert escaped == [".", ".", "\\"]
    assert regex_alternatives(lit.value) == ["gpu-node-00001", "ip-10-0-0-1.ec2.internal",
                                             "a\\b"]


# -- the builders ------------------------------------------------------------------------------

#: Literals the code itself writes: label_replace's label names and values, empty matchers.
CONSTANTS = {"", "stat", "mean", "now", "first", "stddev", "count", "memory", "signal",
             "utilization", "sm", "tensor", "dram", "power", "process", "gpm", "limit",
             "throttle", "sm_clock", "temperature", "util_max", "util", "slice_memory",
             "held", "used", "cutil", "cmem", "at_start",
             # at how many steps each node was there (PlanQueries.presence_query); the
             # whole GPUs without a node label (the first round's ``nodes``)
             "present", "unlabelled", "newest", "seen",
             # the verdicts' labels (which rule a device or container meets at the end)
             "idle", "spin", "held_idle", "candidate", "kind", "stalled", "slow", "silent",
             "input",
             # whether the rules recorded the window's last minute (PlanQueries.served)
             "at", "end", "before",
             # the raw holdings' slice label, made from ``uuid`` and back (Steps.holdings_over)
             "slice", "uuid", "$1", "(.*)",
             # a GPU in MIG mode with no slice: its signal, and its slices found by their
             # parent (idle.uncarved_promql)
             "mig", "parent_uuid",
             # the registry's step queries, sent as one: the label that tells them apart and
             # each one's position
             STEP_LABEL, *(str(i) for i in range(len(registry.step_queries())))}

#: Equality matchers the code itself writes: each node's first GPU (``gpu="0"``: whether
#: data begins at the window's start).
#: "0", and the key of the page's thresholds (the default ones here) and its cluster label,
#: which the recording rules' version series is matched with; a GPU's mode
#: (``gpu_sharing_info{sharing="mig"}``: one in MIG mode with no slice is idle); the empty
#: value (``gpu_info{node="", parent_uuid=""}``: whole GPUs without a node label).
CONSTANT_EQUALS = {"0", Thresholds().key, "cluster", "mig", ""}


def constant_regex(lit: Literal) -> bool:
    """The one regex matcher the code writes itself: the throttle reasons that count."""
    return lit.op == "=~" and set(regex_alternatives(lit.value)) <= set(THROTTLE_REASONS)


WINDOW = make_window(3600, 1_800_000_000.0, min_step=15, max_points=60)


def literals_of(queries: Mapping[str, str] | Sequence[str]) -> tuple[list[str], list[Literal]]:
    skeletons, literals = [], []
    for q in (queries.values() if isinstance(queries, Mapping) else queries):
        skel, lits = tokenize(q)
        skeletons.append(skel)
        literals += lits
    return skeletons, literals


@fuzz(300)
@given(value=STRINGS, name=st.sampled_from(["namespace", "pod", "node", "uuid"]))
@example(value='"} or vector(1) #', name="namespace")
def test_selector_keeps_any_value_inside_one_literal(value: str, name: str) -> None:
    q = selector("container_gpu_utilization_ratio", {"namespace": '!=""'}, **{name: value})
    skel, lits = tokenize(q)
    assert skel == f'container_gpu_utilization_ratio{{namespace!="", {name}=""}}'
    assert lits == [Literal("!=", ""), Literal("=", value)]


@fuzz(300)
@given(values=st.lists(STRINGS, min_size=1, max_size=5))
def test_regex_matcher_matches_exactly_the_values(values: list[str]) -> None:
    skel, lits = tokenize(f'x{{uuid=~"{any_of(values)}"}}')
    assert skel == 'x{uuid=~""}' and len(lits) == 1
    assert regex_alternatives(lits[0].value) == values


def benign(value: str) -> str:
    return "v" if value else ""


#: What the first round hands the second (node names from the backend), whatever it is now.
FOLLOW_UP_FIELDS = tuple(f.name for f in dataclasses.fields(FollowUp)
                         if f.name != "evidence_seconds")


@fuzz(200)
@given(namespace=st.none() | STRINGS,
       asked=st.fixed_dictionaries({f: st.lists(STRINGS, max_size=3) for f in FOLLOW_UP_FIELDS}))
def test_fleet_queries_have_fixed_shapes_whatever_the_values(
    namespace: str | None, asked: dict[str, list[str]],
) -> None:
    # fleet() validates the namespace first; the builders must be safe even without that.
    # (A fixed clock: the first round reads the newest sample as of it.)
    prom = PrometheusData("http://127.0.0.1:1", workers=1, clock=lambda: WINDOW.end)
    try:
        first = prom.fleet_queries(WINDOW, namespace)
        second = prom.second_round(WINDOW, FollowUp(**asked, evidence_seconds=600), namespace)
        ref_first = prom.fleet_queries(WINDOW, None if namespace is None else "v")
        ref_second = prom.second_round(
            WINDOW, FollowUp(**{f: ["x"] * bool(v) for f, v in asked.items()},
                             evidence_seconds=600),
            None if namespace is None else "v")
    finally:
        prom.close()
    assert set(first) == set(ref_first) and set(second) == set(ref_second)
    backend = with_parts(v for values in asked.values() for v in values)
    for role, q in [*first.items(), *second.items()]:
        skel, lits = tokenize(q)
        ref = (ref_first | ref_second)[role]
        assert skel == tokenize(ref)[0], role
        for lit in lits:
            if constant_regex(lit):
                continue
            if lit.op == "=~":
                assert set(regex_alternatives(lit.value)) <= backend
            elif lit.op == "=":
                assert lit.value == namespace or lit.value in CONSTANT_EQUALS
            else:
                assert lit.value in CONSTANTS


@fuzz(300)
@given(namespace=STRINGS, pod=STRINGS, node=STRINGS, workload=STRINGS)
@example(namespace="ml", pod="p", node="ip-10-0-1-1.ec2.internal", workload="PyTorchJob/ddp")
def test_drill_down_queries_validate_then_quote(namespace: str, pod: str, node: str,
                                                workload: str) -> None:
    prom = PrometheusData("http://127.0.0.1:1", workers=1)
    try:
        try:
            wq = prom.workload_queries(namespace, workload, WINDOW)
        except InvalidFilter:
            with pytest.raises(InvalidFilter):
                validate_namespace(namespace)
                validate_workload(workload)
        else:
            _, lits = literals_of(wq)
            assert {lit.value for lit in lits if lit.op == "="} == {
                validate_namespace(namespace), validate_workload(workload)}
        try:
            nq = prom.node_queries(node, WINDOW)
        except InvalidFilter:
            with pytest.raises(InvalidFilter):
                validate_node(node)
        else:
            _, lits = literals_of(nq)
            # The node key's parts: its name and its cluster ("" for a bare name).
            assert {lit.value for lit in lits if lit.op == "="} == set(
                node_parts(validate_node(node)))
        try:
            pq = prom.pod_queries(namespace, pod, WINDOW)
        except InvalidFilter:
            with pytest.raises(InvalidFilter):
                validate_namespace(namespace)
                validate_pod(pod)
        else:
            _, lits = literals_of(pq)
            assert {lit.value for lit in lits if lit.op == "="} == {
                validate_namespace(namespace), validate_pod(pod)}
    finally:
        prom.close()


# -- every input of the page, through the callbacks, the service and the data layer -----------


@dataclass
class Registered:
    func: Callable[..., Any]
    inputs: list[tuple[str, str]]
    states: list[tuple[str, str]]


@dataclass
class FakeApp:
    """Records what ``register_callbacks`` registers instead of building a Dash app."""

    callbacks: dict[str, Registered] = field(default_factory=dict)

    def callback(self, *deps: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
        # Dependencies given positionally, or by keyword (the fleet callback: its outputs a
        # dict by id, its inputs a list).
        deps = (*deps, *kwargs.get("inputs", ()), *kwargs.get("state", ()))

        def register(func: Callable[..., Any]) -> Callable[..., Any]:
            inputs = [(d.component_id, d.component_property) for d in deps
                      if type(d).__name__ == "Input"]
            states = [(d.component_id, d.component_property) for d in deps
                      if type(d).__name__ == "State"]
            # A callback registered once per table (the tables' actions) is kept once each.
            name = func.__name__
            while name in self.callbacks:
                name += "'"
            self.callbacks[name] = Registered(func, inputs, states)
            return func

        return register

    def clientside_callback(self, *_args: Any, **_kwargs: Any) -> None:
        """Runs in the browser only (it scrolls to a link's section): no server input."""


# Every input, and what it is called with below. A new Input/State fails this test until it
# is added here (and fuzzed).
INPUTS = {
    (ids.REFRESH, "n_intervals"), (ids.WINDOW_SELECT, "value"),
    (ids.NAMESPACE_FILTER, "value"), (ids.FLEET_HEATMAP, "clickData"),
    (ids.CLUSTER_SELECT, "value"),  # fuzzed with the node's values
    (ids.NODE_SELECT, "value"), (ids.POD_SELECT, "value"), (ids.WORKLOAD_SELECT, "value"),
    (ids.URL, "search"), (ids.CHOICES, "data"),
    (ids.NODE_SELECT, "search_value"), (ids.POD_SELECT, "search_value"),
    (ids.WORKLOAD_SELECT, "search_value"), (ids.TABLE_LIMITS, "data"),
    # What each graph shows (callbacks.redraw): compared with a key, never in a query;
    # fuzzed with the URL's values.
    (ids.HEATMAP_DRAWN, "data"), (ids.WORKLOAD_DRAWN, "data"), (ids.NODE_DRAWN, "data"),
    (ids.POD_DRAWN, "data"),
    # Each verdict table's "Show all rows" and "Download CSV": they read the view the page
    # shows, never a query (test_table_actions_send_no_query).
    *((sections.more_id(t.id), "n_clicks") for t in sections.tables()),
    *((sections.csv_id(t.id), "n_clicks") for t in sections.tables()),
}


def registered() -> dict[str, Registered]:
    app = FakeApp()
    callbacks.register_callbacks(app, None)  # type: ignore[arg-type]
    return app.callbacks


def test_the_list_of_inputs_is_complete() -> None:
    found = {dep for cb in registered().values() for dep in (*cb.inputs, *cb.states)}
    assert found == INPUTS


class Backend:
    """Stands in for Prometheus at ``PrometheusData._api``: records every query and answers
    with a small fleet whose label values are the fuzzed ``labels`` (node names, UUIDs,
    namespaces ...): one idle node, one GPU shared by two containers, one container whose
    mean puts it in the input-starvation candidates, so every second-round query is made."""

    def __init__(self, labels: Sequence[str]) -> None:
        pick = [*labels, "n1", "n2", "u1", "u2", "u3", "ml", "p", "c", "d"]
        self.n1, self.n2, self.u1, self.u2, self.u3, self.ns, self.pod, self.c1, self.c2 = (
            pick[:9])
        self.queries: list[str] = []
        self.lock = threading.Lock()

    def values(self) -> set[str]:
        return {self.n1, self.n2, self.u1, self.u2, self.u3, self.ns, self.pod, self.c1,
                self.c2}

    def api(self, path: str, params: Mapping[str, str]) -> Any:
        q = params["query"]
        with self.lock:
            self.queries.append(q)
        if path.endswith("query_range"):
            start, end = float(params["start"]), float(params["end"])
            points = [[start + (end - start) * k / 4, "0.2"] for k in range(5)]
            return {"resultType": "matrix",
                    "result": [{"metric": m, "values": points} for m in self.series(q)]}
        t = float(params["time"])
        return {"resultType": "vector",
                "result": [{"metric": m, "value": [t, v]} for m, v in self.instant(q)]}

    def gpu(self, node: str, uuid: str, gpu: str) -> dict[str, str]:
        return {"node": node, "uuid": uuid, "gpu": gpu}

    def container(self, node: str, uuid: str, name: str) -> dict[str, str]:
        return {"node": node, "uuid": uuid, "namespace": self.ns, "pod": self.pod,
                "container": name, "gpu": "0"}

    def instant(self, q: str) -> list[tuple[dict[str, str], str]]:
        if q.startswith("max by (node, gpu, uuid, model"):
            return [({**self.gpu(self.n1, self.u1, "0"), "model": self.c1}, "1"),
                    ({**self.gpu(self.n2, self.u2, "0"), "model": "A10G"}, "1")]
        if q.startswith("max by (node, instance_type"):
            return [({"node": self.n1, "instance_type": "p5.48xlarge"}, "1"),
                    ({"node": self.n2, "instance_type": self.c2}, "1")]
        if '"stat", "now"' in q and "container_" not in q:
            return [({**self.gpu(self.n1, self.u1, "0"), "stat": "now"}, "0"),
                    ({**self.gpu(self.n2, self.u2, "0"), "stat": "now"}, "0.9"),
                    ({**self.gpu(self.n1, self.u1, "0"), "stat": "mean"}, "0"),
                    ({"stat": "first"}, "1799990000")]
        if q.startswith("max by (node, namespace, pod, workload)"):
            return [({"node": self.n2, "namespace": self.ns, "pod": self.pod,
                      "workload": f"Job/{self.c1}"}, "1")]
        if '"stat", "stddev"' in q:
            base = self.container(self.n2, self.u2, self.c1)
            return [({**base, "stat": s}, v) for s, v in
                    (("mean", "0.2"), ("stddev", "0.3"), ("count", "40"), ("memory", "1e9"))]
        return []

    def series(self, q: str) -> list[dict[str, str]]:
        if q.startswith("count by (namespace, workload, model)"):
            # A slow-rank candidate: the second round asks for its devices' signals.
            return [{"namespace": self.ns, "workload": f"Job/{self.c1}", "model": "A10G"}]
        if "container_gpu_utilization_ratio" in q or "container_gpu_memory" in q:
            return [self.container(self.n2, self.u2, self.c1),
                    self.container(self.n2, self.u2, self.c2)]
        if "container_gpu_allocated" in q:
            return [self.gpu(self.n1, self.u1, "0")]
        return [self.gpu(self.n1, self.u1, "0"), self.gpu(self.n2, self.u2, "0")]


@dataclass
class Page:
    service: DashboardService
    prom: PrometheusData
    backend: Backend


#: Every page reads this clock. The rules probe puts the window's ends into its query
#: (``@ <time>``), so the shapes collected once and the fuzzed pages must share one clock:
#: with the wall clock a run that crossed a minute's boundary sent a probe of a "new" shape.
NOW = 1_795_608_300.0


def make_page(labels: Sequence[str]) -> Page:
    backend = Backend(labels)
    prom = PrometheusData("http://prometheus.invalid:9090", workers=4, clock=lambda: NOW)
    prom._api = backend.api  # type: ignore[method-assign]
    service = DashboardService(prom, bundled_prices(), clock=lambda: NOW, share_for=0.0)
    return Page(service, prom, backend)


@pytest.fixture(scope="module")
def cheap_figures() -> Iterator[None]:
    """Plotly figures are most of a callback's time and have nothing to do with PromQL:
    stand-ins that still read what they are given."""
    saved = (callbacks.heatmap_figure, callbacks.timeseries_figure, callbacks.empty_figure)

    def figure(*args: Any, **kwargs: Any) -> go.Figure:
        return go.Figure(layout={"meta": [repr(args), repr(kwargs)]})

    callbacks.heatmap_figure = callbacks.timeseries_figure = callbacks.empty_figure = figure
    try:
        yield
    finally:
        callbacks.heatmap_figure, callbacks.timeseries_figure, callbacks.empty_figure = saved


@pytest.fixture(scope="module")
def shapes(cheap_figures: None) -> Iterator[set[str]]:
    """Every query shape (literals blanked) the page sends for valid inputs."""
    page = make_page([])
    cbs = registered_with(page.service)
    for window in WINDOWS:
        for namespace in (None, "ml", "other"):
            cbs["update_fleet"].func(1, window, namespace)
        cbs["update_node"].func("n1", window, 1)
        cbs["update_pod"].func("ml/p", window, 1)
        cbs["update_workload"].func("ml/Job/c", window, None, 1)
    yield {tokenize(q)[0] for q in page.backend.queries}
    close(page)


def registered_with(service: DashboardService) -> dict[str, Registered]:
    app = FakeApp()
    callbacks.register_callbacks(app, service)  # type: ignore[arg-type]
    return app.callbacks


def close(page: Page) -> None:
    page.service.close()
    page.prom.close()


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), STRINGS,
                         st.sampled_from(list(WINDOWS)))
JSON = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8)
CLICKS = st.one_of(JSON, st.builds(lambda y: {"points": [{"y": y, "x": 0}]}, JSON))


def allowed_literal(lit: Literal, user: set[str], backend: set[str]) -> bool:
    if constant_regex(lit):
        return True
    if lit.op == "=~":
        return set(regex_alternatives(lit.value)) <= backend
    if lit.op == "=":
        return lit.value in user or lit.value in CONSTANT_EQUALS
    return lit.value in CONSTANTS


def with_parts(names: Iterable[str]) -> set[str]:
    """``names`` and their parts as node keys (a key ``cluster/node`` is asked as
    ``node=~"node"`` and ``cluster=~"cluster"``; a bare name's cluster is "")."""
    out: set[str] = set()
    for name in names:
        out |= {name, *node_parts(name)}
    return out


def valid_user_values(*texts: Any) -> set[str]:
    out: set[str] = set()
    for text in texts:
        if not isinstance(text, str):
            continue
        ns, _, pod = text.partition("/")
        for check, part in ((validate_namespace, text), (validate_pod, text),
                            (validate_node, text), (validate_namespace, ns), (validate_pod, pod),
                            (validate_workload, pod)):
            with contextlib.suppress(InvalidFilter):
                out.add(check(part))
    # A node key's parts are asked apart (``node="n"``, ``cluster="c"``).
    return with_parts(out) if out else out


SEARCHES = st.one_of(JSON, st.dictionaries(
    st.sampled_from(["window", "namespace", "node", "pod", "workload", "x"]), STRINGS,
    max_size=5).map(lambda d: "?" + urllib.parse.urlencode(d)))


@fuzz(120)
@given(labels=st.lists(STRINGS, max_size=9), window=JSON, namespace=JSON, node=JSON,
       pod=JSON, click=CLICKS, n=JSON, workload=JSON, search=SEARCHES)
@example(labels=[], window=["15m"], namespace=None, node=None, pod=None, click=None, n=0,
         workload=None, search="")
@example(labels=[], window="1h", namespace=7, node=7, pod=7, click=None, n=0, workload=7,
         search=7)
@example(labels=[], window="1h", namespace=None, node=None, pod=["ml/p"], click=None, n=0,
         workload="ml/Job/x", search=None)
@example(labels=[], window="1h", namespace=None, node="prod-a-", pod=None, click=None, n=0,
         workload="ml/Job/x", search=None)  # a cluster (and no node name) picked
@example(labels=['"} or vector(1) #'] * 9, window="7d", namespace='"} or vector(1) #',
         node='"} or vector(1) #', pod='ml/"} or vector(1) #', click=None, n=None,
         workload='ml/Job/"} or vector(1) #',
         search='?node=%22%7D+or+vector(1)+%23&workload=ml%2FJob%2F%22')
def test_every_input_reaches_promql_only_validated_and_escaped(
    shapes: set[str], labels: list[str], window: Any, namespace: Any, node: Any, pod: Any,
    click: Any, n: Any, workload: Any, search: Any,
) -> None:
    page = make_page(labels)
    try:
        cbs = registered_with(page.service)
        backend = with_parts(page.backend.values())
        # A URL (a pasted link) sets the controls, as the user would.
        # (The cluster picker fuzzed with the node's values: any JSON.)
        synced = callbacks.sync_state(ids.URL, search, window, namespace, node, node, pod,
                                      workload)
        window, namespace, cluster, node, pod, workload = (
            old if new is callbacks.no_update else new
            for old, new in zip((window, namespace, node, node, pod, workload), synced[1:],
                                strict=True))
        fleet = cbs["update_fleet"].func(n, window, namespace, cluster, None, search)
        banner = fleet[f"{ids.BANNER}.children"]
        assert "Internal error" not in str(banner), banner
        picked = cbs["pick_node"].func(click, node)
        node_value = node if picked is callbacks.no_update else picked
        sent = len(page.backend.queries)
        node_out = cbs["update_node"].func(node_value, window, n, search)
        if isinstance(node_value, str) and node_value and page.backend.queries[sent:]:
            validate_node(node_value)  # a query went out: the value was valid
        assert "Internal error" not in str(node_out["banner"]), node_out["banner"]
        sent = len(page.backend.queries)
        pod_out = cbs["update_pod"].func(pod, window, n, cluster, search)
        if page.backend.queries[sent:]:
            ns, _, name = str(pod).partition("/")
            validate_namespace(ns)
            validate_pod(name)
        assert "Internal error" not in str(pod_out["banner"]), pod_out["banner"]
        # The options come from the view the page's store names and what is typed in the
        # dropdowns: any JSON, no query, never an error.
        sent = len(page.backend.queries)
        cbs["update_choices"].func(click, n, namespace, search, node, pod, workload)
        cbs["update_choices"].func({"window": window, "namespace": namespace,
                                    "cluster": cluster, "at": n},
                                   namespace, search, n, node, pod, workload)
        cbs["update_choices"].func({"nodes": labels, "window": labels, "namespace": labels},
                                   namespace, search, n, node, pod, workload)
        assert page.backend.queries[sent:] == []
        # (The workload view also asks for the fleet view; its own queries' literals are
        # checked with the rest below.)
        work_out = cbs["update_workload"].func(workload, window, namespace, n, cluster,
                                               search)
        assert "Internal error" not in str(work_out[1]), work_out[1]
        user = valid_user_values(namespace, node_value, pod, workload)
        # A cluster picked scopes the workload view's queries (``cluster="c"``), validated.
        if isinstance(cluster, str):
            with contextlib.suppress(ValueError):
                user.add(validate_cluster(cluster))
        # With no workload picked, the workload view opens the first straggler's or the
        # first workload's: a name that came back from the backend, validated all the same.
        user |= valid_user_values(f"{page.backend.ns}/Job/{page.backend.c1}")
        for q in page.backend.queries:
            skel, lits = tokenize(q)
            assert skel in shapes, q
            for lit in lits:
                assert allowed_literal(lit, user, backend), (lit, q)
    finally:
        close(page)


def test_an_injected_namespace_sends_no_namespace_at_all() -> None:
    page = make_page([])
    try:
        cbs = registered_with(page.service)
        out = cbs["update_fleet"].func(1, "1h", '"}) or vector(1) or up{x="')
        assert "Namespace filter ignored" in out[f"{ids.BANNER}.children"]
        assert page.backend.queries and not any("namespace=\"" in q
                                                for q in page.backend.queries)
    finally:
        close(page)


def test_number_of_queries_is_bounded() -> None:
    page = make_page([])
    try:
        # docs/dashboard.md: at most 15 queries for a fleet page, however many devices (6 in
        # the first round, at most 9 in the second), one for all the step queries of the
        # registry's verdicts (sent beside them), and one more where the store has no
        # exporter sample within its lookback (none here: the newest over the hour before).
        registered_with(page.service)["update_fleet"].func(1, "1h", "ml")
        assert 6 < len(page.backend.queries) <= 16 + min(len(registry.step_queries()), 1)
    finally:
        close(page)


def test_table_actions_send_no_query() -> None:
    """"Show all rows" and "Download CSV", with any JSON from the page: the view the page
    shows, or nothing; never a query, never an error."""
    page = make_page([])
    try:
        fleet = registered_with(page.service)["update_fleet"].func(1, "1h", None)
        assert "Internal error" not in str(fleet[f"{ids.BANNER}.children"])
        sent = len(page.backend.queries)
        for table in sections.tables():
            for window, namespace, limits in (("1h", None, {}), ("7d", "ml", None),
                                              (3, ["x"], {"a": "b", table.id: -1})):
                more = callbacks.table_more(page.service, table.id, 1, window, namespace,
                                            limits)
                csv = callbacks.table_csv(page.service, table.id, 1, window, namespace)
                if window == "7d":  # no view shown for that window: nothing to send
                    assert more == (callbacks.no_update,) * 3 and csv is callbacks.no_update
                else:  # the view shown (the default one for values that are no window)
                    assert isinstance(more[0], list) and more[2] == {
                        table.id: sections.MAX_ROWS}
                    # (Its window: the default one for values that are no window.)
                    assert re.fullmatch(rf"{table.id}_1h_\d{{8}}T\d{{4}}Z\.csv",
                                        csv["filename"])
        assert page.backend.queries[sent:] == []
    finally:
        close(page)

