"""Bench configs: the schema (frozen dataclasses) and the one strict YAML loader.

A config file is YAML whose shape is the `BenchConfig` dataclass tree. The loader
(`tts_bench.config.loader`: pydantic's strict validation over these dataclasses, its errors in
our words) is generic over type hints, so every section (stage configs, `wer:`, `mem:`) is
checked the same way:

- an unknown key fails with the file, the dotted key and the nearest valid name;
- a wrong type fails with the dotted key and the expected type (an int is accepted where a float
  is expected; a bool is never an int; YAML lists become tuples);
- a string where a section (nested dataclass) is expected is an include path, resolved relative
  to the including file: `stages: ../stages/minicpmo45-tiny.yaml`;
- `dict[str, Any]` fields (stage `extra`) are free-form and kept as parsed. Stages parse their own
  `extra` booleans with `stages.flags` at construction, not here.

Modules: `schema` (the dataclasses), `files` (reading, arms, overrides, hashing), `sut` (the
system-under-test hash), `loader` (the strict YAML loader), `limits`, `paths`, `shipped`, and the
`wer:` / `mem:` sections (`wer`, `mem`).

Paths: a `configs/...` path that does not exist from the working directory names a shipped
config (`tts_bench.config.shipped`); a file with no `stages:` section and the embedded backend gets the
tiny stage config on a host without an accelerator (`with_default_stages`). Sizes (tiers,
prompts, repeats, seeds) have upper bounds (`tts_bench.config.limits`).

Overrides `--set a.b.c=value` are parsed with YAML, set in the config's data and the whole tree
validated again, like a file (configs are never mutated; `dataclasses.replace` works on them).
`code2wav.extra.x=false` is routed to `stages.code2wav.extra.x` because `code2wav` is a stage
section, not a bench section.

    cfg = load_config(Path("configs/ab/default.yaml"), ["bench.num_prompts=4"])
    cfg = apply_overrides(cfg, ["code2wav.extra.token2wav_device_spk=false"])
    config_hash(cfg)  # '3f9c0a...' stored in every run record

An A/B config is a bench config plus an optional `arms:` mapping of two arm names to override
lists; `load_arms` applies file, `--set`, the file's `arms:` lists, then `--base-set` /
`--test-set`, in that order; `load_arm` builds one of them; `load_config` reads the file
without applying `arms:` (what both arms share):

    arms = load_arms(Path("configs/ab/default.yaml"), test_sets=["synthetic.delay_scale=1.2"])
    cfg = load_arm(Path("configs/ab/default.yaml"), arm="test")
"""

import importlib
from typing import Any

# The package's names, each from the module that defines it. They load on first use (PEP 562):
# `from tts_bench.config.limits import MAX_PROMPTS` in a command module must not pull pydantic and
# the stage configs into `tts-bench --help`.
_EXPORTS = {
    **dict.fromkeys(("FlagOverride", "apply_overrides", "config_hash", "config_to_dict", "load_arm", "load_arms",
                     "load_config"), "files"),
    **dict.fromkeys(("load_dataclass", "load_yaml_file"), "loader"),
    **dict.fromkeys(("BenchConfig", "BenchParams", "HttpConfig", "PiperConfig", "PromptsConfig", "SyntheticConfig",
                     "Tier", "parse_tier", "parse_tiers"), "schema"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
