"""The device allocator setting every stage process runs with (no torch here: the memory
estimate reads it too).

Each stage process sets `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` for itself before its
first device allocation, unless the user named an allocator setting (torch reads
`PYTORCH_ALLOC_CONF` first since 2.9, then the CUDA name): a replica holds a slot pool, a prompt
cache and its graphs' private pool, and one process may hold several replicas (`threads`,
`single`). With the default segments `single` ran out of memory at 128x8 on an H200 (139.5 GiB in
use, 108.1 GiB allocated) and finished with expandable ones; replica processes with chunk graphs
ran 128x8 there with them too (D-ALLOC-1).

    record = choose_allocator(os.environ)   # first thing in a stage process
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
# torch's device-neutral name, read before the CUDA one where both are set.
GENERIC_ALLOC_CONF = "PYTORCH_ALLOC_CONF"
EXPANDABLE_SEGMENTS = "expandable_segments:True"


def user_allocator_setting(env: Mapping[str, str]) -> str | None:
    """`NAME=value` of the allocator setting the user gave in `env`, or None."""
    for name in (GENERIC_ALLOC_CONF, ALLOC_CONF):
        if env.get(name, "").strip():
            return f"{name}={env[name]}"
    return None


def choose_allocator(env: MutableMapping[str, str]) -> str:
    """Set expandable segments in `env` unless the user set the allocator; returns the setting
    in force, for the run record. Must run before the process's first device allocation (the
    allocator reads the variable once)."""
    mine = user_allocator_setting(env)
    if mine is not None:
        return f"{mine} (from the environment)"
    env[ALLOC_CONF] = EXPANDABLE_SEGMENTS
    return f"{ALLOC_CONF}={EXPANDABLE_SEGMENTS} (set by the stage runner)"


def runs_expandable_segments(env: Mapping[str, str]) -> bool:
    """Whether stage processes started with `env` use expandable segments: the runner's own
    choice, or the user's setting when it names them."""
    mine = user_allocator_setting(env)
    return mine is None or "expandable_segments:true" in mine.lower().replace(" ", "")
