"""Plots of a recorded run (`--plot` on ab/wer/mem/gate, `tts-bench plot RUN_DIR` afterwards).

Everything is drawn from what the run directory already holds (run.json and the measured
records of requests.jsonl), so an old run plots like a new one:

| file | what | from |
|---|---|---|
| `ecdf_audio_rtf.png`, `ecdf_audio_ttfp_ms.png` | per tier (one panel each) and arm, the ECDF of the measured requests | requests.jsonl |
| `block_deltas_audio_rtf.png`, `..._audio_ttfp_ms.png` | A/B runs: per tier the per-block Δ% of the mean (test vs base), their mean, the 95% interval and ±MDE of the verdict | requests.jsonl + run.json result |
| `throughput.png` | per tier and arm, audio seconds per wall second over the measured phase (audio seconds by request end time, in bins), one line per repeat | requests.jsonl |
| `mem_timeline_*.png` | the memory timeline `tts-bench mem` / `ab --mem` drew (reused, not redrawn) | the run directory |
| `report.html` | all of the above, images embedded as base64, with the run's verdict lines: one self-contained file a PR can link | |

A block delta is `100 * (mean_test_k / mean_base_k - 1)` over block k's measured
requests, the quantity `tts_bench.verdicts.stats.compare` builds its interval from. matplotlib only,
imported with the Agg backend inside the functions (no display; nothing else pays for it).

    plots = plot_run(Path("results/runs/20261204-101500-ab-3fa9c1"))
    plots.html, plots.pngs
"""

from __future__ import annotations

import base64
import html
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tts_bench.report.ci import ab_comparisons, verdict_text
from tts_bench.rundir.results import RunDir

METRICS = (("audio_rtf", "audio RTF (lower is faster)"), ("audio_ttfp_ms", "audio TTFP (ms)"))
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
THROUGHPUT_BINS = 20


@dataclass(frozen=True)
class PlotSet:
    """The files `plot_run` wrote (PNGs in drawing order, mem timelines last) and the report."""

    run_dir: Path
    pngs: list[Path] = field(default_factory=list)
    html: Path | None = None


def pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)  # headless: CI and remote GPU hosts have no display
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------- reading the run


def measured(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Measured, successful requests (no warmup, no failure) that carry a tier and an arm."""
    return [r for r in records if not r.get("warmup") and not r.get("failure_kind")
            and r.get("tier") is not None and r.get("arm") is not None]


def _ordered(values) -> list:
    return list(dict.fromkeys(values))


def _by(records, *keys: str) -> dict[tuple, list]:
    out: dict[tuple, list] = defaultdict(list)
    for r in records:
        out[tuple(r.get(k) for k in keys)].append(r)
    return out


def block_deltas(records: Sequence[Mapping[str, Any]], tier: str, arms: Sequence[str],
                 metric: str = "audio_rtf") -> list[float]:
    """Per repeat (block), Δ% of the test arm's mean `metric` against the base arm's."""
    if len(arms) != 2:
        return []
    base, test = arms
    groups = _by([r for r in records if r.get("tier") == tier and r.get(metric) is not None], "repeat", "arm")
    out = []
    for repeat in sorted({k[0] for k in groups if k[0] is not None}):
        b, t = groups.get((repeat, base)), groups.get((repeat, test))
        if b and t:
            mb = sum(r[metric] for r in b) / len(b)
            mt = sum(r[metric] for r in t) / len(t)
            if mb > 0 and mt > 0:
                out.append(100.0 * (mt / mb - 1.0))
    return out


def throughput_series(records: Sequence[Mapping[str, Any]], bins: int | None = None) -> tuple[list[float], list[float]]:
    """(bin centres s, audio s per wall s) of one phase's measured requests: audio seconds
    counted at each request's end time, from the first measured send to the last end; by
    default about 4 requests per bin, at most THROUGHPUT_BINS bins."""
    bins = bins or min(THROUGHPUT_BINS, max(2, len(records) // 4))
    ends = [(r["t_end_s"], r.get("audio_seconds") or 0.0) for r in records
            if r.get("t_end_s") is not None and r.get("t_send_s") is not None]
    if not ends:
        return [], []
    t0 = min(r["t_send_s"] for r in records if r.get("t_send_s") is not None)
    t1 = max(e for e, _ in ends)
    width = max((t1 - t0) / bins, 1e-9)
    audio = [0.0] * bins
    for end, seconds in ends:
        audio[min(int((end - t0) / width), bins - 1)] += seconds
    return [(i + 0.5) * width for i in range(bins)], [a / width for a in audio]


# ---------------------------------------------------------------- figures


def _panels(plt, n: int, *, height: float = 3.6):
    fig, axes = plt.subplots(1, max(n, 1), figsize=(5.2 * max(n, 1), height), dpi=100, squeeze=False)
    return fig, list(axes[0])


def ecdf_figure(records, metric: str, label: str, tiers: Sequence[str], arms: Sequence[str]):
    """One panel per tier, one ECDF step line per arm; x is the metric, y the fraction <= x."""
    plt = pyplot()
    fig, axes = _panels(plt, len(tiers))
    for ax, tier in zip(axes, tiers):
        for i, arm in enumerate(arms):
            xs = sorted(r[metric] for r in records if r.get("tier") == tier and r.get("arm") == arm
                        and r.get(metric) is not None)
            if xs:
                ax.step(xs, [(k + 1) / len(xs) for k in range(len(xs))], where="post",
                        color=COLOURS[i % len(COLOURS)], label=f"{arm} (n={len(xs)})")
        ax.set_title(f"{label}, tier {tier}")
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests <= x")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        _legend(ax, loc="lower right")
    fig.tight_layout()
    return fig


def block_delta_figure(records, tiers: Sequence[str], arms: Sequence[str], result: Mapping[str, Any] | None,
                       metric: str = "audio_rtf", label: str = "audio RTF"):
    """A/B: per tier, the block deltas of the metric's mean (dots), their mean (line), the
    verdict's 95% interval (band) and ±MDE (dashed), from the run's result where it has them."""
    plt = pyplot()
    fig, axes = _panels(plt, len(tiers))
    by_tier = {t.get("tier"): dict(ab_comparisons(t)) for t in (result or {}).get("tiers", [])
               if isinstance(t, Mapping) and "tier" in t}
    for ax, tier in zip(axes, tiers):
        verdict = by_tier.get(tier, {}).get(metric) or {}
        deltas = verdict.get("block_deltas_pct") or block_deltas(records, tier, arms, metric)
        ks = list(range(1, len(deltas) + 1))
        ax.plot(ks, deltas, "o", color="tab:blue", label="block Δ% (test vs base)")
        ax.axhline(0.0, color="black", linewidth=0.8)
        if verdict.get("delta_mean_pct") is not None:
            ax.axhline(verdict["delta_mean_pct"], color="tab:blue", linewidth=1.2,
                       label=f"Δ mean {verdict['delta_mean_pct']:+.1f}%")
        if verdict.get("ci95_pct"):
            lo, hi = verdict["ci95_pct"]
            ax.axhspan(lo, hi, color="tab:blue", alpha=0.15, label=f"95% interval [{lo:+.1f}%, {hi:+.1f}%]")
        if verdict.get("mde_pct") is not None:
            for sign in (1, -1):
                ax.axhline(sign * verdict["mde_pct"], color="tab:red", linestyle="--", linewidth=1,
                           label=f"±MDE {verdict['mde_pct']:.1f}%" if sign > 0 else None)
        ax.set_title(f"{label} per-block Δ, tier {tier}: {verdict.get('verdict', 'no verdict')}")
        ax.set_xlabel("block (repeat)")
        ax.set_ylabel(f"Δ mean {label} (%)")
        ax.set_xticks(ks)
        ax.grid(True, alpha=0.3)
        _legend(ax)
    fig.tight_layout()
    return fig


def throughput_figure(records, tiers: Sequence[str], arms: Sequence[str]):
    """Per tier, audio s per wall s over the measured phase, one line per arm and repeat."""
    plt = pyplot()
    fig, axes = _panels(plt, len(tiers))
    for ax, tier in zip(axes, tiers):
        phases = _by([r for r in records if r.get("tier") == tier], "arm", "repeat", "phase_id")
        for i, arm in enumerate(arms):
            keys = sorted((k for k in phases if k[0] == arm), key=lambda k: (k[1] is None, k[1] or 0))
            for j, key in enumerate(keys):
                xs, ys = throughput_series(phases[key])
                ax.plot(xs, ys, color=COLOURS[i % len(COLOURS)], alpha=0.8, marker=".",
                        label=arm if j == 0 else None)
        ax.set_title(f"audio throughput over the measured phase, tier {tier}")
        ax.set_xlabel("seconds since the first measured request")
        ax.set_ylabel("audio s per wall s")
        ax.grid(True, alpha=0.3)
        _legend(ax)
    fig.tight_layout()
    return fig


def _legend(ax, **kwargs) -> None:
    """A legend where something is labelled (a metric a backend does not report draws nothing)."""
    if any(not h.get_label().startswith("_") for h in ax.get_lines() + ax.patches):
        ax.legend(fontsize="small", **kwargs)


# ---------------------------------------------------------------- the run's plot set


def run_figures(doc: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """{file name: figure} for a run's header and records (the caller saves and closes them)."""
    ok = measured(records)
    tiers = _ordered(r["tier"] for r in ok)
    arms = list(doc.get("configs") or {}) or _ordered(r["arm"] for r in ok)
    arms = [a for a in arms if any(r["arm"] == a for r in ok)]
    if not tiers:
        return {}
    figures = {f"ecdf_{metric}.png": ecdf_figure(ok, metric, label, tiers, arms) for metric, label in METRICS}
    if len(arms) == 2 and any(r.get("repeat") is not None for r in ok):
        for metric, label in (("audio_rtf", "audio RTF"), ("audio_ttfp_ms", "audio TTFP")):
            figures[f"block_deltas_{metric}.png"] = block_delta_figure(ok, tiers, arms, doc.get("result"), metric, label)
    figures["throughput.png"] = throughput_figure(ok, tiers, arms)
    return figures


def plot_run(path: Path | str) -> PlotSet:
    """Draw every plot of the run at `path` into it and write its report.html."""
    run = RunDir.open(path, flag="tts-bench plot RUN_DIR")
    figures = run_figures(run.doc, run.read_requests())
    plt = pyplot()
    pngs = []
    for name, fig in figures.items():
        try:
            fig.savefig(run.path / name)
        finally:
            plt.close(fig)
        pngs.append(run.path / name)
    pngs += sorted(p for p in run.path.glob("mem_timeline*.png"))
    report = run.path / "report.html"
    report.write_text(report_html(run.doc, pngs, run.path), encoding="utf-8")
    return PlotSet(run.path, pngs, report)


def verdict_lines(doc: Mapping[str, Any]) -> list[str]:
    """One line per tier and metric of an A/B result, or the gate/wer verdict, where recorded."""
    result = doc.get("result") or {}
    lines = []
    for tier in result.get("tiers", []) if isinstance(result, Mapping) else []:
        if isinstance(tier, Mapping) and "tier" in tier and "verdict" in tier:
            lines += [f"{tier['tier']} {metric}: {verdict_text(cmp)}" for metric, cmp in ab_comparisons(tier)]
    if isinstance(result, Mapping) and isinstance(result.get("verdict"), str):
        lines.append(f"verdict: {result['verdict']}")
    return lines


def report_html(doc: Mapping[str, Any], pngs: Sequence[Path], run_path: Path) -> str:
    """A self-contained page: the run's identity, its verdict lines, every PNG inline."""
    esc = html.escape
    env = doc.get("environment") or {}
    rows = [("run", str(run_path.name)), ("kind", doc.get("kind")), ("status", doc.get("status")),
            ("created", doc.get("created")), ("git", f"{env.get('git_sha')} (dirty: {env.get('git_dirty')})"),
            ("command", " ".join(map(str, doc.get("command_line") or [])))]
    parts = ["<!doctype html><html><head><meta charset='utf-8'>",
             f"<title>tts-bench {esc(str(doc.get('kind')))} {esc(run_path.name)}</title>",
             "<style>body{font-family:sans-serif;max-width:1400px;margin:auto}td{padding:2px 8px}"
             "img{max-width:100%;border:1px solid #ddd;margin:8px 0}</style></head><body>",
             f"<h1>tts-bench {esc(str(doc.get('kind')))}: {esc(run_path.name)}</h1><table>",
             *[f"<tr><th align=left>{esc(k)}</th><td>{esc(str(v))}</td></tr>" for k, v in rows], "</table>"]
    lines = verdict_lines(doc)
    if lines:
        parts += ["<h2>verdicts</h2><ul>", *[f"<li><code>{esc(x)}</code></li>" for x in lines], "</ul>"]
    for png in pngs:
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        parts.append(f"<h2>{esc(png.stem)}</h2><img alt='{esc(png.name)}' src='data:image/png;base64,{data}'>")
    if not pngs:
        parts.append("<p>no measured requests to plot</p>")
    return "\n".join(parts) + "\n</body></html>\n"
