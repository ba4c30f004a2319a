"""``budgettune show --plot FILE`` (issue 47): the dashboard's memory × time figure as a
self-contained HTML file or a PNG, its path checked before anything is drawn (issue 48: only a
.html or .png file is ever written, never a folder, link or special file)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from budgettune.errors import UsageError
from budgettune.present.dashboard_views import FEASIBLE, INFEASIBLE, TrialPoint, memory_time_figure
from budgettune.present.plot import check_plot_output, write_plot


def _figure():
    points = [
        TrialPoint(number=0, kind=INFEASIBLE, peak_bytes=14 * 10**9, step_time_ms=53.0,
                   peak_phase="backward", baseline="unconstrained", config="budget 1.00",
                   outcome="ok"),
        TrialPoint(number=1, kind=FEASIBLE, peak_bytes=7 * 10**9, step_time_ms=62.0,
                   peak_phase="backward", baseline="block-ac-every-1", config="AC every 1",
                   outcome="ok"),
        TrialPoint(number=2, kind=FEASIBLE, peak_bytes=9 * 10**9, step_time_ms=55.0,
                   peak_phase="backward", baseline="", config="budget 0.30", outcome="ok"),
    ]  # fmt: skip
    return memory_time_figure(points, limit_bytes=10 * 10**9, mem_metric="device", pin=None)


def test_html_is_the_figure_self_contained_and_png_is_an_image(tmp_path: Path) -> None:
    html = write_plot(_figure(), check_plot_output(str(tmp_path / "study.html")))
    text = html.read_text()
    assert "block-ac-every-1" in text and "--max-mem 10.00 GB" in text
    assert len(text) > 1_000_000 and '<script src="http' not in text  # plotly.js inside
    png = write_plot(_figure(), check_plot_output(str(tmp_path / "study.PNG")))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.PNG", "study.html"]  # no temps


@pytest.mark.parametrize("name", ["budgettune.db", "study.toml", "pin.json", "plot", "out/"])
def test_only_a_html_or_png_file_is_written(tmp_path: Path, name: str) -> None:
    with pytest.raises(UsageError, match="name a .html or a .png file"):
        check_plot_output(str(tmp_path / name) + ("/" if name.endswith("/") else ""))


def test_a_link_a_folder_or_a_fifo_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real.html").write_text("mine")
    (tmp_path / "link.html").symlink_to(tmp_path / "real.html")
    (tmp_path / "dir.html").mkdir()
    os.mkfifo(tmp_path / "fifo.png")
    for name, says in (("link.html", "symbolic link"), ("dir.html", "not a regular file"),
                       ("fifo.png", "not a regular file")):  # fmt: skip
        with pytest.raises(UsageError, match=says):
            check_plot_output(str(tmp_path / name))
    assert (tmp_path / "real.html").read_text() == "mine"
    with pytest.raises(UsageError, match="cannot write into"):
        check_plot_output(str(tmp_path / "missing" / "study.html"))


def test_the_note_says_why_optunas_best_trial_is_not_the_pin() -> None:
    """The dashboard's own "Best Trial" card shows Optuna's fastest trial, which may be over the
    limit: the note names it beside the pin when they differ (issue 47)."""
    from budgettune.pinning import parse_pin
    from budgettune.present.dashboard_views import study_note
    from budgettune.trial.spec import TrialSpec

    document = {
        "schema_version": 1, "spec": TrialSpec().to_json_dict(), "workload": "builtin:tiny-gpt",
        "limit_bytes": 10**9, "mem_metric": "device", "trial_number": 8,
        "measured": {"runs": 3, "peak_worst_bytes": 9 * 10**8, "step_time_ms": 50.0},
    }  # fmt: skip
    pin = parse_pin(document, source="pin.json").pin
    said = "Optuna's own *Best Trial* card shows trial 19"
    assert said in study_note(study_name="s", search={}, points=[], num_failed=0, pin=pin,
                              optuna_best=19)  # fmt: skip
    for same in (8, None):
        note = study_note(
            study_name="s", search={}, points=[], num_failed=0, pin=pin, optuna_best=same
        )
        assert "Best Trial" not in note


def test_the_database_and_a_file_budgettune_did_not_write_are_never_replaced(
    tmp_path: Path,
) -> None:
    """The fifth probe: ``show --storage db.html --plot db.html`` replaced the study with the
    picture, and any .html or .png was replaced without a word."""
    database = tmp_path / "db.html"
    database.write_bytes(b"SQLite format 3\x00")
    with pytest.raises(UsageError, match="is the study's database"):
        check_plot_output(str(database), protected=[database])
    mine = tmp_path / "notes.html"
    mine.write_text("my notes")
    with pytest.raises(UsageError, match="not a plot budgettune wrote.*--force"):
        check_plot_output(str(mine))
    assert mine.read_text() == "my notes"
    write_plot(_figure(), check_plot_output(str(mine), force=True))
    for name in ("again.html", "again.png"):  # a plot budgettune wrote is replaced freely
        path = tmp_path / name
        write_plot(_figure(), check_plot_output(str(path)))
        write_plot(_figure(), check_plot_output(str(path)))
    with pytest.raises(UsageError) as caught:
        check_plot_output(str(tmp_path / "x\x1b[2J\nname.txt"))
    assert "\x1b" not in str(caught.value) and "\n" not in str(caught.value)
