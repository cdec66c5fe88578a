"""What a replica's decode calls did, counted for the runner's stage work table (`Token2Wav.work`).

A decode call runs one chunk group per batch shape among its rows (`token2wav.Token2Wav.decode`),
so rows of one step split into as many groups as they have shapes, and a group's device time
grows far slower than its rows. Which shapes split a step is what decides whether merging them
would fill the batches; each group is counted by the part of a stream's life its rows are in:

- `first`: a stream's first chunk (no vocoder frames cached yet);
- `growing`: a later non-final chunk whose flow caches still grow towards prompt + keep frames;
- `steady`: a non-final chunk whose caches have settled (the next chunk has the same shape);
- `final`: a stream's last chunk (its length varies with the codes left).

Beside them: the final groups that ran eagerly (no warmed final-chunk graph), and the host time
of decode calls spent launching eager / replayed groups and finishing them (device wait and
copy back). Every figure is cumulative; the runner differences two snapshots.

    work = DecodeWork()
    work.count(group_kind(last=False, first=False, steady=True), eager_final=False)  # a group
    work.add_host("finish_s", 0.004)
    work.snapshot(graphs)  # {"groups": 1, "group_steady": 1, "finish_s": 0.004, ...}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GROUP_KINDS = ("first", "growing", "steady", "final")
HOST_SPLIT = ("eager_launch_s", "replay_launch_s", "finish_s")


def group_kind(*, last: bool, first: bool, steady: bool) -> str:
    """The part of a stream's life a group's rows are in (see the module docstring)."""
    if last:
        return "final"
    if first:
        return "first"
    return "steady" if steady else "growing"


@dataclass
class DecodeWork:
    groups: int = 0  # chunk groups run (ChunkDecoder runs, one per batch shape of a decode call)
    eager_final_groups: int = 0  # final groups without a warmed graph, run eagerly
    kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(GROUP_KINDS, 0))
    host_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(HOST_SPLIT, 0.0))

    def count(self, kind: str, *, eager_final: bool) -> None:
        self.groups += 1
        self.kinds[kind] += 1
        self.eager_final_groups += eager_final

    def add_host(self, key: str, seconds: float) -> None:
        self.host_s[key] += seconds

    def snapshot(self, graphs: Any | None) -> dict:
        """The counters as the work report reads them, with the graphs' captures and replays
        (`ChunkGraphs`, or None with graphs off)."""
        return {"groups": self.groups, "graph_captures": 0 if graphs is None else graphs.captures,
                "graph_replays": 0 if graphs is None else graphs.replays,
                "eager_final_groups": self.eager_final_groups,
                **{f"group_{k}": n for k, n in self.kinds.items()}, **self.host_s}
