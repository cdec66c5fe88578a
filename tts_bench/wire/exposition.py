"""Prometheus exposition for `tts-bench serve`'s `/metrics`, and the reading the client does.

Rendering and parsing are prometheus_client's (`generate_latest` over a one-scrape collector,
`parser.text_string_to_metric_families`): the text format, its escaping and its number
formatting are the library's, so any Prometheus scraper reads what we write and we read what
other servers write. The server exposes (all gauges unless noted; bytes as in Prometheus
conventions):

| metric | labels | from |
|---|---|---|
| `process_resident_memory_bytes` | | RSS of the serve process (psutil) |
| `tts_bench_stage_{allocated,reserved,peak,rss}_bytes` | process, pid, source | the backend's `memory_snapshot()` (ReportsMemory), one series per stage process |
| `tts_bench_stage_prompt_cache_{entries,bytes}` | process, pid, source | the voices a code2wav process holds |
| `tts_bench_requests_total` (counter) | | speech requests received |
| `tts_bench_request_failures_total` (counter) | | requests that ended in an error |
| `tts_bench_requests_in_flight` | | requests being served now |

`memory_rows(parse(text))` turns a scrape back into the dicts `ReportsMemory.memory_snapshot()`
returns, so a remote server's memory reads like a local runner's.

    text = render(stage_rows, rss_bytes=123, counters={"requests_total": 4})
    memory_rows(parse(text))   # [{"process": "serve", "rss_bytes": 123, ...}, {...talker...}]
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)

# What `render` writes (generate_latest's classic text format). Spelled out rather than taken
# from the library: its CONTENT_TYPE_LATEST moved to 1.0.0 in recent releases.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Per stage process: its memory, and the voices (prompt setups) a code2wav process holds.
_STAGE_FIELDS = ("allocated_bytes", "reserved_bytes", "peak_bytes", "rss_bytes",
                 "prompt_cache_entries", "prompt_cache_bytes")
_LABELS = ("process", "pid", "source")
_STAGE_PREFIX = "tts_bench_stage_"
_RSS = "process_resident_memory_bytes"
_COUNTERS = {
    "requests_total": (CounterMetricFamily, "Speech requests received."),
    "request_failures_total": (CounterMetricFamily, "Speech requests that ended in an error."),
    "requests_in_flight": (GaugeMetricFamily, "Speech requests being served now."),
}


@dataclass(frozen=True)
class Sample:
    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


class _Scrape:
    """A collector over the values of one scrape (the registry asks it once, in `render`)."""

    def __init__(self, stage_rows: list[Mapping], rss_bytes: int, counters: Mapping[str, float]):
        self.rows, self.rss_bytes, self.counters = stage_rows, rss_bytes, counters

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(_RSS, "Resident set size of the serve process.", value=self.rss_bytes)
        for name in _STAGE_FIELDS:
            what = "voices held" if name.startswith("prompt_cache") else "memory"
            family = GaugeMetricFamily(_STAGE_PREFIX + name, f"Backend stage process {what} ({name}).",
                                       labels=_LABELS)
            for row in self.rows:
                if row.get(name) is not None:
                    family.add_metric([_label(row.get(k)) for k in _LABELS], float(row[name]))
            yield family
        for key, value in self.counters.items():
            kind, help_text = _COUNTERS[key]
            yield kind(f"tts_bench_{key}", help_text, value=float(value))


def _label(value: object) -> str:
    return "" if value is None else str(value)


def render(stage_rows: Iterable[Mapping], *, rss_bytes: int, counters: Mapping[str, float]) -> str:
    """The `/metrics` body (text format 0.0.4, served as `CONTENT_TYPE`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Scrape(list(stage_rows), rss_bytes, counters))
    return generate_latest(registry).decode("utf-8")


def parse(text: str) -> list[Sample]:
    """Samples of a text exposition. A malformed line ends the reading there (with a debug
    log): a server that is not ours may expose anything, and what came before still counts."""
    out: list[Sample] = []
    try:
        for family in text_string_to_metric_families(text):
            out += [Sample(s.name, float(s.value), dict(s.labels)) for s in family.samples]
    except ValueError as exc:
        log.debug("unparsable /metrics text after %d samples: %s", len(out), exc)
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
