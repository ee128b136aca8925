"""``--plot``: latency distributions and throughput against concurrency, as one PNG.

matplotlib is an optional extra (``pip install 'retool_exec[bench]'``); it is
imported only here, and only when a plot is asked for.
"""

from __future__ import annotations

import math
from pathlib import Path

from retool_exec.bench.results import BenchResult

__all__ = ["MatplotlibMissingError", "require_matplotlib", "write_plot"]

INSTALL_HINT = "pip install 'retool_exec[bench]'"


class MatplotlibMissingError(RuntimeError):
    """--plot was asked for but matplotlib is not installed."""


def require_matplotlib() -> None:
    """Fail early (before a long run) when --plot cannot be honoured."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise MatplotlibMissingError(
            f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}"
        ) from exc


def write_plot(result: BenchResult, path: Path) -> None:
    """One row per workload: latency CDF at concurrency 1, and throughput per concurrency."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda value, _pos: f"{value:g}")

    workloads = result.settings.workloads
    backends = result.settings.backends
    levels = result.settings.concurrency
    lowest = min(levels)
    colors = {name: f"C{index}" for index, name in enumerate(backends)}
    fig, axes = plt.subplots(len(workloads), 2, figsize=(12, 2.6 * len(workloads)), squeeze=False)
    for row, workload in enumerate(workloads):
        cdf_ax, rate_ax = axes[row]
        for backend in backends:
            cell = result.cell(backend, workload, lowest)
            if cell is not None and cell.latencies:
                values = sorted(lat * 1000 for lat in cell.latencies)
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                cdf_ax.step(
                    values,
                    fractions,
                    where="post",
                    color=colors[backend],
                    label=backend,
                    marker="." if len(values) < 10 else None,
                )
            xs, ys = [], []
            for level in levels:
                level_cell = result.cell(backend, workload, level)
                if level_cell is not None and not math.isnan(level_cell.throughput):
                    xs.append(level)
                    ys.append(level_cell.throughput)
            if xs:
                rate_ax.plot(xs, ys, marker="o", color=colors[backend], label=backend)
        shown = [
            lat for b in backends if (c := result.cell(b, workload, lowest)) for lat in c.latencies
        ]
        # Log scale only when the values span enough to need it (sleep and timeout do not).
        wide = bool(shown) and max(shown) > 5 * min(shown)
        if wide:
            cdf_ax.set_xscale("log")
        cdf_ax.set_title(f"{workload}: latency CDF at concurrency {lowest}", fontsize=9)
        cdf_ax.set_xlabel("latency (ms, log)" if wide else "latency (ms)", fontsize=8)
        cdf_ax.set_ylabel("fraction of calls", fontsize=8)
        cdf_ax.grid(True, which="both", alpha=0.3)
        rate_ax.set_xscale("log", base=2)
        rate_ax.set_yscale("log")
        rate_ax.set_xticks(levels)
        rate_ax.set_title(f"{workload}: throughput vs concurrency", fontsize=9)
        rate_ax.set_xlabel("concurrent callers", fontsize=8)
        rate_ax.set_ylabel("calls/s (log)", fontsize=8)
        rate_ax.grid(True, which="both", alpha=0.3)
        cdf_ax.set_ylim(0, 1.05)
        for ax in (cdf_ax, rate_ax):
            ax.tick_params(labelsize=7)
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_formatter(plain)
                axis.set_minor_formatter(NullFormatter())
        if row == 0:
            cdf_ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"retool-exec bench ({', '.join(backends)}), {result.started_at}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
