"""run.json, the header of a run directory: how a new one is made and how a read one is checked.

    doc = new_header("ab", created, command_line=argv, configs={"base": d}, config_hashes=None,
                     device="cpu (2 cores)", extra=None)
    doc = read_header(run_path, "--resume")   # ConfigError naming the file when it is damaged

The header holds the schema version, the run's kind, when it was made, its status, the command
line, each arm's resolved config with its hash, and the environment (`tts_bench.rundir.provenance`);
commands add their results to it later (`RunDir.update`). Every reader relies on the schema
version, `kind` and `configs` (arm name -> config): `read_header` checks those once, so a damaged
record is a ConfigError naming the file, not a KeyError in whichever command reads it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tts_bench.errors import ConfigError
from tts_bench.rundir.atomic_json import json_default
from tts_bench.rundir.provenance import collect_environment

SCHEMA_VERSION = 1
RUN_JSON = "run.json"


def _dict_hash(config: dict[str, Any]) -> str:
    """12 hex digits of the SHA-256 of `config` as canonical JSON (sorted keys, no spaces)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=json_default)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


def new_header(
    kind: str,
    created: _dt.datetime,
    *,
    command_line: Sequence[str] | str,
    configs: dict[str, dict[str, Any]],
    config_hashes: dict[str, str] | None,
    device: str | dict[str, Any] | None,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """The run.json of a run that starts now (status `running`); `extra` fields go on top."""
    if config_hashes is None:
        config_hashes = {arm: _dict_hash(c) for arm, c in configs.items()}
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "created": created.isoformat(timespec="seconds"),
        "status": "running",
        "command_line": command_line if isinstance(command_line, str) else list(command_line),
        "configs": configs,
        "config_hashes": config_hashes,
        "environment": collect_environment(device),
    }
    doc.update(extra or {})
    return doc


def read_header(path: Path, flag: str) -> dict[str, Any]:
    """run.json of the run directory `path`, checked for what every reader relies on (the schema
    version, `kind`, `configs` as arm name -> config); `flag` names the option the directory
    came from in the error."""
    file = path / RUN_JSON
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"error: no {RUN_JSON} in {path} ({flag}); pass a run directory made by tts-bench"
        ) from None
    except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError: bytes that are not text
        raise ConfigError(
            f"error: {file} is not valid JSON: {exc} ({flag}); rerun from scratch"
        ) from None
    except OSError as exc:  # a directory in its place, no permission
        raise ConfigError(
            f"error: cannot read {file}: {exc.strerror or exc} ({flag}); pass a run "
            f"directory made by tts-bench"
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(
            f"error: {file} is a JSON {type(doc).__name__}, not a run record ({flag}); pass a run directory made by tts-bench"
        )
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ConfigError(
            f"error: {file} has schema_version {version!r}, this tts-bench writes "
            f"{SCHEMA_VERSION} ({flag}); rerun from scratch"
        )
    problem = _header_problem(doc)
    if problem:
        raise ConfigError(
            f"error: {file} is damaged: {problem} ({flag}); rerun from scratch"
        )
    return doc


def _header_problem(doc: dict[str, Any]) -> str | None:
    """What is wrong with the kind or the configs of a header, or None."""
    configs = doc.get("configs")
    if not isinstance(doc.get("kind"), str):
        return f"its kind is {doc.get('kind')!r}, not a name like 'ab'"
    if "configs" not in doc:
        return "it has no configs (each arm's resolved config)"
    if not isinstance(configs, dict):
        return f"its configs is {json.dumps(configs)[:40]}, not a mapping of arm name to config"
    bad = [arm for arm, c in configs.items() if not isinstance(c, dict)]
    return f"configs.{bad[0]} is not a config (a mapping)" if bad else None
