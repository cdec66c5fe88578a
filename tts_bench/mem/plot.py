"""Timeline PNG of a memory run: used MiB against seconds since the tier started, one line per arm.

Each arm's warmup span (from 0 to its first measure-phase sample) is shaded in the arm's
colour, its steady-state median is a dotted line, gaps are marked with an x on the time axis,
and the device total (when the sampler knows it) is a dashed line. matplotlib is imported here
only, with the non-interactive Agg backend, so nothing else pays for it and no display is needed.

    write_timeline(summary, run.path / "mem_timeline_128x8.png")
"""

from __future__ import annotations

from pathlib import Path

from tts_bench.mem.npu_smi import MIB
from tts_bench.mem.summary import MemSummary

_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def preload() -> None:
    """Import matplotlib now, before sampling starts. The rss sampler counts this process: an
    import between two arms (~40 MiB) would read as a memory difference between them."""
    _pyplot()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)  # headless: CI and remote GPU hosts have no display
    import matplotlib.pyplot as plt

    return plt


def write_timeline(summary: MemSummary, path: Path | str, *, title: str | None = None) -> Path:
    """Draw the summary's series and save a PNG at `path` (parent directories are created)."""
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(12, 5), dpi=110)
    try:
        total = _draw(ax, summary)
        ax.set_xlabel("seconds since the tier started")
        ax.set_ylabel(f"{_ylabel(summary.sampler, summary.describe.get('source'))} (MiB)")
        ax.set_title(title or f"memory at {summary.tier}, {summary.sampler} every {summary.interval_s:g} s"
                     + (f" (device total {total:.0f} MiB)" if total else ""))
        ax.grid(True, alpha=0.3)
        # Outside the axes: a legend over the lines hides exactly the samples one looks for.
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0)
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


def _ylabel(sampler: str, source: str | None = None) -> str:
    if sampler == "torch" and source == "rss":
        return "stage-process RSS (torch sampler, CPU)"  # no device allocator on CPU
    return {"rss": "process-tree RSS", "torch": "allocated, all stage processes",
            "nvml": "device memory used", "npu-smi": "HBM used"}.get(sampler, "used")


def _draw(ax, summary: MemSummary) -> float | None:
    total = None
    for i, (name, arm) in enumerate(summary.arms.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        ok = [s for s in arm.samples if s.ok]
        ax.plot([s.t_s for s in ok], [s.used_bytes / MIB for s in ok], color=colour, marker=".",
                markersize=4, linewidth=1.4, label=f"{name}")
        if arm.warmup_end_s:
            ax.axvspan(0, arm.warmup_end_s, color=colour, alpha=0.10,
                       label=f"{name} warmup (0-{arm.warmup_end_s:.1f} s)")
        if arm.steady_median_mib is not None:
            ax.axhline(arm.steady_median_mib, color=colour, linestyle=":", linewidth=1,
                       label=f"{name} steady median {arm.steady_median_mib:.1f}")
        gaps = [s.t_s for s in arm.samples if not s.ok]
        if gaps:
            ax.plot(gaps, [0] * len(gaps), "x", color=colour, transform=ax.get_xaxis_transform(),
                    clip_on=False, label=f"{name} gaps ({len(gaps)})")
        total = arm.total_mib if arm.total_mib is not None else total
    if total is not None and summary.sampler != "rss":
        # Host RAM would squash the rss lines flat; device totals are what headroom is about.
        ax.axhline(total, color="black", linestyle="--", linewidth=1, label="device total")
    return total if summary.sampler != "rss" else None
