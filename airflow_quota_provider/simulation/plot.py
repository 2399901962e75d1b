"""A PNG of busy GPUs and waiting jobs over time, per quota and policy (matplotlib, no display)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from airflow_quota_provider.simulation.engine import SimulationResult

SAMPLES = 1200


def _series(result: SimulationResult, times: list[float]) -> tuple[list[list[float]], list[list[float]]]:
    """Busy GPUs and waiting jobs per quota, sampled at ``times`` (the value just after each time)."""
    import numpy as np

    quotas = len(result.quota_names)
    events = result.timeline or []
    if not events:
        zeros = [[0.0] * len(times) for _ in range(quotas)]
        return zeros, [list(z) for z in zeros]
    data = np.array(events, dtype=float)
    order = np.argsort(data[:, 0], kind="stable")
    data = data[order]
    sample = np.asarray(times)
    busy, waiting = [], []
    for index in range(quotas):
        rows = data[data[:, 1] == index]
        if len(rows) == 0:
            busy.append(np.zeros(len(sample)))
            waiting.append(np.zeros(len(sample)))
            continue
        level_busy = np.cumsum(rows[:, 2])
        level_wait = np.cumsum(rows[:, 3])
        position = np.searchsorted(rows[:, 0], sample, side="right") - 1
        valid = position >= 0
        busy.append(np.where(valid, level_busy[np.clip(position, 0, None)], 0.0))
        waiting.append(np.where(valid, level_wait[np.clip(position, 0, None)], 0.0))
    return busy, waiting


def plot(results: Mapping[str, SimulationResult], path: str | Path, *, title: str = "") -> None:
    """One row per policy: stacked busy GPUs per quota (left), waiting jobs per quota (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Path simplification drops vertices of long filled paths and leaves white slivers in stacks.
    with matplotlib.rc_context({"path.simplify": False}):
        _plot(results, path, title, plt)


def _plot(results: Mapping[str, SimulationResult], path: str | Path, title: str, plt) -> None:

    if not results:
        raise ValueError("nothing to plot")
    first = next(iter(results.values()))
    start = min(r.start for r in results.values())
    end = max(r.end for r in results.values())
    span = max(end - start, 1e-9)
    unit, scale = ("days", 86_400.0) if span > 3 * 86_400 else ("hours", 3600.0) if span > 3 * 3600 else ("s", 1.0)
    times = [start + span * i / (SAMPLES - 1) for i in range(SAMPLES)]
    x = [(t - start) / scale for t in times]
    rows = len(results)
    figure, axes = plt.subplots(rows, 2, figsize=(15, 3.2 * rows + 0.8), squeeze=False, sharex=True)
    colours = plt.get_cmap("tab10" if len(first.quota_names) <= 10 else "tab20")
    for row, (name, result) in enumerate(results.items()):
        busy, waiting = _series(result, times)
        left, right = axes[row]
        areas = left.stackplot(x, busy, labels=result.quota_names,
                               colors=[colours(i % colours.N) for i in range(len(busy))])
        for area in areas:  # no seams between the stacked areas
            area.set_edgecolor("face")
            area.set_linewidth(0.3)
        left.axhline(result.capacity, color="black", linewidth=0.8, linestyle="--")
        left.set_ylabel(f"{name}\nbusy GPUs")
        left.set_ylim(0, result.capacity * 1.05)
        for index, series in enumerate(waiting):
            right.plot(x, series, linewidth=0.7, color=colours(index % colours.N), label=result.quota_names[index])
        right.set_ylabel("waiting jobs")
        right.set_yscale("symlog", linthresh=10)
        right.set_ylim(bottom=0, top=max(10.0, 1.3 * max((max(w) for w in waiting), default=0.0)))
        if row == 0:
            left.set_title("GPUs in use, stacked by quota (dashed: pool capacity)")
            right.set_title("jobs waiting, per quota")
    for ax in axes[-1]:
        ax.set_xlabel(f"time since the first submission ({unit})")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 10), fontsize="small", frameon=False)
    if title:
        figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.045, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
