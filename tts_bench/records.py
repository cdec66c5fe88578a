"""Dataclass records read back from JSON written by this or another version of tts-bench.

Run records outlive the code that wrote them: a newer version may have added fields (an older
reader must ignore them) and an older one may lack fields (they take their defaults). One rule
for every record type, so `--resume` and the readers of old runs behave alike.

    record = from_known_fields(RequestRecord, json.loads(line))
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def from_known_fields(cls: type[T], data: dict[str, Any]) -> T:
    """`cls(**data)` keeping only the keys that are fields of the dataclass `cls`."""
    names = cls.__dataclass_fields__  # type: ignore[attr-defined]
    return cls(**{k: v for k, v in data.items() if k in names})
