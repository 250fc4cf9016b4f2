"""Training a small Qwen3 target from scratch: next-token cross-entropy through `forward_train`.

Params and AdamW state are float32; the forward/backward math runs in `compute_dtype` (bf16 by
default: the param tree is cast inside the loss, so gradients land in float32). The logits come
out of `lm_head` in float32 either way.
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ddtree_jax.errors import UserError
from ddtree_jax.models.config import RopeConfig, TargetConfig
from ddtree_jax.models.init import init_target
from ddtree_jax.models.target import forward_train
from ddtree_jax.train import (LoopConfig, RunDir, Schedule, SigtermAsInterrupt, apply_updates, cast_tree,
                              count_params, describe_budget, log, make_optimizer, train_loop, write_json_atomic)

DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}


def target_config(*, vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                  intermediate: int, max_position: int = 2048, rope_theta: float = 10000.0) -> TargetConfig:
    for name, v in (("--hidden", hidden), ("--layers", layers), ("--heads", heads), ("--kv-heads", kv_heads),
                    ("--head-dim", head_dim), ("--intermediate", intermediate), ("--max-position", max_position)):
        if v <= 0:
            raise UserError(f"{name} must be positive, got {v}")
    if heads % kv_heads:
        raise UserError(f"--heads ({heads}) must be a multiple of --kv-heads ({kv_heads})")
    if head_dim % 2:
        raise UserError(f"--head-dim must be even (RoPE), got {head_dim}")
    if not math.isfinite(rope_theta) or rope_theta <= 0:
        raise UserError(f"--rope-theta must be a finite number > 0, got {rope_theta}")
    return TargetConfig(family="qwen3", vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
                        num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rms_eps=1e-6,
                        max_position=max_position, tie_embeddings=True, qk_norm=True, qkv_bias=False,
                        rope=RopeConfig(theta=rope_theta), architecture="Qwen3ForCausalLM")


def init_params(cfg: TargetConfig, key: jax.Array) -> dict:
    """`init_target` rescaled for training: embeddings (also the tied LM head) at std 0.02, and
    the residual-branch outputs (o, down) by 1/sqrt(2 L), so the initial logits are near uniform."""
    params = init_target(cfg, key, jnp.float32)
    params["embed"] = params["embed"] * 0.02
    scale = (2 * cfg.num_layers) ** -0.5
    for p in params["layers"]:
        p["o"] = p["o"] * scale
        p["down"] = p["down"] * scale
    return params


def lm_loss(params: dict, cfg: TargetConfig, tokens: jax.Array, weights: jax.Array | None = None,
            compute_dtype=jnp.bfloat16) -> tuple[jax.Array, jax.Array]:
    """(sum of next-token cross-entropies, number of predicted tokens) over tokens [B, T];
    `weights` [B] (0/1) masks padding rows."""
    logits, _ = forward_train(cast_tree(params, compute_dtype), cfg, tokens)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:])
    w = jnp.ones(tokens.shape[:1], jnp.float32) if weights is None else weights
    return jnp.sum(ce * w[:, None]), jnp.sum(w) * (tokens.shape[1] - 1)


def make_train_step(cfg: TargetConfig, tx, compute_dtype):
    def loss_fn(params, tokens):
        total, n = lm_loss(params, cfg, tokens, compute_dtype=compute_dtype)
        return total / n

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, tokens, lr):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        params, opt_state = apply_updates(tx, grads, opt_state, params, lr)
        return params, opt_state, loss

    return step


def make_evaluator(cfg: TargetConfig, sequences: np.ndarray, batch_size: int, compute_dtype):
    """Mean held-out cross-entropy over `sequences` (the last batch is padded and masked)."""

    @jax.jit
    def batch_loss(params, tokens, weights):
        return lm_loss(params, cfg, tokens, weights, compute_dtype)

    def evaluate(params, seqs: np.ndarray | None = None) -> dict[str, float]:
        seqs = sequences if seqs is None else seqs
        total = count = 0.0
        for i in range(0, len(seqs), batch_size):
            chunk = seqs[i:i + batch_size]
            w = np.zeros(batch_size, np.float32)
            w[:len(chunk)] = 1
            if len(chunk) < batch_size:
                chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch_size - len(chunk), 0)])
            s, n = batch_loss(params, jnp.asarray(chunk), jnp.asarray(w))
            total += float(s)
            count += float(n)
        loss = total / count
        return {"eval_loss": loss, "eval_ppl": float(np.exp(loss))}

    return evaluate


def run_target_command(args) -> int:
    """`python -m ddtree_jax.train target`: validate, train, evaluate, export (all atomic)."""
    from ddtree_jax.train.data import PackedData, check_data_file, eval_sequences, load_docs
    from ddtree_jax.train.export import export_target
    from ddtree_jax.train.tokenizer import load_tokenizer

    t_begin = time.time()
    check_data_file(args.data)
    tokenizer = load_tokenizer(args.tokenizer)
    _check_training_args(args)
    run = RunDir(args.out, resume=args.resume, force=args.force)
    compute_dtype = DTYPES[args.compute_dtype]

    if args.resume:
        meta = run.read_meta()
        if meta.get("kind") != "target":
            raise UserError(f"{run.ckpt} is a {meta.get('kind')} checkpoint, not a target one")
        cfg = TargetConfig.from_hf(meta["hf_config"])
        log(f"resuming from {run.ckpt} at step {meta['step']} (model shape from the checkpoint)")
    else:
        cfg = target_config(vocab_size=len(tokenizer), hidden=args.hidden, layers=args.layers, heads=args.heads,
                            kv_heads=args.kv_heads, head_dim=args.head_dim, intermediate=args.intermediate,
                            max_position=args.max_position, rope_theta=args.rope_theta)
    if args.seq_len > cfg.max_position:
        raise UserError(f"--seq-len {args.seq_len} exceeds --max-position {cfg.max_position}")
    eos = tokenizer.eos_token_id

    t0 = time.time()
    train_docs = load_docs(tokenizer, args.data, "train", args.token_cache)
    eval_docs = load_docs(tokenizer, args.data, "eval", args.token_cache)
    data = PackedData(train_docs, args.seq_len, args.batch_size, seed=args.seed)
    eval_all = eval_sequences(eval_docs, args.seq_len)
    eval_some = eval_all[: args.eval_sequences]
    log(f"data: {data.num_tokens:,} training tokens ({data.num_sequences:,} sequences of {args.seq_len}, "
        f"{data.steps_per_epoch} steps/epoch), {len(eval_all)} held-out sequences; tokenized in {time.time() - t0:.1f} s")

    tx = make_optimizer(args.weight_decay, args.grad_clip)
    params = init_params(cfg, jax.random.PRNGKey(args.seed))
    opt_state = tx.init(params)
    start_step, metrics, last_ckpt = 0, {"train": [], "eval": []}, None
    # The params of the best periodic eval: with few unique tokens and many epochs a small model
    # can start to overfit late in the run; then the best ones, not the last ones, are exported.
    best: dict[str, Any] = {"loss": float("inf"), "step": None, "params": None}
    if args.resume:
        params, opt_state, meta, best_params = run.load(params, opt_state)
        start_step, metrics, last_ckpt = meta["step"], meta.get("metrics", metrics), meta["step"]
        if best_params is not None and meta.get("best_step") is not None:
            best.update(loss=meta["best_loss"], step=meta["best_step"], params=jax.device_put(best_params))
    n_params = count_params(params)
    log(f"target: {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.num_heads}x{cfg.head_dim} heads "
        f"({cfg.num_kv_heads} kv), intermediate {cfg.intermediate_size}, vocab {cfg.vocab_size}: {n_params:,} params; "
        f"devices {jax.devices()}")

    from ddtree_jax.train.export import target_hf_config

    hf_config = target_hf_config(cfg, dtype=args.export_dtype, eos_id=eos)
    step_fn = make_train_step(cfg, tx, compute_dtype)
    evaluator = make_evaluator(cfg, eval_some, min(args.batch_size, 64), compute_dtype)
    summary: dict[str, Any] = {"kind": "target", "args": _jsonable(vars(args)), "num_params": n_params}

    def write_metrics():
        write_json_atomic(run.out / "metrics.json", {**summary, "metrics": metrics})

    def checkpoint(p, o, step, planned):
        run.save(p, o, {"kind": "target", "step": step, "planned_steps": planned, "hf_config": hf_config,
                        "metrics": metrics, "args": _jsonable(vars(args)), "best_step": best["step"],
                        "best_loss": best["loss"] if best["step"] is not None else None}, best=best["params"])

    def periodic_eval(p, step):
        ev = evaluator(p)
        if args.keep_best and ev["eval_loss"] < best["loss"]:
            best.update(loss=ev["eval_loss"], step=step, params=jax.tree.map(jnp.copy, p))  # p is donated next step
        return ev

    loop_cfg = LoopConfig(steps=args.steps, time_budget=args.time_budget,
                          schedule=Schedule(args.lr, args.warmup, args.min_lr_ratio), log_every=args.log_every,
                          eval_every=args.eval_every, ckpt_every=args.ckpt_every,
                          tokens_per_step=args.batch_size * args.seq_len)
    log(f"training for {describe_budget(args)} from step {start_step}, batch {args.batch_size} x {args.seq_len}")
    with SigtermAsInterrupt():
        res = train_loop(cfg=loop_cfg, params=jax.device_put(params), opt_state=jax.device_put(opt_state),
                         start_step=start_step, step_fn=step_fn, batch_at=lambda s: jnp.asarray(data.batch(s)),
                         evaluate=periodic_eval, checkpoint=checkpoint, metrics=metrics,
                         write_metrics=write_metrics, last_ckpt_step=last_ckpt, ckpt_dir=run.ckpt)
        t_eval = time.time()
        chosen, chosen_name = res.params, "final"
        if args.keep_best and best["params"] is not None and best["step"] != res.step:
            last_sub = evaluator(res.params)["eval_loss"]
            if best["loss"] < last_sub:
                chosen, chosen_name = best["params"], f"best periodic eval (step {best['step']})"
                log(f"the params of step {best['step']} had a lower held-out loss ({best['loss']:.4f}) than the last "
                    f"ones ({last_sub:.4f}): exporting those")
        final_seqs = eval_all[: args.final_eval_sequences] if args.final_eval_sequences else eval_all
        ev = evaluator(chosen, final_seqs)
        ev_last = ev if chosen is res.params else evaluator(res.params, final_seqs)
        t_eval = time.time() - t_eval
        metrics["eval"].append({"step": res.step, **ev_last})
        train_tail = [m["loss"] for m in metrics["train"][-5:]]
        tok_s = [m["tokens_per_s"] for m in metrics["train"] if np.isfinite(m["tokens_per_s"])]
        summary["final"] = {
            "step": res.step, "stopped_by": res.stopped_by, "train_seconds": round(res.train_seconds, 1),
            "tokens_this_run": res.tokens, "tokens_total": res.step * args.batch_size * args.seq_len,
            "epochs": round(res.step / data.steps_per_epoch, 2),
            "train_loss": float(np.mean(train_tail)) if train_tail else None,
            "eval_loss": ev["eval_loss"], "eval_ppl": ev["eval_ppl"], "eval_sequences": len(final_seqs),
            "eval_tokens": len(final_seqs) * (args.seq_len - 1), "eval_seconds": round(t_eval, 1),
            "tokens_per_s_median": float(np.median(tok_s)) if tok_s else None,
            "train_tokens_available": data.num_tokens,
            "exported_params": chosen_name, "last_eval_loss": ev_last["eval_loss"],
        }
        log(f"final: step {res.step} ({res.stopped_by}), {summary['final']['tokens_total']:,} tokens "
            f"({summary['final']['epochs']} epochs) in {res.train_seconds:.0f} s; train loss "
            f"{summary['final']['train_loss']:.4f}, eval loss {ev['eval_loss']:.4f} (ppl {ev['eval_ppl']:.2f}) on "
            f"{len(final_seqs)} held-out sequences")
        if args.ckpt_every and res.step != last_ckpt:
            checkpoint(res.params, res.opt_state, res.step, res.planned_steps)
        export_target(run.hf, cfg, jax.device_get(chosen), tokenizer_dir=args.tokenizer, eos_id=eos,
                      dtype=args.export_dtype)
        summary["wall_seconds"] = round(time.time() - t_begin, 1)
        write_metrics()
    log(f"exported the Hugging Face target to {run.hf} ({args.export_dtype}); metrics in {run.out / 'metrics.json'}")
    return 0


def _check_training_args(args) -> None:
    for name in ("steps", "batch_size", "seq_len", "log_every"):
        if getattr(args, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("eval_every", "ckpt_every", "warmup", "eval_sequences", "final_eval_sequences"):
        if getattr(args, name) < 0:
            raise UserError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not math.isfinite(args.lr) or args.lr <= 0:
        raise UserError(f"--lr must be a finite number > 0, got {args.lr}")
    if args.time_budget is not None and (not math.isfinite(args.time_budget) or args.time_budget <= 0):
        raise UserError(f"--time-budget must be a finite number of seconds > 0, got {args.time_budget}")
    if not 0 <= args.min_lr_ratio <= 1:
        raise UserError(f"--min-lr-ratio must be in [0, 1] (the final LR as a fraction of the peak), "
                        f"got {args.min_lr_ratio}")
    for name in ("weight_decay", "grad_clip"):
        v = getattr(args, name)
        if not math.isfinite(v) or v < 0:
            raise UserError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {v}")


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()
            if isinstance(v, (int, float, str, bool, type(None), tuple, list))}
