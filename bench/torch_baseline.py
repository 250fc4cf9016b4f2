"""PyTorch reference: `transformers` greedy `generate` on the same prompts and weights.

The target is loaded from its Hugging Face directory in float32 (the converted checkpoint may be
bf16, so tokens can differ after a near-tie; that is reported, not asserted), on the GPU when torch
sees one (what users of a GPU machine run today), else on the CPU (`device`: auto | cpu | cuda).
A static KV cache (`cache_implementation="static"`) is used when the installed transformers
accepts it; otherwise the default dynamic cache, and the JSON says so.
"""
from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path
from typing import Sequence

from ddtree_jax.errors import UserError


def resolve_hf_target(ckpt_path: Path, meta: dict, explicit: str | None) -> Path:
    """--hf-target, else the checkpoint's recorded `target.source` where it still exists, else the
    checkpoint's target exported back to Hugging Face form in a temporary directory (removed at
    exit): the shipped pair is stored converted only."""
    if explicit:
        if not (Path(explicit) / "config.json").is_file():
            raise UserError(f"--hf-target {explicit} has no config.json; give a Hugging Face model directory")
        return Path(explicit)
    src = (meta.get("target") or {}).get("source")
    if src and (Path(src) / "config.json").is_file():
        return Path(src)
    import atexit
    import shutil
    import tempfile

    from ddtree_jax.train.export import export_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="ddtree_torch_baseline_"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    target, _ = export_checkpoint(ckpt_path, tmp / "hf")
    return target


def pick_device(device: str) -> str:
    """auto: "cuda" when this torch build sees a GPU, else "cpu"."""
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise UserError(f"--torch-device must be auto, cpu or cuda (got {device!r})")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--torch-device cuda: this torch build sees no GPU; use --torch-device cpu")
    return device


def load_model(hf_dir: Path, device: str = "cpu"):
    import torch
    from transformers import AutoModelForCausalLM

    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
        except TypeError:  # transformers < 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32)
    except (OSError, ValueError) as e:
        raise UserError(f"transformers cannot load {hf_dir}: {str(e).splitlines()[0]}") from None
    return model.to(device).eval()


def run(hf_dir: Path, prompts, max_new_tokens: int, stop_ids: Sequence[int], repeats: int,
        reference: Sequence[Sequence[int]] | None = None, tick=lambda n=1: None, device: str = "auto") -> dict:
    """Greedy generation per prompt (batch 1); `reference`: our greedy AR tokens per prompt."""
    import torch
    import transformers

    device = pick_device(device)
    model = load_model(hf_dir, device)
    gen_cfg = copy.deepcopy(model.generation_config)
    gen_cfg.do_sample, gen_cfg.temperature, gen_cfg.top_p, gen_cfg.top_k = False, None, None, None
    gen_cfg.max_new_tokens, gen_cfg.min_new_tokens = max_new_tokens, None
    gen_cfg.eos_token_id = list(stop_ids) or None
    gen_cfg.pad_token_id = stop_ids[0] if stop_ids else 0

    def generate(ids, cache):
        x = torch.tensor([list(ids)], dtype=torch.long, device=device)
        gen_cfg.cache_implementation = cache
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen_cfg)
            if device == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
        return out[0, x.shape[1]:].tolist(), dt

    cache, note = "static", None
    try:
        generate(prompts[0].ids, cache)  # warm-up (and the static cache's allocation)
    except Exception as e:  # noqa: BLE001 - any refusal of the static cache means: use the default
        cache, note = None, f"static cache refused ({type(e).__name__}: {str(e).splitlines()[0][:200]}); default cache"
        generate(prompts[0].ids, cache)
    tick()
    times = [[0.0] * len(prompts) for _ in range(repeats)]
    tokens = [None] * len(prompts)
    for r in range(repeats):
        for i, p in enumerate(prompts):
            tokens[i], times[r][i] = generate(p.ids, cache)
            tick()
    n_tok = sum(len(t) for t in tokens)
    per_prompt = []
    equal = 0
    for i, p in enumerate(prompts):
        t = statistics.median(times[r][i] for r in range(repeats))
        entry = {"prompt": p.index, "num_output_tokens": len(tokens[i]), "time_s": t,
                 "tokens_per_s": len(tokens[i]) / t}
        if reference is not None:

            at = first_mismatch(tokens[i], reference[i])
            entry["equal_to_jax_ar"] = at is None
            if at is not None:
                entry["first_mismatch"] = at
            equal += at is None
        per_prompt.append(entry)
    tps = [n_tok / sum(ts) for ts in times]
    return {
        "hf_target": str(hf_dir), "dtype": "float32", "transformers": transformers.__version__,
        "torch": torch.__version__, "threads": torch.get_num_threads(), "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "cache_implementation": cache or "default (dynamic)", "cache_note": note,
        "repeats": repeats, "output_tokens": n_tok,
        "tokens_per_s": {"median": statistics.median(tps), "min": min(tps), "max": max(tps), "n": len(tps)},
        "equal_to_jax_ar": None if reference is None else f"{equal}/{len(prompts)}",
        "per_prompt": per_prompt,
    }


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (or the shorter length when one is a prefix); None if equal."""
    if list(a) == list(b):
        return None
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
