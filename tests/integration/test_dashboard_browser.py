"""`budgettune.present.dashboard.serve` in a real process, rendered by headless Chromium.

The dashboard is a React app: the plot and the note exist only after its JavaScript ran, so the
test reads the DOM Chromium dumps (``--dump-dom``) after a virtual-time budget. Chromium is
required: without it this test fails (``apt-get install -y chromium chromium-driver``).

Set ``BUDGETTUNE_UPDATE_SCREENSHOT=1`` to refresh ``docs/dashboard.png`` from this run.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from budgettune.present import dashboard
from budgettune.present.dashboard_views import PLOT_ID
from budgettune.storage import open_storage
from budgettune.study.publish import publish_views
from fixtures.dashboard_study import PIN_TRIAL, SampleStudy, make_study

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "docs" / "dashboard.png"
SERVE = (
    "import sys\n"
    "from budgettune.present.dashboard import serve\n"
    "serve(sys.argv[1], host='127.0.0.1', port=0, log=lambda line: print(line, flush=True))\n"
)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(
        "headless Chromium is required for the dashboard browser test; install it with "
        "`apt-get install -y chromium chromium-driver`"
    )


@pytest.fixture
def sample(tmp_path: Path) -> SampleStudy:
    sample = make_study(tmp_path / "budgettune.db")
    with open_storage(sample.url, create=False) as store:
        publish_views(store, sample.study_name)
    return sample


@pytest.fixture
def server(sample: SampleStudy) -> Iterator[str]:
    """`serve` in a child process on a free port; yields its base URL."""
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE, sample.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    output: list[str] = []
    line = ""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 30
        while "budgettune dashboard at" not in line and time.monotonic() < deadline:
            if selector.select(timeout=1) and (line := process.stdout.readline()):
                output.append(line)
            elif process.poll() is not None:
                break
    found = re.search(r"http://127\.0\.0\.1:(\d+)/dashboard/", line)
    if found is None:
        process.kill()
        pytest.fail("the dashboard did not start:\n" + "".join(output))
    assert "read-only" in line and "--allow-writes" in line
    # keep draining the child's output (request errors are printed) so it never blocks
    threading.Thread(target=lambda: output.extend(process.stdout or ()), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{found.group(1)}"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, "".join(output)


def browse(url: str, profile: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--window-size=1400,1900",
            "--virtual-time-budget=10000",
            *extra,
            url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> str:
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    return out


def test_plot_and_note_render_and_writes_are_refused(
    server: str, sample: SampleStudy, tmp_path: Path
) -> None:
    study_page = f"{server}/dashboard/studies/{sample.study_id}"
    png = tmp_path / "dashboard.png"
    # three independent browsers at once: the main page, the note page, a screenshot
    main = browse(study_page, tmp_path / "profile-main", "--dump-dom")
    note = browse(f"{study_page}/note", tmp_path / "profile-note", "--dump-dom")
    shot = browse(study_page, tmp_path / "profile-shot", f"--screenshot={png}")

    request = urllib.request.Request(f"{server}/api/studies/{sample.study_id}", method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 403
    assert json.loads(refused.value.read())["reason"] == dashboard.READ_ONLY_REASON

    dom = finish(main)
    start = dom.find(f'id="user-defined-plot:{PLOT_ID}"')
    assert start >= 0, "our plot's container is not on the study page"
    plot = dom[start:]
    assert 'class="main-svg"' in plot, "plotly did not draw our figure"
    assert "Peak device memory vs step time" in plot
    assert f"pinned #{PIN_TRIAL}" in plot
    for label in ("unconstrained", "block-ac-every-1", "budget-0.5", "--max-mem 150.00 MB"):
        assert label in plot

    note_dom = finish(note)
    assert f"Current pin: trial {PIN_TRIAL}" in note_dom
    assert "+6.0%" in note_dom
    assert "<table" in note_dom

    finish(shot)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("BUDGETTUNE_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(png, SCREENSHOT)

    with urllib.request.urlopen(f"{server}/api/studies", timeout=10) as response:
        assert [s["study_name"] for s in json.load(response)["study_summaries"]] == [
            sample.study_name
        ]
