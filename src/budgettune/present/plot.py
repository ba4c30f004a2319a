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
from pathlib import Path
from typing import Any

from budgettune.errors import BudgettuneError, UsageError

PLOT_SUFFIXES = (".html", ".png")
"""The files ``--plot`` writes."""

_MARKERS = {"circle": "o", "x": "x", "x-thin-open": "1", "star": "*"}


def check_plot_output(path: str) -> Path:
    """The plot's path, refused in one line where it cannot or must not be written.

    Raises:
        UsageError: another suffix, a folder, a link, a special file, or a folder that cannot
            be written into.
    """
    target = Path(path)
    if path.endswith(("/", os.sep)) or target.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {path!r:.200}: name a .html or a .png file")
    try:
        status = target.lstat()
    except FileNotFoundError:
        status = None
    except OSError as exc:
        raise UsageError(f"--plot {target}: {exc.strerror or exc}") from None
    if status is not None and not stat.S_ISREG(status.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(status.st_mode) else "not a regular file"
        raise UsageError(f"--plot {target} is {kind}: name a file to write")
    folder = target.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--plot {target}: cannot write into {folder}")
    return target


def write_plot(figure: Any, path: Path) -> Path:
    """Write the plotly figure as ``path``'s suffix says, atomically; returns ``path``.

    Raises:
        BudgettuneError: matplotlib is missing for a PNG, or the file cannot be written.
    """
    if path.suffix.lower() == ".html":
        data = figure.to_html(include_plotlyjs=True, full_html=True).encode()
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
        fig.savefig(out, format="png", bbox_inches="tight")
        return out.getvalue()
    finally:
        plt.close(fig)
