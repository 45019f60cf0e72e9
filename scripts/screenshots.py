#!/usr/bin/env python3
"""Screenshots of every dashboard view, from the demo, for docs/dashboard.md.

    .venv/bin/python scripts/screenshots.py            # writes docs/img/dashboard-*.png

Starts ``gpuscope-dashboard --demo`` on a free loopback port, opens it in Debian's headless
Chromium (``apt-get install chromium``; Playwright drives it, no browser is downloaded),
and saves one PNG per view. Bounded: every wait has a timeout, and the dashboard is
stopped whatever happens.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {url}")


def shoot(page: Page, element: str, path: Path) -> None:
    page.locator(f"#{element}").screenshot(path=str(path), animations="disabled")
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "img"))
    args = ap.parse_args()
    if not os.path.exists(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} not found: apt-get install chromium")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen([sys.executable, "-m", "gpuscope.dashboard",
                             "--demo", "--refresh", "3600",
                             "--listen", f"127.0.0.1:{port}"], cwd=REPO)
    try:
        wait_up(url, proc)
        with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=ARGS,
                viewport={"width": 1400, "height": 1000}, device_scale_factor=1,
            )
            ctx.set_default_timeout(30_000)
            page = ctx.new_page()
            # The drill-downs open from the URL, as a link from a table row would open them.
            page.goto(url + "?node=ip-10-0-1-13.ec2.internal"
                            "&pod=ml-train%2Fmixtral-pretrain-worker-3")
            page.wait_for_selector("#idle-nodes-table td.dash-cell")
            page.wait_for_selector("#stragglers-table td.dash-cell")
            page.wait_for_selector("#spinning-gpus-table td.dash-cell")
            page.wait_for_selector("#fleet-heatmap .heatmaplayer")
            page.wait_for_selector("#workload-view .scatterlayer .trace", state="attached")
            page.wait_for_selector("#node-activity-graph .scatterlayer .trace",
                                   state="attached")
            page.wait_for_selector("#pod-util-graph .scatterlayer .trace", state="attached")
            page.wait_for_timeout(1000)
            for section, name in (
                ("section-fleet", "fleet"), ("section-idle", "idle"),
                ("cost-by-owner", "cost-by-owner"),
                ("section-allocated-idle", "allocated-idle"), ("section-spinning", "spinning"),
                ("section-throttled", "throttled"), ("section-starvation", "starvation"),
                ("section-stragglers", "stragglers"), ("section-workload", "workload"),
                ("section-node", "node"), ("section-pod", "pod"),
            ):
                shoot(page, section, out / f"dashboard-{name}.png")
            ctx.close()
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
