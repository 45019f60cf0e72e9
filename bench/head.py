#!/usr/bin/env python3
"""A data set's hour moved into the head of an empty Prometheus, as a running Prometheus holds
it, for the scale benchmark (``bench/dashboard_bench.py --head``).

    python bench/head.py --data $SETS/f57-vmalert          # writes DATA/head

Why: a running Prometheus answers for its last two to three hours from its head (the series
in memory, the samples in its write-ahead log and head chunks), not from the persisted blocks
that ``bench/fleet.py`` backfills with promtool. The dashboard's default window is the last
hour, so the head is what it reads in production, and the two cost the store differently
(docs/benchmarks.md, eighth and ninth passes): the head makes Prometheus' heap several
GiB, which its garbage collector walks.

How: the data set's VictoriaMetrics folder (``DATA/vm``: the fleet's samples, and the
recording rules' series where vmalert replayed them) is exported a minute at a time, in time
order (``/api/v1/export``), into ``vmagent`` (``/api/v1/import``), which remote-writes it with
one queue (so each series' samples arrive in order) to a Prometheus started empty on
``DATA/head`` with ``--web.enable-remote-write-receiver``. The load is complete when
Prometheus has appended as many samples as VictoriaMetrics counts in the range (so none was
lost on the way), with none refused as out of order or out of bounds; Prometheus is then stopped
(SIGTERM: its head stays in the WAL and head chunks, which it replays on the next start).
Needs Debian's ``prometheus`` and ``victoria-metrics`` (``vmagent`` is in the latter).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.fleet import load_meta  # noqa: E402
from tests.stores import (  # noqa: E402
    Store,
    StoreError,
    self_metrics,
    start_prometheus,
    start_victoriametrics,
    start_vmagent,
)

#: Prometheus' flag for the receiver (2.33 and later); nothing else differs from the bench's.
RECEIVER = "--web.enable-remote-write-receiver"
#: How far before the data set's first sample (``meta.json``'s start) the export begins: a
#: margin, so that no sample is left out whatever the set's rounding.
LEAD_S = 120.0


def _copy_minute(vm: Store, agent: str, start: float, end: float) -> int:
    """One minute's samples (``start`` ≤ t ≤ ``end``) from VictoriaMetrics' export into
    vmagent's import, streamed (a minute at 5,000 nodes is some 250 MB of JSON lines)."""
    params = urllib.parse.urlencode({"match[]": '{__name__!=""}', "start": f"{start:.3f}",
                                     "end": f"{end:.3f}"})
    with urllib.request.urlopen(f"{vm.url}/api/v1/export?{params}", timeout=600) as src:
        sent = [0]

        def body() -> Iterator[bytes]:
            while chunk := src.read(1 << 20):
                sent[0] += len(chunk)
                yield chunk

        # An iterable body goes out with chunked transfer encoding: nothing held in memory.
        req = urllib.request.Request(agent + "/api/v1/import", data=body(), method="POST")
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
    return sent[0]


def load_head(vm: Store, prom: Store, start: float, end: float,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Copies every sample ``vm`` holds from ``start`` to ``end`` (seconds) into ``prom`` (a
    Prometheus with the remote-write receiver), a minute at a time in time order, and waits
    until ``prom`` has appended them all. ``StoreError`` if a sample is refused or lost.
    Returns the load's figures."""
    expected_samples = vm.scalar(
        f'sum(count_over_time({{__name__!=""}}[{math.ceil(end - start) + 1}s]))', end)
    began = time.perf_counter()
    exported = 0
    with start_vmagent(prom.url + "/api/v1/write") as agent:
        minutes = math.floor((end - start) / 60.0) + 1  # both ends inclusive
        for i in range(minutes):
            t = start + 60.0 * i
            exported += _copy_minute(vm, agent.url, t, min(t + 59.999, end))
            if i % 10 == 9 or i == minutes - 1:
                log(f"head: {i + 1}/{minutes} minutes sent ({exported / 2**20:,.0f} MiB)")
        # vmagent queues what it received; wait until Prometheus has appended all of it.
        last, still = -1.0, time.monotonic()
        while True:
            m = self_metrics(prom.url)
            appended = m.get("prometheus_tsdb_head_samples_appended_total", 0.0)
            refused = (m.get("prometheus_tsdb_out_of_order_samples_total", 0.0)
                       + m.get("prometheus_tsdb_out_of_bound_samples_total", 0.0))
            if refused:
                raise StoreError(f"prometheus refused {refused:,.0f} samples (out of order or "
                                 "out of bounds)")
            if expected_samples is not None and appended >= expected_samples:
                break
            if appended != last:
                last, still = appended, time.monotonic()
            elif time.monotonic() - still > 60:
                dropped = self_metrics(agent.url).get(
                    "vmagent_remotewrite_packets_dropped_total", 0)
                raise StoreError(f"prometheus appended {appended:,.0f} of "
                                 f"{expected_samples or 0:,.0f} samples and no more in 60 s "
                                 f"(vmagent dropped {dropped:,.0f} packets)")
            time.sleep(1.0)
    head = self_metrics(prom.url)
    return {"load_s": time.perf_counter() - began, "export_bytes": exported,
            "samples": int(head.get("prometheus_tsdb_head_samples_appended_total", 0)),
            "series": int(head.get("prometheus_tsdb_head_series", 0)),
            "rss_kib_after_load": prom.rss_kib()}


def build_head(data: Path, out: Path | None = None, log: Callable[[str], None] = print
               ) -> dict[str, Any]:
    """``data``'s hour (its ``vm/`` folder and ``meta.json``) as a Prometheus head in
    ``out`` (default ``data/head``, replaced); the figures go into ``data/meta.json`` under
    ``"head"``."""
    meta = load_meta(data)
    if not (data / "vm").is_dir():
        raise StoreError(f"{data} has no vm/ folder to export from (bench/fleet.py builds one)")
    out = out or data / "head"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    with start_victoriametrics(data / "vm", extra_args=[
                # the count and the export each touch every series (1.1 M at 5,000 nodes)
                "-search.maxUniqueTimeseries=5000000"]) as vm, \
            start_prometheus(out, copy=False, extra_args=[RECEIVER]) as prom:
        figures = load_head(vm, prom, meta["start"] - LEAD_S, meta["end"], log)
    meta["head"] = figures
    (data / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True,
                    help="a data set bench/fleet.py built, with its vm/ folder")
    ap.add_argument("--out", type=Path, help="the head's folder (default DATA/head)")
    args = ap.parse_args(argv)
    if not (args.data / "meta.json").is_file():
        print(f"head: {args.data}: no meta.json (build it with bench/fleet.py)", file=sys.stderr)
        return 2
    try:
        f = build_head(args.data, args.out)
    except (StoreError, OSError) as exc:  # one line, no traceback
        print(f"head: {exc}", file=sys.stderr)
        return 1
    print(f"head: {f['samples']:,} samples, {f['series']:,} series in {f['load_s']:.0f} s; "
          f"Prometheus {f['rss_kib_after_load'] / 2**20:.1f} GiB RSS after the load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
