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
import os
from pathlib import Path

from tts_bench.rundir.atomic_json import json_default, write_json_atomic


def _folder(value: str) -> str | None:
    # `--out none` (or OUT=none, or empty) means stdout only, as the help says, not a folder "none".
    return None if value.strip().lower() in ("", "none") else value


def add_out(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=_folder, default=os.environ.get("OUT"),
                    help="folder for the result JSON (default: $OUT; none: stdout only)")


def emit(doc: dict, out: str | None, name: str) -> None:
    if out:
        write_json_atomic(Path(out, f"{name}.json"), doc)
    print(json.dumps(doc, default=json_default), flush=True)
