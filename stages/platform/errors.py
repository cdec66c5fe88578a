"""The platform layer's one error, in a module of its own so that every platform module can raise
it without importing another (device.py uses partition.py's streams; partition.py raises this)."""

from __future__ import annotations


class PlatformError(ValueError):
    """A device kind or dtype that this machine or this layer cannot provide."""
