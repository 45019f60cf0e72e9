"""What a verdict shows on the page, as data: its section (title, help text, stable ids) and
its tables' columns. The layout builds the sections from :mod:`.registry` in its order, and
the fleet callback addresses each table by its id; no verdict appears by name in the layout,
the callbacks or the components.

A verdict judged by the registry (:class:`StepVerdict`) also says which series it reads
(:class:`~gpuscope.dashboard.data.StepQuery`: a metric reduced per step, only the steps that
matter), judges them into typed findings, and turns its findings into table rows. Adding
such a verdict touches its module, its line in :mod:`.registry` and its tests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias

from gpuscope.dashboard.series import GpuInfo, GpuRef, Series, Window

if TYPE_CHECKING:
    # For the types only: the package's __init__ (Thresholds) imports the verdict modules,
    # which import this one.
    from gpuscope.dashboard.data.steps import StepQuery
    from gpuscope.dashboard.verdicts import Thresholds

#: How a column's values are shown: ``text``; ``link`` (markdown links); ``money`` ($, 2
#: decimals, "unknown" when None); ``percent`` (a ratio 0-1 as %, "n/a" when None);
#: ``count``; ``ratio`` (2 decimals).
ColumnKind = Literal["text", "link", "money", "percent", "count", "ratio"]

Row = dict[str, str | float | int | None]
#: What a row's links keep of the page's state (window, namespace).
State = Mapping[str, str | None]

#: What a threshold measures, and so how its flag is read: ``ratio`` (0-1), ``factor`` (a
#: positive multiplier), ``seconds`` (a duration: ``600``, ``90s``, ``30m``, ``1h``),
#: ``count`` (a whole number >= 1), ``names`` (comma-separated names).
ThresholdKind = Literal["ratio", "factor", "seconds", "count", "names"]


@dataclass(frozen=True, slots=True)
class Threshold:
    """One of a verdict's thresholds, as data: the field of
    :class:`~gpuscope.dashboard.verdicts.Thresholds` it sets (whose default is the
    verdict's), what it measures, and the help text of its flag (``--`` and the field,
    ``_`` as ``-``: ``--idle-utilization``)."""

    field: str
    kind: ThresholdKind
    help: str
    #: ``names``: the names it may be (none: any name): a name no exporter writes would
    #: never match, silently.
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return "--" + self.field.replace("_", "-")

    def text(self, value: Any) -> str:
        """``value`` as its flag reads it back, exactly (rules printed for other values
        carry another thresholds key): names comma-separated, seconds in whole minutes or
        seconds where they are (``30m``, ``90s``), numbers in their shortest exact form."""
        if self.kind == "names":
            return ",".join(value)
        if self.kind == "count":
            return str(int(value))
        if self.kind == "seconds" and value == int(value):
            return f"{int(value) // 60}m" if value % 60 == 0 else f"{int(value)}s"
        short = f"{value:g}"
        return short if float(short) == value else repr(float(value))


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a verdict's table: its id (the row's key), header and kind; ``csv``:
    the row's key the CSV reads instead, where the page shows a number as text (a value in
    % or W by its row's measure): the CSV's amounts are numbers."""

    id: str
    name: str
    kind: ColumnKind = "text"
    csv: str = ""


@dataclass(frozen=True, slots=True)
class Table:
    """A table: its stable element id, the id of the note under it (how many rows, or that
    there are none), its columns, a heading when it is not the section's first, and
    ``order``: the money column its rows come in, costliest first (the page sends the first
    rows: those that cost the most; "" where the table has no price)."""

    id: str
    note_id: str
    columns: tuple[Column, ...]
    heading: str = ""
    order: str = ""


@dataclass(frozen=True, slots=True)
class Section:
    """A verdict's section of the main page: its element id, title, the help text under the
    title, its tables, and ``header_id``: an element above the tables that the section fills
    (the idle cost's total), or ""."""

    id: str
    title: str
    intro: str
    tables: tuple[Table, ...]
    header_id: str = ""


@dataclass(frozen=True, slots=True)
class PageContext:
    """What a :class:`StepVerdict` may read besides its own series, filled by the view once
    per page: the window and where history begins; every device (``gpu_info``); each
    node's $/hour (None: unknown price), a whole GPU's share of it (``gpu_price``: the node's
    $/hour over its whole GPUs, counted where the page counts them, nodes summarised by the
    recording rules included) and how it is priced (``on-demand``, ``spot``);
    the pods on each device (``namespace/pod``, holding it or running on it); the namespace
    filter (None: all); the page's thresholds (None: the defaults)."""

    window: Window
    history_start: float
    gpus: Mapping[GpuRef, GpuInfo] = field(default_factory=dict)
    node_price: Mapping[str, float | None] = field(default_factory=dict)
    gpu_price: Mapping[str, float | None] = field(default_factory=dict)
    price_basis: Mapping[str, str] = field(default_factory=dict)
    pods: Mapping[GpuRef, tuple[str, ...]] = field(default_factory=dict)
    namespace: str | None = None
    thresholds: Thresholds | None = None

    def index(self, ref: GpuRef) -> str:
        """The device's index on its node (``gpu_info``'s ``gpu``), else its UUID's end."""
        info = self.gpus.get(ref)
        return info.gpu if info is not None else ref.uuid[-8:]

    def basis(self, node: str) -> str:
        """How ``node`` is priced (``on-demand`` where the page has no price for it)."""
        return self.price_basis.get(node, "on-demand")

    def wanted(self, namespace: str) -> bool:
        """Whether the page shows ``namespace``'s findings (all without a filter)."""
        return self.namespace is None or namespace == self.namespace


def device_ref(labels: Mapping[str, str]) -> GpuRef:
    """The device a step query's series is about (its ``node`` and ``uuid`` labels)."""
    return GpuRef(labels.get("node", ""), labels.get("uuid", ""))


#: A store's answer to a verdict's queries: per query, each series' labels (``node`` and the
#: query's ``by`` labels) with its flagged steps.
StepAnswers: TypeAlias = "Mapping[StepQuery, Sequence[tuple[Mapping[str, str], Series]]]"


class StepVerdict(ABC):
    """A verdict judged by the registry: it names the series it reads (:attr:`queries`),
    judges them (:meth:`judge`) into findings (frozen dataclasses, newest problem first or
    in the order the table shows them), and renders them (:meth:`rows`, :meth:`note`).
    Its one section has one table."""

    name: ClassVar[str]
    section: ClassVar[Section]
    #: The queries at the default thresholds.
    queries: ClassVar[tuple[StepQuery, ...]]

    def step_queries(self, th: Thresholds | None = None) -> tuple[StepQuery, ...]:
        """The queries at the thresholds ``th`` (None: the defaults); :meth:`judge` reads
        the answers to these, at ``ctx.thresholds``."""
        return self.queries

    @abstractmethod
    def judge(self, answers: StepAnswers, ctx: PageContext) -> tuple[Any, ...]:
        """The findings on ``answers`` (a query the store did not answer reads as none)."""

    @abstractmethod
    def rows(self, findings: Sequence[Any], ctx: PageContext, state: State) -> list[Row]:
        """The table's rows, keyed by :attr:`section`'s columns."""

    @abstractmethod
    def note(self, findings: Sequence[Any], ctx: PageContext) -> str:
        """The line under the table: how many findings, and what they cost."""
