"""Same-day A/B of audio RTF (`tts-bench ab`): arms interleaved per tier on fresh backends.

    from tts_bench.ab import run_ab
    result = run_ab({"base": cfg_a, "test": cfg_b}, parse_tiers("2x1,4x2"),
                    repeats=2, num_prompts=8, run_dir=RunDir.create(...))
"""

from tts_bench.ab.run import (
    VOICE_CACHE,
    AbPlan,
    AbResult,
    TierResult,
    phase_order,
    plan_from_run,
    run_ab,
    summarize_ab,
    voice_cache_view,
)

__all__ = [
    "VOICE_CACHE",
    "AbPlan",
    "AbResult",
    "TierResult",
    "phase_order",
    "plan_from_run",
    "run_ab",
    "summarize_ab",
    "voice_cache_view",
]
