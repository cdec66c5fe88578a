"""Same-day A/B of audio RTF (`tts-bench ab`): two arms interleaved per tier on fresh backends.

- `run`: the interleaving (`run_ab`: counterbalanced blocks per tier, each phase on a fresh
  backend through `tts_bench.load.phases`, `--until-resolved` rounds, `--resume`);
- `summary`: the result from the recorded requests (`summarize_ab`: aggregates, paired-block
  comparisons and verdicts, duration and identity flags, validity; the voice-cache view);
- `session`: one `tts-bench ab` as a library call (`run_session`: plan or reopen the run, run
  it, record it), which is all the command calls.

    from tts_bench.ab import run_ab
    result = run_ab({"base": cfg_a, "test": cfg_b}, parse_tiers("2x1,4x2"),
                    repeats=2, num_prompts=8, run_dir=RunDir.create(...))
"""

from tts_bench.ab.position import phase_order
from tts_bench.ab.run import run_ab
from tts_bench.ab.session import AbPlan, AbRequest, AbSession, plan_from_run, run_session
from tts_bench.ab.summary import VOICE_CACHE, AbResult, TierResult, summarize_ab, voice_cache_view

__all__ = [
    "VOICE_CACHE",
    "AbPlan",
    "AbRequest",
    "AbResult",
    "AbSession",
    "TierResult",
    "phase_order",
    "plan_from_run",
    "run_ab",
    "run_session",
    "summarize_ab",
    "voice_cache_view",
]
