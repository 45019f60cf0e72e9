"""The dashboard in a real headless Chromium.

The demo runs as a real ``gpuscope-dashboard --demo`` process; the Prometheus-mode page
runs in-process against a recording stand-in for Prometheus (to see every query sent), and
a page whose backend fails mid-way shows a banner over the last data.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
from playwright.sync_api import Page, Route, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from gpuscope.dashboard import fmt, ids, sections
from gpuscope.dashboard.app import DashboardServer, create_app
from gpuscope.dashboard.data import DataError, EmbeddedData, StepQuery
from gpuscope.dashboard.demo import DemoFleet, scenario_files
from gpuscope.dashboard.demo import _samples as demo_samples
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import FleetData, NodeDetail, PodDetail, Series, Window
from gpuscope.dashboard.service import DashboardService
from gpuscope.dashboard.verdicts import registry
from gpuscope.exporter.sources.simulated import SimulatedSource
from tests.dashboard.conftest import DashboardProcess, FixedSource, one_idle_gpu_fleet

INJECTION = '"}) or vector(1) or up{x="'


def rows(page: Page, table_id: str, note_id: str) -> list[list[str]]:
    """The cells of a DataTable's rows, once the callback filled it (its note says so)."""
    page.wait_for_function(
        f"document.getElementById('{note_id}').innerText.length > 0"
    )
    return [
        [cell.strip() for cell in row.locator("td.dash-cell").all_inner_texts()]
        for row in page.locator(f"#{table_id} tr:has(td.dash-cell)").all()
    ]


def choose(page: Page, dropdown_id: str, option: str) -> None:
    """Pick ``option`` in a dcc.Dropdown like a user (retried: an auto-refresh that lands
    while the menu is open replaces its options and closes it)."""
    for _ in range(3):
        page.click(f"#{dropdown_id}")
        try:
            page.get_by_role("option", name=option, exact=True).click(timeout=5000)
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
            continue
        if option in page.inner_text(f"#{dropdown_id}"):
            return
    raise AssertionError(f"could not choose {option!r} in #{dropdown_id}")


def open_page(page: Page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector(f"#{ids.FLEET_KPIS} .kpi")


def test_demo_renders_every_design_element(page: Page, demo_dashboard: DashboardProcess) -> None:
    open_page(page, demo_dashboard.url)
    for element_id in ids.DESIGN_IDS:
        assert page.locator(f"#{element_id}").count() == 1, element_id
        # Waited for, not sampled: a graph filled by a callback (the heatmap) is laid out a
        # moment after the KPIs appear, and an instant check raced it (seen once in CI).
        expect(page.locator(f"#{element_id}"), element_id).to_be_visible(timeout=10_000)
    page.wait_for_selector(f"#{ids.FLEET_HEATMAP} .heatmaplayer")
    kpis = page.inner_text(f"#{ids.FLEET_KPIS}")
    assert "66" in kpis and "45 / 13 / 8" in kpis, kpis  # busy / idle / spinning
    assert "Traceback" not in page.content()
    # Nothing picked: the drill-downs' empty charts are folded away, with a hint.
    expect(page.locator(f"#{ids.NODE_GRAPHS}")).to_be_hidden()
    assert "No node selected" in page.inner_text(f"#{ids.NODE_BANNER}")
    # The backfilled hour is explained on the page, and times say their zone.
    note = page.inner_text(f"#{ids.HISTORY_NOTE}")
    assert "an hour of generated past" in note and "UTC" in note


def test_idle_nodes_table_lists_the_planted_idle_nodes_with_prices(
    page: Page, demo_dashboard: DashboardProcess
) -> None:
    open_page(page, demo_dashboard.url)
    prices = bundled_prices()
    table = {r[0]: r for r in rows(page, ids.IDLE_NODES_TABLE, ids.IDLE_NOTE)}
    expected = {  # instance type, GPUs, unallocated, allocated-idle, spinning GPUs
        "ip-10-0-1-12.ec2.internal": ("p5.48xlarge", "8", "0", "8", "8"),
        "ip-10-0-2-37.ec2.internal": ("p4d.24xlarge", "8", "6", "2", "0"),
        "ip-10-0-4-18.ec2.internal": ("g5.12xlarge", "4", "4", "0", "0"),
        "ip-10-0-5-90.ec2.internal": ("g6.xlarge", "1", "0", "1", "0"),
    }
    assert set(table) == set(expected)
    for node, (itype, gpus, unallocated, allocated, spinning) in expected.items():
        row = table[node]
        assert (row[1], row[2], row[8], row[10], row[12]) == (
            itype, gpus, unallocated, allocated, spinning)
        assert row[3].endswith("UTC or earlier")
        price = prices.per_hour(itype)
        assert price is not None
        # Dollars with cents, in the tables as in the text: "$21.96", never "$21.958".
        assert row[5] == fmt.money(price) and row[6] == "on-demand"
    slice_price = 55.04 / 8 * 3 / 7
    burning = 21.957642 + 5.672 + 0.8048 + 55.04 + 2 * slice_price
    assert fmt.money(burning, per_hour=True) in page.inner_text(f"#{ids.WASTE_TOTAL}")
    slices = {(r[0], r[1]) for r in rows(page, ids.IDLE_SLICES_TABLE, ids.IDLE_SLICES_NOTE)}
    assert slices == {("ip-10-0-6-20.ec2.internal", "6/2"), ("ip-10-0-6-20.ec2.internal", "7/2")}


def test_gpu_health_table_lists_the_planted_broken_gpu(
    page: Page, demo_dashboard: DashboardProcess
) -> None:
    # The registry's own verdict, on the page like the others: p5-mixed's GPU 4 (an
    # uncorrectable ECC error, XID 63, a row remap pending), its pod, its node's $/hour.
    open_page(page, demo_dashboard.url)
    (row,) = rows(page, "gpu-health-table", "gpu-health-note")
    assert row[:2] == ["ip-10-0-6-20.ec2.internal", "4"]
    assert "XID 63" in row[2] and "row remap pending" in row[2] and "ECC" in row[2]
    assert row[4] == "yes" and "cfd-solver" in row[5] and row[6] == fmt.money(55.04)
    assert "1 GPU with problems on 1 node" in page.inner_text("#gpu-health-note")


def test_a_table_downloads_as_csv(page: Page, demo_dashboard: DashboardProcess) -> None:
    # Every row of the view the page shows, names as text (no markdown links), in Chromium's
    # own download.
    open_page(page, demo_dashboard.url)
    shown = {r[0] for r in rows(page, ids.IDLE_NODES_TABLE, ids.IDLE_NOTE)}
    with page.expect_download() as download:
        page.click(f"#{ids.IDLE_NODES_TABLE}-csv")
    assert re.fullmatch(rf"{ids.IDLE_NODES_TABLE}_1h_\d{{8}}T\d{{4}}Z\.csv",
                        download.value.suggested_filename)
    path = download.value.path()
    lines = path.read_text().splitlines() if path else []
    assert lines[0].startswith("Node,Instance type,GPUs,")
    assert {line.split(",")[0] for line in lines[1:]} == shown
    assert "](" not in "".join(lines)


def test_starved_pods_table_lists_the_planted_containers(
    page: Page, demo_dashboard: DashboardProcess
) -> None:
    open_page(page, demo_dashboard.url)
    got = {(r[0], r[1], r[2], r[3]) for r in rows(page, ids.STARVED_PODS_TABLE, ids.STARVED_NOTE)}
    assert got == {
        ("time-slice starved", "serving", "rerank-api-6b8c7d9f5-m3n8z", "server"),
        ("input-starved (suspected)", "vision", "resnet-finetune-8kq2x", "trainer"),
    }
    shares = {r[3].split("/")[1].split("-")[0]: r
              for r in rows(page, ids.TIMESLICE_TABLE, ids.TIMESLICE_NOTE)}
    assert shares["rerank"][6] == "33%" and shares["rerank"][7].startswith("yes")


def test_stragglers_table_lists_the_planted_ranks_with_kind_and_evidence(
    page: Page, demo_dashboard: DashboardProcess
) -> None:
    open_page(page, demo_dashboard.url)
    stalled, slow = sorted(rows(page, ids.STRAGGLERS_TABLE, ids.STRAGGLERS_NOTE),
                           key=lambda r: r[1])
    assert stalled[:6] == ["stalled: waits while its peers work", "PyTorchJob/llama-pretrain",
                           "ml-train", "llama-pretrain-worker-5", "ip-10-0-1-11.ec2.internal",
                           "5"]
    assert slow[:6] == ["slow: its peers wait for it", "PyTorchJob/mixtral-pretrain",
                        "ml-train", "mixtral-pretrain-worker-3", "ip-10-0-1-13.ec2.internal",
                        "3"]
    assert slow[6].startswith("SM activity")
    assert slow[11].startswith("throttled by heat: thermal 50% of the time (median 0%)")


def test_new_tables_list_the_planted_cases_and_only_them(
    page: Page, demo_dashboard: DashboardProcess
) -> None:
    open_page(page, demo_dashboard.url)
    spinning = rows(page, ids.SPINNING_GPUS_TABLE, ids.SPINNING_NOTE)
    assert {(r[0], r[1]) for r in spinning} == {
        ("ip-10-0-1-12.ec2.internal", str(i)) for i in range(8)}
    assert all(r[3] == "PyTorchJob/gpt-sft" and r[8].startswith("SM, tensor, DRAM")
               for r in spinning)
    throttled = rows(page, ids.THROTTLED_GPUS_TABLE, ids.THROTTLED_NOTE)
    assert [r[:4] for r in throttled] == [["ip-10-0-1-13.ec2.internal", "3",
                                           "mixtral-pretrain-worker-3", "thermal"]]
    idle = rows(page, ids.ALLOCATED_IDLE_TABLE, ids.ALLOCATED_IDLE_NOTE)
    assert sorted((r[1], r[4], r[5]) for r in idle) == [
        ("dev-erin-0", "ip-10-0-5-90.ec2.internal", "GPU 0"),
        ("jupyter-dana", "ip-10-0-2-37.ec2.internal", "GPU 0"),
        ("jupyter-dana", "ip-10-0-2-37.ec2.internal", "GPU 1"),
        ("notebook-carol", "ip-10-0-6-20.ec2.internal", "MIG 3g.40gb (3/7 of GPU 6)"),
    ]


def test_workload_view_draws_every_rank_of_the_planted_job(
    page: Page, demo_dashboard: DashboardProcess
) -> None:
    open_page(page, demo_dashboard.url)
    view = page.locator(f"#{ids.WORKLOAD_VIEW}")
    expect(view).to_contain_text("mixtral-pretrain: 16 GPUs", timeout=20_000)
    # Three panels (utilization, SM activity, power), one line per rank in each.
    assert page.locator(f"#{ids.WORKLOAD_VIEW} .scatterlayer .trace").count() == 48
    legend = page.locator(f"#{ids.WORKLOAD_VIEW} .legend").text_content() or ""
    for node, gpus in (("ip-10-0-1-13.ec2.internal", range(8)),
                       ("ip-10-0-1-14.ec2.internal", range(8))):
        for gpu in gpus:
            assert f"{node} GPU {gpu}" in legend
    assert "★ ip-10-0-1-13.ec2.internal GPU 3 (slow straggler)" in legend


def test_links_open_the_drill_down_and_the_url_keeps_the_view(
    page: Page, demo_dashboard: DashboardProcess
) -> None:
    open_page(page, demo_dashboard.url + "?window=15m")
    rows(page, ids.SPINNING_GPUS_TABLE, ids.SPINNING_NOTE)
    page.locator(f"#{ids.SPINNING_GPUS_TABLE} a",
                 has_text="ip-10-0-1-12.ec2.internal").first.click()
    page.wait_for_url("**node=ip-10-0-1-12.ec2.internal**")
    assert "window=15m" in page.url
    expect(page.locator(f"#{ids.NODE_SELECT}")).to_contain_text("ip-10-0-1-12.ec2.internal")
    expect(page.locator(f"#{ids.NODE_ACTIVITY_GRAPH}")).to_contain_text(
        "work signals (GPM)", timeout=20_000)
    assert page.inner_text(f"#{ids.WINDOW_SELECT}").strip() == "15m"
    # A pod link from the same page: the pod drill-down, the URL says so.
    page.locator(f"#{ids.ALLOCATED_IDLE_TABLE} a", has_text="dev-erin-0").first.click()
    page.wait_for_url("**pod=research%2Fdev-erin-0**")
    expect(page.locator(f"#{ids.POD_UTIL_GRAPH}")).to_contain_text("research/dev-erin-0")
    # A node that is not there (a stale link): a banner says so, no blank charts.
    open_page(page, demo_dashboard.url + "?node=ip-10-9-9-9.ec2.internal")
    expect(page.locator(f"#{ids.NODE_BANNER}")).to_contain_text(
        "No GPU data for node 'ip-10-9-9-9.ec2.internal'")
    expect(page.locator(f"#{ids.NODE_GRAPHS}")).to_be_hidden()


def test_a_heatmap_click_opens_the_node_in_view(page: Page,
                                                 demo_dashboard: DashboardProcess) -> None:
    """Clicking a node's cell in the heatmap opens its drill-down, pages below, and brings it
    into view, as a table's node link does (the page does not stay where it was, the
    drill-down out of sight)."""
    open_page(page, demo_dashboard.url)
    page.wait_for_selector(f"#{ids.FLEET_HEATMAP} .heatmaplayer")
    section = page.locator(f"#{ids.SECTION_NODE}")
    expect(section).not_to_be_in_viewport()
    cells = page.locator(f"#{ids.FLEET_HEATMAP} .nsewdrag").first
    box = cells.bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + box["width"] * 0.05, box["y"] + 8)  # the first row's GPU 0
    page.wait_for_url("**node=**")
    expect(section).to_be_in_viewport()
    expect(page.locator(f"#{ids.NODE_UTIL_GRAPH}")).to_contain_text("GPU utilization")
    expect(section).to_be_in_viewport()


def _sorts_from_the_keyboard(page: Page) -> None:
    """On a page just opened: a table's sort arrows are reached with Tab and pressed with
    Enter or Space, and sort as a mouse click does (assets/table_sort.js): ascending,
    descending, then the page's own order; Tab goes on out of the table; every table's
    arrows are buttons named for their column."""
    table = f"#{ids.IDLE_NODES_TABLE}"

    def types() -> list[str]:
        """The instance types of the table's rows, top to bottom (one round trip)."""
        return list(page.evaluate(
            "t => Array.from(document.querySelectorAll(t + ' td[data-dash-column=instance_type]'))"
            ".map(td => td.innerText.trim())", table))

    rows(page, ids.IDLE_NODES_TABLE, ids.IDLE_NOTE)  # filled
    page_order = types()
    assert len(page_order) == 4 and page_order != sorted(page_order), page_order
    header = page.locator(f"{table} th[data-dash-column=instance_type]")
    control = header.locator(".column-header--sort")
    expect(control).to_have_attribute("aria-label", "Sort by Instance type")

    def tab_to(selector: str, most: int) -> None:
        for _ in range(most):
            page.keyboard.press("Tab")
            if page.evaluate("s => document.activeElement.matches(s)", selector):
                return
        raise AssertionError(f"Tab never reached {selector}")

    # Reached from the top of the page by Tab alone.
    tab_to(f"{table} th[data-dash-column=instance_type] .column-header--sort", 40)

    def sorted_by_keyboard(key: str, direction: str) -> list[str]:
        page.keyboard.press(key)
        expect(header).to_have_attribute("aria-sort", direction)
        return types()

    ascending = sorted_by_keyboard("Enter", "ascending")
    assert ascending == sorted(page_order)
    assert sorted_by_keyboard("Space", "descending") == sorted(page_order, reverse=True)
    assert sorted_by_keyboard("Enter", "none") == page_order
    # What the keyboard did is what a click does.
    control.click()
    expect(header).to_have_attribute("aria-sort", "ascending")
    assert types() == ascending
    # Tab goes on past the table's rows, their links, to the next table's arrows (the
    # table's own key handling held the focus in its first row's link).
    tab_to(f"#{ids.IDLE_SLICES_TABLE} .column-header--sort", 40)
    # Every table's arrows: in the tab order, a button, named for its column.
    marks = page.evaluate("""() => Array.from(document.querySelectorAll('.column-header--sort'))
        .map(el => [el.tabIndex, el.getAttribute('role'), el.getAttribute('aria-label')])""")
    assert len(marks) >= sum(len(t.columns) for t in sections.tables())
    assert all(m[0] == 0 and m[1] == "button" and m[2].startswith("Sort by ")
               for m in marks), marks


def test_every_control_says_what_it_is_for(page: Page, demo_dashboard: DashboardProcess) -> None:
    """A screen reader's list of buttons and fields: each table's "Show all rows" and
    "Download CSV" name their table (not 13 of each alike), and the drill-downs' and the
    workload view's pickers have a label, as the window, namespace and cluster pickers do;
    and every table's sort arrows are buttons named for their column, which the keyboard
    reaches and presses (:func:`_sorts_from_the_keyboard`, on the same page load)."""
    open_page(page, demo_dashboard.url)
    _sorts_from_the_keyboard(page)
    for section in registry.SECTIONS:
        for table in section.tables:
            name = ", ".join(n for n in (section.title, table.heading) if n)
            for action in ("Show all rows", "Download CSV"):
                expect(page.get_by_role("button", name=f"{action} ({name})", exact=True),
                       name).to_have_count(1)
    for label, picker in (("Window", ids.WINDOW_SELECT), ("Namespace", ids.NAMESPACE_FILTER),
                          ("Cluster", ids.CLUSTER_SELECT), ("Workload", ids.WORKLOAD_SELECT),
                          ("Node", ids.NODE_SELECT), ("Pod", ids.POD_SELECT)):
        # (The label of the element a screen reader reads for the picker: a dropdown's
        # button, the namespace's input.)
        labels = page.evaluate(f"Array.from(document.getElementById('{picker}').labels)"
                               ".map(l => l.textContent)")
        assert labels == [label], (picker, labels)


def _url_callbacks(bodies: Sequence[str]) -> int:
    """How many of these callback requests were the URL's (``page-url.search`` written)."""
    return sum(1 for body in bodies if f"{ids.URL}.search" in json.loads(body)["output"])


def _fleet_callbacks(bodies: Sequence[str]) -> int:
    """How many of these callback requests were the fleet's."""
    return sum(1 for body in bodies if f"{ids.FLEET_KPIS}.children" in json.loads(body)["output"])


def test_a_link_sets_the_controls_with_or_without_a_referrer(
    page: Page, demo_dashboard: DashboardProcess
) -> None:
    """The layout comes in the link's state (the page's URL is its request's referrer); a
    browser that sends no referrer gets the default layout, and the URL's callback then
    sets the controls. Either way the URL's callback runs once (the page's refresh runs the
    fleet's alone, every 10 s in the demo: it may have run more than once by then)."""
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.post_data or "{}")
            if "_dash-update-component" in r.url else None)
    open_page(page, demo_dashboard.url + "?window=15m")
    expect(page.locator(f"#{ids.WINDOW_SELECT}")).to_contain_text("15m")
    assert _url_callbacks(sent) == 1 and _fleet_callbacks(sent) >= 1

    def no_referrer(route: Any) -> None:
        # The layout as the server answers a request without a Referer header.
        with urllib.request.urlopen(route.request.url, timeout=30) as answer:
            route.fulfill(status=200, body=answer.read(),
                          headers={"Content-Type": "application/json"})

    sent.clear()
    page.route("**/_dash-layout", no_referrer)
    try:
        open_page(page, demo_dashboard.url + "?window=15m")
        expect(page.locator(f"#{ids.WINDOW_SELECT}")).to_contain_text("15m")
        assert _url_callbacks(sent) == 1 and _fleet_callbacks(sent) >= 1
    finally:
        page.unroute("**/_dash-layout")
    # A window the page does not offer: the default hour, and the URL says so.
    # (A node kept, not a namespace: no other view for the demo's server to compute.)
    open_page(page, demo_dashboard.url + "?window=bogus&node=ip-10-0-4-18.ec2.internal")
    page.wait_for_url(lambda url: "bogus" not in url)
    assert "node=ip-10-0-4-18.ec2.internal" in page.url
    expect(page.locator(f"#{ids.WINDOW_SELECT}")).to_contain_text("1h")


def test_a_dropdown_offers_what_is_typed(page: Page, demo_dashboard: DashboardProcess) -> None:
    # The server sends each dropdown the names that contain what is typed (at most
    # callbacks.MAX_OPTIONS of them), not every name of the fleet.
    open_page(page, demo_dashboard.url)
    wanted = "vision/resnet-finetune-8kq2x"
    def narrowed(response: Any) -> bool:
        sent = response.request.post_data or ""
        return "_dash-update-component" in response.url and "RESNET" in sent

    options: list[dict[str, str]] = []
    for _ in range(3):  # an auto-refresh landing while the menu is open closes it
        try:
            page.click(f"#{ids.POD_SELECT}")
            with page.expect_response(narrowed, timeout=20_000) as answer:
                page.keyboard.type("RESNET")
            # The server's answer to what was typed: only pods that contain it.
            options = answer.value.json()["response"][ids.POD_SELECT]["options"]
            page.get_by_role("option", name=wanted, exact=True).wait_for(timeout=10_000)
            offered = page.get_by_role("option").all_inner_texts()
            page.get_by_role("option", name=wanted, exact=True).click(timeout=5000)
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
            continue
        break
    else:
        raise AssertionError("the typed pod was never offered")
    assert options and all("resnet" in o["value"].lower() for o in options), options
    assert offered and all("resnet" in o.lower() for o in offered), offered
    expect(page.locator(f"#{ids.POD_SELECT}")).to_contain_text(wanted)
    page.wait_for_selector(f"#{ids.POD_UTIL_GRAPH} .scatterlayer .trace", state="attached")


def test_pod_drill_down_and_window_selector(page: Page, demo_dashboard: DashboardProcess) -> None:
    open_page(page, demo_dashboard.url)
    choose(page, ids.POD_SELECT, "vision/resnet-finetune-8kq2x")
    page.wait_for_selector(f"#{ids.POD_UTIL_GRAPH} .scatterlayer .trace", state="attached")
    page.wait_for_function(
        f"document.getElementById('{ids.POD_UTIL_GRAPH}').innerText"
        ".includes('vision/resnet-finetune-8kq2x')"
    )
    # A shorter window: the verdicts now rest on 15 minutes, and the URL says which.
    choose(page, ids.WINDOW_SELECT, "15m")
    page.wait_for_function(
        f"document.getElementById('{ids.HISTORY_NOTE}').innerText.startsWith('Window 15m')"
    )
    assert len(rows(page, ids.IDLE_NODES_TABLE, ids.IDLE_NOTE)) == 4
    assert page.inner_text(f"#{ids.IDLE_NOTE}") == "4 idle nodes."
    page.wait_for_url("**window=15m**")
    assert "pod=vision%2Fresnet-finetune-8kq2x" in page.url
    # A pod on a MIG slice: its memory, and why there is no utilization line.
    choose(page, ids.POD_SELECT, "serving/asr-api-5d6c7b8a9-gg4hh")
    page.wait_for_function(
        f"document.getElementById('{ids.POD_UTIL_GRAPH}').innerText"
        ".includes('no per-container utilization (a MIG slice reports none')")
    page.wait_for_selector(f"#{ids.POD_MEMORY_GRAPH} .scatterlayer .trace", state="attached")



def _zoom(page: Page, graph_id: str, axis: str, lo: float, hi: float) -> list[float]:
    """Drag across a graph's plot area along ``axis`` (``xaxis`` or ``yaxis``), from ``lo``
    to ``hi`` of its length, as a user zooms in; give the range it then shows."""
    area = page.locator(f"#{graph_id} .nsewdrag").first
    area.scroll_into_view_if_needed()
    box = area.bounding_box()
    assert box is not None
    if axis == "xaxis":
        y = box["y"] + box["height"] / 2
        start, end = (box["x"] + box["width"] * lo, y), (box["x"] + box["width"] * hi, y)
    else:
        x = box["x"] + box["width"] / 2
        start, end = (x, box["y"] + box["height"] * lo), (x, box["y"] + box["height"] * hi)
    before = _range(page, graph_id, axis)
    page.mouse.move(*start)
    page.mouse.down()
    page.mouse.move(*end, steps=8)
    page.mouse.up()
    page.wait_for_function(
        """([id, axis, before]) => {
            const ax = document.querySelector('#' + id + ' .js-plotly-plot')._fullLayout[axis];
            const [a, b] = ax.range.map(v => ax.r2l(v));
            return Math.abs(b - a) < 0.9 * Math.abs(before[1] - before[0]);
        }""", arg=[graph_id, axis, before])
    return _range(page, graph_id, axis)


def _range(page: Page, graph_id: str, axis: str) -> list[float]:
    """The range a graph's ``axis`` shows, as numbers (a date axis's in milliseconds)."""
    return list(page.evaluate(
        """([id, axis]) => {
            const ax = document.querySelector('#' + id + ' .js-plotly-plot')._fullLayout[axis];
            return ax.range.map(v => ax.r2l(v));
        }""", [graph_id, axis]))


def test_a_zoom_outlives_the_auto_refresh(page: Page, demo_dashboard: DashboardProcess) -> None:
    """A drill-down's chart, the heatmap and the workload view, zoomed in, stay zoomed when
    the page refreshes itself (10 s in the demo): their data is redrawn, not the user's view
    of it."""
    node = "ip-10-0-1-13.ec2.internal"
    open_page(page, demo_dashboard.url + f"?node={node}")
    page.wait_for_selector(f"#{ids.NODE_UTIL_GRAPH} .scatterlayer .trace", state="attached")
    page.wait_for_selector(f"#{ids.FLEET_HEATMAP} .heatmaplayer")
    expect(page.locator(f"#{ids.WORKLOAD_VIEW}")).to_contain_text("mixtral-pretrain")
    node_zoom = _zoom(page, ids.NODE_UTIL_GRAPH, "xaxis", 0.3, 0.6)
    heat_zoom = _zoom(page, ids.FLEET_HEATMAP, "yaxis", 0.2, 0.5)
    run_zoom = _zoom(page, ids.WORKLOAD_VIEW, "xaxis", 0.4, 0.7)
    # Drawn anew: plotly gives each graph the layout of the figure that came, a new object.
    graphs = [ids.NODE_UTIL_GRAPH, ids.FLEET_HEATMAP, ids.WORKLOAD_VIEW]
    page.evaluate("ids => { window.drawn = ids.map(id => document.querySelector("
                  "'#' + id + ' .js-plotly-plot').layout); }", graphs)
    page.wait_for_function(
        "ids => ids.every((id, i) => document.querySelector('#' + id + ' .js-plotly-plot')"
        ".layout !== window.drawn[i])", arg=graphs, timeout=40_000)
    assert _range(page, ids.NODE_UTIL_GRAPH, "xaxis") == node_zoom
    assert _range(page, ids.FLEET_HEATMAP, "yaxis") == heat_zoom
    assert _range(page, ids.WORKLOAD_VIEW, "xaxis") == run_zoom
    # Another node starts at its whole window.
    choose(page, ids.NODE_SELECT, "ip-10-0-1-14.ec2.internal")
    expect(page.locator(f"#{ids.NODE_UTIL_GRAPH}")).to_contain_text("ip-10-0-1-14")
    assert _range(page, ids.NODE_UTIL_GRAPH, "xaxis") != node_zoom


# -- Prometheus mode: injection through the UI -------------------------------------------------


@pytest.fixture
def serve() -> Iterator[Callable[[DashboardService, float], str]]:
    servers: list[DashboardServer] = []

    def start(service: DashboardService, refresh: float = 30.0) -> str:
        server = DashboardServer(create_app(service, refresh_seconds=refresh), "127.0.0.1", 0)
        server.start()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}/"

    yield start
    for server in servers:
        server.stop()


def test_promql_injection_through_the_namespace_filter_is_harmless(
    page: Page,
    serve: Callable[[DashboardService, float], str],
    recording_prometheus: tuple[str, list[str]],
) -> None:
    base, queries = recording_prometheus
    prom = PrometheusData(base)
    url = serve(DashboardService(prom, bundled_prices()), 30.0)
    open_page(page, url)
    # rules looked for, the store's newest sample (none: asked again over the hour before),
    # first round (who held what in two), when data begins (none at the window's first
    # step): an empty fleet needs no second; and the registry's step queries (sent beside
    # the fleet's from a pool of their own: on a loaded machine they may still be on their
    # way when the page is drawn, which their sections do not wait for)
    expected = 16 + min(len(registry.step_queries()), 1)
    # (A generous wait, left as soon as they are in: under the whole suite's load one came
    # later than 10 s.)
    deadline = time.monotonic() + 30.0
    while len(queries) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(queries) == expected, [q[:60] for q in queries]
    page.fill(f"#{ids.NAMESPACE_FILTER}", INJECTION)
    page.press(f"#{ids.NAMESPACE_FILTER}", "Enter")
    banner = page.locator(f"#{ids.BANNER}")
    banner.wait_for(state="visible")
    assert "Namespace filter ignored: not a Kubernetes namespace name" in banner.inner_text()
    assert "vector(1)" not in "".join(queries)
    # A valid namespace goes through, quoted.
    page.fill(f"#{ids.NAMESPACE_FILTER}", "ml-train")
    page.press(f"#{ids.NAMESPACE_FILTER}", "Enter")
    banner.wait_for(state="hidden")
    assert any('namespace="ml-train"' in q for q in queries)
    assert "Traceback" not in page.content()
    prom.close()


class _Switchable:
    description = "switchable test source"

    def __init__(self) -> None:
        self.fail = False
        self.data = one_idle_gpu_fleet()

    def window(self, window_seconds: float) -> Window:
        return self.data.window

    def fleet(self, window_seconds: float, namespace: str | None = None,
              window: Window | None = None) -> FleetData:
        if self.fail:
            raise DataError("Prometheus http://prom:9090 unreachable: timed out")
        return self.data

    def step_series(self, queries: Sequence[StepQuery], window_seconds: float,
                    window: Window | None = None
                    ) -> dict[StepQuery, list[tuple[dict[str, str], Series]]]:
        if self.fail:
            raise DataError("Prometheus http://prom:9090 unreachable: timed out")
        return {q: [] for q in queries}

    def node_detail(self, node: str, window_seconds: float) -> NodeDetail:
        if self.fail:
            raise DataError("Prometheus http://prom:9090 unreachable: timed out")
        return NodeDetail(node, self.data.window,
                          utilization={"0": self.data.gpu_busy_max[next(iter(self.data.gpus))]})

    def pod_detail(self, namespace: str, pod: str, window_seconds: float,
                   cluster: str | None = None) -> PodDetail:
        raise DataError("down")

    def close(self) -> None:
        pass


def test_backend_down_shows_a_banner_over_the_last_data(
    page: Page, serve: Callable[[DashboardService, float], str]
) -> None:
    source = _Switchable()
    url = serve(DashboardService(source, bundled_prices()), 1.0)
    open_page(page, url + "?node=gpu-node-1")
    assert rows(page, ids.IDLE_NODES_TABLE, ids.IDLE_NOTE)[0][0] == "gpu-node-1"
    trace = page.locator(f"#{ids.NODE_UTIL_GRAPH} .scatterlayer .trace")
    trace.wait_for(state="attached")
    source.fail = True
    banner = page.locator(f"#{ids.BANNER}")
    banner.wait_for(state="visible")
    assert "unreachable: timed out" in banner.inner_text()
    assert "Showing the last data" in banner.inner_text()
    assert rows(page, ids.IDLE_NODES_TABLE, ids.IDLE_NOTE)[0][0] == "gpu-node-1"
    # The node drill-down keeps its charts too, under a banner saying whose they are.
    node_banner = page.locator(f"#{ids.NODE_BANNER}")
    expect(node_banner).to_contain_text("of node gpu-node-1, the 1h window.")
    assert "unreachable: timed out" in node_banner.inner_text()
    expect(node_banner).to_have_class("banner")
    expect(page.locator(f"#{ids.NODE_GRAPHS}")).to_be_visible()
    assert trace.count() == 1
    assert "Traceback" not in page.content()
    source.fail = False
    banner.wait_for(state="hidden")
    expect(node_banner).to_be_empty()


def _idle_nodes(prefix: str, n: int) -> FleetData:
    """``n`` one-GPU idle nodes, ``<prefix>-00`` on."""
    fleets = [one_idle_gpu_fleet(f"{prefix}-{i:02d}") for i in range(n)]
    return replace(fleets[0], **{name: {k: v for f in fleets for k, v in getattr(f, name).items()}
                                 for name in ("gpus", "nodes", "gpu_busy_max", "gpu_now",
                                              "gpu_mean")})


class _NodesPerWindow(FixedSource):
    """Idle nodes named for the window asked for (which view a table's rows are from, at a
    glance): the hour's one, ``gpu-node-3600-00``; 15 minutes' 51, one more than a table
    is sent before "Show all rows" (its note says so until then)."""

    def __init__(self) -> None:
        super().__init__(one_idle_gpu_fleet())
        self.views = {3600: _idle_nodes("gpu-node-3600", 1), 900: _idle_nodes("gpu-node-900", 51)}

    def fleet(self, window_seconds: float, namespace: str | None = None,
              window: Window | None = None) -> FleetData:
        return self.views[round(window_seconds)]


def test_a_late_show_all_rows_answer_for_another_window_is_dropped(
    page: Page, serve: Callable[[DashboardService, float], str]
) -> None:
    """"Show all rows", then another window before that answer came: the answer, for the old
    window, does not replace the new window's rows (it raced the fleet callback's answer,
    and the later one won until the next refresh). The answer is held in the browser until
    the new window's rows are drawn, so the order is the race's worst, every time."""
    url = serve(DashboardService(_NodesPerWindow(), bundled_prices()), 30.0)
    open_page(page, url)
    table, note = page.locator(f"#{ids.IDLE_NODES_TABLE}"), page.locator(f"#{ids.IDLE_NOTE}")
    expect(note).to_have_text("1 idle node.")
    more = sections.more_id(ids.IDLE_NODES_TABLE)
    held: list[Route] = []

    def hold(route: Route) -> None:
        if more in (route.request.post_data or ""):
            held.append(route)
        else:
            route.continue_()

    def callbacks(url: str) -> bool:  # (Dash adds a query: a glob would not match)
        return "/_dash-update-component" in url

    page.route(callbacks, hold)
    try:
        page.click(f"#{more}")
        deadline = time.monotonic() + 10.0
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        assert held, "the Show all rows request was never sent"
        choose(page, ids.WINDOW_SELECT, "15m")
        expect(note).to_contain_text("51 idle nodes. The table shows the first 50 of 51")
        with page.expect_response(lambda r: more in (r.request.post_data or "")) as late:
            held[0].continue_()
        assert late.value.ok
        page.wait_for_timeout(500)  # (before, the old window's rows were drawn at once)
        expect(note).to_contain_text("The table shows the first 50 of 51")
        assert "gpu-node-3600" not in table.inner_text()
    finally:
        page.unroute(callbacks)
    # Asked for in the window shown, the answer fills the table.
    page.click(f"#{more}")
    expect(note).to_have_text("51 idle nodes.")
    assert "gpu-node-900-00" in table.inner_text()


# -- Many clusters: a row's links keep its cluster ----------------------------------------------


@pytest.fixture
def two_clusters_store() -> Iterator[EmbeddedData]:
    """The demo's g6-dev node (a dev pod holding its GPU and doing nothing: allocated-idle,
    ``research/dev-erin-0`` of ``StatefulSet/dev-erin``) in two clusters, ``prod`` and
    ``dev``, under one node name: an hour of its past in an embedded store, keyed
    ``cluster/node`` as a store of many clusters keys it."""
    scenario = next(p for p in scenario_files() if p.name == "g6-dev.yaml")
    fleet = DemoFleet([scenario], history=3600.0)
    fleet.start()
    store = EmbeddedData([], interval=15.0, extra_metrics=registry.step_metrics())
    try:
        node = fleet.nodes[0]
        start = time.time() - 3600.0
        for cluster in ("prod", "dev"):
            past = SimulatedSource(node.scenario, start=start)
            for i in range(1, 240):
                at = i * 15.0
                store.ingest(f"{cluster}/{node.name}",
                             demo_samples(past.sample_at(at, start + at), node), start + at)
        yield store
    finally:
        fleet.stop()
        store.close()


def test_a_rows_pod_and_workload_links_keep_its_cluster(
    page: Page, serve: Callable[[DashboardService, float], str],
    two_clusters_store: EmbeddedData,
) -> None:
    """With every cluster shown, the allocated-idle row of ``dev``'s pod links to ``dev``'s
    pod and run (``cluster=dev``), not to the pod and run of that name in every cluster (the
    same pod names and Helm releases in two clusters are the rule, not the exception); the
    cost-by-workload row of ``dev``'s workload likewise."""
    url = serve(DashboardService(two_clusters_store, bundled_prices()), 30.0)
    open_page(page, url)
    node = "dev/ip-10-0-5-90.ec2.internal"
    table = rows(page, ids.ALLOCATED_IDLE_TABLE, ids.ALLOCATED_IDLE_NOTE)
    assert sorted(r[4] for r in table) == ["dev/ip-10-0-5-90.ec2.internal",
                                           "prod/ip-10-0-5-90.ec2.internal"]
    row = page.locator(f"#{ids.ALLOCATED_IDLE_TABLE} tr:has(td.dash-cell)", has_text=node)
    for column, wanted in (("pod", "pod=research%2Fdev-erin-0"),
                           ("workload", "workload=research%2FStatefulSet%2Fdev-erin")):
        href = row.locator(f"td[data-dash-column={column}] a").get_attribute("href") or ""
        assert wanted in href and "cluster=dev" in href, (column, href)
    workload = page.locator(f"#{ids.COST_BY_WORKLOAD_TABLE} tr:has(td.dash-cell)",
                            has_text="dev").filter(has_text="StatefulSet/dev-erin")
    for r in workload.all():
        cluster = r.locator("td[data-dash-column=cluster]").inner_text().strip()
        href = r.locator("td[data-dash-column=workload] a").get_attribute("href") or ""
        assert f"cluster={cluster}" in href, (cluster, href)
    # Followed, the link opens dev's pod alone, the picker on dev.
    row.locator("td[data-dash-column=pod] a").click()
    page.wait_for_url("**cluster=dev**")
    expect(page.locator(f"#{ids.CLUSTER_SELECT}")).to_contain_text("dev")
    page.wait_for_selector(f"#{ids.POD_UTIL_GRAPH} .scatterlayer .trace", state="attached")
    traces = page.evaluate(
        f"() => document.querySelector('#{ids.POD_UTIL_GRAPH} .js-plotly-plot')"
        ".data.map(t => t.name)")
    assert traces and all(node in t for t in traces), traces
