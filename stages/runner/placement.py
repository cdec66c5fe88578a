"""Where the stage processes (or replica threads) run: the talker and the R code2wav replicas.

`runner.devices` lists accelerator indices (`[0, 1, 2, 3]`), says `auto` (every visible device)
or is null (everything on `runner.device`, index 0). The talker runs on the first listed device;
replica r on devices[r % n], so `128x8` on an 8-GPU host puts one replica per GPU and the talker
shares GPU 0 with replica 0.

Pure arithmetic on the config: `auto` is resolved by the caller (it needs the device count,
which only the platform layer may ask), so this module imports nothing heavy.

    plan = place((0, 1, 2, 3), replicas=8)
    plan.talker, plan.replicas      # 0, (0, 1, 2, 3, 0, 1, 2, 3)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    talker: int  # device index of the talker
    replicas: tuple[int, ...]  # device index of each code2wav replica

    def to_dict(self) -> dict:
        return {"talker": self.talker, "replicas": list(self.replicas)}


def place(devices: Sequence[int], replicas: int) -> Placement:
    """Talker on devices[0]; replicas round-robin over `devices`."""
    if not devices:
        raise ValueError("runner.devices must list at least one device index")
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    devices = tuple(devices)
    return Placement(devices[0], tuple(devices[r % len(devices)] for r in range(replicas)))


def resolve_devices(configured: Sequence[int] | str | None, visible: int) -> tuple[int, ...]:
    """The device list of `runner.devices` on a machine with `visible` accelerators.

    null -> (0,) (every stage on the first device, as before placement existed); `auto` -> all
    visible devices (at least index 0); an explicit list must name visible devices only.
    """
    if configured is None:
        return (0,)
    if configured == "auto":
        return tuple(range(max(1, visible)))
    bad = [d for d in configured if not 0 <= d < max(1, visible)]
    if bad and visible == 0:
        raise ValueError(
            f"error: runner.devices names device {bad[0]}, but this host has no accelerator (runner.devices); "
            f"every stage runs on the CPU there: use [0], auto or null"
        )
    if bad:
        raise ValueError(
            f"error: runner.devices names device {bad[0]} but {visible} are visible "
            f"(runner.devices); list indices below {visible}, or use auto"
        )
    return tuple(configured)
