"""CFM decoder (`CausalConditionalCFM`, spec §4.4): mu -> mel by a cosine-scheduled Euler solve.

Each of the `n_timesteps` (10) steps runs the DiT estimator once on 2B rows laid out
[cond x B | uncond x B]: uncond rows see mu = 0, spk = 0, cond = 0 (x and t shared), and the
guided velocity is (1 + 0.7) * v_cond - 0.7 * v_uncond. Every step has its own estimator caches,
so the per-request caches are [n_t, depth, 2, ...] and a B-row batch [n_t, depth, 2B, ...].

Noise is a fixed buffer drawn once at construction from a *seeded* generator (upstream draws it
unseeded); a chunk reads `noise[:, :, L : L + T]` with L = current estimator-cache length, so
after the cache trim saturates, steady chunks keep reusing the same window (as upstream).

Streaming decode passes `att_steps` (a `chunk_decode.PooledAttSteps`: `length`, `load(i, buf)`,
`store(i, buf)`) instead of a stacked `att_cache`: one [depth, 2B, H, T+L, 2D] step buffer is
reused by all steps (loaded from the rows' pool slots before the step, stored back trimmed
after), so no whole-solve batch cache exists.

Landmines: dt values are read to the host once per solve (no per-step sync); the uncond half
must stay *behind* the cond half, the cache split relies on that order.

    cfm = CausalCFM(cfg)
    cfm.init_noise(seed=0, device=dev, dtype=torch.float32)
    out = cfm.solve(mu, spk, cond, cnn_cache=None, att_cache=None)  # out.mel: [B, 80, T]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from stages.code2wav.config import Code2WavConfig
from stages.code2wav.dit import DiT, StepModulation
from stages.code2wav.dit_conv import CONV_CACHE_FRAMES
from stages.platform.precision import tf32_enabled


class AttSteps(Protocol):
    """Per-step estimator attention caches fed to `solve` (see chunk_decode.PooledAttSteps)."""

    length: int  # cached frames L

    def load(self, step: int, buf: torch.Tensor) -> None: ...

    def store(self, step: int, buf: torch.Tensor) -> None: ...


# Upstream computes the schedule in fp32 on the device and advances t by `t + dt` (up to 6.8e-8
# from these values at n = 10); that, and the adaLN rows made once per step on one row
# (`step_modulations`: the CPU's 1-row GEMM rounds unlike upstream's 2-row one), are the flow's
# deviations from the official formulation besides dit.py's addcmul (measured together there).
def cosine_t_span(n_timesteps: int) -> list[float]:
    """t_i = 1 - cos((i/n) * pi/2), i = 0..n, computed on the host in float64."""
    return [1.0 - math.cos(i / n_timesteps * math.pi / 2) for i in range(n_timesteps + 1)]


@dataclass
class CFMOut:
    mel: torch.Tensor  # [B, 80, T]
    cnn_cache: torch.Tensor  # [n_t, depth, 2B, 2*hidden, 2]
    att_cache: torch.Tensor | None  # [n_t, depth, 2B, H, T+L, 2*head_dim]; None with att_steps


class CausalCFM(nn.Module):
    def __init__(self, cfg: Code2WavConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.estimator = DiT(cfg.dit)
        self.noise: torch.Tensor | None = None  # not a parameter: never in the checkpoint
        self._mods: tuple[tuple, list[StepModulation]] | None = None  # (key, per-step rows)

    def step_modulations(self, like: torch.Tensor) -> list[StepModulation]:
        """The estimator's adaLN rows of every Euler step, computed once and reused.

        The cosine schedule's t values are fixed, so the rows are a function of the weights,
        dtype, device and TF32 setting; the key checks all four (weights by their storage and
        version counter, so a reload recomputes them)."""
        est = self.estimator
        params = [*est.t_embedder.parameters(), *est.final_layer.parameters(),
                  *(p for b in est.blocks for p in b.adaLN_modulation.parameters())]
        tf32 = tf32_enabled(like.device)
        key = (self.cfg.n_timesteps, like.dtype, like.device, tf32,
               tuple((p.data_ptr(), p._version) for p in params))
        if self._mods is None or self._mods[0] != key:
            t_span = cosine_t_span(self.cfg.n_timesteps)
            self._mods = (key, [est.step_modulation(t, like) for t in t_span[:-1]])
        return self._mods[1]

    def init_noise(self, *, seed: int, device: torch.device, dtype: torch.dtype) -> None:
        """Draw the fixed noise buffer [1, mel, noise_frames] on the CPU (same bytes everywhere)."""
        gen = torch.Generator().manual_seed(seed)
        noise = torch.randn(1, self.cfg.mel_bins, self.cfg.noise_frames, generator=gen)
        self.noise = noise.to(device=device, dtype=dtype)

    def _noise(self, offset: int, frames: int, rows: int) -> torch.Tensor:
        if self.noise is None:
            raise RuntimeError("CausalCFM.init_noise was not called")
        if offset + frames > self.noise.shape[2]:
            raise ValueError(
                f"error: CFM needs noise frames [{offset}, {offset + frames}) but the buffer "
                f"holds {self.noise.shape[2]} (code2wav.noise_frames); raise noise_frames or "
                "lower prompt_keep_frames"
            )
        z = self.noise[:, :, offset : offset + frames].expand(rows, -1, -1)
        return z * self.cfg.noise_temperature

    def solve(
        self,
        mu: torch.Tensor,  # [B, 80, T]
        spk: torch.Tensor,  # [B, 80] projected speaker rows
        cond: torch.Tensor,  # [B, 80, T] prompt mel for the setup solve, zeros when streaming
        *,
        cnn_cache: torch.Tensor | None,  # [n_t, depth, 2B, 2*hidden, 2]
        att_cache: torch.Tensor | None,  # [n_t, depth, 2B, H, L, 2*head_dim]
        mask: torch.Tensor | None = None,  # [1, T, T] block-causal (reference path only)
        att_steps: AttSteps | None = None,  # per-request caches, read/written per step
    ) -> CFMOut:
        b, _, frames = mu.shape
        if att_steps is not None and att_cache is not None:
            raise ValueError("CausalCFM.solve takes att_cache or att_steps, not both")
        cached = 0 if att_cache is None else att_cache.shape[4]
        if att_steps is not None:
            cached = att_steps.length
        x = self._noise(cached, frames, b)
        # Conditioning half stays in front of the unconditional half: [cond x B | uncond x B].
        static = torch.cat(
            [
                torch.cat([mu, torch.zeros_like(mu)], dim=0),
                torch.cat([spk, torch.zeros_like(spk)], dim=0)[:, :, None].expand(-1, -1, frames),
                torch.cat([cond, torch.zeros_like(cond)], dim=0),
            ],
            dim=1,
        )
        # The estimator may run in a lower precision than the flow (code2wav_dit_dtype): its
        # inputs, modulation rows and caches take its dtype; the Euler state x stays in the
        # flow's (no-op casts when they agree).
        static = static.to(self.estimator.in_proj.weight.dtype)
        t_span = cosine_t_span(self.cfg.n_timesteps)
        mods = self.step_modulations(static)
        rate, n_t, d = self.cfg.cfg_rate, self.cfg.n_timesteps, self.cfg.dit
        # Per-step caches are written in place into these buffers (no stack copies).
        cnn_out = static.new_empty(n_t, d.depth, 2 * b, 2 * d.hidden_size, CONV_CACHE_FRAMES)
        att_shape = (d.depth, 2 * b, d.num_heads, frames + cached, 2 * d.head_dim)
        # Stepwise: ONE step buffer, reused; its tail [T:] holds the step's old cache in place.
        att_out = static.new_empty(att_shape if att_steps is not None else (n_t, *att_shape))
        for i in range(n_t):
            if att_steps is not None:
                att_steps.load(i, att_out)
                step_in, step_out = att_out[:, :, :, frames:], att_out
            else:
                step_in = None if att_cache is None else att_cache[i]
                step_out = att_out[i]
            out = self.estimator.forward_chunk(
                torch.cat([torch.cat([x, x], dim=0).to(static.dtype), static], dim=1),
                None,  # t: the step's modulation rows are precomputed
                None if cnn_cache is None else cnn_cache[i],
                step_in,
                mask,
                cnn_out=cnn_out[i],
                att_out=step_out,
                mod=mods[i],
            )
            if att_steps is not None:
                att_steps.store(i, att_out)
            v_cond, v_uncond = out.velocity.to(x.dtype).chunk(2, dim=0)
            x = x + (t_span[i + 1] - t_span[i]) * ((1.0 + rate) * v_cond - rate * v_uncond)
        return CFMOut(x, cnn_out, None if att_steps is not None else att_out)
