"""The records every part of the harness reads: one request as measured, and the JSON files
that outlive the code that wrote them.

`RequestRecord` is what the load generator measures per request and what requests.jsonl stores;
metrics, the A/B summary, the memory run, the gate and the WER gate all read it from here (none
of them needs the load generator). `Job` is one request to send and `PhaseLabels` names the
phase it belongs to (arm, tier, repeat).

Run records outlive the code that wrote them: a newer version may have added fields (an older
reader must ignore them) and an older one may lack fields (they take their defaults). One rule
for every record type (`from_known_fields`), so `--resume` and the readers of old runs behave
alike.

    record = RequestRecord.from_dict(json.loads(line))       # from_known_fields underneath
    records = read_records(run)                               # a run's requests.jsonl, parsed
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

from tts_bench.errors import ConfigError

if TYPE_CHECKING:
    from tts_bench.backends.base import SynthesisRequest
    from tts_bench.rundir.results import RunDir

T = TypeVar("T")
RequestKey = tuple[str, str, int, str]  # (arm, tier, repeat, request_id)


def from_known_fields(cls: type[T], data: dict[str, Any]) -> T:
    """`cls(**data)` keeping only the keys that are fields of the dataclass `cls`."""
    names = cls.__dataclass_fields__  # type: ignore[attr-defined]
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Job:
    """One request to send; `utt` is the prompt's id (the same in both arms)."""

    request: SynthesisRequest
    utt: str
    warmup: bool = False


@dataclass(frozen=True)
class PhaseLabels:
    arm: str
    tier: str
    repeat: int


@dataclass(frozen=True)
class RequestRecord:
    """What the JSONL stores per request. Times `t_send_s`/`t_end_s` are seconds from the start of
    the phase identified by `phase_id` (perf_counter has no meaning across phases/processes)."""

    arm: str
    tier: str
    repeat: int
    request_id: str
    utt: str
    warmup: bool
    phase_id: str
    t_send_s: float
    t_end_s: float
    audio_ttfp_ms: float | None = None
    audio_rtf: float | None = None
    audio_seconds: float = 0.0
    num_chunks: int = 0
    num_codes: int = 0
    audio_sha256: str | None = None
    codes_sha256: str | None = None
    # Over the chunks' mel digests, where the backend reports them (the embedded runner).
    mel_sha256: str | None = None
    failure_kind: str | None = None
    failure_detail: str = ""
    # How the request's voice was set up, where the backend reports it (the embedded runner):
    # a cache hit reuses a voice's prompt setup; a miss builds it (setup_ms, device synced).
    prompt_cache_hit: bool | None = None
    prompt_setup_ms: float | None = None
    # Duration mode (tts_bench.load.windows): which part of the phase the request was sent in (ramp,
    # window, drain; only window requests are measured, the others are flagged warmup) and the
    # audio seconds of its chunks that arrived inside the window. None in count mode.
    window: str | None = None
    audio_s_in_window: float | None = None

    @property
    def ok(self) -> bool:
        return self.failure_kind is None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RequestRecord:
        return from_known_fields(cls, data)


def read_records(run_dir: RunDir) -> list[RequestRecord]:
    """Every request the run recorded, parsed (each request key once: `RunDir.iter_requests`).
    It reads and parses the whole JSONL: read once per result and pass the list along. A record
    without a field every request has (a line cut or edited by hand) is a ConfigError naming
    the file and the request, not a TypeError from the dataclass."""
    required = [f.name for f in fields(RequestRecord) if f.default is MISSING]
    records = []
    for d in run_dir.iter_requests():  # each a JSON object with a request key (checked there)
        missing = [name for name in required if name not in d]
        if missing:
            raise ConfigError(
                f"error: {run_dir.requests_path}: request {request_key(d)} has no {', '.join(missing)} "
                f"(run directory); the record is corrupt: rerun from scratch"
            )
        records.append(RequestRecord.from_dict(d))
    return records


def request_key(record: dict[str, Any]) -> RequestKey:
    """The identity of a request inside a run; records must carry these four fields."""
    return (
        str(record["arm"]),
        str(record["tier"]),
        int(record["repeat"]),
        str(record["request_id"]),
    )
