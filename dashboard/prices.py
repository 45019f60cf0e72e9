"""Instance type -> $/hour, from the bundled dated table and an optional override.

``dashboard/prices.yaml`` (bundled) holds one on-demand table per provider, each with its
region, date and source. ``--prices FILE`` adds or replaces entries: the same format, or a
plain ``instance-type: price`` mapping. Spot prices come only from the user's file (they
change by the hour and by zone): a table with ``capacity_type: spot``, or a ``spot:``
mapping next to the plain entries; a node whose ``capacity_type`` is ``spot`` is priced at
its spot price where there is one, else on demand, and the dashboard says which. A bad file
raises :class:`PriceError` with one line; the files are YAML as :mod:`gpuscope.exporter.yaml12`
reads it (a duplicate key is an error, ``1e1`` a number). Lookups of unknown types return
None: the dashboard shows "unknown", never $0.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any

from gpuscope.dashboard.data.promql import any_of
from gpuscope.exporter.files import TooLarge, read_text
from gpuscope.exporter.yaml12 import YamlError, load

BUNDLED = "prices.yaml"


class PriceError(Exception):
    """A price file that cannot be used; ``str()`` is one line naming the file and key."""

    def __init__(self, message: str) -> None:
        # One line whatever a key or file name holds (a quoted YAML key may hold newlines).
        super().__init__(" ".join(message.split()))


def _show(value: Any) -> str:
    """``repr(value)`` cut to a readable length (and safe for huge integers)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return "a huge integer" if value > 0 else "a huge negative integer"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


CAPACITY_TYPES = ("on-demand", "spot")


@dataclass(frozen=True, slots=True)
class Price:
    instance_type: str
    per_hour: float
    provider: str = ""
    region: str = ""
    date: str = ""
    source: str = ""
    capacity_type: str = "on-demand"


@dataclass(frozen=True, slots=True)
class NodePrice:
    """What one node costs and on what basis: ``basis`` is ``on-demand``, ``spot``, or
    ``on-demand (no spot price)`` for a spot node the price file has no spot price for."""

    per_hour: float | None
    basis: str


class PriceTable:
    def __init__(self, prices: Mapping[str, Price], spot: Mapping[str, Price] | None = None
                 ) -> None:
        self._prices = dict(prices)
        self._folded = {k.lower(): v for k, v in prices.items()}
        self._spot = dict(spot or {})
        self._spot_folded = {k.lower(): v for k, v in self._spot.items()}

    def __len__(self) -> int:
        return len(self._prices)

    def lookup(self, instance_type: str) -> Price | None:
        """Exact match first, then case-insensitive (Azure sizes appear in both cases)."""
        if not instance_type:
            return None
        return self._prices.get(instance_type) or self._folded.get(instance_type.lower())

    def per_hour(self, instance_type: str) -> float | None:
        price = self.lookup(instance_type)
        return price.per_hour if price is not None else None

    def spot(self, instance_type: str) -> Price | None:
        if not instance_type:
            return None
        return self._spot.get(instance_type) or self._spot_folded.get(instance_type.lower())

    def node_price(self, instance_type: str, capacity_type: str = "") -> NodePrice:
        """A node's $/hour: its spot price when it is a spot node and one is known, else
        the on-demand price (None when that is unknown too)."""
        if capacity_type == "spot":
            spot = self.spot(instance_type)
            if spot is not None:
                return NodePrice(spot.per_hour, "spot")
            return NodePrice(self.per_hour(instance_type), "on-demand (no spot price)")
        return NodePrice(self.per_hour(instance_type), "on-demand")

    def entries(self) -> list[Price]:
        """The on-demand entries."""
        return sorted(self._prices.values(), key=lambda p: (p.provider, p.instance_type))

    def spot_entries(self) -> list[Price]:
        return sorted(self._spot.values(), key=lambda p: (p.provider, p.instance_type))

    def merged(self, override: PriceTable) -> PriceTable:
        """This table with ``override``'s entries winning, whatever case they are written
        in: lookups fold case, so a bundled ``Standard_NC24ads_A100_v4`` left at its own
        price beside a file's ``standard_nc24ads_a100_v4`` would still price a node
        labelled the bundled way, by its exact match. Such an entry keeps its name (the
        price rules match names exactly) and takes the override's price."""
        def merge(base: Mapping[str, Price], mine: Mapping[str, Price]) -> dict[str, Price]:
            folded = {k.lower(): v for k, v in mine.items()}
            out = {k: (replace(folded[k.lower()], instance_type=k)
                       if k.lower() in folded else v) for k, v in base.items()}
            return {**out, **mine}
        return PriceTable(merge(self._prices, override._prices),
                          merge(self._spot, override._spot))


#: The series whose ``instance_type`` and ``capacity_type`` labels price a node.
NODE_INFO = "gpu_node_info"


def node_price_promql(table: PriceTable) -> str:
    """Each node's $/hour as :meth:`PriceTable.node_price` gives it, as PromQL the store
    evaluates: a series per ``node`` (the stores add its cluster to every ``by (node)``
    where they hold several) valued at the price of its ``gpu_node_info`` labels and
    labelled ``basis`` (``spot``, ``on-demand``, ``on-demand (no spot price)``), none for a
    node of unknown price (never $0). So that a query can rank findings by $/hour and add
    their dollars in the store (issue 29 item 3).

    One term per price, the first that names a node winning (``or on (node)``), in
    :meth:`PriceTable.node_price`'s order: a spot node's spot price, else any node's
    on-demand price. Instance types match case-insensitively (``(?i)``, each literally:
    ``any_of``), as the table's second lookup does; where two entries differ only in case,
    each is matched exactly first, as its first lookup does."""
    def terms(prices: Mapping[str, Price], spot_only: bool) -> list[str]:
        folded: dict[str, Price] = {k.lower(): v for k, v in prices.items()}
        cases = Counter(k.lower() for k in prices)
        twins = {k: v for k, v in prices.items() if cases[k.lower()] > 1}
        out = []
        for fold, entries in ((False, twins), (True, folded)):
            by_price: dict[float, list[str]] = {}
            for name, price in entries.items():
                by_price.setdefault(price.per_hour, []).append(name)
            for per_hour, names in sorted(by_price.items()):
                regex = ("(?i)" if fold else "") + any_of(sorted(names))
                extra = 'capacity_type="spot", ' if spot_only else ""
                term = (f"max by (node, capacity_type) ({NODE_INFO}{{{extra}"
                        f'instance_type=~"{regex}"}}) * 0 + {per_hour!r}')
                if spot_only:
                    out.append(f'label_replace({term}, "basis", "spot", "", "")')
                else:
                    out.append(
                        f'label_replace(label_replace({term}, "basis", "on-demand", "", ""),'
                        f' "basis", "on-demand (no spot price)", "capacity_type", "spot")')
        return out

    parts = [*terms(table._spot, True), *terms(table._prices, False)]
    if not parts:
        return "(vector(0) < 0)"  # no prices: no node has one
    # One series a node, where its info has several (a label changed within the lookback).
    return f"topk by (node) (1, {' or on (node) '.join(parts)})"


def _price_value(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PriceError(f"{where}: expected a number of dollars per hour, got {_show(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the floats
        number = math.inf
    if not math.isfinite(number) or number < 0:
        raise PriceError(f"{where}: expected a price >= 0, got {_show(value)}")
    return number


def _entries(mapping: Any, where: str, meta: Mapping[str, str],
             key_where: str | None = None) -> dict[str, Price]:
    """``key_where``: what an entry's key follows in an error (``where`` and a dot, unless
    given: a plain mapping's keys follow the file's name and a colon)."""
    key_where = f"{where}." if key_where is None else key_where
    if not isinstance(mapping, dict):
        raise PriceError(f"{where}: expected a mapping of instance type to $/hour")
    out = {}
    for key, value in mapping.items():
        if not isinstance(key, str) or not key.strip():
            raise PriceError(f"{where}: instance types must be non-empty strings, "
                             f"got {_show(key)}")
        out[key] = Price(key, _price_value(value, f"{key_where}{key}"), **meta)
    return out


#: The keys of a price file beside ``tables``, beside ``prices``, and of one table.
_TOP_TABLES = ("currency", "tables")
_TOP_PRICES = ("currency", "prices", "spot")
_TABLE_KEYS = ("capacity_type", "date", "prices", "provider", "region", "source")


def _known_keys(mapping: dict[Any, Any], known: tuple[str, ...], where: str, beside: str
                ) -> None:
    for key in mapping:
        if key not in known:
            raise PriceError(f"{where} unknown key {_show(key)}{beside} "
                             f"(expected {', '.join(known)})")


def parse_prices(data: Any, source: str) -> PriceTable:
    """Either ``{tables: [{provider, region, date, source, capacity_type, prices: {...}},
    ...]}``, or ``{prices: {...}, spot: {...}}``, or a plain ``{instance-type: price}``
    mapping (with an optional ``spot: {instance-type: price}``); a key the form does not use
    is an error (never dropped)."""
    if not isinstance(data, dict) or not data:
        raise PriceError(f"{source}: expected a mapping of instance types to $/hour")
    prices: dict[str, Price] = {}
    spot: dict[str, Price] = {}
    # A key the file's form does not use is an error, not dropped: a price the user wrote
    # would be silently left out (or a spot table read as on-demand prices).
    for form, known in (("tables", _TOP_TABLES), ("prices", _TOP_PRICES)):
        if form in data:
            _known_keys(data, known, f"{source}:", f" beside {form!r}")
            break
    if "tables" in data:
        tables = data["tables"]
        if not isinstance(tables, list):
            raise PriceError(f"{source}: tables: expected a list")
        for i, table in enumerate(tables):
            where = f"{source}: tables[{i}]"
            if not isinstance(table, dict) or "prices" not in table:
                raise PriceError(f"{where}: expected a mapping with 'prices'")
            _known_keys(table, _TABLE_KEYS, f"{where}:", "")
            meta = {k: str(table.get(k, "")) for k in ("provider", "region", "date", "source")}
            capacity = table.get("capacity_type", "on-demand")
            if capacity not in CAPACITY_TYPES:
                raise PriceError(f"{where}.capacity_type: expected on-demand or spot, "
                                 f"got {_show(capacity)}")
            entries = _entries(table["prices"], f"{where}.prices",
                               {**meta, "capacity_type": capacity})
            (spot if capacity == "spot" else prices).update(entries)
    elif "prices" in data:
        prices.update(_entries(data["prices"], f"{source}: prices", {}))
    else:
        prices.update(_entries({k: v for k, v in data.items() if k not in ("currency", "spot")},
                               source, {"source": source}, f"{source}: "))
    if "spot" in data and "tables" not in data:
        spot.update(_entries(data["spot"], f"{source}: spot",
                             {"source": source, "capacity_type": "spot"}))
    currency = data.get("currency", "USD")
    if currency != "USD":
        raise PriceError(f"{source}: currency: only USD is supported, got {_show(currency)}")
    return PriceTable(prices, spot)


def bundled_prices() -> PriceTable:
    text = resources.files("gpuscope.dashboard").joinpath(BUNDLED).read_text(encoding="utf-8")
    return parse_prices(load(text, BUNDLED), BUNDLED)



#: The largest price file read, in bytes (a line an instance type).
MAX_PRICE_FILE_BYTES = 16 << 20


def load_prices(path: str | os.PathLike[str] | None = None) -> PriceTable:
    """The bundled table, with the entries of ``path`` (if given) winning."""
    table = bundled_prices()
    if path is None:
        return table
    name = os.fspath(path)
    try:
        text = read_text(name, MAX_PRICE_FILE_BYTES)
    except TooLarge as exc:
        raise PriceError(f"{name}: {exc}") from None
    except OSError as exc:
        raise PriceError(f"{name}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PriceError(f"{name}: not UTF-8 text") from None
    except ValueError as exc:  # "embedded null byte" in the path
        raise PriceError(f"{name!r}: cannot read: {exc}") from None
    try:
        data = load(text, name)
    except YamlError as exc:
        raise PriceError(str(exc)) from None
    return table.merged(parse_prices(data, name))
