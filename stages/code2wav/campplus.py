"""CAM++ speaker encoder (3D-Speaker `CAMPPlus(feat_dim=80, embedding_size=192)`), torch.

Input: mean-normalised Kaldi fbank [B, T, 80] (100 frames/s, `mel.kaldi_fbank`); output: the
192-d speaker embedding [B, 192] the flow projects to 80 dims. Structure (parameter names follow
3D-Speaker so state dicts exported from it load by name):

  head (FCM): Conv2d 1->32 + BN + ReLU, 2 x 2 BasicResBlocks (freq stride 2), Conv2d (freq
    stride 2) + BN + ReLU -> [B, 32 * 80/8 = 320, T]
  xvector: TDNN 320->128 k5 stride 2 -> 3 x (CAM dense block of 12/24/16 layers, growth 32,
    bottleneck 128, k3 dilation 1/2/2 + transit halving channels) -> BN-ReLU -> mean+std pooling
    -> Linear 1024->192 + BN (no affine)

Each CAM layer gates its local conv with a context vector from the utterance mean plus
100-frame segment means (`seg_pooling`), which is what makes CAM++ "context aware".

    model = CAMPPlus(SpeakerConfig()).eval()
    emb = model(fbank[None])        # [1, 192]
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from stages.code2wav.config import SpeakerConfig

# 3D-Speaker CAM++ architecture constants (the official campplus.onnx was exported from these).
HEAD_CHANNELS = 32
INIT_CHANNELS = 128
GROWTH_RATE = 32
BN_SIZE = 4
BLOCKS = ((12, 3, 1), (24, 3, 2), (16, 3, 2))  # (layers, kernel, dilation)
SEG_LEN = 100  # frames per context segment in CAM layers


def _bn_relu(channels: int) -> nn.Sequential:
    return nn.Sequential(OrderedDict(batchnorm=nn.BatchNorm1d(channels), relu=nn.ReLU()))


class BasicResBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=(stride, 1), bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, F, T]
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class FCM(nn.Module):
    """2-D front end over (freq, time); frequency is downsampled x8."""

    def __init__(self, feat_dim: int, channels: int = HEAD_CHANNELS):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.layer1 = nn.Sequential(BasicResBlock(channels, channels, 2), BasicResBlock(channels, channels, 1))
        self.layer2 = nn.Sequential(BasicResBlock(channels, channels, 2), BasicResBlock(channels, channels, 1))
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.out_channels = channels * (feat_dim // 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, F, T] -> [B, C*F/8, T]
        out = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        out = self.layer2(self.layer1(out))
        out = F.relu(self.bn2(self.conv2(out)))
        return out.reshape(out.shape[0], out.shape[1] * out.shape[2], out.shape[3])


class TDNNLayer(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, kernel: int, stride: int):
        super().__init__()
        self.linear = nn.Conv1d(in_ch, out_ch, kernel, stride=stride, padding=(kernel - 1) // 2, bias=False)
        self.nonlinear = _bn_relu(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x))


class CAMLayer(nn.Module):
    def __init__(self, bn_ch: int, out_ch: int, kernel: int, dilation: int):
        super().__init__()
        pad = (kernel - 1) // 2 * dilation
        self.linear_local = nn.Conv1d(bn_ch, out_ch, kernel, padding=pad, dilation=dilation, bias=False)
        self.linear1 = nn.Conv1d(bn_ch, bn_ch // 2, 1)
        self.relu = nn.ReLU()
        self.linear2 = nn.Conv1d(bn_ch // 2, out_ch, 1)

    @staticmethod
    def seg_pooling(x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T] -> per-frame segment mean
        seg = F.avg_pool1d(x, kernel_size=SEG_LEN, stride=SEG_LEN, ceil_mode=True)
        shape = seg.shape
        seg = seg.unsqueeze(-1).expand(*shape, SEG_LEN).reshape(*shape[:-1], -1)
        return seg[..., : x.shape[-1]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Call order matters: `lift_campplus_state` matches ONNX Conv nodes to our convs by it.
        y = self.linear_local(x)
        context = x.mean(-1, keepdim=True) + self.seg_pooling(x)
        return y * torch.sigmoid(self.linear2(self.relu(self.linear1(context))))


class CAMDenseTDNNLayer(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, bn_ch: int, kernel: int, dilation: int):
        super().__init__()
        self.nonlinear1 = _bn_relu(in_ch)
        self.linear1 = nn.Conv1d(in_ch, bn_ch, 1, bias=False)
        self.nonlinear2 = _bn_relu(bn_ch)
        self.cam_layer = CAMLayer(bn_ch, out_ch, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))


class CAMDenseTDNNBlock(nn.ModuleList):
    """Densely connected: each layer's output is concatenated to its input."""

    def __init__(self, num_layers: int, in_ch: int, kernel: int, dilation: int):
        super().__init__()
        for i in range(num_layers):
            layer = CAMDenseTDNNLayer(in_ch + i * GROWTH_RATE, GROWTH_RATE, BN_SIZE * GROWTH_RATE, kernel, dilation)
            self.add_module(f"tdnnd{i + 1}", layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self:
            x = torch.cat([x, layer(x)], dim=1)
        return x


class TransitLayer(nn.Module):
    def __init__(self, in_ch: int, out_ch: int):
        super().__init__()
        self.nonlinear = _bn_relu(in_ch)
        self.linear = nn.Conv1d(in_ch, out_ch, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.nonlinear(x))


class StatsPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T] -> [B, 2C]
        return torch.cat([x.mean(dim=-1), x.std(dim=-1, unbiased=True)], dim=-1)


class DenseLayer(nn.Module):
    def __init__(self, in_ch: int, out_ch: int):
        super().__init__()
        self.linear = nn.Conv1d(in_ch, out_ch, 1, bias=False)
        self.nonlinear = nn.Sequential(OrderedDict(batchnorm=nn.BatchNorm1d(out_ch, affine=False)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C] -> [B, out]
        return self.nonlinear(self.linear(x.unsqueeze(-1)).squeeze(-1))


class CAMPPlus(nn.Module):
    def __init__(self, cfg: SpeakerConfig):
        super().__init__()
        self.cfg = cfg
        self.head = FCM(cfg.fbank_bins)
        channels = self.head.out_channels
        layers: OrderedDict[str, nn.Module] = OrderedDict(tdnn=TDNNLayer(channels, INIT_CHANNELS, 5, 2))
        channels = INIT_CHANNELS
        for i, (num_layers, kernel, dilation) in enumerate(BLOCKS):
            layers[f"block{i + 1}"] = CAMDenseTDNNBlock(num_layers, channels, kernel, dilation)
            channels += num_layers * GROWTH_RATE
            layers[f"transit{i + 1}"] = TransitLayer(channels, channels // 2)
            channels //= 2
        layers["out_nonlinear"] = _bn_relu(channels)
        layers["stats"] = StatsPool()
        layers["dense"] = DenseLayer(channels * 2, cfg.embedding_dim)
        self.xvector = nn.Sequential(layers)

    def forward(self, fbank: torch.Tensor) -> torch.Tensor:  # fbank: [B, T, F] -> [B, 192]
        return self.xvector(self.head(fbank.permute(0, 2, 1)))


def init_campplus_(model: CAMPPlus, seed: int) -> CAMPPlus:
    """Seeded random init (identical in every process): Kaiming-normal convs, zero biases, and
    BN running statistics drawn near (0, 1) so eval-mode BN is not a no-op."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv1d, nn.Conv2d)):
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * (2.0 / m.weight[0].numel()) ** 0.5)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.1)
                m.running_var.copy_(1.0 + torch.rand(m.running_var.shape, generator=gen) * 0.1)
    return model
