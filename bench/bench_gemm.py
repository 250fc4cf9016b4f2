"""Skinny matmuls of the Qwen3-8B (or 30B-A3B, Qwen3.5-27B) shapes: the XLA dot against ddtree_jax.kernels.matmul.

    python3 -m bench.bench_gemm --out DIR                       # GPU: rows 1,16,65 x 8B shapes
    python3 -m bench.bench_gemm --model qwen3-30b-a3b --out DIR   # the 30B-A3B's dense products
    python3 -m bench.bench_gemm --small --budget-s 60           # CPU smoke run (interpret mode)

Every variant runs in a jitted chain over several copies of the weight, the copies holding
>= --cold-mb together, so each call reads its weight from HBM as the layers of a forward do
(the H200's L2 is 50 MB). Call l's output, cut or tiled to K columns, is call l+1's input (one
small fusion between calls, the same for every variant; none when N = K; with the swiglu
prologue it also rescales the rows, or the values square call after call and overflow). Figures
per variant: device (all kernels of the chain per call, from a profiler trace: the GEMM and the
small fusion; what the table and the plot rank by), kernel (the chain's costliest kernel name
per call: only meaningful where every call runs a kernel of one name, as the Pallas kernel and
cuBLAS's nvjet_* do; XLA names its own gemm fusions once per call) and wall (the chain's time /
calls, median of --reps: it includes one host dispatch and sync per chain, ~50-200 us, split over
only 2-16 calls for the large shapes, so it is not a GEMM time, and ranking by it picks the
wrong configs). Bytes floor: the weight bytes / 3.3e12 B/s (the plain JAX copy rate on the H200) and TB/s
achieved (from the device figure).

Shapes: the projections of one layer (qkv, o, gate_up, down); down_swiglu (the down projection
from the gate_up output: XLA's silu*mul fusion + dot against the kernel's swiglu prologue);
qkv_norm and gate_up_norm (the product of the RMSNorm of x: XLA's norm + dot against the
kernel's norm prologue); the LM head (float32 logits); the drafter's k/v (one layer's), ctx_kv (the 5
layers' context k/v in one product, drafters.dflash.fuse_params) and fc; NAME_int8: the
same with int8 weights (a quantized drafter's; bytes floor at 1 byte a weight). Variants: "xla"
(what `layers.linear` runs), "xla:OPTION=VALUE" (the same with an XLA option, e.g.
xla_gpu_exhaustive_tiling_search=true), "pallas" (default_matmul_config) and
"pallas:BNxBKxWxSxSPLIT[xTAIL[xSWAP[xROWTILE]]]" configs (block_n, block_k, num_warps, num_stages,
split_k, tail_rows 1/0, swap_ab 1/0, row_tile: ddtree_jax.kernels.matmul.MatmulConfig's fields in
order), and "det" (the deterministic mode's product, matmul.deterministic_config); --sweep
adds variants for the --sweep-rows and --sweep-shapes only.
Results go to DIR/bench_gemm.json, rewritten after every row. ``--write-table FILE`` then merges
the winners into a tuned table (ddtree_jax/kernels/matmul_configs.json's format: per device kind, the
best kernel config per shape and row range where it beat XLA's dot by more than --min-gain on
the device figure), which ``impl="auto"`` reads; see ``table_entries`` for the row ranges.
``--against xla:OPTION=VALUE`` ranks against XLA's dot compiled with that option instead, and the
entries then carry it (``xla_options``: they apply only in executables with it, such as the
split-K-1 round executables). A table entry is a candidate, not a verdict: check it end to end
(bench_round --matmul-impl auto,xla) before committing it; wins timed in isolation have made the
8B round slower.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench.bench_round import xla_options
from bench.plots import time_us
from ddtree_jax.kernels import matmul as mm

HBM_BPS = 3.3e12
SHAPES_8B = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096),
             "down_swiglu": (12288, 4096), "qkv_norm": (4096, 6144), "gate_up_norm": (4096, 24576),
             "lm_head": (4096, 151936), "drafter_kv": (4096, 2048),
             "fc": (20480, 4096), "ctx_kv": (4096, 10240)}
# Qwen3-30B-A3B's dense products (its experts run grouped: bench round --moe-experts)
SHAPES_30B_A3B = {"qkv": (2048, 5120), "qkv_norm": (2048, 5120), "o": (4096, 2048), "lm_head": (2048, 151936)}
# Qwen3.5-27B's products in the hybrid inference layout (models.hybrid.fuse_layer): the GDN layers'
# in_proj (qkv | z | b | a: 2 x 16 x 128 + 48 x 128 + 48 x 128 + 2 x 48) and out, the attention
# layers' qg | k | v (24 heads of [query | gate] 256, 4 kv heads of 256) and o, the MLP
SHAPES_27B = {"in_proj": (5120, 16480), "gdn_out": (6144, 5120), "qgkv": (5120, 14336), "o": (6144, 5120),
              "gate_up": (5120, 34816), "down_swiglu": (17408, 5120), "lm_head": (5120, 248320)}
SHAPE_SETS = {"qwen3-8b": SHAPES_8B, "qwen3-30b-a3b": SHAPES_30B_A3B, "qwen3.5-27b": SHAPES_27B}
# --shapes by default: a layer's products as the model's forward runs them, and its LM head
DEFAULT_SHAPES = {"qwen3-8b": "qkv,o,gate_up,down,lm_head", "qwen3-30b-a3b": "qkv_norm,o,lm_head",
                  "qwen3.5-27b": ",".join(SHAPES_27B)}
SMALL = {"qkv": (256, 384), "down": (512, 128), "down_swiglu": (128, 64), "qkv_norm": (128, 192),
         "o_int8": (128, 128)}


def prologue_of(shape: str) -> str | None:
    """down_swiglu[_int8] -> "swiglu", NAME_norm[_int8] -> "rmsnorm" (the product of the RMSNorm of x)."""
    base = shape.removesuffix("_int8")
    return "swiglu" if base.endswith("swiglu") else "rmsnorm" if base.endswith("_norm") else None


def parse_variant(v: str):
    """'xla' | 'xla:K=V' | 'pallas' | 'pallas:64x128x4x4x1' | 'det' -> (kind, options or MatmulConfig|None)."""
    kind, _, rest = v.partition(":")
    if v == "det":
        return "det", None
    if kind == "xla":
        return "xla", (xla_options([rest]) if rest else None)
    if kind == "pallas":
        if not rest:
            return "pallas", None
        return "pallas", mm.MatmulConfig(*(int(x) for x in rest.split("x")))
    raise SystemExit(f"unknown variant {v!r}: xla, xla:OPTION=VALUE, pallas, pallas:BNxBKxWxSxSPLIT[xTAIL[xSWAP[xROWTILE]]] "
                     "or det")


def bucket(m: int) -> tuple[int, int]:
    """The rows that share m's row tile (16, 32, 64 or 128 rows)."""
    hi = max(16, 1 << max(0, (m - 1).bit_length()))
    return (1 if hi == 16 else hi // 2 + 1), hi


def table_entries(rows: list[dict], min_gain: float, against: str = "xla") -> list[dict]:
    """Table entries from measured rows: per shape and measured M, the fastest kernel config if it
    beat the `against` variant ("xla", or "xla:OPTION=VALUE": XLA's dot in an executable with that
    option, whose entries then carry it as `xla_options` and apply only there) by more than
    min_gain (a fraction). An entry covers the rows of M's row tile from the next smaller measured
    M in that tile (exclusive) up to the tile's end if M is the largest measured there, else up to
    M: measured M = 1, 16, 65 give [1, 1], [2, 16], [65, 128]."""
    kind, options = parse_variant(against)
    if kind != "xla":
        raise SystemExit(f"--against {against!r}: an xla or xla:OPTION=VALUE variant")
    out = []
    for (shape, k, n) in sorted({(r["shape"], r["k"], r["n"]) for r in rows}):
        mine = [r for r in rows if r["shape"] == shape]
        ms = sorted({r["m"] for r in mine})
        for m in ms:
            xla = [time_us(r) for r in mine if r["m"] == m and r["variant"] == against]
            ker = [r for r in mine if r["m"] == m and r.get("config") and r["variant"].startswith("pallas")]
            if not xla or not ker:
                continue
            best = min(ker, key=time_us)
            if time_us(best) >= xla[0] * (1.0 - min_gain):
                continue
            lo, hi = bucket(m)
            same = [x for x in ms if bucket(x) == (lo, hi)]
            below = [x for x in same if x < m]
            entry = dict(k=k, n=n, rows=[max(below) + 1 if below else lo, hi if m == max(same) else m],
                         config=best["config"], us=round(time_us(best), 2), xla_us=round(xla[0], 2),
                         shape=shape, measured_m=m)
            if prologue_of(shape):
                entry["prologue"] = prologue_of(shape)
            if shape.endswith("_int8"):
                entry["weight"] = "int8"
            if options:
                entry["xla_options"] = options
            out.append(entry)
    return out


def summary_table(rows: list[dict]) -> str:
    """Markdown: per shape and M, XLA's time (time_us: device time where traced), the best kernel
    variant's, their ratio and the kernel's TB/s (what RESULTS.md records)."""
    lines = ["| shape | M | bytes floor us | XLA us | best kernel | kernel us | XLA / kernel | kernel TB/s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for shape, m in sorted({(r["shape"], r["m"]) for r in rows}, key=lambda sm: (sm[1] != 65, sm)):
        mine = [r for r in rows if r["shape"] == shape and r["m"] == m]
        xla = next((r for r in mine if r["variant"] == "xla"), None)
        ker = [r for r in mine if r.get("config")]
        best = min(ker, key=time_us) if ker else None
        cells = [shape, str(m), f"{mine[0]['floor_us']:.1f}", f"{time_us(xla):.1f}" if xla else "-",
                 best["variant"] if best else "-", f"{time_us(best):.1f}" if best else "-",
                 f"{time_us(xla) / time_us(best):.2f}" if xla and best else "-",
                 f"{best['tbps']:.2f}" if best else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_table(path: Path, device: str, entries: list[dict]) -> None:
    """Merge entries into the table at path: this device's entries for the same shapes are replaced."""
    table = json.loads(path.read_text()) if path.exists() else {}

    def key(e):
        return e["k"], e["n"], e.get("prologue"), e.get("weight"), tuple(sorted(e.get("xla_options", {}).items()))

    shapes = {key(e) for e in entries}
    kept = [e for e in table.get(device, []) if key(e) not in shapes]
    table[device] = sorted(kept + entries, key=lambda e: (e["k"], e["n"], e["rows"][0]))
    path.write_text(json.dumps(table, indent=1) + "\n")


def chain_fn(k: int, n: int, impl: str, cfg, out_dtype, prologue=None):
    """Call l+1's input from call l's output: cut or tiled to the K (2K with the swiglu prologue:
    the down projection from a gate_up output) columns x has."""
    kx = 2 * k if prologue == "swiglu" else k
    norm_w = jnp.full((k,), 1.1, jnp.bfloat16) if prologue == "rmsnorm" else None

    def step(x, w):
        y = mm.matmul(x, w, impl=impl, config=cfg, out_dtype=out_dtype, prologue=prologue,
                      norm_w=None if norm_w is None else norm_w.astype(x.dtype)).astype(x.dtype)
        if prologue == "swiglu":  # silu(g) * u squares the values: rescale the rows, or they overflow
            yf = y.astype(jnp.float32)
            y = (yf * jax.lax.rsqrt(jnp.mean(yf * yf, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)
        if n == kx:
            return y
        return y[:, :kx] if n > kx else jnp.tile(y, (1, -(-kx // n)))[:, :kx]

    def chain(x, ws):
        for w in ws:
            x = step(x, w)
        return x

    return chain


def kernel_us(fn, args, calls: int) -> tuple[float, float, str]:
    """From a trace of one chain: (device time of all its kernels per call, the device time per
    call of its costliest kernel name, that name)."""
    from bench.profile_round import kernel_summary, traced_events

    t = kernel_summary(traced_events(lambda: jax.block_until_ready(fn(*args))), calls)
    if not t:
        return float("nan"), float("nan"), ""
    name, us = next(iter(t["kernels_us"].items()))
    return t["busy_us"], us, name[:60]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_gemm", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16,65", help="M values (rows of x)")
    ap.add_argument("--model", default="qwen3-8b", choices=tuple(SHAPE_SETS), help="whose shapes --shapes names")
    ap.add_argument("--shapes", default=None,
                    help="; ".join(f"{m}: of {','.join(SHAPE_SETS[m])}, default {d}" for m, d in DEFAULT_SHAPES.items()))
    ap.add_argument("--variants", default="xla,pallas", help="comma-separated, see the module doc")
    ap.add_argument("--sweep", default="", help="extra variants tried at --sweep-rows only")
    ap.add_argument("--sweep-rows", default="65")
    ap.add_argument("--sweep-shapes", default="", help="shapes the sweep runs on (default: all)")
    ap.add_argument("--cold-mb", type=float, default=400.0, help="weight copies per chain hold at least this")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--trace", default="all", choices=("base", "all", "none"),
                    help="which variants get the profiler's device time (a trace costs ~1 s); the "
                         "others are ranked by their wall time, which is not comparable")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--small", action="store_true", help="tiny shapes, interpret mode (CPU smoke run)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--write-table", default=None, metavar="FILE",
                    help="merge the winners into this tuned table (e.g. ddtree_jax/kernels/matmul_configs.json)")
    ap.add_argument("--min-gain", type=float, default=0.03, help="a kernel enters the table if this much faster")
    ap.add_argument("--against", default="xla", metavar="VARIANT",
                    help="the XLA variant a kernel must beat for --write-table: xla, or xla:OPTION=VALUE (the "
                         "entries then apply only in executables with that option, e.g. the split-K-1 rounds)")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    dtype = jnp.dtype(args.dtype)
    shapes = dict(SMALL) if args.small else {}
    known = SHAPE_SETS[args.model]
    for name in ([] if args.small else [s for s in (args.shapes or DEFAULT_SHAPES[args.model]).split(",") if s]):
        base = name.removesuffix("_int8")
        if base not in known:
            raise SystemExit(f"unknown {args.model} shape {name!r}: one of {', '.join(known)}, each also as NAME_int8")
        shapes[name] = known[base]
    rows = [int(r) for r in args.rows.split(",") if r]
    sweep_rows = {int(r) for r in args.sweep_rows.split(",") if r}
    sweep_shapes = {x for x in args.sweep_shapes.split(",") if x}
    base = [v for v in args.variants.split(",") if v]
    extra = [v for v in args.sweep.split(",") if v]
    pallas_impl = "pallas_interpret" if args.small else "pallas"
    result = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, dtype=args.dtype, rows=[], errors=[])
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    print(f"{'shape':8s} {'M':>4s} {'variant':28s} {'wall us':>8s} {'device us':>9s} {'kernel us':>9s} {'floor':>6s} "
          f"{'TB/s':>5s}  kernel")
    key = jax.random.key(0, impl="unsafe_rbg") if not args.small else jax.random.key(0)
    weights = {}  # every shape's copies up front: the rows loop is outermost (the first rows matter most)
    for sname, (k, n) in shapes.items():
        int8 = sname.endswith("_int8")
        wbytes = k * n * (1 if int8 else dtype.itemsize)
        copies = 1 if args.small else max(2, min(16, int(-(-args.cold_mb * 1e6 // wbytes))))
        draw = [jax.random.normal(jax.random.fold_in(key, i), (k, n), jnp.float32) * 0.02 for i in range(copies)]
        weights[sname] = [mm.quantize_int8(w) if int8 else w.astype(dtype) for w in draw]
        del draw
        jax.block_until_ready(weights[sname])
    for m in rows:
        for sname, (k, n) in shapes.items():
            ws = weights[sname]
            copies = len(ws)
            int8 = sname.endswith("_int8")
            wbytes = k * n * (1 if int8 else dtype.itemsize)
            out_dtype = jnp.float32 if sname.startswith("lm_head") else dtype
            prologue = prologue_of(sname)
            x = jax.random.normal(jax.random.fold_in(key, 999), (m, 2 * k if prologue == "swiglu" else k),
                                  jnp.float32).astype(dtype)
            swept = m in sweep_rows and (not sweep_shapes or sname in sweep_shapes)
            for v in base + (extra if swept else []):
                if time.perf_counter() - t_start > args.budget_s:
                    result["errors"].append(f"budget: stopped before {sname} M={m} {v}")
                    break
                kind, opt = parse_variant(v)
                impl = "xla" if kind == "xla" else pallas_impl
                if kind == "det":  # the deterministic mode's product (its config is the shape's alone)
                    kind, opt = "pallas", mm.deterministic_config(k, n)
                if kind == "pallas" and opt is None:  # explicit, so a tuned table cannot change it
                    opt = mm.default_matmul_config(m, k, n)
                try:
                    fn = jax.jit(chain_fn(k, n, impl, opt if kind == "pallas" else None, out_dtype, prologue))
                    lowered = fn.lower(x, ws)
                    comp = lowered.compile(compiler_options=opt if kind == "xla" else None)
                    ref = jax.block_until_ready(comp(x, ws))
                    if not np.isfinite(np.asarray(ref, np.float32)).all():
                        raise FloatingPointError("non-finite output")
                    times = []
                    for _ in range(args.reps):
                        t0 = time.perf_counter()
                        jax.block_until_ready(comp(x, ws))
                        times.append((time.perf_counter() - t0) * 1e6 / copies)
                    wall = statistics.median(times)
                    traced = not args.small and (args.trace == "all" or (args.trace == "base" and v in base))
                    dus, kus, kname = kernel_us(comp, (x, ws), copies) if traced else (float("nan"),) * 2 + ("",)
                except Exception as e:  # a config that does not compile is a result, not a crash
                    result["errors"].append(f"{sname} M={m} {v}: {type(e).__name__}: {str(e)[:300]}")
                    print(f"{sname:8s} {m:4d} {v:28s} FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                floor = wbytes / HBM_BPS * 1e6
                row = dict(shape=sname, k=k, n=n, m=m, variant=v, wall_us=wall, device_us=dus, kernel_us=kus,
                           kernel=kname, floor_us=floor, copies=copies,
                           config=(list(dataclasses.astuple(opt)) if kind == "pallas" and opt else None))
                row["tbps"] = wbytes / time_us(row) / 1e6
                result["rows"].append(row)
                print(f"{sname:8s} {m:4d} {v:28s} {wall:8.1f} {dus:9.1f} {kus:9.1f} {floor:6.1f} {row['tbps']:5.2f}  {kname}",
                      flush=True)
                if out:
                    (out / "bench_gemm.json").write_text(json.dumps(result, indent=1))
    del weights
    print(summary_table(result["rows"]))
    if out and result["rows"]:
        try:
            from bench.plots import gemm_bandwidth
        except ImportError as e:  # matplotlib is not on every device image
            print(f"[bench_gemm] no plot ({e})")
        else:
            print(f"[bench_gemm] plot: {gemm_bandwidth(result, out / 'gemm_bandwidth.png')}")
    print(f"[bench_gemm] done in {time.perf_counter() - t_start:.0f}s; {len(result['errors'])} errors")
    for e in result["errors"]:
        print("  ", e)
    if args.write_table:
        entries = table_entries(result["rows"], args.min_gain, args.against)
        write_table(Path(args.write_table), result["device"], entries)
        print(f"[bench_gemm] {len(entries)} table entries for {result['device']} -> {args.write_table}")
        for e in entries:
            print(f"   {e['shape']:8s} rows {e['rows']} config {e['config']}: {e['us']:.1f} us vs XLA {e['xla_us']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
