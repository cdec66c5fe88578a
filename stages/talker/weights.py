"""Load the talker from the official MiniCPM-o 4.5 checkpoint layout (`tts.*` keys).

The checkpoint dir holds `model-0000x-of-0000y.safetensors` + `model.safetensors.index.json`
(or `*.bin` / `*.pt` torch pickles); only the shards that hold `tts.` keys are opened, and only
those keys are read. Our parameter names equal the checkpoint's minus the `tts.` prefix, so there
is no rename table -- just a short list of keys the checkpoint has and the talker does not use:

* `tts.model.embed_tokens.weight`: the Llama backbone's own 32000-row table; the talker feeds
  embeddings (condition rows, then `emb_code`), never backbone token ids.
* `tts.projector_spk.*`: the speaker projector; the speaker lives in code2wav's prompt instead.

Everything else is strict: a missing, unexpected or wrongly shaped key raises
`TalkerWeightsError` listing the first few. Load into a meta-built model with `assign=True`, then
cast/move, then `fold_weight_norm()`:

    >>> with torch.device("meta"):
    ...     model = TalkerModel(cfg)
    >>> load_talker_weights(model, "/path/to/MiniCPM-o-4_5")
    >>> model.to(device=device, dtype=dtype).fold_weight_norm()
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from stages.talker.config import TalkerConfig
from stages.talker.model import TalkerModel

logger = logging.getLogger(__name__)

PREFIX = "tts."
IGNORED_PREFIXES = ("model.embed_tokens.", "projector_spk.")
_SHOW = 8  # keys listed per category in an error

# config.json `tts_config` key -> TalkerConfig field, checked when config.json is present.
_CONFIG_FIELDS = {
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "intermediate_size": "intermediate_size",
    "num_text_tokens": "num_text_tokens",
    "num_audio_tokens": "num_audio_tokens",
    "llm_dim": "llm_dim",
    "audio_bos_token_id": "audio_bos_token_id",
    "text_eos_token_id": "text_eos_token_id",
}


class TalkerWeightsError(ValueError):
    """The weights dir does not hold a talker that fits the config."""


def _fail(what: str, where: object, fix: str) -> TalkerWeightsError:
    return TalkerWeightsError(f"error: {what} ({where}); {fix}")


def checkpoint_files(weights_dir: Path) -> list[Path]:
    """The files to read: shards named by an index that hold `tts.` keys, else all weights."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = weights_dir / index_name
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted({f for k, f in weight_map.items() if k.startswith(PREFIX)})
            return [weights_dir / s for s in shards]
    files = sorted(weights_dir.glob("*.safetensors"))
    return files or sorted([*weights_dir.glob("*.bin"), *weights_dir.glob("*.pt")])


def _read_file(path: Path) -> dict[str, torch.Tensor]:
    """`tts.` tensors of one file, prefix stripped, on CPU."""
    if path.suffix == ".safetensors":
        try:
            from safetensors import safe_open
        except ImportError as exc:
            raise _fail("safetensors is not installed", path, "pip install safetensors") from exc
        with safe_open(str(path), framework="pt") as fh:
            return {k[len(PREFIX):]: fh.get_tensor(k) for k in fh.keys() if k.startswith(PREFIX)}
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX)}


def read_tts_state_dict(weights_dir: str | Path) -> dict[str, torch.Tensor]:
    """All used talker tensors of a checkpoint dir, keyed like `TalkerModel.state_dict()`."""
    root = Path(weights_dir)
    files = checkpoint_files(root) if root.is_dir() else []
    if not files:
        raise _fail(
            "no checkpoint files (*.safetensors, *.bin, *.pt) found", root,
            "point `weights` at the MiniCPM-o 4.5 checkpoint dir",
        )
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(_read_file(path))
    if not state:
        raise _fail("no `tts.*` keys in the checkpoint", root, "use the MiniCPM-o 4.5 checkpoint")
    return {k: v for k, v in state.items() if not k.startswith(IGNORED_PREFIXES)}


def check_config_json(weights_dir: str | Path, cfg: TalkerConfig) -> None:
    """Compare config.json's `tts_config` dims with `cfg` (skipped when there is no file)."""
    path = Path(weights_dir) / "config.json"
    if not path.is_file():
        return
    tts = json.loads(path.read_text()).get("tts_config") or {}
    wrong = [
        f"{ours}={getattr(cfg, ours)} vs {theirs}={tts[theirs]}"
        for theirs, ours in _CONFIG_FIELDS.items()
        if theirs in tts and tts[theirs] != getattr(cfg, ours)
    ]
    if wrong:
        raise _fail(
            f"talker config differs from the checkpoint's tts_config: {', '.join(wrong)}", path,
            "use configs/stages/minicpmo45.yaml (the real dims) with real weights",
        )


def check_state_dict(model: TalkerModel, state: dict[str, torch.Tensor], where: object) -> None:
    """Strict key and shape check with an error that lists the first offenders."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [
        f"{k} {tuple(state[k].shape)} != {expected[k]}"
        for k in expected
        if k in state and tuple(state[k].shape) != expected[k]
    ]
    problems = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", shapes)):
        if items:
            more = f" (+{len(items) - _SHOW} more)" if len(items) > _SHOW else ""
            problems.append(f"{label} {len(items)}: {', '.join(items[:_SHOW])}{more}")
    if problems:
        raise _fail(
            "talker checkpoint does not match the model: " + "; ".join(problems),
            where,
            "check the weights dir and that the config dims match the checkpoint",
        )


def load_talker_weights(model: TalkerModel, weights_dir: str | Path) -> None:
    """Strictly load `tts.*` tensors into `model` (before `fold_weight_norm`), assign=True."""
    check_config_json(weights_dir, model.cfg)
    state = read_tts_state_dict(weights_dir)
    check_state_dict(model, state, weights_dir)
    model.load_state_dict(state, strict=True, assign=True)
    logger.info("talker weights: %d tensors from %s", len(state), weights_dir)


def save_official_layout(model: TalkerModel, path: str | Path) -> None:
    """Write `model` as the checkpoint does (`tts.` prefix; .safetensors or torch pickle by
    suffix). For tests and fixtures; the ignored keys are not written."""
    state = {PREFIX + k: v.detach().contiguous() for k, v in model.state_dict().items()}
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
