"""How a decode call's chunk groups are launched: which run row by row, and in what order.

`Token2Wav.decode` groups a step's rows by `BatchShape`; this module turns the groups into
launches. Two rules, neither of which changes a row's codes or which rows share a launch except
as said:

1. **Warmed final chunks run row by row.** A final group of k rows whose one-row shape is among
   the warmed final shapes (`code2wav_final_chunk_graphs`, graph_warmup.py) runs as k one-row
   launches, each a graph replay, instead of one k-row eager group: an eager group is thousands
   of host launches (~257 ms of a replica's host time each at 32x1, H200 log 23), a replay one.
   Only warmed one-row shapes exist, since final chunks vary in length and rows too much to
   capture as they come; a k-row final group would otherwise always be eager.
2. **Replays are queued before eager runs.** The device runs the queued replays while the host
   is still launching an eager group, instead of idling behind it; groups are independent (each
   row is in one group, and a replay's outputs are copied out of its graph as it is queued), so
   the order changes no value. Within each kind the groups keep their first row's order.

    launches = plan_launches(groups, replays=graphs.__contains__, final_shapes=t2w.final_shapes)
    for launch in launches:
        run(launch.shape, [payloads[i] for i in launch.rows])
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from stages.code2wav.chunk_decode import BatchShape


@dataclass(frozen=True)
class Launch:
    shape: BatchShape  # rows == len(self.rows)
    rows: tuple[int, ...]  # positions in the decode call's payloads
    replay: bool  # expected to replay a captured graph (else eager, or eager then captured)


def plan_launches(
    groups: Mapping[BatchShape, Sequence[int]],
    *,
    replays: Callable[[BatchShape], bool],
    final_shapes: Collection[BatchShape],
) -> list[Launch]:
    """`groups`: shape (rows unset) -> positions of its rows. `replays(shape)`: whether a
    launch of `shape` (rows set) would replay a graph now. `final_shapes`: the warmed one-row
    final shapes. Returns every position exactly once, replays first (rules 1 and 2 above)."""
    launches = []
    for shape, rows in groups.items():
        one_row = replace(shape, rows=1)
        if shape.last and one_row in final_shapes:
            launches += [Launch(one_row, (i,), replays(one_row)) for i in rows]
            continue
        full = replace(shape, rows=len(rows))
        launches.append(Launch(full, tuple(rows), replays(full)))
    return sorted(launches, key=lambda launch: not launch.replay)  # stable: kinds keep their order
