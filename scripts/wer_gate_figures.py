"""How often the WER gate passes non-deterministic A/As and fails a degraded arm, by prompt count
and margin, from recorded `tts-bench wer` runs.

Record the runs first (piper at its default noise in both arms; the degraded arm louder and
faster), each with more prompts than any count studied, so every count is the first n
utterances of the same runs (file order, `bench.disable_shuffle`):

    NOISE="--set piper.noise_scale=0.667 --set piper.noise_w_scale=0.8"
    for i in $(seq 24); do tts-bench wer --config configs/wer/seed-tts-en.yaml $NOISE \
        --num-prompts 80 --result-dir /tmp/wer-aa --format json > /dev/null; done
    for i in $(seq 6); do tts-bench wer --config configs/wer/seed-tts-en.yaml $NOISE \
        --test-set piper.noise_scale=1.5 --test-set piper.length_scale=0.7 \
        --num-prompts 80 --result-dir /tmp/wer-degraded --format json > /dev/null; done
    PYTHONPATH=. python scripts/wer_gate_figures.py --aa /tmp/wer-aa/* --degraded /tmp/wer-degraded/* \
        --prompts 20,40,60,80 --margins 2,3,4,5 --out results/wer-gate

Each run is re-judged with the gate's own code (`tts_bench.wer.score.compare_utterances`,
`tts_bench.wer.gate.judge_pair`, mode auto) on its first n utterances. Beside the counts, a
normal-theory expectation from the pooled per-utterance SDs smooths over the few runs:

    P(A/A passes)       = Phi((margin - t * se_aa) / se_aa)              se = SD / sqrt(n)
    P(degraded fails)   = Phi((delta_deg - margin + t * se_deg) / se_deg)

Writes `<out>/figures.json` and `figures.md`; the last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tts_bench.verdicts.stats import clopper_pearson, t_quantile  # noqa: E402
from tts_bench.wer.gate import judge_pair  # noqa: E402
from tts_bench.config.wer import WerParams  # noqa: E402
from tts_bench.rundir.atomic_json import write_json_atomic  # noqa: E402
from tts_bench.wer.score import compare_utterances, scored_wer  # noqa: E402


def load_arms(run_dir: Path) -> tuple[list[dict], list[dict], dict] | None:
    """(base utterances, test utterances, the WER document) of a finished run, else None."""
    path = run_dir / "run.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    wer = doc.get("wer")
    if not wer:
        return None  # still generating, or killed
    base, test = (wer["arms"][a]["utterances"] for a in ("base", "test"))
    return base, test, wer


def judge_first(base: list[dict], test: list[dict], n: int, margin: float) -> tuple[bool, float, float]:
    """(passed, mean ΔWER points, SD of per-utterance ΔWER points) on the first n utterances."""
    p = compare_utterances("base", base[:n], "test", test[:n])
    ok, _, _ = judge_pair(p, replace(WerParams(), margin_points=margin))
    return bool(ok), 100.0 * (p.delta_mean_wer or 0.0), 100.0 * (p.sd_delta_wer or 0.0)


def _rate(k: int, n: int) -> str:
    lo, hi = clopper_pearson(k, n)
    return f"{k}/{n} [{100 * lo:.0f}%, {100 * hi:.0f}%]"


def expected(sd_aa: float, sd_deg: float | None, delta_deg: float | None, n: int, m: float) -> tuple[float, float | None]:
    """Normal-theory P(A/A passes), P(degraded fails) at n prompts and margin m (see docstring)."""
    from scipy.stats import norm

    t = t_quantile(0.975, n - 1)
    se = sd_aa / np.sqrt(n)
    p_pass = float(norm.cdf((m - t * se) / se))
    if sd_deg is None or delta_deg is None:
        return p_pass, None
    se_d = sd_deg / np.sqrt(n)
    return p_pass, float(norm.cdf((delta_deg - m + t * se_d) / se_d))


def _pooled_sd(sds: list[float]) -> float:
    return float(np.sqrt(np.mean(np.square(sds))))


def table(aa: list, degraded: list, prompts: list[int], margins: list[float]) -> tuple[list[dict], str]:
    cells, lines = [], ["| prompts | margin | A/A pass [95% CI] | expected | degraded fail [95% CI] | expected | "
                        "A/A mean ΔWER (range) | A/A SD of per-utterance ΔWER | degraded mean ΔWER (range) |",
                        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n in prompts:
        for m in margins:
            a = [judge_first(b, t, n, m) for b, t, _ in aa]
            d = [judge_first(b, t, n, m) for b, t, _ in degraded]
            passed, failed = int(sum(x[0] for x in a)), int(sum(not x[0] for x in d))
            ad, dd = [x[1] for x in a], [x[1] for x in d]
            e_pass, e_fail = expected(_pooled_sd([x[2] for x in a]), _pooled_sd([x[2] for x in d]) if d else None,
                                      float(np.mean(dd)) if d else None, n, m)
            cells.append({"prompts": n, "margin_points": m, "aa_runs": len(a), "aa_pass": passed,
                          "degraded_runs": len(d), "degraded_fail": failed, "expected_aa_pass": e_pass,
                          "expected_degraded_fail": e_fail,
                          "aa_delta_points": [x[1] for x in a], "aa_sd_points": [x[2] for x in a],
                          "degraded_delta_points": dd, "degraded_sd_points": [x[2] for x in d]})
            lines.append(
                f"| {n} | {m:g} | {_rate(passed, len(a))} | {100 * e_pass:.0f}% | "
                f"{_rate(failed, len(d)) if d else 'n/a'} | {'n/a' if e_fail is None else f'{100 * e_fail:.0f}%'} | "
                f"{np.mean(ad):+.2f} ({min(ad):+.1f} .. {max(ad):+.1f}) | {np.mean([x[2] for x in a]):.1f} | "
                + (f"{np.mean(dd):+.2f} ({min(dd):+.1f} .. {max(dd):+.1f}) |" if dd else "n/a |"))
    return cells, "\n".join(lines) + "\n"


def arm_wers(runs: list) -> dict[str, list[float]]:
    """Mean WER (empty = 1.0) per arm over the runs' utterances, for the header."""
    out: dict[str, list[float]] = {"base": [], "test": []}
    for b, t, _ in runs:
        for arm, utts in (("base", b), ("test", t)):
            w = [x for x in map(scored_wer, utts) if x is not None]
            out[arm].append(100.0 * float(np.mean(w)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--aa", nargs="+", type=Path, required=True, help="A/A run directories")
    ap.add_argument("--degraded", nargs="*", type=Path, default=[], help="degraded-arm run directories")
    ap.add_argument("--prompts", default="20,40,60,80")
    ap.add_argument("--margins", default="2,3,4,5")
    ap.add_argument("--out", type=Path, default=ROOT / "results/wer-gate")
    args = ap.parse_args()
    aa = [x for x in map(load_arms, args.aa) if x is not None]
    degraded = [x for x in map(load_arms, args.degraded) if x is not None]
    prompts = [int(x) for x in args.prompts.split(",")]
    margins = [float(x) for x in args.margins.split(",")]
    cells, md = table(aa, degraded, prompts, margins)
    aw, dw = arm_wers(aa), arm_wers(degraded)
    asr = aa[0][2]["asr"]
    head = (f"**WER gate, non-inferiority (mode auto), piper at default noise**: {len(aa)} A/As, {len(degraded)} "
            f"degraded runs (test arm noise_scale 1.5, length_scale 0.7), first n of the builtin set in file "
            f"order, ASR {asr['backend']} {asr['model']} {asr['compute_type']}, normalizer {asr['normalizer']}\n\n"
            f"mean WER (empty = 1) per run, A/A arms: {np.mean(aw['base'] + aw['test']):.2f}% "
            f"({min(aw['base'] + aw['test']):.2f} .. {max(aw['base'] + aw['test']):.2f})"
            + (f"; degraded runs: base {np.mean(dw['base']):.2f}%, test {np.mean(dw['test']):.2f}% "
               f"({min(dw['test']):.2f} .. {max(dw['test']):.2f})" if degraded else "") + "\n\n")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"aa_runs": [str(p) for p in args.aa], "degraded_runs": [str(p) for p in args.degraded],
           "asr": asr, "cells": cells, "arm_mean_wer_points": {"aa": aw, "degraded": dw}}
    write_json_atomic(args.out / "figures.json", doc)
    (args.out / "figures.md").write_text(head + md)
    sys.stdout.write(head + md + "\n")
    print(json.dumps([{k: c[k] for k in ("prompts", "margin_points", "aa_pass", "aa_runs", "degraded_fail",
                                          "degraded_runs")} for c in cells]))


if __name__ == "__main__":
    main()
