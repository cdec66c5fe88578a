"""The run directory: one versioned, append-only record per run, and the files that keep it whole.

- `results`: `RunDir` (run.json, per-request samples, aggregates, final status; `--resume`);
- `run_json`: run.json's header: how a new one is built, how a read one is checked;
- `provenance`: what a record says about where it was measured (git, host, versions, load);
- `records`: `RequestRecord` (one request as measured, a line of requests.jsonl), `Job`, `PhaseLabels`;
- `appender`: the append-only JSONL writer a killed run leaves readable;
- `atomic_json`: the one JSON writer (temp file beside the target, fsync, rename);
- `lock`: one writer per run directory;
- `versioned_json`: schema-versioned JSON files (baselines, calibrations, histories).
"""
