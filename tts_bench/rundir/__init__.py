"""The run directory: one versioned, append-only record per run, and the files that keep it whole.

- `results`: `RunDir` (run.json, per-request samples, aggregates; `--resume`), atomic JSON writes;
- `records`: `RequestRecord` (one request as measured, a line of requests.jsonl), `Job`, `PhaseLabels`;
- `appender`: the append-only JSONL writer a killed run leaves readable;
- `lock`: one writer per run directory;
- `versioned_json`: schema-versioned JSON files (baselines, calibrations, histories).
"""
