"""Synthetic gate cases and their baselines, for the gate/baseline CLI tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from tts_bench.errors import ExitStatus

ROOT = Path(__file__).resolve().parents[2]


def synthetic_case(path: Path, *, bench: str, extra: str = "", overrides: Sequence[str] = ()) -> Path:
    """A case file named `synth` on configs/ab/synthetic.yaml: `bench` is its YAML flow mapping,
    `extra` more top-level YAML lines, `overrides` config sets."""
    sets = f"overrides: [{', '.join(overrides)}]\n" if overrides else ""
    path.write_text(f"name: synth\nconfig: {ROOT / 'configs/ab/synthetic.yaml'}\n{sets}bench: {bench}\n{extra}")
    return path


def record_baseline(invoke: Callable, case: Path, out: Path, *, run: int, result_dir: Path) -> Path:
    """`baseline update` of `case` into `out` (profile cpu-2core), which must succeed."""
    result, status = invoke("baseline", "update", "--case", str(case), "--run", str(run), "--profile", "cpu-2core",
                            "--result-dir", str(result_dir), "--out", str(out))
    assert status == ExitStatus.OK, result.output
    return out
