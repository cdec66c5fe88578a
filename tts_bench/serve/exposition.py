"""Prometheus text exposition for `tts-bench serve`'s `/metrics`, and the parser the client uses.

The server exposes (all gauges unless noted; bytes as in Prometheus conventions):

| metric | labels | from |
|---|---|---|
| `process_resident_memory_bytes` | | RSS of the serve process (psutil) |
| `tts_bench_stage_{allocated,reserved,peak,rss}_bytes` | process, pid, source | the backend's `memory_snapshot()` (ReportsMemory), one series per stage process |
| `tts_bench_requests_total` (counter) | | speech requests received |
| `tts_bench_request_failures_total` (counter) | | requests that ended in an error |
| `tts_bench_requests_in_flight` | | requests being served now |

`memory_rows(parse(text))` turns a scrape back into the dicts `ReportsMemory.memory_snapshot()`
returns, so a remote server's memory reads like a local runner's.

    text = render(stage_rows, rss_bytes=123, counters={"requests_total": 4})
    memory_rows(parse(text))   # [{"process": "serve", "rss_bytes": 123, ...}, {...talker...}]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Per stage process: its memory, and the voices (prompt setups) a code2wav process holds.
_STAGE_FIELDS = ("allocated_bytes", "reserved_bytes", "peak_bytes", "rss_bytes",
                 "prompt_cache_entries", "prompt_cache_bytes")
_LABELS = ("process", "pid", "source")
_STAGE_PREFIX = "tts_bench_stage_"
_RSS = "process_resident_memory_bytes"
_COUNTERS = {
    "requests_total": ("counter", "Speech requests received."),
    "request_failures_total": ("counter", "Speech requests that ended in an error."),
    "requests_in_flight": ("gauge", "Speech requests being served now."),
}
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


def _escape(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(stage_rows: Iterable[Mapping], *, rss_bytes: int, counters: Mapping[str, float]) -> str:
    """The `/metrics` body (text format 0.0.4)."""
    lines = [f"# HELP {_RSS} Resident set size of the serve process.", f"# TYPE {_RSS} gauge",
             f"{_RSS} {float(rss_bytes)}"]
    rows = list(stage_rows)
    for name in _STAGE_FIELDS:
        metric = _STAGE_PREFIX + name
        what = "voices held" if name.startswith("prompt_cache") else "memory"
        lines += [f"# HELP {metric} Backend stage process {what} ({name}).", f"# TYPE {metric} gauge"]
        for row in rows:
            if row.get(name) is None:
                continue
            labels = ",".join(f'{k}="{_escape(row.get(k, ""))}"' for k in _LABELS)
            lines.append(f"{metric}{{{labels}}} {float(row[name])}")
    for key, value in counters.items():
        kind, help_text = _COUNTERS[key]
        lines += [f"# HELP tts_bench_{key} {help_text}", f"# TYPE tts_bench_{key} {kind}",
                  f"tts_bench_{key} {float(value)}"]
    return "\n".join(lines) + "\n"


def parse(text: str) -> list[Sample]:
    """Samples of a text exposition; comments and malformed lines are skipped."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if line.startswith("#") or m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                  for k, v in _LABEL.findall(m.group(2) or "")}
        out.append(Sample(m.group(1), value, labels))
    return out


def memory_rows(samples: Iterable[Sample]) -> list[dict]:
    """Scraped samples -> memory_snapshot()-shaped dicts: the serve process first, then stages."""
    rows: dict[tuple[str, ...], dict] = {}
    serve: dict | None = None
    for s in samples:
        if s.name == _RSS:
            serve = {"process": "serve", "pid": None, "rss_bytes": int(s.value), "source": "rss"}
        elif s.name.startswith(_STAGE_PREFIX) and s.name[len(_STAGE_PREFIX):] in _STAGE_FIELDS:
            key = tuple(s.labels.get(k, "") for k in _LABELS)
            row = rows.setdefault(key, {"process": key[0], "pid": _int_or_none(key[1]),
                                        "source": key[2]})
            row[s.name[len(_STAGE_PREFIX):]] = int(s.value)
    return ([serve] if serve else []) + list(rows.values())


def _int_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() else None
