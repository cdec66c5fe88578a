"""How the measuring scripts hand back their result: `--out DIR` (default `$OUT`, the device
machine's output folder) gets `<name>.json` (written whole or not at all, by the harness's one
JSON writer), and the same JSON is the last line on stdout (the device tool returns the tail of
the output, so the figures survive even without the file).

    add_out(ap)
    ...
    emit(doc, args.out, "precision_drift")
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

from tts_bench.rundir.atomic_json import json_default, write_json_atomic


def _folder(value: str) -> str | None:
    # `--out none` (or OUT=none, or empty) means stdout only, as the help says, not a folder "none".
    return None if value.strip().lower() in ("", "none") else value


def add_out(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=_folder, default=os.environ.get("OUT"),
                    help="folder for the result JSON (default: $OUT; none: stdout only)")


def json_ready(obj):
    """`obj` with every infinite or NaN float as the string "inf" / "-inf" / "nan": strict JSON
    has no such numbers, and equal outputs have an infinite SNR or an undefined ratio."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    return obj


def emit(doc: dict, out: str | None, name: str) -> None:
    doc = json_ready(doc)
    if out:
        write_json_atomic(Path(out, f"{name}.json"), doc)
    print(json.dumps(doc, default=json_default), flush=True)
