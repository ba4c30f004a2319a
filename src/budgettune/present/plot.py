"""``budgettune show --plot FILE``: the dashboard's memory × time figure as a file, for a CI log
or a pull request (issue 47). ``.html`` is the plotly figure itself, self-contained (plotly.js
inside: it opens offline); ``.png`` draws the same traces with matplotlib (installed with the
dev extra; plotly's own image export needs kaleido).

Like the pin (issue 48), the path is checked before anything is drawn and written atomically:
never a folder, a link or a special file, never a file of another kind (only ``.html`` and
``.png`` are written, so neither a database nor a study file can be replaced).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from budgettune.errors import BudgettuneError, UsageError, shown_path
from budgettune.pinning.output import same_file

PLOT_SUFFIXES = (".html", ".png")
"""The files ``--plot`` writes."""

_MARKERS = {"circle": "o", "x": "x", "x-thin-open": "1", "star": "*"}


MARK = "budgettune show --plot"
"""What a plot budgettune wrote carries (an HTML comment, the PNG's Software text), so that
``--plot`` replaces only such a file without ``--force`` (the fifth probe: it replaced any)."""


def is_written_plot(path: Path) -> bool:
    """Whether ``path`` holds a plot budgettune wrote: an HTML file that starts with its mark,
    or a PNG whose Software text is it (not any file naming it, issue 48's P6-4)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(8192)
    except OSError:
        return False
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return b"tEXtSoftware\x00" + MARK.encode() in head
    return head.startswith(f"<!-- {MARK} -->\n".encode())


def check_plot_output(path: str, *, protected: Sequence[Path] = (), force: bool = False) -> Path:
    """The plot's path, refused in one line where it cannot or must not be written.

    Raises:
        UsageError: another suffix, a folder, a link, a special file, a file ``protected``
            names (the study's database, whatever its name), an existing file that is not a
            plot budgettune wrote (unless ``force``), or a folder that cannot be written into.
    """
    target = Path(path)
    shown = shown_path(path)
    if path.endswith(("/", os.sep)) or target.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {shown}: name a .html or a .png file")
    for other in protected:
        if same_file(target, other):
            raise UsageError(f"--plot {shown} is the study's database: name another file")
    try:
        status = target.lstat()
    except FileNotFoundError:
        status = None
    except OSError as exc:
        raise UsageError(f"--plot {shown}: {exc.strerror or exc}") from None
    if status is not None and not stat.S_ISREG(status.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(status.st_mode) else "not a regular file"
        raise UsageError(f"--plot {shown} is {kind}: name a file to write")
    if status is not None and not force and not is_written_plot(target):
        raise UsageError(
            f"--plot {shown} exists and is not a plot budgettune wrote; name another file, or "
            "pass --force to replace it"
        )
    folder = target.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--plot {shown}: cannot write into {shown_path(str(folder))}")
    return target


def write_plot(figure: Any, path: Path) -> Path:
    """Write the plotly figure as ``path``'s suffix says, atomically; returns ``path``.

    Raises:
        BudgettuneError: matplotlib is missing for a PNG, or the file cannot be written.
    """
    if path.suffix.lower() == ".html":
        html = figure.to_html(include_plotlyjs=True, full_html=True)
        data = f"<!-- {MARK} -->\n{html}".encode()
    else:
        data = _png(figure)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise BudgettuneError(f"cannot write the plot {path}: {exc.strerror or exc}") from None
    return path


def _plain(text: str | None) -> str:
    """Plotly's label markup as plain text (``<br>`` a new line, other tags dropped)."""
    return re.sub(r"<[^>]+>", "", (text or "").replace("<br>", "\n")).strip()


def _png(figure: Any) -> bytes:
    """The figure's traces, its vertical limit line, title and axis titles, drawn by
    matplotlib into PNG bytes."""
    import io

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BudgettuneError(
            "--plot FILE.png needs matplotlib (pip install matplotlib), or write FILE.html"
        ) from None
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    try:
        for trace in figure.data:
            marker = trace.marker
            symbol = _MARKERS.get(marker.symbol or "circle", "o")
            hollow = marker.color == "rgba(0,0,0,0)"
            ax.scatter(
                list(trace.x),
                list(trace.y),
                label=trace.name,
                marker=symbol,
                s=(marker.size or 9) ** 2,
                facecolors="none" if hollow else marker.color,
                edgecolors=(marker.line.color if hollow else None),
                zorder=3 if symbol == "*" else 2,
            )
            for x, y, text in zip(trace.x, trace.y, trace.text or (), strict=False):
                ax.annotate(_plain(text), (x, y), textcoords="offset points", xytext=(0, 8),
                            ha="center", fontsize=8)  # fmt: skip
        for shape in figure.layout.shapes:
            if shape.x0 is not None and shape.x0 == shape.x1:
                ax.axvline(shape.x0, color=shape.line.color, linestyle="--", linewidth=1.2)
        for note in figure.layout.annotations:
            if note.text and note.x is not None:
                ax.annotate(_plain(note.text), (note.x, 1), xycoords=("data", "axes fraction"),
                            xytext=(-4, -12), textcoords="offset points", ha="right",
                            color="#d62728", fontsize=8)  # fmt: skip
        ax.set_title(_plain(figure.layout.title.text), loc="left", fontsize=10)
        ax.set_xlabel(_plain(figure.layout.xaxis.title.text))
        ax.set_ylabel(_plain(figure.layout.yaxis.title.text))
        ax.grid(color="#e6e6e6")
        ax.legend(fontsize=8, loc="best")
        out = io.BytesIO()
        fig.savefig(out, format="png", bbox_inches="tight", metadata={"Software": MARK})
        return out.getvalue()
    finally:
        plt.close(fig)
