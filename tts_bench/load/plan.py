"""The requests a phase sends: one plan per (arm, tier, repeat), the same in every arm but for ids.

A bench phase (`ab`, `mem`, `gate`) sends `plan_jobs(...)`: the same prompts, order and seeds in
every arm, with ids that name the arm, tier, repeat and slot (`base:2x1:r0:0003`; warmups
`base:2x1:r0:w01`), and each request's reference voice chosen by `prompts.voices`:

    prompts = select_bench_prompts(cfg, 8)
    warm, measured = plan_jobs(prompts, PhaseLabels("base", "2x1", 0), seed=42, warmup=2)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tts_bench.backends.base import SynthesisRequest
from tts_bench.inputs.prompts import Prompt
from tts_bench.inputs.voices import request_voice
from tts_bench.rundir.records import Job, PhaseLabels


def request_id(arm: str, tier: str, repeat: int, slot: str) -> str:
    """`base:2x1:r0:0003` (measured) / `base:2x1:r0:w01` (warmup); unique within a run."""
    return f"{arm}:{tier}:r{repeat}:{slot}"


def _job(prompts: Sequence[Prompt], labels: PhaseLabels, i: int, *, slot: str, voice_slot: str, seed: int,
         voices: str, warmup: bool) -> Job:
    """The request of prompt i mod n with seed `seed + i`, its id naming `slot` and its voice chosen
    by `voice_slot` (tts_bench.inputs.voices, `prompts.voices`)."""
    p = prompts[i % len(prompts)]
    wav, audio = request_voice(p, voice_slot, mode=voices, first=prompts[0].prompt_wav)
    req = SynthesisRequest(
        request_id=request_id(labels.arm, labels.tier, labels.repeat, slot),
        text=p.text, prompt_text=p.prompt_text, prompt_wav=wav, seed=seed + i, prompt_audio=audio,
    )
    return Job(req, p.utt, warmup=warmup)


def plan_jobs(
    prompts: Sequence[Prompt], labels: PhaseLabels, *, seed: int, warmup: int, voices: str = "file"
) -> tuple[list[Job], list[Job]]:
    """(warmup jobs, measured jobs) for one phase; identical across arms but for the ids."""
    warm = [_job(prompts, labels, i, slot=f"w{i:02d}", voice_slot=f"w{i:02d}", seed=seed, voices=voices, warmup=True)
            for i in range(warmup)]
    measured = [cycle_jobs(prompts, labels, seed=seed, voices=voices)(i) for i in range(len(prompts))]
    return warm, measured


def cycle_jobs(
    prompts: Sequence[Prompt], labels: PhaseLabels, *, seed: int, voices: str = "file", attempt: int = 0
) -> Callable[[int], Job]:
    """Duration mode's measured jobs: position i -> the job of prompt i mod n with seed `seed + i`,
    the same in both arms but for the ids (the first n are `plan_jobs`' measured jobs). A phase
    run again on --resume (`attempt` > 0) gets fresh ids (`0003.1`) beside the cut one's, and the
    same voice in every attempt."""
    suffix = f".{attempt}" if attempt else ""

    def job(i: int) -> Job:
        return _job(prompts, labels, i, slot=f"{i:04d}{suffix}", voice_slot=f"{i:04d}", seed=seed, voices=voices,
                    warmup=False)

    return job
