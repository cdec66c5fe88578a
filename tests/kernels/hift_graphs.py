"""A full-size HiFT decode run eagerly and replayed from a CUDA graph, for the HiFT kernel tests."""

from __future__ import annotations

import torch

from stages.code2wav.hift import HiFTGenerator


def decode_eager_and_replayed(hift: HiFTGenerator, mel: torch.Tensor, cache: torch.Tensor,
                              seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(eager, replayed) speech of `hift.decode` on CUDA over `mel` with the source of `seed`'s
    noise, its first samples overwritten by `cache` (as streaming does): inputs fixed and the
    noise drawn outside the graph, so a kernel that replays correctly gives equal tensors."""
    with torch.inference_mode():
        src = hift.f0_to_source(hift.f0_predictor(mel), torch.Generator(device="cuda").manual_seed(seed))
        src[:, :, : cache.shape[2]] = cache
        eager = hift.decode(mel, src)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.inference_mode():
        hift.decode(mel, src)  # warm on the side stream, as the runner's capture does
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            captured = hift.decode(mel, src)
    graph.replay()
    torch.cuda.synchronize()
    return eager, captured
