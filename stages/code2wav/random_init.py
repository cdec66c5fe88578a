"""Seeded random weights for code2wav that keep the signal alive, as trained weights do.

Why: with no checkpoint the stages run on random weights, and those weights are part of the
system under test. The modules' own initialisations erase the input: torch's default for
Linear/Conv (kaiming-uniform with a = sqrt(5), std 1/sqrt(3 fan_in)) shrinks every layer, and
HiFT's upstream HiFi-GAN init (N(0, 0.01) on every conv, a training-time choice) shrinks it far
more: at tiny dims a real mel and an all-zero mel gave audio 6e-8 apart, under one int16 step, and
the f0 predictor gave 0.3 Hz (never voiced), so the audio depended on nothing but the noise seed
(results/cpu/code2wav_sensitivity.md, decision D-INIT-1). Trained weights keep a scale through
each block; this init does the same by construction:

* every Linear / Conv1d / ConvTranspose1d: weight ~ N(0, gain^2 / fan_in), bias 0 (fan_in of a
  transposed conv = in_channels x kernel / stride: the taps that reach one output sample);
  gain sqrt(2 / (1 + slope^2)) before a leaky ReLU (HiFT's up-layers), 1 elsewhere;
* HiFT's residual branches (the second conv of each ResBlock pair) at half that scale, so three
  residual adds per block grow the stream by ~1.4x, not ~2.8x;
* the speaker projection reads a unit-norm embedding, so its weight has std 1 (an N(0, 1/192)
  weight would make the voice 14x weaker than the mel it conditions);
* the f0 predictor's last layer maps its unit-scale features to F0_MEAN_HZ +- F0_STD_HZ, so most
  frames are voiced (> nsf_voiced_threshold) and f0 follows the mel, as in speech;
* conv_post at gain CONV_POST_GAIN (the stream reaches it at ~2.5x scale) and its log-magnitude
  rows at a bias of LOG_MAGNITUDE_BIAS, so the audio of the random flow's mels (zero-mean, std
  ~1.7) sits at a speech level (rms ~0.05), inside the +-0.99 clamp. A log-mel at real speech
  levels (mean ~-5) carries a large offset through the random convs and reads louder.
Norm layers, embeddings and non-weight parameters keep their constructors' values. Everything is
drawn from one CPU generator per module tree in `named_modules` order, so every process and every
run gets the same weights for a seed. A checkpoint, when given, replaces all of it.

    flow = FlowModel(cfg); init_flow_(flow, seed=0)
    hift = HiFTGenerator(cfg.hift); fold_weight_norm(hift); init_hift_(hift, seed=1)
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.utils import parametrize

F0_MEAN_HZ = 120.0  # the f0 predictor's output centre: a speaking voice's range
F0_STD_HZ = 60.0
LOG_MAGNITUDE_BIAS = -2.0  # conv_post's magnitude rows: exp(N(-2, ~1)) keeps the audio near rms 0.1
CONV_POST_GAIN = 0.4  # the stream reaches conv_post ~2.5x its input scale (three residual stages)
RESIDUAL_BRANCH_GAIN = 0.5

_WEIGHTED = (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)


def _fan_in(module: nn.Module) -> float:
    w = module.weight
    if isinstance(module, nn.ConvTranspose1d):  # [in, out, k]: in x k / stride taps per output
        return w.shape[0] * w.shape[2] / module.stride[0]
    return float(w[0].numel())  # Linear [out, in], Conv1d [out, in, k]


def _draw(module: nn.Module, gen: torch.Generator, std: float) -> None:
    if parametrize.is_parametrized(module, "weight"):
        raise ValueError("random_init: fold weight norm first (fold_weight_norm): a parametrized weight "
                         "cannot be assigned")
    with torch.no_grad():
        module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * std)
        if module.bias is not None:
            module.bias.zero_()


def variance_preserving_(model: nn.Module, gen: torch.Generator, gains: dict[str, float] | None = None) -> None:
    """N(0, gain^2 / fan_in) weights and zero biases on every Linear/Conv/ConvTranspose below
    `model`, in `named_modules` order; `gains` maps module names to a gain other than 1."""
    gains = gains or {}
    for name, module in model.named_modules():
        if isinstance(module, _WEIGHTED):
            _draw(module, gen, gains.get(name, 1.0) / math.sqrt(_fan_in(module)))


def init_flow_(flow: nn.Module, *, seed: int) -> nn.Module:
    """The flow (encoder, CFM estimator, speaker projection) with scale-keeping weights."""
    gen = torch.Generator().manual_seed(seed)
    variance_preserving_(flow, gen)
    spk = flow.spk_embed_affine_layer
    _draw(spk, gen, 1.0)  # its input is a unit-norm embedding: std 1 keeps a unit-scale row
    return flow


def init_hift_(hift: nn.Module, *, seed: int) -> nn.Module:
    """HiFT (folded: no weight-norm parametrizations) with scale-keeping weights; see the module
    docstring for the per-layer choices."""
    gen = torch.Generator().manual_seed(seed)
    slope_gain = math.sqrt(2.0 / (1.0 + hift.cfg.lrelu_slope**2))
    gains = {f"ups.{i}": slope_gain for i in range(len(hift.ups))} | {"conv_post": CONV_POST_GAIN}
    for prefix in ("resblocks", "source_resblocks"):
        for i, block in enumerate(getattr(hift, prefix)):
            gains |= {f"{prefix}.{i}.convs2.{j}": RESIDUAL_BRANCH_GAIN for j in range(len(block.convs2))}
    variance_preserving_(hift, gen, gains)
    classifier = hift.f0_predictor.classifier
    _draw(classifier, gen, F0_STD_HZ / math.sqrt(_fan_in(classifier)))
    with torch.no_grad():
        classifier.bias.fill_(F0_MEAN_HZ)
        half = hift.cfg.istft_n_fft // 2 + 1
        hift.conv_post.bias[:half] = LOG_MAGNITUDE_BIAS
    return hift
