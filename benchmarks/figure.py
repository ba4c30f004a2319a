"""The memory x time figure of a grid (``python -m benchmarks.report --figure``): its points by
family, their measured frontier, the limits and the pins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import options_cell


def family_of(spec: dict[str, Any]) -> str:
    """The hand-picked family a configuration belongs to, read from its spec."""
    if spec.get("compile_mode") == "eager":
        base = "eager + block AC" if spec.get("block_ac_every") else "eager"
    elif spec.get("block_ac_every"):
        op = spec.get("block_ac_policy") == "op"
        base = "compile + op-policy AC" if op else "compile + block AC"
    elif "aten.add" in spec.get("recompute_ops_removed", ()):
        base = "nosac (0.99, -add)"
    else:
        base = "compile, budget"
    return base + (", fused AdamW" if spec.get("optimizer_impl") == "fused" else "")


def short_tag(spec: dict[str, Any]) -> str:
    """A point's label on the figure: its budget or AC stride."""
    every = spec.get("block_ac_every") or 0
    if every:
        return f"AC{every}" + ("op" if spec.get("block_ac_policy") == "op" else "")
    if spec.get("compile_mode") == "eager":
        return "eager"
    return f"{spec.get('activation_memory_budget', 1.0):g}"


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (lower is better), by x.

    Ties on both axes keep the first. Used for the measured memory x time frontier.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front: list[int] = []
    best_y = float("inf")
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def label_offsets(
    xs: list[float], ys: list[float], near_x: float, near_y: float
) -> list[tuple[tuple[int, int], str]]:
    """Where each point's tag goes (offset in points, alignment) so that close points' tags do
    not print over each other: the n-th point near earlier ones alternates right and left of its
    marker and steps down every second time."""
    out: list[tuple[tuple[int, int], str]] = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        crowd = sum(
            abs(x - xs[j]) < near_x and abs(y - ys[j]) < near_y for j in range(i)
        )  # fmt: skip
        right = crowd % 2 == 0
        out.append(((5 if right else -5, 3 - 8 * (crowd // 2)), "left" if right else "right"))
    return out


def figure(
    records: list[dict[str, Any]],
    out: Path,
    *,
    limits: dict[str, float],
    pins: dict[str, dict[str, Any]],
    title: str | None = None,
) -> list[str]:
    """Draw peak device GB (x) against median step ms (y) and save it as a PNG.

    Args:
        records: measured configurations (``reference.py`` records); failures are skipped.
        out: the PNG to write.
        limits: name -> limit in GB, drawn as vertical lines.
        pins: label -> pinned-config JSON (its worst re-measured device peak and step time).
        title: the figure's title; default: workload, options, device, torch, dates.

    Returns:
        The labels of the frontier's configurations, lowest memory first.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r["result"].get("measurement")]
    if not ok:
        raise SystemExit("no measured configuration to draw")
    xs = [r["result"]["measurement"]["peak_device_bytes"] / 1e9 for r in ok]
    ys = [r["result"]["measurement"]["step_time_ms"] for r in ok]
    fig, ax = plt.subplots(figsize=(12, 6.5), dpi=120)
    families = sorted({family_of(r["spec"]) for r in ok})
    markers = "osD^v<>ph*X"
    for n, family in enumerate(families):
        idx = [i for i, r in enumerate(ok) if family_of(r["spec"]) == family]
        fused = family.endswith("fused AdamW")
        ax.scatter(
            [xs[i] for i in idx], [ys[i] for i in idx], label=family, s=46,
            marker=markers[n % len(markers)], facecolors="none" if not fused else None,
            edgecolors=f"C{n % 10}", color=f"C{n % 10}", linewidths=1.4, zorder=3,
        )  # fmt: skip
    x_span = (max(xs) - min(xs)) or 1.0
    y_span = (max(ys) - min(ys)) or 1.0
    for i, (xytext, ha) in enumerate(label_offsets(xs, ys, x_span / 60, y_span / 40)):
        ax.annotate(
            short_tag(ok[i]["spec"]), (xs[i], ys[i]), textcoords="offset points",
            xytext=xytext, ha=ha, fontsize=7, color="0.3",
        )  # fmt: skip
    front = pareto_front(list(zip(xs, ys, strict=True)))
    ax.step(
        [xs[i] for i in front], [ys[i] for i in front], where="post", color="0.2",
        linestyle="--", linewidth=1, label="measured frontier", zorder=2,
    )  # fmt: skip
    for n, (name, gb) in enumerate(sorted(limits.items(), key=lambda kv: kv[1])):
        ax.axvline(gb, color="firebrick", linestyle=":", linewidth=1.2, zorder=1)
        ax.annotate(
            f"{name} {gb:.2f} GB", (gb, 0.0), xycoords=("data", "axes fraction"),
            xytext=(3, 4 + 11 * (n % 2)), textcoords="offset points", fontsize=8,
            color="firebrick",
        )  # fmt: skip
    for n, (label, pin) in enumerate(pins.items()):
        measured = pin["measured"]
        x, y = measured["peak_device_worst_bytes"] / 1e9, measured["step_time_ms"]
        ax.scatter([x], [y], marker="*", s=260, color="gold", edgecolors="black", zorder=4)
        # the pins sit among the grid's tags: label them off to the side, with an arrow
        ax.annotate(
            f"pin {label}: {y:.1f} ms, {x:.2f} GB", (x, y), textcoords="offset points",
            xytext=(30, 40 + 14 * n), fontsize=8, fontweight="bold",
            arrowprops={"arrowstyle": "-", "color": "0.2", "linewidth": 0.8},
            bbox={"boxstyle": "round,pad=0.2", "facecolor": "white", "edgecolor": "0.6"},
        )  # fmt: skip
    if title is None:
        first = ok[0]
        dates = sorted(r["date"][:10] for r in ok)
        options = options_cell(first["options"])
        title = (
            f"{first['workload']} ({options}) on {first['device']}, torch "
            f"{first['torch_version']}, {dates[0]}"
        )
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("peak device memory, GB (worst re-measured for pins)")
    ax.set_ylabel("median step time, ms (lower is better)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return [ok[i]["label"] for i in front]
