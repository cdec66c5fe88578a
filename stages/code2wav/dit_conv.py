"""The DiT's causal conv block (CausalConvBlock): conv1 -> LayerNorm -> Mish -> conv2, each conv
causal with two frames of history a chunk, in the checkpoint's channels-first layout or
frames-first (`DiT.use_kernels` switches it; `stages.code2wav.kernels.conv_layout` decides, and
may wire in one Triton launch for the middle and 3xTF32 GEMMs for the convs).

    block = CausalConvBlock(512)
    y = block(x, cache, out_cache)  # x [B, T, C]; cache, out_cache [B, 2C, 2]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

CONV_LN_EPS = 1e-5  # the conv block's affine LayerNorm (torch's default, as the checkpoint has it)
_CONV_KERNEL = 3
CONV_CACHE_FRAMES = _CONV_KERNEL - 1  # causal history per conv in the block's cache


class Transpose(nn.Module):
    """Parameter-free; kept as a module so `conv.block.<i>` indices match the checkpoint."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2)


class CausalConvBlock(nn.Module):
    """block = [T, conv1, T, LayerNorm, Mish, T, conv2, T]; convs are causal with k-1 history.

    Two layouts, the same function: channels-first as the checkpoint's Transposes say (the CPU;
    cuDNN brackets each such conv with two layout-transform kernels), or frames-first all the way
    (`frames_first`, set by `DiT.use_kernels`, on CUDA): the [B, T, C] activations are
    already the channels-last layout of a [B, C, 1, T] image, so a 2-D conv over that view with a
    channels-last weight runs without transforms and writes [B, T, C] directly."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.channels = channels
        self.frames_first = False
        # Frames-first only (`DiT.use_kernels`): `dit_conv_triton.ln_mish_window` or None, and
        # `dit_gemm.causal_conv` (the convs as 3xTF32 GEMMs) or None (cuDNN).
        self.ln_mish: Callable | None = None
        self.conv_gemm: Callable | None = None
        # With both kernels above and the DiT's fused norm step (`DiT.use_kernels`): the convs'
        # split k-sums are left open (`dit_gemm.OpenSum`) for the next kernel to add.
        self.open_sums = False
        # Frames-first (`DiT.use_kernels`): the norm step before the block writes conv1's input
        # window itself (`window_history`), so the block gets the window and skips its cat.
        self.window_from_norm = False
        self.block = nn.Sequential(
            Transpose(),
            nn.Conv1d(channels, channels, _CONV_KERNEL),
            Transpose(),
            nn.LayerNorm(channels, eps=CONV_LN_EPS),
            nn.Mish(),
            Transpose(),
            nn.Conv1d(channels, channels, _CONV_KERNEL),
            Transpose(),
        )

    def _causal(self, conv: nn.Conv1d, x: torch.Tensor, hist: torch.Tensor):
        # x: [B, C, T]; hist: [B, C, k-1]
        full = torch.cat([hist, x], dim=2)
        return conv(full), full[:, :, -(CONV_CACHE_FRAMES) :]

    def window_history(self, cache: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
        """conv1's cached input frames [B, C, 2] for the norm step to write ahead of the block's
        input (`window_from_norm`), or None: the block makes its window itself."""
        if not (self.window_from_norm and self.frames_first):
            return None
        if cache is None:
            return x.new_zeros(x.shape[0], self.channels, CONV_CACHE_FRAMES)
        return cache[:, : self.channels]

    def forward(self, x: torch.Tensor, cache: torch.Tensor | None, out_cache: torch.Tensor, *, window: bool = False):
        # x: [B, T, C], or with `window` (frames-first only) conv1's input window [B, 2 + T, C]
        # made by the caller from `window_history`; cache, out_cache: [B, 2C, 2] (conv1 input
        # history | conv2 input history)
        if cache is None:
            cache = x.new_zeros(x.shape[0], 2 * self.channels, CONV_CACHE_FRAMES)
        if window and not self.frames_first:
            raise ValueError("a conv window from the caller is a frames-first block's input only")
        if self.frames_first:
            return self._forward_frames_first(x, cache, out_cache, window)
        hist1, hist2 = cache.split(self.channels, dim=1)
        h, new1 = self._causal(self.block[1], x.transpose(1, 2), hist1)
        h = self.block[4](self.block[3](h.transpose(1, 2))).transpose(1, 2)
        h, new2 = self._causal(self.block[6], h, hist2)
        # The new histories land in the caller's buffer (no cat): [conv1 | conv2] on channels.
        out_cache[:, : self.channels] = new1
        out_cache[:, self.channels :] = new2
        return h.transpose(1, 2)

    def _forward_frames_first(self, x: torch.Tensor, cache: torch.Tensor, out_cache: torch.Tensor, window: bool):
        # The cache keeps its channels-first [B, 2C, 2] layout (the flow cache and its tests
        # read it so); only its two frames a conv are transposed, not the activations.
        c = self.channels
        full1 = x if window else torch.cat([cache[:, :c].transpose(1, 2), x], dim=1)  # [B, 2 + T, C]
        if self.ln_mish is not None:  # LayerNorm, Mish, conv2's window and both histories: one launch
            norm = self.block[3]
            full2 = self.ln_mish(self._conv(1, full1, self.open_sums), full1, cache[:, c:], norm.weight, norm.bias,
                                 norm.eps, out_cache)
            return self._conv(6, full2, self.open_sums)
        h = self.block[4](self.block[3](self._conv(1, full1)))
        full2 = torch.cat([cache[:, c:].transpose(1, 2), h], dim=1)
        out_cache[:, :c] = full1[:, -CONV_CACHE_FRAMES:].transpose(1, 2)
        out_cache[:, c:] = full2[:, -CONV_CACHE_FRAMES:].transpose(1, 2)
        return self._conv(6, full2)

    def _conv(self, index: int, window: torch.Tensor, open_sum: bool = False):
        """Frames-first conv `block[index]` over `window` [B, 2 + T, C]: cuDNN's, or the GEMM that
        `DiT.use_kernels` wired in (whose [B, T, C] output is a view with a batch stride of
        (2 + T) * C; every consumer here takes strided input; with `open_sum` it may be an
        `OpenSum`, which only the fused kernels take)."""
        conv = self.block[index]
        if self.conv_gemm is None:
            return conv_frames_first(conv, window)
        # The channels-last weight [C_out, C_in, k] is [C_out, k, C_in] memory: k-major rows, a view.
        weight = conv.weight.transpose(1, 2).reshape(conv.out_channels, -1)
        return self.conv_gemm(window, weight, conv.bias, open_sum=open_sum)

    def set_frames_first(self, on: bool) -> None:
        """Switch the layout; the conv weights are re-laid-out in place (same shape and values,
        channels-last strides when on), so no second copy of them is kept."""
        self.frames_first = on
        for conv in (self.block[1], self.block[6]):
            w = conv.weight.data
            conv.weight.data = w.transpose(1, 2).contiguous().transpose(1, 2) if on else w.contiguous()


def conv_frames_first(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """A valid (unpadded) Conv1d over frames-first x: [B, T, C] -> [B, T - k + 1, C_out].

    [B, T, C] memory is a [B, C, 1, T] image in channels-last layout, and a weight stored with
    channels-last strides ([C_out, k, C_in] memory) makes the 2-D conv pick a channels-last
    kernel whose output, [B, C_out, 1, T'] channels-last, is [B, T', C_out] memory again."""
    image = x.unsqueeze(1).permute(0, 3, 1, 2)  # [B, C, 1, T], channels-last strides: no copy
    out = F.conv2d(image, conv.weight.unsqueeze(2), conv.bias)
    return out.squeeze(2).transpose(1, 2)
