"""Disk full for the dashboard: ``gpuscope-dashboard --demo`` with RLIMIT_FSIZE=0 (any
write to a regular file fails with EFBIG; SIGXFSZ is ignored so it is an error, not a
kill), TMPDIR pointing at a directory that does not exist, HOME read-only and an empty
working directory. The dashboard writes no files, so it must serve the page and its main
callback as usual, and leave nothing behind.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import free_port, wait_for


def no_file_writes() -> None:
    """preexec_fn: in the child, between fork and exec."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


class Dashboard:
    def __init__(self, tmp_path: Path) -> None:
        self.cwd = tmp_path / "cwd"
        self.cwd.mkdir()
        home = tmp_path / "home"
        home.mkdir()
        home.chmod(0o555)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
        env.update(TMPDIR=str(tmp_path / "no-such-dir"), HOME=str(home),
                   XDG_CACHE_HOME=str(home / ".cache"))
        script = Path(sys.executable).with_name("gpuscope-dashboard")
        cmd = [str(script)] if script.exists() else [sys.executable, "-m", "gpuscope.dashboard"]
        # Output to a pipe (regular files cannot grow under the limit), drained by a thread.
        self.proc = subprocess.Popen(
            [*cmd, "--demo", "--listen", f"127.0.0.1:{self.port}"],
            cwd=self.cwd, env=env, preexec_fn=no_file_writes,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self.output: list[bytes] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def log(self) -> str:
        return b"".join(self.output).decode(errors="replace")

    def up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"dashboard exited {self.proc.returncode}: {self.log()}")
        try:
            return requests.get(self.url + "/", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        # Killed, not terminated: its graceful exit is not under test here (and takes a
        # few seconds: seven in-process exporters to stop).
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(15)


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[Dashboard]:
    d = Dashboard(tmp_path)
    try:
        wait_for(d.up, 120, "the dashboard")
        yield d
    finally:
        d.stop()
        (tmp_path / "home").chmod(0o755)


def find(node: Any, component_id: str) -> dict[str, Any] | None:
    """The props of the component with this id in a Dash layout tree."""
    if isinstance(node, list):
        for child in node:
            if (found := find(child, component_id)) is not None:
                return found
    elif isinstance(node, dict):
        props = node.get("props", {})
        if props.get("id") == component_id:
            return dict(props)
        for value in props.values():
            if (found := find(value, component_id)) is not None:
                return found
    return None


def test_demo_dashboard_serves_with_no_disk_space(dashboard: Dashboard) -> None:
    # The fault is really in place: no file may grow, and SIGXFSZ (25) is ignored.
    limits = Path(f"/proc/{dashboard.proc.pid}/limits").read_text()
    assert any(line.startswith("Max file size") and line.split()[3:5] == ["0", "0"]
               for line in limits.splitlines()), limits
    status = Path(f"/proc/{dashboard.proc.pid}/status").read_text()
    ignored = int(next(x for x in status.splitlines() if x.startswith("SigIgn:")).split()[1], 16)
    assert ignored & (1 << (signal.SIGXFSZ - 1))
    page = requests.get(dashboard.url + "/", timeout=10)
    assert page.status_code == 200 and "_dash-config" in page.text
    layout = requests.get(dashboard.url + "/_dash-layout", timeout=10).json()
    dependencies = requests.get(dashboard.url + "/_dash-dependencies", timeout=10).json()
    # The main callback: KPIs, heatmap, idle nodes, starved pods, stragglers... (the one
    # whose inputs are the refresh timer, the window and the namespace filter).
    main = next(d for d in dependencies if any(i["id"] == "refresh-interval"
                                               for i in d["inputs"]))
    outputs = [dict(zip(("id", "property"), o.split("."), strict=True))
               for o in main["output"].strip(".").split("...")]
    for window in (None, "6h"):
        inputs = []
        for i in main["inputs"]:
            props = find(layout, i["id"])
            assert props is not None, i
            value = props.get(i["property"])
            if i["id"] == "window-select" and window is not None:
                value = window
            inputs.append({**i, "value": value})
        # Its states (the tables' row limits) as the page holds them.
        states = [{**st, "value": (find(layout, st["id"]) or {}).get(st["property"])}
                  for st in main.get("state", [])]
        answer = requests.post(dashboard.url + "/_dash-update-component", json={
            "output": main["output"], "outputs": outputs, "inputs": inputs,
            "changedPropIds": [], "state": states,
        }, timeout=60)
        assert answer.status_code == 200, answer.text[:500]
        response = answer.json()["response"]
        # the demo's planted idle nodes, the one spinning in a hung collective included
        assert len(response["idle-nodes-table"]["data"]) == 4
        assert response["fleet-kpis"]["children"]
        assert response["data-banner"]["className"] == "banner hidden"  # no error shown
    assert dashboard.proc.poll() is None
    assert list(dashboard.cwd.iterdir()) == []
    assert "Traceback" not in dashboard.log()
    assert "Errno 27" not in dashboard.log() and "File too large" not in dashboard.log()
