"""How the measuring scripts hand back their result: `--out DIR` (default `$OUT`, the device
machine's output folder) gets `<name>.json`, and the same JSON is the last line on stdout (the
device tool returns the tail of the output, so the figures survive even without the file).

    add_out(ap)
    ...
    emit(doc, args.out, "precision_drift")
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def _folder(value: str) -> str | None:
    # `--out none` (or OUT=none, or empty) means stdout only, as the help says, not a folder "none".
    return None if value.strip().lower() in ("", "none") else value


def add_out(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=_folder, default=os.environ.get("OUT"),
                    help="folder for the result JSON (default: $OUT; none: stdout only)")


def emit(doc: dict, out: str | None, name: str) -> None:
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"{name}.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc), flush=True)
