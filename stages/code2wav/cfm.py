"""CFM decoder (`CausalConditionalCFM`, spec §4.4): mu -> mel by a cosine-scheduled Euler solve.

Each of the `n_timesteps` (10) steps runs the DiT estimator once on 2B rows laid out
[cond x B | uncond x B]: uncond rows see mu = 0, spk = 0, cond = 0 (x and t shared), and the
guided velocity is (1 + 0.7) * v_cond - 0.7 * v_uncond. Every step has its own estimator caches,
so the per-request caches are [n_t, depth, 2, ...] and a B-row batch [n_t, depth, 2B, ...].

Noise is a fixed buffer drawn once at construction from a *seeded* generator (upstream draws it
unseeded); a chunk reads `noise[:, :, L : L + T]` with L = current estimator-cache length, so
after the cache trim saturates, steady chunks keep reusing the same window (as upstream).

Streaming decode passes `att_steps` (a `flow_cache.StepwiseAttCache`) instead of a stacked
`att_cache`: one [depth, 2B, H, T+L, 2D] step buffer is reused by all steps (loaded from the
request rows before the step, stored back trimmed after), so no whole-solve batch cache exists.

Landmines: dt values are read to the host once per solve (no per-step sync); the uncond half
must stay *behind* the cond half, the cache split relies on that order.

    cfm = CausalCFM(cfg)
    cfm.init_noise(seed=0, device=dev, dtype=torch.float32)
    out = cfm.solve(mu, spk, cond, cnn_cache=None, att_cache=None)  # out.mel: [B, 80, T]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from stages.code2wav.config import Code2WavConfig
from stages.code2wav.dit import CONV_CACHE_FRAMES, DiT
from stages.code2wav.flow_cache import StepwiseAttCache


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
        att_steps: StepwiseAttCache | None = None,  # per-request caches, read/written per step
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
        t_span = cosine_t_span(self.cfg.n_timesteps)
        rate, n_t, d = self.cfg.cfg_rate, self.cfg.n_timesteps, self.cfg.dit
        # Per-step caches are written in place into these buffers (no stack copies).
        cnn_out = mu.new_empty(n_t, d.depth, 2 * b, 2 * d.hidden_size, CONV_CACHE_FRAMES)
        att_shape = (d.depth, 2 * b, d.num_heads, frames + cached, 2 * d.head_dim)
        # Stepwise: ONE step buffer, reused; its tail [T:] holds the step's old cache in place.
        att_out = mu.new_empty(att_shape if att_steps is not None else (n_t, *att_shape))
        for i in range(n_t):
            if att_steps is not None:
                att_steps.load(i, att_out)
                step_in, step_out = att_out[:, :, :, frames:], att_out
            else:
                step_in = None if att_cache is None else att_cache[i]
                step_out = att_out[i]
            t = mu.new_full((2 * b,), t_span[i])
            out = self.estimator.forward_chunk(
                torch.cat([torch.cat([x, x], dim=0), static], dim=1),
                t,
                None if cnn_cache is None else cnn_cache[i],
                step_in,
                mask,
                cnn_out=cnn_out[i],
                att_out=step_out,
            )
            if att_steps is not None:
                att_steps.store(i, att_out)
            v_cond, v_uncond = out.velocity.chunk(2, dim=0)
            x = x + (t_span[i + 1] - t_span[i]) * ((1.0 + rate) * v_cond - rate * v_uncond)
        return CFMOut(x, cnn_out, None if att_steps is not None else att_out)
