"""Real-size checkpoints: convert's and generate's time and peak host memory, cold start with cache cold and warm.

    python -m bench checkpoint --model qwen3-8b --work /tmp/ckpt-bench --out DIR
    python -m bench checkpoint --model qwen3-30b-a3b --skip-convert --out DIR   # 57 GiB: HF-direct only
    python -m bench checkpoint --model qwen3-30b-a3b --ckpt-dir /dev/shm/c --out DIR  # the copy elsewhere
    python -m bench checkpoint --model qwen3-30b-a3b --zeros --skip-generate --out DIR  # convert's memory, any host
    python -m bench checkpoint --model tiny --out DIR          # CPU smoke run (a few MB; tiny-moe: MoE)

Steps, one progress line each:
  1. the shape: --model qwen3-8b is bench round's (Qwen3-8B: 36 layers, hidden 4096, vocab 151936,
     untied; a 5-layer z-lab DFlash drafter of block 16 tapping [1, 9, 17, 25, 33]); qwen3-30b-a3b
     bench round's Qwen3-30B-A3B (Qwen3MoeForCausalLM, 128 experts a layer stored per expert, as the
     hub has them); tiny and tiny-moe are bench round's with the shipped tokenizer's vocab (its ids
     must be valid tokens).
  2. random bf16 Hugging Face directories in --work: the target in shards of about --shard-gb GB with
     model.safetensors.index.json (as the hub has them) and the shipped tokenizer; the drafter in one
     file. One shard is in memory at a time; a complete directory of the same spec is reused.
     --zeros: the files hold zeros as holes (no disk blocks), for convert's memory at a size the
     disk cannot hold twice; its time against the disk is then not judged.
  3. the disk's reference speed: the target's shards copied to one file beside the converted
     checkpoint's place (fsync'ed, as convert does) and read back; bytes read + written per
     second (--skip-convert: the first shard alone).
  4. python -m convert in a subprocess (a kept converted checkpoint is reused unless --reconvert).
  5. python -m ddtree_jax.generate --ckpt with a fresh DDTREE_COMPILE_CACHE (cold), the same again
     (warm), then --target --draft on the HF directories (warm). --skip-convert: steps 4 and 5's
     --ckpt commands are left out (a 64 GiB disk holds the 30B-A3B's HF files once, not a converted
     copy too) and the HF command runs cold; --skip-generate leaves step 5 out (convert needs no
     accelerator: a host that cannot run the shape still measures it). generate's closing line gives load,
     compile and first-token seconds (from the process's start) and, where the backend reports it,
     the device's peak memory.
  6. DIR/checkpoint_MODEL.json (rewritten after every step) and a table with the targets: convert's
     peak RSS against 2 GiB + 3x the largest tensor, generate's against 2 GiB + 2x, convert's time
     against (bytes read + written) / the disk's speed, the warm command's first token against 15 s.
Every command: wall time, peak RSS (wait4's ru_maxrss), rc, its output in DIR/log_NAME.txt. The HF
directories and the converted checkpoint are deleted at the end unless --keep. A failed command is
recorded (rc, last log line), the rest still run, and the exit code is 1.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import ml_dtypes
import numpy as np

from ddtree_jax.errors import ArgumentParser, UserError, cli_main

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "ddtree-jax-checkpoint/1"
MODELS = ("qwen3-8b", "qwen3-30b-a3b", "tiny", "tiny-moe")
TOKENIZER = ROOT / "ddtree_jax" / "default_model" / "tokenizer"
MARKER = ".bench_complete.json"
GIB = 2**30
MIB = 2**20
POOL = 1 << 24  # random values every tensor is cut from (32 MiB a scale): memcpy speed, not RNG speed
COLD_START_TARGET_S = 15.0


def log(line: str) -> None:
    print(f"[checkpoint] {line}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- shapes


def shape_of(model: str) -> dict:
    """bench round's shape of `model` (tiny, tiny-moe: with the shipped tokenizer's vocab); "moe"
    for a mixture-of-experts target."""
    from bench.bench_round import SHAPES

    s = SHAPES[model]
    target = dict(s["target"])
    if model.startswith("tiny"):  # prompt ids come from the shipped tokenizer: every one must be a token
        target["vocab_size"] = SHAPES["shipped"]["target"]["vocab_size"]
    return dict(target=target, drafter=dict(s["drafter"]), theta=s["theta"],
                **({"moe": dict(s["moe"])} if "moe" in s else {}))


def hf_configs(shape: dict) -> tuple[dict, dict]:
    """config.json of the Qwen3 (or Qwen3-MoE) target and of its z-lab DFlash drafter."""
    t, d = shape["target"], shape["drafter"]
    gen = json.loads((TOKENIZER / "generation_config.json").read_text())
    target = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": gen.get("bos_token_id"), "eos_token_id": gen.get("eos_token_id"),
        "head_dim": t["head_dim"], "hidden_act": "silu", "hidden_size": t["hidden_size"],
        "initializer_range": 0.02, "intermediate_size": t["intermediate_size"],
        "max_position_embeddings": t["max_position"], "max_window_layers": t["num_layers"],
        "num_attention_heads": t["num_heads"], "num_hidden_layers": t["num_layers"],
        "num_key_value_heads": t["num_kv_heads"], "rms_norm_eps": 1e-6, "rope_scaling": None,
        "rope_theta": shape["theta"], "sliding_window": None, "tie_word_embeddings": t["tie_embeddings"],
        "torch_dtype": "bfloat16", "dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
        "vocab_size": t["vocab_size"],
    }
    moe = shape.get("moe")
    if moe:  # Qwen3-30B-A3B's config.json: every layer sparse
        target.update({
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": moe["num_experts"],
            "num_experts_per_tok": moe["top_k"], "moe_intermediate_size": moe["expert_intermediate"],
            "norm_topk_prob": moe["norm_topk_prob"], "decoder_sparse_step": 1, "mlp_only_layers": [],
            "output_router_logits": False, "router_aux_loss_coef": 0.001,
        })
    layers = d["num_layers"]
    drafter = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "hidden_act": "silu", "hidden_size": t["hidden_size"],
        "intermediate_size": t["intermediate_size"], "num_attention_heads": t["num_heads"],
        "num_key_value_heads": t["num_kv_heads"], "head_dim": t["head_dim"], "num_hidden_layers": layers,
        "num_target_layers": t["num_layers"], "vocab_size": t["vocab_size"], "rms_norm_eps": 1e-6,
        "rope_theta": shape["theta"], "rope_scaling": None, "max_position_embeddings": t["max_position"],
        "block_size": d["block_size"],
        "dflash_config": {"mask_token_id": t["vocab_size"] - 1, "target_layer_ids": list(d["target_layer_ids"])},
        "layer_types": ["full_attention"] * layers, "sliding_window": None, "use_sliding_window": False,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "dtype": "bfloat16",
    }
    return target, drafter


def tensor_list(target_cfg: dict, drafter_cfg: dict) -> tuple[list, list]:
    """(HF name, HF shape) of every tensor, from the loader's own name table (so convert accepts them)."""
    from ddtree_jax.checkpoint import names
    from ddtree_jax.models.config import DrafterConfig, TargetConfig, check_pair

    tc, dc = TargetConfig.from_hf(target_cfg), DrafterConfig.from_hf(drafter_cfg)
    check_pair(tc, dc)
    return ([t for e in names.entries_for(tc) for t in e.hf_tensors.items()],
            [t for e in names.entries_for(dc) for t in e.hf_tensors.items()])


def nbytes(shape) -> int:
    return 2 * math.prod(shape)  # bf16


def plan_shards(tensors: list, shard_bytes: int) -> list[list]:
    """Tensors in order into shards of at most shard_bytes (a larger tensor gets one of its own)."""
    shards, cur, size = [], [], 0
    for name, shape in tensors:
        if cur and size + nbytes(shape) > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += nbytes(shape)
    return shards + [cur] if cur else shards


# ---------------------------------------------------------------------------------------------- random HF dirs


class Filler:
    """Random bf16 tensors (numpy, ml_dtypes): slices of a uniform(-1, 1) pool at random offsets,
    scaled: norms 1 + 0.1 u, matrices u x sqrt(3 / fan_in) (std 1/sqrt(fan_in): activations stay
    finite). One pool per scale, so a tensor is a memcpy."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.unit = self.rng.uniform(-1.0, 1.0, POOL).astype(np.float32)
        self.pools: dict[tuple[float, float], np.ndarray] = {}

    def pool(self, scale: float, shift: float) -> np.ndarray:
        if (scale, shift) not in self.pools:
            self.pools[scale, shift] = (self.unit * scale + shift).astype(ml_dtypes.bfloat16).view(np.uint16)
        return self.pools[scale, shift]

    def __call__(self, shape) -> np.ndarray:
        n = math.prod(shape)
        pool = self.pool(0.1, 1.0) if len(shape) == 1 else self.pool(math.sqrt(3.0 / shape[-1]), 0.0)
        out = np.empty(n, np.uint16)  # bf16's bits: a plain copy, not ml_dtypes' element-wise one
        i, off = 0, int(self.rng.integers(POOL))
        while i < n:
            k = min(n - i, POOL - off)
            out[i:i + k] = pool[off:off + k]
            i, off = i + k, 0
        return out.view(ml_dtypes.bfloat16).reshape(shape)


def write_sparse_safetensors(path: Path, tensors: list) -> None:
    """A safetensors file of bf16 zeros: its header, then its data left as a hole (no disk blocks;
    read back as zeros at memory speed)."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes(shape)]}
        offset += nbytes(shape)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(8 + len(text) + offset)


def write_dir(path: Path, config: dict, tensors: list, shard_bytes: int, fill: Filler | None, *, tokenizer: bool,
              spec: dict) -> dict:
    """A HF directory of random weights (fill None: zeros, sparse files), one shard in memory at a
    time; skipped when `path` holds a complete one of the same spec. Returns {"bytes", "shards", "s", "reused"}."""
    from safetensors.numpy import save_file

    marker = path / MARKER
    if marker.is_file():
        try:
            done = json.loads(marker.read_text())
        except (OSError, json.JSONDecodeError):
            done = None
        if done is not None and done.get("spec") == spec:
            return dict(done["result"], s=0.0, reused=True)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    t0 = time.perf_counter()
    shards = plan_shards(tensors, shard_bytes)
    files = (["model.safetensors"] if len(shards) == 1
             else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    weight_map = {}
    for fname, shard in zip(files, shards):
        if fill is None:
            write_sparse_safetensors(path / fname, shard)
        else:
            data = {name: fill(shape) for name, shape in shard}
            save_file(data, str(path / fname), metadata={"format": "pt"})
            del data
        weight_map.update({name: fname for name, _ in shard})
    total = sum(nbytes(s) for _, s in tensors)
    if len(shards) > 1:
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer:
        for f in TOKENIZER.iterdir():
            shutil.copyfile(f, path / f.name)
    result = {"bytes": total, "shards": len(shards), "files": files}
    marker.write_text(json.dumps({"spec": spec, "result": result}))
    return dict(result, s=time.perf_counter() - t0, reused=False)


def weight_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.safetensors"))


def disk_reference(files: list[Path], scratch: Path, chunk: int = 64 * MIB) -> dict:
    """Copy `files` into one scratch file (fsync'ed), then read it back; deleted after."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    try:
        with open(scratch, "wb") as out:
            for f in files:
                with open(f, "rb", buffering=0) as src:
                    while n := src.readinto(buf):
                        out.write(view[:n])
                        total += n
            out.flush()
            os.fsync(out.fileno())
        copy_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with open(scratch, "rb", buffering=0) as src:
            while src.readinto(buf):
                pass
        read_s = time.perf_counter() - t0
    finally:
        scratch.unlink(missing_ok=True)
    return {"bytes": total, "copy_s": copy_s, "read_s": read_s,
            "copy_bytes_per_s": 2 * total / copy_s if copy_s > 0 else None,  # read + written
            "read_bytes_per_s": total / read_s if read_s > 0 else None,
            "note": "files just written: reads likely come from the page cache, as convert's do here; "
                    "copy_bytes_per_s counts bytes read + written (fsync'ed), the measure of convert's"}


# ---------------------------------------------------------------------------------------------- commands


# Runs the command and reports its rusage. A small process between us and the command: a child
# forked from this (large) process keeps this one's peak RSS as its own ru_maxrss across exec.
REAPER = ("import os, sys\n"
          "pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)\n"
          "_, status, usage = os.wait4(pid, 0)\n"
          "rc = os.waitstatus_to_exitcode(status)\n"
          "open(sys.argv[1], 'w').write(f'{usage.ru_maxrss} {rc}')\n"
          "sys.exit(0 if rc == 0 else 1)\n")


def run_child(argv: list[str], log_path: Path, env: dict, timeout: float) -> dict:
    """One command: wall s, its peak RSS (wait4's ru_maxrss), rc; stdout+stderr into log_path."""
    report = log_path.with_suffix(".rusage")
    report.unlink(missing_ok=True)
    t0 = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", REAPER, str(report), *argv], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=ROOT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        if timed_out:
            os.killpg(proc.pid, signal.SIGKILL)  # the command too: one session
            proc.wait()
    wall = time.perf_counter() - t0
    try:
        maxrss_kib, rc = map(int, report.read_text().split())
        report.unlink()
    except (OSError, ValueError):
        maxrss_kib, rc = None, proc.returncode
    row = {"argv": argv[1:], "wall_s": wall, "peak_rss_mb": None if maxrss_kib is None else maxrss_kib / 1024,
           "rc": rc, "log": log_path.name}
    if rc != 0:
        lines = [x for x in log_path.read_text(errors="replace").splitlines() if x.strip()]
        row["error"] = f"timed out after {timeout:.0f} s" if timed_out else (lines[-1] if lines else f"exit {rc}")
    return row


STATS = {  # generate's closing line (ddtree_jax/cli.py stats_line)
    "load_s": r"\bload ([0-9.]+) s",
    "compile_s": r"\bcompile ([0-9.]+) s",
    "first_token_s": r"\bfirst token ([0-9.]+) s",
    "device_peak_gib": r"\bpeak memory ([0-9.]+) GiB",
    "generation_tokens_per_s": r"generation: \d+ tokens, ([0-9.]+) tokens/s",
}


def parse_generate(text: str) -> dict:
    """The numbers of generate's stats line (None where absent: e.g. no peak memory on the CPU)."""
    import re

    lines = [x for x in text.splitlines() if "first token" in x]
    line = lines[-1] if lines else ""
    out = {k: (float(m.group(1)) if (m := re.search(p, line)) else None) for k, p in STATS.items()}
    out["compiled_in_s"] = sum(float(m) for m in re.findall(r"compiled in ([0-9.]+)s", text))
    return out


def child_env(cache: Path | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # JAX's own setting would win over ours
    if cache is not None:
        env["DDTREE_COMPILE_CACHE"] = str(cache)
    return env


def probe_environment(commit: str | None, out: Path, timeout: float) -> dict:
    """bench.suite.environment() in a child: this process must not start the device (it would hold its memory)."""
    code = ("import json, sys\nfrom bench.suite import environment\n"
            "print('ENV ' + json.dumps(environment(sys.argv[1] or None)))\n")
    path = out / "log_environment.txt"
    row = run_child([sys.executable, "-c", code, commit or ""], path, child_env(None), timeout)
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("ENV "):
            return json.loads(line[4:])
    return {"error": row.get("error", "no output")}


# ---------------------------------------------------------------------------------------------- report


def targets(doc: dict) -> dict:
    """The issue's targets as ratios (< 1 meets it); None where a number is missing."""
    largest = doc["bytes"]["largest_tensor"]["bytes"]
    cmds = doc["commands"]
    out = {}

    def ok(name):
        c = cmds.get(name)
        return c if c and c.get("rc") == 0 and c.get("peak_rss_mb") is not None else None

    conv = ok("convert")
    if conv:
        bound = 2 * GIB + 3 * largest
        out["convert_peak_rss"] = {"measured_mb": conv["peak_rss_mb"], "bound_mb": bound / MIB,
                                   "ratio": conv["peak_rss_mb"] * MIB / bound}
        # zeros: holes read at memory speed, so the copy is no measure of a disk that holds the data
        rate = None if doc.get("zeros") else (doc.get("disk") or {}).get("copy_bytes_per_s")
        moved = doc["bytes"]["target"] + doc["bytes"]["drafter"] + (doc["bytes"].get("converted") or 0)
        if rate:
            out["convert_time"] = {"measured_s": conv["wall_s"], "bound_s": moved / rate,
                                   "ratio": conv["wall_s"] / (moved / rate), "bytes_read_written": moved}
    for name in ("generate_cold", "generate_warm", "generate_hf"):
        g = ok(name)
        if g:
            bound = 2 * GIB + 2 * largest
            out[f"{name}_peak_rss"] = {"measured_mb": g["peak_rss_mb"], "bound_mb": bound / MIB,
                                       "ratio": g["peak_rss_mb"] * MIB / bound}
    warm = ok("generate_warm")
    if warm and warm.get("first_token_s") is not None:
        out["warm_first_token"] = {"measured_s": warm["first_token_s"], "bound_s": COLD_START_TARGET_S,
                                   "ratio": warm["first_token_s"] / COLD_START_TARGET_S}
    return out


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(doc: dict) -> str:
    b = doc["bytes"]
    lines = [f"# checkpoint: {doc['model']} ({b['target'] / GIB:.2f} GiB target, {b['drafter'] / GIB:.2f} GiB "
             f"drafter, largest tensor {b['largest_tensor']['bytes'] / MIB:.0f} MiB)", ""]
    disk = doc.get("disk")
    if disk:
        gbs = {k: fmt(disk[k] and disk[k] / 1e9, ".2f") for k in ("copy_bytes_per_s", "read_bytes_per_s")}
        lines += [f"disk: copy {gbs['copy_bytes_per_s']} GB/s (read + written), read back {gbs['read_bytes_per_s']} "
                  "GB/s (page cache likely)", ""]
    lines += ["| command | rc | wall s | peak RSS MB | load s | compile s | first token s | device peak GiB |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, c in doc["commands"].items():
        if "skipped" in c:
            lines.append(f"| {name} | skipped: {c['skipped']} | | | | | | |")
            continue
        lines.append(f"| {name} | {c['rc']} | {fmt(c['wall_s'])} | {fmt(c['peak_rss_mb'], '.0f')} | "
                     f"{fmt(c.get('load_s'))} | {fmt(c.get('compile_s'))} | {fmt(c.get('first_token_s'))} | "
                     f"{fmt(c.get('device_peak_gib'), '.2f')} |")
    lines += ["", "| target | measured | bound | ratio (< 1 meets it) |", "| --- | --- | --- | --- |"]
    for name, t in doc["targets"].items():
        unit, shown = ("mb", "MB") if "measured_mb" in t else ("s", "s")
        lines.append(f"| {name} | {fmt(t['measured_' + unit])} {shown} | {fmt(t['bound_' + unit])} {shown} | "
                     f"{t['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------- main


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m bench checkpoint", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b", choices=MODELS, help="bench round's shape (tiny: CPU smoke run)")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "ddtree-bench-checkpoint"),
                    help="where the HF directories, the converted checkpoint and the compile cache go")
    ap.add_argument("--out", required=True, help="output directory: checkpoint_MODEL.json and a log per command")
    ap.add_argument("--force", action="store_true", help="write into a non-empty --out")
    ap.add_argument("--shard-gb", type=float, default=4.0, help="target shard size in GB (1e9 bytes)")
    ap.add_argument("--prompt", default="def fibonacci(n):")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=64, help="generate's DDTree budget")
    ap.add_argument("--reconvert", action="store_true", help="convert again over a kept converted checkpoint")
    ap.add_argument("--skip-convert", action="store_true",
                    help="measure generate --target --draft on the HF directories alone (no convert, no --ckpt "
                         "runs; the disk reference copies one shard): for a disk that cannot hold a second copy")
    ap.add_argument("--ckpt-dir", default=None,
                    help="where the converted checkpoint goes (default WORK/ckpt-MODEL), e.g. another disk or "
                         "/dev/shm where WORK's cannot hold the HF files and a converted copy; the disk "
                         "reference copies the shards beside it")
    ap.add_argument("--zeros", action="store_true",
                    help="HF files of zeros left as holes (sparse): convert's memory at a size the disk cannot "
                         "hold twice; its time is then not the disk's (holes read at memory speed)")
    ap.add_argument("--skip-generate", action="store_true",
                    help="convert alone (a host that cannot run the shape: convert needs no accelerator)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory's checkpoints (reruns reuse them)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a command may run before it is killed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--commit", help="the commit to record (a device copy without .git cannot tell)")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def validate(args) -> None:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise UserError(f"--out {out} is not empty; give another directory or --force to write into it")
    work = Path(args.work)
    if work.exists() and not work.is_dir():
        raise UserError(f"--work {work} is a file; give a directory")
    if args.skip_convert and args.skip_generate:
        raise UserError("--skip-convert and --skip-generate leave nothing to measure; give one of them")
    if args.ckpt_dir is not None:
        if args.skip_convert:
            raise UserError("--ckpt-dir names the converted checkpoint, which --skip-convert leaves out; give one")
        parent = Path(args.ckpt_dir).absolute().parent
        if not parent.is_dir():
            raise UserError(f"--ckpt-dir {args.ckpt_dir}: its folder {parent} does not exist; "
                            "create it or give another")
    for flag, v in (("--shard-gb", args.shard_gb), ("--max-new-tokens", args.max_new_tokens),
                    ("--budget", args.budget), ("--timeout", args.timeout)):
        if not v > 0:
            raise UserError(f"{flag} must be > 0 (got {v})")


def run(argv: Sequence[str]) -> int:
    argv = list(argv)
    args = build_parser().parse_args(argv)
    validate(args)
    out, work = Path(args.out).absolute(), Path(args.work).absolute()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    m, skip = args.model, args.skip_convert
    from bench.bench_round import set_mem_fraction

    set_mem_fraction(m)  # generate's share of the GPU, bench round's for the shape; the children inherit it
    hf_t, hf_d, cache = work / f"hf-{m}-target", work / f"hf-{m}-draft", work / f"xla-{m}"
    conv = Path(args.ckpt_dir).absolute() if args.ckpt_dir else work / f"ckpt-{m}"
    json_path = out / f"checkpoint_{m}.json"

    shape = shape_of(m)
    tcfg, dcfg = hf_configs(shape)
    t_tensors, d_tensors = tensor_list(tcfg, dcfg)
    name, shp = max(t_tensors + d_tensors, key=lambda x: nbytes(x[1]))
    doc = {"schema": SCHEMA, "command": "python -m bench checkpoint " + " ".join(argv), "model": m,
           "shape": shape, "shard_gb": args.shard_gb, "work": str(work), "environment": None,
           "bytes": {"target": sum(nbytes(s) for _, s in t_tensors), "drafter": sum(nbytes(s) for _, s in d_tensors),
                     "largest_tensor": {"name": name, "shape": list(shp), "bytes": nbytes(shp)}, "converted": None},
           "create": None, "disk": None, "commands": {}, "targets": {}, "kept": args.keep, "skip_convert": skip,
           "skip_generate": args.skip_generate, "zeros": args.zeros,
           "notes": ["peak_rss_mb: the command's own peak resident set (wait4 ru_maxrss), in MiB",
                     "first_token_s, load_s, compile_s: generate's closing line; first token counts from the "
                     "process's start (imports included)",
                     "targets: GiB = 2**30 bytes; ratio < 1 meets the target"]}
    save = lambda: write_json(json_path, doc)  # noqa: E731
    log(f"1/6 shape {m}: target {doc['bytes']['target'] / GIB:.2f} GiB in {len(t_tensors)} tensors, drafter "
        f"{doc['bytes']['drafter'] / GIB:.2f} GiB, largest {name} {nbytes(shp) / MIB:.0f} MiB")
    save()
    try:
        doc["environment"] = probe_environment(args.commit, out, args.timeout)
        save()
        fill = None if args.zeros else Filler(args.seed)
        shard_bytes = max(1, int(args.shard_gb * 1e9))
        seed = "zeros" if args.zeros else args.seed
        spec = {"config": tcfg, "shard_bytes": shard_bytes, "seed": seed}
        t = write_dir(hf_t, tcfg, t_tensors, shard_bytes, fill, tokenizer=True, spec=spec)
        d = write_dir(hf_d, dcfg, d_tensors, 2**62, fill, tokenizer=False, spec={"config": dcfg, "seed": seed})
        del fill
        if not (t["reused"] and d["reused"]) and conv.exists():  # converted from other weights
            shutil.rmtree(conv)
        doc["create"] = {"target": t, "drafter": d}
        log(f"2/6 HF dirs {'reused' if t['reused'] and d['reused'] else 'written'} in {t['s'] + d['s']:.1f} s: "
            f"{hf_t} ({t['shards']} shard{'s' * (t['shards'] > 1)}), {hf_d}")
        save()

        shards = [hf_t / f for f in t["files"]]
        doc["disk"] = disk_reference(shards[:1] if skip else shards, conv.parent / f"{conv.name}.disk-reference.tmp")
        dk = doc["disk"]
        log(f"3/6 disk: {dk['bytes'] / GIB:.2f} GiB copied in {dk['copy_s']:.1f} s "
            f"({(dk['copy_bytes_per_s'] or 0) / 1e9:.2f} GB/s read + written), read back in {dk['read_s']:.1f} s")
        save()

        cmds = doc["commands"]
        if not skip:
            if conv.exists() and not args.reconvert:
                cmds["convert"] = {"skipped": f"{conv} exists (kept); --reconvert measures it again"}
            else:
                argv_c = [sys.executable, "-m", "convert", "--target", str(hf_t), "--draft", str(hf_d), "--out",
                          str(conv), "--dtype", "bfloat16"] + (["--force"] if conv.exists() else [])
                cmds["convert"] = run_child(argv_c, out / "log_convert.txt", child_env(None), args.timeout)
            if conv.exists():
                doc["bytes"]["converted"] = weight_bytes(conv)
        c = cmds.get("convert", {"skipped": "--skip-convert"})
        log("4/6 convert: " + (c["skipped"] if "skipped" in c else
                              f"rc {c['rc']}, {c['wall_s']:.1f} s, peak RSS {fmt(c['peak_rss_mb'], '.0f')} MB"))
        save()

        if cache.exists():
            shutil.rmtree(cache)
        cache.mkdir(parents=True)
        gen_args = ["--prompt", args.prompt, "--max-new-tokens", str(args.max_new_tokens), "--method", "ddtree",
                    "--budget", str(args.budget), "--ignore-eos"]
        runs = [("generate_cold", ["--ckpt", str(conv)]), ("generate_warm", ["--ckpt", str(conv)]),
                ("generate_hf", ["--target", str(hf_t), "--draft", str(hf_d)])]
        if skip:
            runs = runs[2:]
        if args.skip_generate:
            runs = []
        for i, (key, src) in enumerate(runs):
            if "--ckpt" in src and not conv.exists():
                cmds[key] = {"skipped": "no converted checkpoint (convert failed)"}
            else:
                argv_g = [sys.executable, "-m", "ddtree_jax.generate", *src, *gen_args]
                r = run_child(argv_g, out / f"log_{key}.txt", child_env(cache), args.timeout)
                r.update(parse_generate((out / r["log"]).read_text(errors="replace")))
                cmds[key] = r
            r = cmds[key]
            log(f"5/6 {key} ({i + 1}/{len(runs)}): " + (r["skipped"] if "skipped" in r else
                f"rc {r['rc']}, {r['wall_s']:.1f} s, peak RSS {fmt(r['peak_rss_mb'], '.0f')} MB, first token "
                f"{fmt(r.get('first_token_s'))} s" + (f": {r['error']}" if r.get("error") else "")))
            save()
    finally:
        if not args.keep:
            for p in (hf_t, hf_d, conv, cache):
                shutil.rmtree(p, ignore_errors=True)
            try:
                work.rmdir()  # only when nothing else is in it
            except OSError:
                pass
        doc["targets"] = targets(doc)
        save()
    text = table(doc)
    (out / f"checkpoint_{m}.md").write_text(text)
    print(text, end="")
    failed = [k for k, c in doc["commands"].items() if c.get("rc", 0) != 0]
    log(f"6/6 wrote {json_path}" + (f"; FAILED: {', '.join(failed)} (see their logs)" if failed else "")
        + ("" if args.keep else "; work directories deleted"))
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Bad input: one line, exit 2, before any work."""
    return cli_main(run, list(sys.argv[1:] if argv is None else argv), prog="bench checkpoint")


if __name__ == "__main__":
    sys.exit(main())
