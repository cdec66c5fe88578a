"""Memory sampling during a phase: the hooks `tts_bench.load.phases.run_fresh_phase` calls.

`run_fresh_phase(..., hooks=MemoryHooks(...))` (inside `tts-bench ab --mem`, `tts-bench mem` and
a case with `bench.mem`) calls `on_phase(arm, tier, repeat, phase, backend)` with phase "warmup"
(after the fresh backend started: samplers start), "measure" (before the measured requests:
later samples are steady-state candidates) and "end" (after them: samplers stop), and
`abandon()` when the phase raised in between (samplers stop, nothing is kept). With a `run_dir`,
after each "end" the hooks write what they have so far into run.json (`mem`: one summary per
tier, repeat and sampler, every arm seen), and once every arm of a tier ran, its timeline PNG; a
killed A/B keeps the memory of what it finished. Without one (`tts-bench mem`, which records
its own summary) they only keep the series (`series(tier)`).

    hooks = MemoryHooks(("nvml", "torch"), interval_s=2.0, run_dir=run)   # or make_ab_hooks(cfg, run)
    result = run_ab(arms, tiers, repeats=1, num_prompts=64, run_dir=run, hooks=hooks)
    for s in hooks.summaries(): print(render(mem_table(s), "md", title=table_title(s)))
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

from tts_bench.mem.plot import preload, write_timeline
from tts_bench.mem.recorder import MemoryRecorder, MemSeries
from tts_bench.mem.samplers import make_sampler, resolve_names
from tts_bench.mem.summary import MemSummary, summarize

log = logging.getLogger(__name__)


class MemoryHooks:
    """Samples memory during every (arm, tier, repeat) of an A/B; see the module docstring."""

    def __init__(self, samplers: tuple[str, ...] = ("auto",), *, interval_s: float = 2.0,
                 device_index: int = 0, run_dir: Any = None, arms_per_tier: int = 2) -> None:
        self.sampler_names = samplers
        # Draw a tier's PNG once all its arms ran: drawing grows this process's RSS (fonts,
        # buffers), which the rss sampler would otherwise charge to the next arm only.
        self.arms_per_tier = arms_per_tier
        self.interval_s = interval_s
        self.device_index = device_index
        self.run_dir = run_dir  # a tts_bench.rundir.results.RunDir, or None to keep results in memory
        self._active: list[MemoryRecorder] = []
        # (tier, repeat, sampler) -> arm -> series, in the order arms ran
        self._series: dict[tuple[str, int, str], dict[str, MemSeries]] = defaultdict(dict)
        self.timelines: list[str] = []

    def on_phase(self, arm: str, tier: str, repeat: int, phase: str, backend: Any) -> None:
        if phase == "warmup":
            self._stop_active()  # a phase that raised last time left its samplers running
            self._active = self._start(backend)
        elif phase == "measure":
            for rec in self._active:
                rec.mark("measure")
        elif phase == "end":
            for rec in self._active:
                self._series[(tier, repeat, rec.sampler.name)][arm] = rec.stop()
                rec.sampler.close()
            self._active = []
            self._write(tier, repeat)
        else:
            raise ValueError(f"unknown phase {phase!r}; valid: warmup, measure, end")

    def abandon(self) -> None:
        """The phase raised after "warmup": stop sampling and keep nothing of it."""
        self._stop_active()

    def series(self, tier: str, repeat: int = 0) -> dict[str, dict[str, MemSeries]]:
        """sampler -> arm -> series of one (tier, repeat), samplers in the order they started."""
        return {name: dict(arms) for (t, r, name), arms in self._series.items() if (t, r) == (tier, repeat)}

    def _start(self, backend: Any) -> list[MemoryRecorder]:
        """One recorder per requested sampler; two names resolving to one sampler record once."""
        recorders: dict[str, MemoryRecorder] = {}
        for name in self.sampler_names:
            sampler = make_sampler(name, device_index=self.device_index, backend=backend)
            if sampler.name in recorders:
                log.warning("mem sampler %r resolves to %s, already sampling; recorded once", name, sampler.name)
                sampler.close()
                continue
            recorders[sampler.name] = MemoryRecorder(sampler, self.interval_s)
        for rec in recorders.values():
            rec.start("warmup")
        return list(recorders.values())

    def _stop_active(self) -> None:
        for rec in self._active:
            if rec.running:
                rec.stop()
            rec.sampler.close()
        self._active = []

    def summaries(self) -> list[MemSummary]:
        """One summary per (tier, repeat, sampler) recorded so far, arms in the order they ran."""
        return [summarize(arms, tier=tier if repeat == 0 else f"{tier} r{repeat}")
                for (tier, repeat, _), arms in self._series.items()]

    def summary(self) -> dict[str, Any]:
        """Everything as JSON: `{"tiers": [summary.to_dict(), ...], "timelines": [...]}`."""
        return {"tiers": [s.to_dict() for s in self.summaries()], "timelines": list(self.timelines)}

    def _write(self, tier: str, repeat: int) -> None:
        if self.run_dir is None:
            return
        for (t, r, name), arms in self._series.items():
            if (t, r) != (tier, repeat):
                continue
            if len(arms) < self.arms_per_tier:
                continue
            s = summarize(arms, tier=tier)
            path = self.run_dir.path / f"mem_timeline_{tier}_r{repeat}_{name}.png"
            write_timeline(s, path)
            if str(path) not in self.timelines:
                self.timelines.append(str(path))
        self.run_dir.update(mem=self.summary())


def make_ab_hooks(cfg: Any, run_dir: Any, *, arms_per_tier: int = 2) -> MemoryHooks:
    """The hooks `tts-bench ab --mem` passes to run_ab, configured by the base arm's `mem:`
    (`arms_per_tier=1`: a gate case, one arm per tier)."""
    params = cfg.mem
    names = resolve_names(params.sampler_names, device_index=params.device_index)  # fail before any tier
    preload()  # the first tier's PNG is drawn between arms of later tiers: import it up front
    return MemoryHooks(names, interval_s=params.interval_s, device_index=params.device_index,
                       run_dir=run_dir, arms_per_tier=arms_per_tier)
