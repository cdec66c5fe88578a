"""`python tests/cli/held_cli.py <tts-bench arguments>`: tts-bench whose load generator holds one
request, so a test can stop the run mid-way by an event instead of racing it with a clock.

With HOLD_AFTER=N and HOLD_MARKER=path in the environment, the (N+1)th request the process sends
waits forever (until the process is killed or interrupted) after creating `path`; every other
request runs as usual, so the rest of its phase goes on around it and the run cannot end.

    proc = subprocess.Popen([sys.executable, HELD_CLI, "ab", ...], env={..., "HOLD_AFTER": "20",
                                                                       "HOLD_MARKER": str(marker)})
    wait until marker exists; proc.kill()
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

HELD_CLI = str(Path(__file__).resolve())


def hold_one_request(after: int, marker: Path) -> None:
    from tests.virtual_clock import load_generator_modules
    from tts_bench.load.send import run_request as real

    sent = 0

    async def run_request(*args, **kwargs):
        nonlocal sent
        sent += 1
        if sent == after + 1:
            marker.touch()
            await asyncio.Event().wait()  # held: only a kill or a cancellation ends it
        return await real(*args, **kwargs)

    for module in load_generator_modules("run_request", real):  # every phase driver that sends
        module.run_request = run_request


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for `tests.` (PYTHONPATH has it too)
    hold_one_request(int(os.environ["HOLD_AFTER"]), Path(os.environ["HOLD_MARKER"]))
    from tts_bench.cli import main

    main()
