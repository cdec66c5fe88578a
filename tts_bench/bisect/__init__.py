"""`tts-bench bisect`: from "this range is slower" to the commit that made it so.

- `workspace`: git plumbing (the range, a temporary `git worktree` per commit, never the user's
  checkout) and the speech server each arm's commit is served by;
- `search`: the binary search, one `tts-bench ab` per step (same-day, interleaved blocks,
  `--until-resolved`), its decisions (good / bad / unresolved) and bisect.json (`--resume`).

    run = start_bisect(BisectRequest(good="v1", bad="HEAD", config="configs/ab/synthetic.yaml", tier="4x1"))
    outcome = run_bisect(run)
"""

from tts_bench.bisect.search import (
    BisectRequest,
    BisectRun,
    Outcome,
    decide,
    open_bisect,
    run_bisect,
    start_bisect,
)

__all__ = ["BisectRequest", "BisectRun", "Outcome", "decide", "open_bisect", "run_bisect", "start_bisect"]
