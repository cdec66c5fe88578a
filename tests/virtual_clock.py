"""Virtual time for synthetic-backend runs in the test process, so machine load cannot move a
measured figure.

The synthetic backend is nothing but `asyncio.sleep` to deadlines on the event loop's clock, and
the load generator reads `time.perf_counter()` when a chunk arrives. Under `virtual_clock`, every
event loop that `asyncio.run` makes keeps time on one virtual clock: when nothing is ready it jumps
to the next timer instead of sleeping, and the load generator reads the same clock. A request's
TTFP and RTF are then what its delays imply plus a seeded lateness of at most 2 ms a timer, the
same on an idle machine or a loaded one, and a "slower" arm is slower by its `delay_scale`.

    def test_x(virtual_clock): ...         # the fixture (tests/conftest.py)
    with on_virtual_time(): ...            # a module-scoped fixture's run

Only for process-free backends (synthetic): the clock jumps ahead while a thread works, so a
backend that waits on threads or sockets would see its timeouts come early.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import pkgutil
import random
import selectors
import time
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace


class VirtualClock:
    """Seconds, as `time.perf_counter()` gives them. Every jump to a timer lands `lateness_s`
    times a seeded uniform draw after it, as a real loop's timers fire a little late: the A/B and
    gate statistics need some spread (none at all reads "unresolved (metric resolution)"), and a
    seeded one is the same on every machine."""

    def __init__(self, lateness_s: float = 0.002, seed: int = 0, read_s: float = 1e-6) -> None:
        self.now = 1000.0
        self.lateness_s = lateness_s
        self.read_s = read_s
        self._rng = random.Random(seed)

    def __call__(self) -> float:
        """A read, as `time.perf_counter()`: each one moves the clock by `read_s`, so code that
        spins until a deadline without ever suspending still gets there."""
        self.now += self.read_s
        return self.now

    def jump(self, seconds: float) -> None:
        self.now += seconds + self.lateness_s * self._rng.random()


class _JumpingSelector:
    """A selector that, when nothing is ready and a timer is due in `timeout` seconds, moves the
    clock to that timer instead of waiting; with no timer (`None`) it waits for real I/O."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self._selector = selectors.DefaultSelector()

    def select(self, timeout: float | None = None):
        ready = self._selector.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            return self._selector.select(None)
        self._clock.jump(timeout)
        return []

    def __getattr__(self, name: str):
        return getattr(self._selector, name)


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__(_JumpingSelector(clock))
        self._virtual = clock

    def time(self) -> float:
        return self._virtual.now


class _VirtualPolicy(asyncio.DefaultEventLoopPolicy):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _VirtualLoop(self._clock)


def load_generator_modules(name: str, value: object) -> list[ModuleType]:
    """The modules of `tts_bench.load` whose global `name` is `value` (wherever sending and
    timing live after a move); at least one, or the helpers here would silently do nothing."""
    import tts_bench.load as package

    found = []
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        if getattr(module, name, None) is value:
            found.append(module)
    assert found, f"no tts_bench.load module has {name} = {value!r}"
    return found


@contextlib.contextmanager
def on_virtual_time(clock: VirtualClock | None = None) -> Iterator[VirtualClock]:
    """Every `asyncio.run` inside, and the load generator's clock, on `clock` (a new one by
    default); both restored on the way out. For module-scoped fixtures; tests take the fixture."""
    clock = clock or VirtualClock()
    fake_time = SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("__")})
    fake_time.perf_counter = clock
    modules = load_generator_modules("time", time)
    before = [m.time for m in modules], asyncio.get_event_loop_policy()
    for m in modules:
        m.time = fake_time
    asyncio.set_event_loop_policy(_VirtualPolicy(clock))
    try:
        yield clock
    finally:
        for m, t in zip(modules, before[0]):
            m.time = t
        asyncio.set_event_loop_policy(before[1])
