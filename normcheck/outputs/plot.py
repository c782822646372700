"""`--plot out.png`: where the error budget goes, per tensor and channel (or group), at a glance.

Top: one heatmap per output tensor. Rows are the cases in the table's order, columns the channels
(BatchNorm, SyncBN) or groups (GroupNorm); the colour is the max budget ratio of that channel on a
log scale centred on the budget: green is well inside it, yellow at the edge (ratio 1), red over
it, grey no data (the case was skipped or failed before producing the tensor).
Bottom: a histogram of all those per-channel ratios, with the budget marked.
matplotlib is an optional dependency (the `plot` extra); nothing here touches pyplot's global state.
"""
from __future__ import annotations

import math

import numpy as np

from ..core.errors import UsageError
from ..engine import Report, tally

SIZE_PX = (1600, 1000)
DPI = 100
RATIO_RANGE = (1e-3, 1e3)  # colour and histogram range; values beyond it are clipped to its ends


def require_matplotlib() -> None:
    """Called before a run starts, so a missing extra costs nothing but one line."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError('--plot needs matplotlib, which is not installed: pip install "normcheck[plot]"') from None


def write_plot(path: str, title: str, reports: list[Report]) -> None:
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator
    import matplotlib

    panels = _panels(reports)
    unit = reports[0].unit if reports else "channel"
    fig = Figure(figsize=(SIZE_PX[0] / DPI, SIZE_PX[1] / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(f"{title}: {len(reports)} cases: {tally(reports)}. Budget ratio per {unit} (≤ 1 passes)",
                 fontsize=15)
    cols = max(1, math.ceil(len(panels) / 2))
    grid = fig.add_gridspec(3, cols, height_ratios=(1, 1, 0.9))
    cmap = matplotlib.colormaps["RdYlGn_r"].with_extremes(bad="0.85")
    norm = LogNorm(*RATIO_RANGE, clip=True)
    image = None
    for i, (name, matrix) in enumerate(panels.items()):
        ax = fig.add_subplot(grid[i // cols, i % cols])
        image = ax.imshow(np.clip(matrix, *RATIO_RANGE), aspect="auto", interpolation="nearest", cmap=cmap,
                          norm=norm)
        worst = float(np.nanmax(matrix)) if not np.isnan(matrix).all() else float("nan")
        ax.set_title(f"{name}  (worst {worst:.3g})", fontsize=12, color="firebrick" if worst > 1 else "black")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(unit)
        ax.set_ylabel("case")
    if image is not None:
        bar = fig.colorbar(image, ax=fig.axes, shrink=0.6, extend="both")
        bar.set_label("budget ratio (log scale); grey: tensor not produced")
    _histogram(fig.add_subplot(grid[2, :]), panels, unit)
    fig.savefig(path, dpi=DPI)


def _panels(reports: list[Report]) -> dict[str, np.ndarray]:
    """tensor name -> (cases x units) max budget ratio, NaN where the case has no such tensor.

    Per-rank running statistics (`running_mean[rank 2]`) fold into their tensor, as in compare.
    """
    units = max((r.case.record.units(r.case) for r in reports), default=1)
    panels: dict[str, np.ndarray] = {}
    for row, r in enumerate(reports):
        for t in r.tensors:
            name = t.name.split("[")[0]
            matrix = panels.setdefault(name, np.full((len(reports), units), np.nan))
            values = np.asarray(t.unit_ratios, dtype=float)
            current = matrix[row, : len(values)]
            matrix[row, : len(values)] = np.fmax(current, values)  # fmax: NaN (no data yet) loses
    return panels


def _histogram(ax, panels: dict[str, np.ndarray], unit: str) -> None:
    values = np.concatenate([m[~np.isnan(m)] for m in panels.values()]) if panels else np.array([])
    lo, hi = RATIO_RANGE
    bins = np.logspace(math.log10(lo), math.log10(hi), 61)
    counts, edges = np.histogram(np.clip(values, lo, hi), bins=bins)
    colours = ["firebrick" if left >= 1 else "seagreen" for left in edges[:-1]]
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color=colours)
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1.5)
    over = int(np.count_nonzero(values > 1))
    ax.set_title(f"all {values.size} per-{unit} ratios: {over} over budget (dashed line: ratio 1; "
                 f"values beyond {lo:g}..{hi:g} are counted at the ends)", fontsize=12)
    ax.set_xlabel("budget ratio")
    ax.set_ylabel(f"{unit}s")
