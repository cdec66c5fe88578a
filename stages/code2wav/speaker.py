"""Speaker embedding for the prompt: CAM++ on the stage device (torch) or on CPU (onnxruntime).

Seed item 2 (DESIGN.md §3): stage extra `token2wav_device_spk` (strict, default true; parsed
with the stage's options, `Code2WavOptions.device_spk`, and handed in) with env opt-out
`VLLM_OMNI_DEVICE_SPK=0`, read once at construction. true -> the torch `CAMPPlus`
on the stage device; false -> onnxruntime CPUExecutionProvider, 1 intra-op thread, ORT_ENABLE_ALL
(the upstream default). One INFO log line names the branch taken.

Where the ONNX graph comes from:
* official assets (`<weights>/assets/token2wav/campplus.onnx`): that file. Its torch twin gets
  the weights lifted from the graph by structure (`lift_campplus_state`, BN-folded convs
  included). If the graph does not have our structure, the device branch logs a warning and
  runs the ONNX graph on CPU instead of guessing.
* no assets: our seeded `CAMPPlus` is exported once with `torch.onnx.export(dynamo=False)`
  (the dynamo exporter needs onnxscript, which we do not depend on) into
  `$XDG_CACHE_HOME/tts-bench/` (default `~/.cache/tts-bench/`), keyed by a hash of the weights,
  so the CPU onnxruntime path is real without official assets.

Measured on the seeded weights, CPU fp32 (tests/stages/test_speaker.py): max |torch - onnx| is
7e-7 .. 1.1e-6 (embedding magnitude ~1-3) for 1.4-10 s inputs; the test asserts < 1e-4. The
structural lift is verified against graphs our exporter writes; the official campplus.onnx was
not available here, so a different structure there falls back to CPU onnxruntime (with a warning).

    emb = SpeakerEmbedder(cfg.speaker, device=torch.device("cpu")).embed(fbank)  # [192]
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from stages.code2wav.campplus import SEG_LEN, CAMPPlus, init_campplus_
from stages.code2wav.config import SpeakerConfig
from stages.code2wav.options import DEVICE_SPK_ENV
from stages.flags import read_env_opt_out

logger = logging.getLogger(__name__)

OFFICIAL_ONNX = Path("assets") / "token2wav" / "campplus.onnx"
ONNX_INPUT = "input"


class SpeakerWeightsError(ValueError):
    """campplus.onnx is missing, unreadable, or its weights do not fit our CAM++."""


def cache_dir() -> Path:
    """Per-user cache for derived artefacts (exported ONNX graphs)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tts-bench"


def weights_digest(module: torch.nn.Module) -> str:
    """sha256 over names, shapes and bytes of the state dict (stable across processes)."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()[:16]


def export_onnx(module: CAMPPlus, path: Path | None = None) -> Path:
    """Export CAM++ (input `input` [1, T, 80] with dynamic T) to ONNX; cached by weight hash.

    The file is written to a temp name and renamed, so concurrent replicas never read a partial
    graph.
    """
    if path is None:
        path = cache_dir() / f"campplus-{weights_digest(module)}.onnx"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    cpu = CAMPPlus(module.cfg).eval()
    cpu.load_state_dict({k: v.detach().to("cpu", torch.float32) for k, v in module.state_dict().items()})
    example = torch.zeros(1, 300, module.cfg.fbank_bins)  # only the dims matter
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=path.parent)
    os.close(fd)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
            torch.onnx.export(
                cpu, (example,), tmp, dynamo=False, input_names=[ONNX_INPUT], output_names=["embedding"],
                dynamic_axes={ONNX_INPUT: {1: "frames"}}, opset_version=17,
            )
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    logger.info("exported CAM++ to %s", path)
    return path


def onnx_session(path: Path):
    """CPU onnxruntime session with the upstream options."""
    import onnxruntime as ort  # imported lazily: only the CPU branch needs it

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def _call_order(model: CAMPPlus, fbank_bins: int) -> list[tuple[str, nn.Module]]:
    """Conv and BatchNorm modules in the order one forward pass calls them."""
    order: list[tuple[str, nn.Module]] = []
    hooks = [
        m.register_forward_hook(lambda mod, _i, _o, name=name: order.append((name, mod)))
        for name, m in model.named_modules()
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.modules.batchnorm._BatchNorm))
    ]
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, 2 * SEG_LEN, fbank_bins))
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    return order


def _graph_constants(graph) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    consts = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    consts[node.output[0]] = numpy_helper.to_array(attr.t)
        elif node.op_type == "Identity" and node.input[0] in consts:
            # The exporter deduplicates equal initializers (e.g. zero biases) into Identity nodes.
            consts[node.output[0]] = consts[node.input[0]]
    return consts


def lift_campplus_state(path: Path, model: CAMPPlus) -> dict[str, torch.Tensor]:
    """Lift CAM++ weights out of an ONNX graph by structure, not by name.

    The TorchScript exporter folds a BatchNorm that directly follows a conv into that conv
    (weights renamed `onnx::Conv_N`, a bias appears), so names alone do not identify weights.
    Conv nodes are matched to our convs in call order; a conv that gained a bias had its
    following BatchNorm folded in, which we then set to a pure bias (mean = -b, var = 1 - eps);
    the remaining BatchNormalization nodes match our other BNs in call order. Any count or shape
    mismatch raises SpeakerWeightsError (the caller then keeps the ONNX graph on CPU).
    """
    import onnx

    def fail(what: str) -> SpeakerWeightsError:
        return SpeakerWeightsError(
            f"error: cannot lift CAM++ weights from the ONNX graph ({path}): {what}; "
            "set token2wav_device_spk: false to run that graph on CPU onnxruntime"
        )

    graph = onnx.load(str(path)).graph
    consts = _graph_constants(graph)
    conv_nodes = [n for n in graph.node if n.op_type == "Conv"]
    bn_nodes = [n for n in graph.node if n.op_type == "BatchNormalization"]
    order = _call_order(model, model.cfg.fbank_bins)
    convs = [(i, name, m) for i, (name, m) in enumerate(order) if isinstance(m, (nn.Conv1d, nn.Conv2d))]
    if len(conv_nodes) != len(convs):
        raise fail(f"{len(conv_nodes)} Conv nodes, our CAM++ has {len(convs)}")
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def put(key: str, value) -> None:
        value = torch.as_tensor(np.array(value, dtype=np.float32, copy=True))
        if tuple(value.shape) != tuple(state[key].shape):
            raise fail(f"{key} has shape {tuple(value.shape)}, expected {tuple(state[key].shape)}")
        state[key] = value

    folded: set[str] = set()
    for node, (i, name, conv) in zip(conv_nodes, convs):
        put(f"{name}.weight", consts[node.input[1]])
        bias = consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        if conv.bias is not None:
            if bias is None:
                raise fail(f"{name} has no bias in the graph")
            put(f"{name}.bias", bias)
        elif bias is not None:  # its BatchNorm was folded in: keep only the bias
            bn_name, bn = order[i + 1] if i + 1 < len(order) else (None, None)
            if not isinstance(bn, nn.modules.batchnorm._BatchNorm):
                raise fail(f"{name} carries a bias but no BatchNorm follows it in our model")
            folded.add(bn_name)
            put(f"{bn_name}.running_mean", -bias)
            put(f"{bn_name}.running_var", np.full_like(bias, 1.0 - bn.eps))
            if bn.affine:
                put(f"{bn_name}.weight", np.ones_like(bias))
                put(f"{bn_name}.bias", np.zeros_like(bias))
    bns = [(name, m) for name, m in order if isinstance(m, nn.modules.batchnorm._BatchNorm) and name not in folded]
    if len(bn_nodes) != len(bns):
        raise fail(f"{len(bn_nodes)} BatchNormalization nodes, expected {len(bns)} after folding")
    for node, (name, bn) in zip(bn_nodes, bns):
        scale, shift, mean, var = (consts[x] for x in node.input[1:5])
        if bn.affine:
            put(f"{name}.weight", scale)
            put(f"{name}.bias", shift)
        put(f"{name}.running_mean", mean)
        put(f"{name}.running_var", var)
    return state


class SpeakerEmbedder:
    """fbank [T, 80] -> 192-d speaker embedding (float32, on `device`), by the selected branch."""

    def __init__(
        self,
        cfg: SpeakerConfig,
        *,
        device: torch.device,
        device_spk: bool = True,
        weights_dir: str | None = None,
        init_seed: int = 0,
    ):
        """`device_spk`: the parsed stage flag (`Code2WavOptions.device_spk`); the environment's
        opt-out and weights that cannot be lifted to torch can still put the embedding on the CPU."""
        self.cfg = cfg
        self.device = torch.device(device)
        want_device = device_spk and not read_env_opt_out(DEVICE_SPK_ENV)
        official = self._official_onnx(weights_dir)
        self._module: CAMPPlus | None = None
        self._session = None
        model = CAMPPlus(cfg).eval()
        if official is None:
            init_campplus_(model, init_seed)
        elif want_device:
            try:
                model.load_state_dict(lift_campplus_state(official, model))
            except SpeakerWeightsError as exc:
                logger.warning("%s", exc)
                want_device = False
        if want_device:
            self._module = model.to(self.device)
            self.branch = f"device-torch ({self.device.type})"
        else:
            self._session = onnx_session(official if official is not None else export_onnx(model))
            self.branch = "cpu-onnxruntime"
        source = str(official) if official else f"seeded CAM++ (seed {init_seed})"
        logger.info("speaker embedding: %s branch, weights from %s", self.branch, source)

    @staticmethod
    def _official_onnx(weights_dir: str | None) -> Path | None:
        if weights_dir is None:
            return None
        path = Path(weights_dir) / OFFICIAL_ONNX
        if not path.is_file():
            raise SpeakerWeightsError(
                f"error: speaker model not found ({path}); the official layout has "
                f"{OFFICIAL_ONNX} under the model directory"
            )
        return path

    @property
    def on_device(self) -> bool:
        return self._module is not None

    @torch.inference_mode()
    def embed(self, fbank: torch.Tensor) -> torch.Tensor:  # fbank: [T, 80] -> [192]
        if self._module is not None:
            x = fbank.to(self.device, torch.float32)[None]
            return self._module(x)[0]
        feed = {self._session.get_inputs()[0].name: fbank.detach().to("cpu", torch.float32)[None].numpy()}
        out = self._session.run(None, feed)[0]
        return torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(-1)).to(self.device)
