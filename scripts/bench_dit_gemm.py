"""The DiT's linears, one GEMM at a time: cuBLAS fp32 / cuBLAS TF32 against the Triton GEMM
(`stages.code2wav.dit_gemm`) with 3xTF32 products (its table's tile and k-split, and the same
tile unsplit), for every tile in a sweep; and each one's error against an fp64 GEMM of the same
operands.

Shapes are the DiT's (spec §4.4: hidden 512, MLP 2048, q|k|v fused to 1536, in 320, out 80) at
row counts 2 x requests x 50 frames. Times are `triton.testing.do_bench` medians (cold L2 between
calls: the DiT's 458 MB of weights never stay in a 50 MB L2 from one block to the next). The
error is max |y - y64| / max |y64| with x ~ N(0, 1) and nn.Linear's default init.

    PYTHONPATH=. python3 scripts/bench_dit_gemm.py --rows 100,800,6400 --out $OUT
    PYTHONPATH=. python3 scripts/bench_dit_gemm.py --rows 100 --sweep none   # the table's tiles only

The last stdout line is one JSON document; a fixed-width table precedes it.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch

from scripts._report import add_out, emit
from stages.platform import device_name, tf32_scope

# (name, N, K, gelu): the DiT's linears; every one has a bias.
SHAPES = [("qkv", 1536, 512, False), ("proj", 512, 512, False), ("fc1", 2048, 512, True),
          ("fc2", 512, 2048, False), ("in_proj", 512, 320, False), ("final", 80, 512, False)]


def _sweep_tiles(kind: str):
    from stages.code2wav.dit_gemm import Tile

    if kind == "none":
        return []
    tiles = [Tile(m, n, 32, 4, 3) for m, n in itertools.product((16, 32, 64, 128), (32, 64, 128))]
    tiles += [Tile(32, 32, 64, 4, 3), Tile(64, 64, 64, 4, 3), Tile(32, 64, 32, 4, 4), Tile(64, 64, 32, 4, 4),
              Tile(128, 64, 32, 8, 3), Tile(128, 128, 32, 8, 3), Tile(64, 128, 32, 8, 3), Tile(16, 64, 64, 4, 4)]
    return tiles


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.double() - ref).abs().max() / ref.abs().max()).item()


def _cublas(x, w, b, gelu: bool, tf32: bool):
    def call():
        with tf32_scope(x.device, tf32):
            y = torch.nn.functional.linear(x, w, b)
            return torch.nn.functional.gelu(y, approximate="tanh") if gelu else y
    return call


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="100,400,800,1600,3200,6400", help="GEMM row counts (2 x requests x 50)")
    ap.add_argument("--sweep", default="tiles", choices=("tiles", "none"), help="time every sweep tile too")
    ap.add_argument("--device", default="cuda")
    add_out(ap)
    args = ap.parse_args()
    import triton.testing

    from stages.code2wav import dit_gemm

    device = torch.device(args.device)
    torch.manual_seed(0)
    results = []
    print(f"{'shape':8} {'rows':>5} {'cublas':>8} {'tf32':>8} {'3xtf32':>8} {'split':>5} {'unsplit':>8} {'best':>8}"
          "  best tile / errors "
          "(fp32, tf32, 3xtf32)", file=sys.stderr)
    for (name, n, k, gelu), rows in itertools.product(SHAPES, [int(r) for r in args.rows.split(",")]):
        lin = torch.nn.Linear(k, n, device=device)
        w, b = lin.weight.detach(), lin.bias.detach()
        x = torch.randn(rows, k, device=device)
        ref = torch.nn.functional.linear(x.double(), w.double(), b.double())
        if gelu:
            ref = torch.nn.functional.gelu(ref, approximate="tanh")
        row = {"shape": name, "n": n, "k": k, "rows": rows, "gelu": gelu}
        for arm, tf32 in (("cublas_fp32", False), ("cublas_tf32", True)):
            call = _cublas(x, w, b, gelu, tf32)
            row[f"{arm}_ms"] = triton.testing.do_bench(call, return_mode="median")
            row[f"{arm}_err"] = _rel_err(call(), ref)
        table = dit_gemm.tile_for(rows)
        for prec in ("tf32x3", "ieee"):
            call = lambda prec=prec: dit_gemm.linear(x, w, b, gelu=gelu, precision=prec)  # noqa: E731
            row[f"triton_{prec}_ms"] = triton.testing.do_bench(call, return_mode="median")
            row[f"triton_{prec}_err"] = _rel_err(call(), ref)
        row["table_tile"] = list(vars(table).values())
        row["table_split_k"] = dit_gemm.split_for(rows, n, k, table)
        call = lambda: dit_gemm.linear(x, w, b, gelu=gelu, split_k=1)  # noqa: E731 - the k-sum unsplit
        row["triton_tf32x3_unsplit_ms"] = triton.testing.do_bench(call, return_mode="median")
        sweep = {}
        for tile in _sweep_tiles(args.sweep):
            call = lambda tile=tile: dit_gemm.linear(x, w, b, gelu=gelu, tile=tile)  # noqa: E731
            try:
                sweep[",".join(map(str, vars(tile).values()))] = triton.testing.do_bench(call, return_mode="median")
            except Exception as exc:  # a tile the compiler refuses (shared memory) is skipped, named
                sweep[",".join(map(str, vars(tile).values()))] = f"{type(exc).__name__}"
        timed = {t: ms for t, ms in sweep.items() if isinstance(ms, float)}
        best = min(timed, key=timed.get) if timed else None
        row["sweep_ms"] = sweep
        row["best_tile"], row["best_ms"] = best, timed.get(best)
        results.append(row)
        print(f"{name:8} {rows:5d} {row['cublas_fp32_ms'] * 1e3:7.1f}u {row['cublas_tf32_ms'] * 1e3:7.1f}u "
              f"{row['triton_tf32x3_ms'] * 1e3:7.1f}u {row['table_split_k']:5d} "
              f"{row['triton_tf32x3_unsplit_ms'] * 1e3:7.1f}u {(row['best_ms'] or 0) * 1e3:7.1f}u  {best} / "
              f"{row['cublas_fp32_err']:.1e} {row['cublas_tf32_err']:.1e} {row['triton_tf32x3_err']:.1e}",
              file=sys.stderr)
    doc = {"device": device_name(device), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "results": results}
    emit(doc, args.out, "dit_gemm_bench")
    return 0


if __name__ == "__main__":
    sys.exit(main())
