"""A fake decoder for runner tests that proves two replicas decode at the same time by an event,
not by a clock: the first decode of each `meet-*` request waits inside until a decode of another
replica is inside too. Stage processes import it by name (it pickles by reference), so it lives
in a module, not in a test file.

    factories = meeting_factories(meet_dir, decode_s=0.15, log_dir=str(log_dir))
    ... submit "meet-a" and "meet-b" (one a replica) ... then
    assert meetings(meet_dir) == {"meet-a": "met", "meet-b": "met"}  # each found the other inside

Replicas that decode one at a time never meet: the first to arrive waits out HANG_S (a hang
guard) and records that it was alone.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from stages.runner.fakes import FakeToken2Wav, fake_factories

HANG_S = 60.0


class MeetingToken2Wav(FakeToken2Wav):
    def __init__(self, cfg: Any, *, meet_dir: str, **options: Any) -> None:
        super().__init__(cfg, **options)
        self.meet_dir = Path(meet_dir)
        self.meeting: set[str] = set()  # meet-* requests whose first decode is done

    def decode(self, payloads: list) -> list:
        first = {p.request_id for p in payloads if p.request_id.startswith("meet-")} - self.meeting
        if first:
            self.meeting |= first
            me = f"inside-{os.getpid()}-{threading.get_ident()}"
            (self.meet_dir / me).touch()  # never removed: one that arrives later still sees it
            deadline = time.monotonic() + HANG_S
            while not (met := any(p.name != me for p in self.meet_dir.glob("inside-*"))):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.002)
            for rid in first:
                (self.meet_dir / f"met-{rid}").write_text("met" if met else "alone")
        return super().decode(payloads)


def meeting_factories(meet_dir: Path, **token2wav_options: Any):
    """fake_factories(**token2wav_options) whose decoders meet in `meet_dir`."""
    return dataclasses.replace(fake_factories(**token2wav_options),
                               token2wav=partial(MeetingToken2Wav, meet_dir=str(meet_dir), **token2wav_options))


def meetings(meet_dir: Path) -> dict[str, str]:
    """request id -> "met" / "alone", for the meet-* requests whose first decode ran."""
    return {p.name.removeprefix("met-"): p.read_text() for p in meet_dir.glob("met-*")}
