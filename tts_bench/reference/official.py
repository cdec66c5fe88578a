"""The official MiniCPM-o 4.5 token2wav modules (minicpmo-utils 1.0.7) as an fp32 reference decoder.

The official flow (`CausalMaskedDiffWithXvec` = `UpsampleConformerEncoderV2` + `CausalConditionalCFM`
over the `DiT` estimator) and vocoder (`HiFTGenerator`, the original HiFT of `hift_original.pt`) are
built here at the dims of a project `Code2WavConfig` (tiny or full), either with the official
modules' own initialisation or with the project's seeded weights copied in (`state_dict`, strict:
the project's module names are the checkpoint's), and driven as the official glue drives them.

Install (test and measurement only; `stages` never imports this): the sdist's hard dependencies
pin pillow, librosa, decord and moviepy, none of which these modules use, hence `--no-deps`;
`einops` is the one extra they need (the DiT packs its inputs with it):

    pip install --no-deps minicpmo-utils==1.0.7 && pip install einops

Import without the heavy optional dependencies: `stepaudio2/__init__.py` imports the `Token2wav`
glue, which imports s3tokenizer, torchaudio, hyperpyyaml and yaml. Nothing here uses that
file, so the package is registered from its spec without executing it, and the leaf modules
(`cosyvoice2.flow.*`, `cosyvoice2.transformer.*`, `flashcosyvoice.modules.hifigan*`) import as
shipped: nothing is stubbed. Their own imports are torch, numpy, scipy, onnxruntime (a project
dependency) and einops. One side effect is undone: `upsample_encoder_v2` sets
`torch._dynamo.config.suppress_errors = True` and `cache_size_limit = 128` at import, process-wide;
both are restored after the import so the project's compile-failure handling is unchanged.

Landmines of the official modules, handled here and nowhere else:
* Their streaming cache buffers are sized for the full model (16 blocks, 512 channels, 8 heads
  of 64); `_fit_cache_buffers` re-sizes them (zeros, same layout, 1000 frames) for other dims.
* `UpsampleConformerEncoderV2.forward_chunk` is wrapped in `torch.compile(backend="eager")`: the
  undecorated function is called (the same ops, without seconds of tracing per shape).
* Their CFM draws its noise buffer unseeded at construction; `init="project"` copies the
  project's seeded buffer in, so both decoders denoise the same noise.

    dec = build_official(Code2WavConfig(), init="official", seed=0)     # the modules' own init
    dec = build_official(tiny_cfg, init="project", seed=0)              # the project's weights
    mel, audio = dec.decode(codes, prompt.tokens, prompt.mel.t()[None], prompt.spk_embedding, seed=0)
    audio, source = dec.vocode(mel[None], seed=0)                        # mel -> audio alone
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal

import torch
from torch import nn

from stages.code2wav import cfm as cfm_mod
from stages.code2wav import dit as dit_mod
from stages.code2wav import flow_encoder as enc_mod
from stages.code2wav import hift as hift_mod
from stages.code2wav.config import Code2WavConfig
from stages.code2wav.hift import fold_weight_norm
from stages.code2wav.streaming import Chunker
from stages.code2wav.token2wav import Token2Wav
from stages.platform import is_cpu

DISTRIBUTION = "minicpmo-utils"
VERSION = "1.0.7"
INSTALL = f"pip install --no-deps {DISTRIBUTION}=={VERSION} && pip install einops"
Init = Literal["official", "project"]
INITS: tuple[str, ...] = ("official", "project")
_MAX_STEPS = 16  # the official CFM's per-step cache buffers hold 16 Euler steps
_CACHE_FRAMES = 1000  # ... and 1000 frames of attention cache (prompt + 100 + a chunk fits)
_LEAVES = {
    "flow": "stepaudio2.cosyvoice2.flow.flow",
    "cfm": "stepaudio2.cosyvoice2.flow.flow_matching",
    "dit": "stepaudio2.cosyvoice2.flow.decoder_dit",
    "encoder": "stepaudio2.cosyvoice2.transformer.upsample_encoder_v2",
    "hift": "stepaudio2.flashcosyvoice.modules.hifigan",
}


class OfficialUnavailable(ImportError):
    """The official token2wav modules cannot be imported here (not installed, wrong version, or
    a dependency of theirs missing); the message says which and how to install them."""


def _unavailable(what: str) -> OfficialUnavailable:
    return OfficialUnavailable(
        f"error: the official token2wav modules are not importable ({what}); {INSTALL}"
    )


@functools.cache
def official_modules() -> SimpleNamespace:
    """The official classes (Flow = `CausalMaskedDiffWithXvec`, CFM, DiT, Encoder, HiFT,
    F0Predictor) and the DiT's module (`dit_module.modulate`). Raises OfficialUnavailable naming
    the install line."""
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise _unavailable(f"{DISTRIBUTION} is not installed") from None
    if version != VERSION:
        raise _unavailable(f"{DISTRIBUTION} {version} is installed, the reference is {VERSION}")
    if "stepaudio2" not in sys.modules:
        spec = importlib.util.find_spec("stepaudio2")
        if spec is None or spec.submodule_search_locations is None:
            raise _unavailable(f"{DISTRIBUTION} has no stepaudio2 package")
        # The package object without running its __init__ (the Token2wav glue and its imports).
        sys.modules["stepaudio2"] = importlib.util.module_from_spec(spec)
    dynamo = importlib.import_module("torch._dynamo").config
    saved = (dynamo.suppress_errors, dynamo.cache_size_limit)
    try:
        mods = {name: importlib.import_module(path) for name, path in _LEAVES.items()}
    except ImportError as exc:
        raise _unavailable(f"importing {exc.name or exc}: {exc}") from exc
    finally:
        dynamo.suppress_errors, dynamo.cache_size_limit = saved
    return SimpleNamespace(
        Flow=mods["flow"].CausalMaskedDiffWithXvec,
        CFM=mods["cfm"].CausalConditionalCFM,
        DiT=mods["dit"].DiT,
        Encoder=mods["encoder"].UpsampleConformerEncoderV2,
        HiFT=mods["hift"].HiFTGenerator,
        F0Predictor=mods["hift"].ConvRNNF0Predictor,
        dit_module=mods["dit"],
    )


def official_available() -> str | None:
    """None when the official modules import, else why not (for pytest skips and reports)."""
    try:
        official_modules()
    except OfficialUnavailable as exc:
        return str(exc)
    return None


# ---- construction ----------------------------------------------------------------------------


def _check_fixed_dims(cfg: Code2WavConfig) -> None:
    """Dims the official constructors do not take: they must be the official values."""
    fixed = {"dit.time_embed_dim": (cfg.dit.time_embed_dim, 256), "dit.time_scale": (cfg.dit.time_scale, 1000.0),
             "flow.max_relpos_len": (cfg.flow.max_relpos_len, 5000)}
    wrong = [f"code2wav.{k} = {have} (official {want})" for k, (have, want) in fixed.items() if have != want]
    if cfg.n_timesteps > _MAX_STEPS:
        wrong.append(f"code2wav.n_timesteps = {cfg.n_timesteps} (official buffers hold {_MAX_STEPS})")
    if wrong:
        raise ValueError(f"error: the official modules cannot be built at these dims ({'; '.join(wrong)}); "
                         "use the shipped full or tiny code2wav config")


def official_flow(cfg: Code2WavConfig) -> nn.Module:
    """The official flow at `cfg`'s dims, with the official init (from the global RNG)."""
    m, fc, d = official_modules(), cfg.flow, cfg.dit
    encoder = m.Encoder(
        input_size=fc.input_size, output_size=fc.input_size, input_layer="linear",
        pre_lookahead_len=fc.pre_lookahead_len, num_blocks=fc.num_blocks, num_up_blocks=fc.num_up_blocks,
        up_stride=fc.up_rate, up_scale_factor=fc.up_rate, attention_heads=fc.attention_heads,
        pos_enc_layer_type="rel_pos_espnet", selfattention_layer_type="rel_selfattn", key_bias=True,
        linear_units=fc.linear_units, normalize_before=True, activation_type="swish",
    )  # fmt: skip
    estimator = m.DiT(in_channels=d.in_channels, out_channels=d.out_channels, mlp_ratio=d.mlp_ratio, depth=d.depth,
                      num_heads=d.num_heads, head_dim=d.head_dim, hidden_size=d.hidden_size)
    decoder = m.CFM(estimator, inference_cfg_rate=cfg.cfg_rate)
    flow = m.Flow(input_size=fc.input_size, output_size=fc.output_size, spk_embed_dim=cfg.speaker.embedding_dim,
                  output_type="mel", vocab_size=fc.vocab_size, encoder=encoder, decoder=decoder)
    _fit_cache_buffers(flow, cfg)
    return flow.eval()


def official_hift(cfg: Code2WavConfig) -> nn.Module:
    """The official original HiFT at `cfg.hift`'s dims, with the official init."""
    m, h = official_modules(), cfg.hift
    f0 = m.F0Predictor(num_class=1, in_channels=h.in_channels, cond_channels=h.f0_predictor_channels)
    hift = m.HiFT(
        in_channels=h.in_channels, base_channels=h.base_channels, nb_harmonics=h.nb_harmonics,
        sampling_rate=h.sampling_rate, nsf_alpha=h.nsf_alpha, nsf_sigma=h.nsf_sigma,
        nsf_voiced_threshold=h.nsf_voiced_threshold, upsample_rates=list(h.upsample_rates),
        upsample_kernel_sizes=list(h.upsample_kernel_sizes),
        istft_params={"n_fft": h.istft_n_fft, "hop_len": h.istft_hop_len},
        resblock_kernel_sizes=list(h.resblock_kernel_sizes),
        resblock_dilation_sizes=[list(d) for d in h.resblock_dilation_sizes],
        source_resblock_kernel_sizes=list(h.source_resblock_kernel_sizes),
        source_resblock_dilation_sizes=[list(d) for d in h.source_resblock_dilation_sizes],
        lrelu_slope=h.lrelu_slope, audio_limit=h.audio_limit, f0_predictor=f0,
    )  # fmt: skip
    return hift.eval()


def _fit_cache_buffers(flow: nn.Module, cfg: Code2WavConfig) -> None:
    """The official CFM and DiT keep streaming-cache buffers of the full model's shape; give
    them `cfg`'s (a no-op at full size: same shapes, the official tensors stay)."""
    d = cfg.dit
    cnn = (d.depth, 2, 2 * d.hidden_size, 2)  # [depth, cond|uncond, conv1|conv2 history, 2]
    att = (d.depth, 2, d.num_heads, _CACHE_FRAMES, 2 * d.head_dim)  # [..., H, L, K|V]
    want = {(flow.decoder, "cnn_cache_buffer"): (_MAX_STEPS, *cnn), (flow.decoder, "att_cache_buffer"): (_MAX_STEPS, *att),
            (flow.decoder.estimator, "cnn_cache_buffer"): cnn, (flow.decoder.estimator, "att_cache_buffer"): att}
    for (module, name), shape in want.items():
        if tuple(getattr(module, name).shape) != shape:
            module.register_buffer(name, torch.zeros(shape), persistent=False)


@dataclass
class OfficialDecoder:
    """The official flow + HiFT at one config's dims (CPU or any device, fp32)."""

    cfg: Code2WavConfig
    flow: nn.Module  # CausalMaskedDiffWithXvec
    hift: nn.Module  # HiFTGenerator (original HiFT)

    def to(self, device: torch.device) -> OfficialDecoder:
        self.flow.to(device)
        self.hift.to(device)
        self.hift.stft_window = self.hift.stft_window.to(device)  # a plain attribute upstream
        return self

    # -- driving them as the official glue does (stepaudio2/token2wav.py, 1.0.7) ---------------

    @torch.inference_mode()
    def stream_mels(
        self,
        prompt_tokens: torch.Tensor,  # [Tp] speech tokens of the voice
        prompt_mel: torch.Tensor,  # [1, 80, 2*Tp] (the project's layout)
        spk_embedding: torch.Tensor,  # [192]
        payloads: Sequence[tuple[Sequence[int], bool]],  # (codes incl. left context, last_chunk)
    ) -> list[torch.Tensor]:
        """Per payload, the mel [80, T] of `flow.setup_cache` then `flow.inference_chunk`, with
        1.0.7's cache trims. The setup's lookahead is 3 silence codes, as the project's (1.0.7's
        glue re-sends the first 3 prompt tokens there; the modules take either)."""
        cfg, device = self.cfg, prompt_mel.device
        lookahead = torch.full((cfg.flow.pre_lookahead_len,), cfg.silence_code, dtype=torch.long)
        tokens = torch.cat([prompt_tokens.cpu().long(), lookahead])[None].to(device=device, dtype=torch.int32)
        spk = spk_embedding.reshape(1, -1).float()
        cache = self.flow.setup_cache(tokens, prompt_mel.float().transpose(1, 2), spk, n_timesteps=cfg.n_timesteps)
        prompt_frames = prompt_mel.shape[2]
        mels = []
        for codes, last in payloads:
            chunk = torch.tensor([list(codes)], dtype=torch.int32, device=device)
            mel, cache = self.flow.inference_chunk(chunk, spk, cache, last_chunk=last, n_timesteps=cfg.n_timesteps)
            cache = self._trimmed(dict(cache), prompt_frames)
            mels.append(mel[0].clone())  # the official returns a view of its buffers
        return mels

    def _trimmed(self, cache: dict, prompt_frames: int) -> dict:
        """`Token2wav._trim_estimator_cache` + `_trim_conformer_cache` of 1.0.7, verbatim in effect."""
        keep = self.cfg.prompt_keep_frames
        att = cache["estimator_att_cache"]
        if att.shape[4] > prompt_frames + keep:
            cache["estimator_att_cache"] = torch.cat([att[:, :, :, :, :prompt_frames], att[:, :, :, :, -keep:]], dim=4)
        att = cache["conformer_att_cache"]
        if att.shape[3] > prompt_frames + keep:
            depth = len(self.flow.encoder.encoders)
            tok = att[:depth, :, :, : att.shape[3] // 2]
            tok = torch.cat([tok[:, :, :, : prompt_frames // 2], tok[:, :, :, tok.shape[3] - keep // 2 :]], dim=3)
            mel = torch.cat([att[depth:, :, :, :prompt_frames], att[depth:, :, :, att.shape[3] - keep :]], dim=3)
            cache["conformer_att_cache"] = torch.cat([tok.repeat(1, 1, 1, 2, 1), mel], dim=0)
        return cache

    def decode(
        self,
        codes: Sequence[int],
        prompt_tokens: torch.Tensor,  # [Tp]
        prompt_mel: torch.Tensor,  # [1, 80, 2*Tp]
        spk_embedding: torch.Tensor,  # [192]
        *,
        seed: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """codes -> (mel [80, T], audio [T*480]): streamed in the project's payloads (25 new + 3
        left-context codes, then the final flush), the whole mel vocoded once with `seed`."""
        chunker = Chunker(self.cfg, "official")
        payloads = [*chunker.push(codes), chunker.finish()]
        mels = self.stream_mels(prompt_tokens, prompt_mel, spk_embedding, [(p.codes, p.last_chunk) for p in payloads])
        mel = torch.cat(mels, dim=1)
        return mel, self.vocode(mel[None], seed=seed)[0][0]

    @torch.inference_mode()
    def vocode(self, mel: torch.Tensor, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """mel [B, 80, T] -> (audio [B, T*480], NSF source [B, 1, T*480]) by `HiFTGenerator.forward`,
        its random source drawn from the global RNG seeded with `seed` (restored afterwards):
        the project's `hift.inference(mel, empty)` with the same seed draws the same numbers."""
        with torch.random.fork_rng(devices=[] if is_cpu(mel.device) else [mel.device]):
            torch.manual_seed(seed)
            return self.hift(speech_feat=mel.float())


def _official_forward_chunk(encoder: nn.Module):
    """The encoder's forward_chunk without its torch.compile(backend="eager") wrapper."""
    fn = type(encoder).forward_chunk
    orig = getattr(fn, "_torchdynamo_orig_callable", None) or getattr(fn, "__wrapped__", None)
    return None if orig is None else orig.__get__(encoder)


def build_official(cfg: Code2WavConfig, *, init: Init = "official", seed: int = 0, project=None) -> OfficialDecoder:
    """The official flow + HiFT at `cfg`'s dims, on the CPU in fp32, eval mode.

    init="official": each module with the official modules' own initialisation (DiT: xavier
    linears, adaLN and final layer zeroed; HiFT: N(0, 0.01) convs), the flow drawn after
    `torch.manual_seed(seed)` and HiFT after `seed + 1` (the global RNG is restored), noise
    included (the CFM's own unseeded draw, made under that seed).
    init="project": the project's weights and noise copied in (a `Token2Wav`-like `project` with
    `.flow` and `.hift`, else a fresh fp32 `Token2Wav(cfg, init_seed=seed)` on the CPU); HiFT's
    weight norm is folded first, as the project folds it (bit-identical output, torch.equal tested).
    """
    if init not in INITS:
        raise ValueError(f"error: unknown init {init!r} (build_official); choose one of {', '.join(INITS)}")
    _check_fixed_dims(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        flow = official_flow(cfg)
        torch.manual_seed(seed + 1)
        hift = official_hift(cfg)
    unwrapped = _official_forward_chunk(flow.encoder)
    if unwrapped is not None:
        flow.encoder.forward_chunk = unwrapped
    dec = OfficialDecoder(cfg, flow, hift)
    if init == "project":
        copy_project_weights(dec, project if project is not None else _project_token2wav(cfg, seed))
    return dec


def _project_token2wav(cfg: Code2WavConfig, seed: int):
    return Token2Wav(cfg, device=torch.device("cpu"), dtype=torch.float32, init_seed=seed)


@torch.no_grad()
def copy_project_weights(dec: OfficialDecoder, project) -> None:
    """Load the project's flow and HiFT weights (and CFM noise) into the official modules,
    strictly: every key present on both sides with the same shape."""
    dec.flow.load_state_dict(project.flow.state_dict(), strict=True)
    noise = project.flow.decoder.noise
    if noise is not None:
        dec.flow.decoder.rand_noise = noise.detach().to(device="cpu", dtype=torch.float32).clone()
    fold_weight_norm(dec.hift)
    dec.hift.load_state_dict(project.hift.state_dict(), strict=True)


# ---- the project's deviations from the official formulation, undone (measurement only) ------


def official_t_span(n_timesteps: int) -> list[float]:
    """The t values upstream's Euler loop actually uses: the cosine schedule in fp32 on the
    device (`1 - cos(linspace(0, 1, n + 1) * pi / 2)`), t advanced by `t = t + dt` in fp32 with
    `dt = t_span[i + 1] - t` (`CausalConditionalCFM.solve_euler_chunk`)."""
    span = 1 - torch.cos(torch.linspace(0, 1, n_timesteps + 1, dtype=torch.float32) * 0.5 * torch.pi)
    t, dt, out = span[0], span[1] - span[0], [float(span[0])]
    for step in range(1, n_timesteps + 1):
        t = t + dt
        out.append(float(t))
        if step < n_timesteps:
            dt = span[step + 1] - t
    return out


@contextlib.contextmanager
def upstream_formulation(cfm: nn.Module) -> Iterator[None]:
    """The project's modules with the official formulation swapped back in, for one B = 1 run
    (a monkeypatch of `stages` in this process, restored on exit; `cfm` is the project's
    `CausalCFM`, whose cached adaLN rows are dropped on entry and exit). The swaps, each a speed
    or sync choice of the project (or, the last, a copy it skips):
    * `dit.modulate` / `dit.gated`: `x * (1 + scale) + shift` and `x + gate * y` (two roundings)
      instead of one `addcmul` each;
    * `hift.istft`: `torch.istft` instead of the graph-safe deterministic one;
    * `cfm.cosine_t_span`: the fp32 on-device schedule (`official_t_span`) instead of float64 on
      the host;
    * `DiT.step_modulation`: adaLN rows computed on the 2 rows upstream's CFG batch has (the
      CPU's GEMM rounds a 1-row product differently) instead of once on 1 row;
    * `flow_encoder.LinearEmbed`: its input made contiguous, as upstream's `up_embed` gets it (the
      project hands it the upsample output transposed, a view: the CPU's GEMM then sums in
      another order at full width, 2.4e-6 apart).
    With all six, the tiny and full flow mel and HiFT audio equal the official bit for bit on
    the CPU (tests/stages/test_official_reference.py; results/cpu/official_deviation_*.json)."""
    def step_modulation(self, t: float, like: torch.Tensor):
        rows = self._modulation(self.t_embedder(like.new_full((2,), t)).unsqueeze(1))
        return dit_mod.StepModulation(tuple(tuple(r[:1] for r in b) for b in rows.blocks),
                                      tuple(r[:1] for r in rows.final))

    saved = (dit_mod.modulate, dit_mod.gated, hift_mod.istft, cfm_mod.cosine_t_span, dit_mod.DiT.step_modulation,
             enc_mod.LinearEmbed.forward)
    dit_mod.modulate = lambda x, shift, scale_plus_one: x * scale_plus_one + shift  # the rows hold 1 + scale
    dit_mod.gated = lambda x, gate, y: x + gate * y
    hift_mod.istft = lambda spec, n_fft, hop, window: torch.istft(spec, n_fft, hop, n_fft, window=window)
    cfm_mod.cosine_t_span = official_t_span
    dit_mod.DiT.step_modulation = step_modulation
    enc_mod.LinearEmbed.forward = lambda self, x: self.out(x.contiguous()) * self.xscale
    cfm._mods = None
    try:
        yield
    finally:
        (dit_mod.modulate, dit_mod.gated, hift_mod.istft, cfm_mod.cosine_t_span, dit_mod.DiT.step_modulation,
         enc_mod.LinearEmbed.forward) = saved
        cfm._mods = None
