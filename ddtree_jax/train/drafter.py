"""Training a DFlash drafter against a frozen target, the DFlash way.

Per training sequence x[0..T) the target runs once (`forward_train` with `taps`), giving its
tapped hidden states and its logits. A anchors a_1..a_A are drawn in [1, T - bs]; anchor a gives
the noise block [x_a, MASK x (bs-1)] at positions a .. a+bs-1, whose block position k predicts
x_{a+k}. All A blocks run in ONE drafter pass: the keys are [context features of all T positions ;
all blocks' tokens] and block j's queries see the context positions < a_j (not the anchor's own
features: at inference the block root is the bonus token, whose hidden state is not computed yet)
plus block j's own keys, non-causally. That is exactly what inference computes with
`extend_cache` + `draft_hidden` on the prefix x[0..a) (tests/test_train.py checks it), because
both use the same `context_features`, `context_kv`, `block_qkv` and `layer_finish`.

Labels (`--labels`): "distill" (default) is the cross-entropy towards the target's own softmax at
position a+k-1 (teacher-forced on the data), so the drafter learns what the verifier will accept;
"data" is the data's token x_{a+k}. Block position k is weighted by exp(-(k-1)/gamma): an early
miss ends the accepted chain, so early positions matter most.
"""
from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.errors import UserError
from ddtree_jax.models.config import DrafterConfig, TargetConfig, check_pair
from ddtree_jax.drafters.dflash import block_qkv, context_features, context_kv, layer_finish
from ddtree_jax.models.init import init_drafter
from ddtree_jax.models.layers import masked_attention, rms_norm, rope_tables
from ddtree_jax.models.target import causal_mask, embed, forward, forward_train, lm_head
from ddtree_jax.train import (LoopConfig, RunDir, Schedule, SigtermAsInterrupt, apply_updates, cast_tree,
                              count_params, describe_budget, log, make_optimizer, train_loop, write_json_atomic)

DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}


def default_taps(num_target_layers: int) -> tuple[int, ...]:
    """Layers 1 and L-2 (a low and a high layer); fewer for very shallow targets."""
    last = num_target_layers - 1
    return tuple(sorted({min(1, last), max(num_target_layers - 2, 0)}))


def check_shape_options(*, layers: int, intermediate: int | None, heads: int | None, kv_heads: int | None,
                        head_dim: int | None, block_size: int) -> None:
    """The drafter shape options on their own (None: the target's), before the target is loaded."""
    for name, v in (("--layers", layers), ("--intermediate", intermediate), ("--heads", heads),
                    ("--kv-heads", kv_heads), ("--head-dim", head_dim)):
        if v is not None and v <= 0:
            raise UserError(f"{name} must be positive, got {v}")
    if head_dim is not None and head_dim % 2:
        raise UserError(f"--head-dim must be even (RoPE), got {head_dim}")
    if block_size < 2:
        raise UserError(f"--block-size must be at least 2, got {block_size}")


def drafter_config(target: TargetConfig, *, mask_token_id: int, layers: int = 2, intermediate: int | None = None,
                   heads: int | None = None, kv_heads: int | None = None, head_dim: int | None = None,
                   block_size: int = 16, target_layer_ids: tuple[int, ...] | None = None) -> DrafterConfig:
    check_shape_options(layers=layers, intermediate=intermediate, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                        block_size=block_size)
    heads = heads or target.num_heads
    kv_heads = kv_heads or target.num_kv_heads
    if heads % kv_heads:
        raise UserError(f"--heads ({heads}) must be a multiple of --kv-heads ({kv_heads})")
    taps = tuple(target_layer_ids) if target_layer_ids else default_taps(target.num_layers)
    cfg = DrafterConfig(
        hidden_size=target.hidden_size, intermediate_size=intermediate or target.intermediate_size,
        num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim or target.head_dim,
        rms_eps=target.rms_eps, block_size=block_size, target_layer_ids=taps, mask_token_id=mask_token_id,
        num_target_layers=target.num_layers, vocab_size=target.vocab_size, sliding_windows=(None,) * layers,
        rope=target.rope, qkv_bias=False)
    check_pair(target, cfg)
    return cfg


def init_params(cfg: DrafterConfig, key: jax.Array) -> dict:
    """`init_drafter` with the residual-branch outputs (o, down) scaled by 1/sqrt(2 L)."""
    params = init_drafter(cfg, key, jnp.float32)
    scale = (2 * cfg.num_layers) ** -0.5
    for p in params["layers"]:
        p["o"] = p["o"] * scale
        p["down"] = p["down"] * scale
    return params


def sample_anchors(rng: np.random.Generator, batch: int, seq_len: int, n: int, block_size: int) -> np.ndarray:
    """[batch, n] distinct sorted anchors per row, uniform in [1, seq_len - block_size]."""
    span = seq_len - block_size
    if n > span:
        raise UserError(f"--anchors {n} does not fit: a sequence of {seq_len} has {span} anchor positions "
                        f"for blocks of {block_size}")
    a = np.argsort(rng.random((batch, span)), axis=1)[:, :n] + 1
    return np.sort(a, axis=1).astype(np.int32)


def block_attention_mask(anchors: jax.Array, seq_len: int, block_size: int, window: int | None = None) -> jax.Array:
    """bool [B, A*bs, T + A*bs]: block j's queries see context positions t < a_j (and, for a
    sliding-window layer, t >= a_j + bs - window, as inference's kv_start) and block j's keys."""
    b, a = anchors.shape
    t = jnp.arange(seq_len)
    anc = anchors[:, :, None]
    ctx = t < anc
    if window is not None:
        ctx &= t >= anc + block_size - window
    ctx = jnp.broadcast_to(ctx[:, :, None, :], (b, a, block_size, seq_len))
    own = jnp.eye(a, dtype=bool)[:, None, :, None]  # [A(query block), 1, A(key block), 1]
    blk = jnp.broadcast_to(own, (a, block_size, a, block_size)).reshape(a, block_size, a * block_size)
    blk = jnp.broadcast_to(blk[None], (b, a, block_size, a * block_size))
    return jnp.concatenate([ctx, blk], axis=-1).reshape(b, a * block_size, seq_len + a * block_size)


def train_hidden(dparams: dict, cfg: DrafterConfig, tparams: dict, taps: jax.Array, tokens: jax.Array,
                 anchors: jax.Array) -> jax.Array:
    """The training pass: final-normed drafter hidden [B, A, bs, H] for every anchor's block.

    taps [B, T, nTaps*H] (the target's tapped hidden states), tokens [B, T], anchors [B, A].
    Runs in the dtype of `dparams`.
    """
    b, t = tokens.shape
    n_anchor = anchors.shape[1]
    bs = cfg.block_size
    dtype = dparams["norm"].dtype
    offs = jnp.arange(bs, dtype=jnp.int32)
    blk_pos = (anchors[:, :, None] + offs).reshape(b, n_anchor * bs)
    roots = jnp.take_along_axis(tokens, anchors, axis=1)
    blk_tokens = jnp.where(offs == 0, roots[:, :, None], cfg.mask_token_id).reshape(b, n_anchor * bs)
    x = embed(tparams, blk_tokens).astype(dtype)
    c = context_features(dparams, cfg, taps.astype(dtype))
    ctx_pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    cos_c, sin_c = rope_tables(ctx_pos, cfg.rope, cfg.head_dim)
    cos_b, sin_b = rope_tables(blk_pos, cfg.rope, cfg.head_dim)
    masks = {w: block_attention_mask(anchors, t, bs, w) for w in set(cfg.sliding_windows)}
    scale = cfg.head_dim**-0.5
    for i, p in enumerate(dparams["layers"]):
        with jax.named_scope(f"draft_train_layer{i}"):
            ck, cv = context_kv(p, cfg, c, cos_c, sin_c)
            q, k, v = block_qkv(p, cfg, x, cos_b, sin_b)
            o = masked_attention(q, jnp.concatenate([ck, k], axis=1), jnp.concatenate([cv, v], axis=1),
                                 masks[cfg.sliding_windows[i]], scale)
            x = layer_finish(p, cfg, x, o)
    return rms_norm(x, dparams["norm"], cfg.rms_eps).reshape(b, n_anchor, bs, -1)


def position_weights(block_size: int, gamma: float) -> jax.Array:
    return jnp.exp(-jnp.arange(block_size - 1, dtype=jnp.float32) / gamma)


def _gather_positions(x: jax.Array, idx: jax.Array) -> jax.Array:
    """x [B, T, ...] at idx [B, A, K] -> [B, A, K, ...]."""
    b, a, k = idx.shape
    flat = idx.reshape(b, a * k)
    out = jnp.take_along_axis(x, flat.reshape(b, a * k, *([1] * (x.ndim - 2))), axis=1)
    return out.reshape(b, a, k, *x.shape[2:])


def _forward_pass(dparams, dcfg, tparams, tcfg, tokens, anchors, compute_dtype):
    """Shared by the loss and the eval: (drafter logits [B,A,D,V], teacher logits [B,A,D,V], labels [B,A,D])."""
    tp = cast_tree(tparams, compute_dtype)
    t_logits, taps = forward_train(tp, tcfg, tokens, taps=dcfg.target_layer_ids)
    t_logits, taps = jax.lax.stop_gradient(t_logits), jax.lax.stop_gradient(taps)
    h = train_hidden(cast_tree(dparams, compute_dtype), dcfg, tp, taps, tokens, anchors)
    d_logits = lm_head(tp, tcfg, h[:, :, 1:])
    idx = anchors[:, :, None] + jnp.arange(dcfg.block_size - 1, dtype=jnp.int32)  # predictors of a+1..a+D
    teacher = _gather_positions(t_logits, idx)
    labels = _gather_positions(tokens, idx + 1)
    return d_logits, teacher, labels


def _block_loss(d_logits, teacher, labels, weights, kind):
    """Weighted mean over blocks of the per-position losses; also returns the per-position loss."""
    logp = jax.nn.log_softmax(d_logits, axis=-1)
    if kind == "distill":
        ce = -jnp.sum(jax.nn.softmax(teacher, axis=-1) * logp, axis=-1)
    else:
        ce = -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    per_pos = ce.reshape(-1, ce.shape[-1]).mean(axis=0)
    return jnp.sum(per_pos * weights) / jnp.sum(weights), per_pos


def make_train_step(dcfg: DrafterConfig, tcfg: TargetConfig, tx, compute_dtype, gamma: float, labels: str):
    weights = position_weights(dcfg.block_size, gamma)

    def loss_fn(dparams, tparams, tokens, anchors):
        d_logits, teacher, lab = _forward_pass(dparams, dcfg, tparams, tcfg, tokens, anchors, compute_dtype)
        return _block_loss(d_logits, teacher, lab, weights, labels)[0]

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(dparams, opt_state, tparams, tokens, anchors, lr):
        loss, grads = jax.value_and_grad(loss_fn)(dparams, tparams, tokens, anchors)
        dparams, opt_state = apply_updates(tx, grads, opt_state, dparams, lr)
        return dparams, opt_state, loss

    return step


def acceptance(matches: jax.Array) -> jax.Array:
    """1 + the number of leading True along the last axis (tokens committed per chain round)."""
    return 1 + jnp.sum(jnp.cumprod(matches.astype(jnp.int32), axis=-1), axis=-1)


def make_evaluator(dcfg: DrafterConfig, tcfg: TargetConfig, sequences: np.ndarray, batch_size: int,
                   anchors_per_seq: int, compute_dtype, gamma: float, labels: str, seed: int = 1234):
    """Held-out loss and chain acceptance on fixed anchors.

    acc_len:    greedy DFlash chain acceptance, as inference would see it: the drafter's argmax
                tokens d_1..d_D of each block are verified by one target pass over
                x[0..a] + d_1..d_D; acc_len = 1 + the number of leading k with
                d_k == argmax target(x[0..a], d_1..d_{k-1}) (the +1 is the bonus token).
    acc_len_tf: the same with the target's argmax teacher-forced on the data x[0..a+k-1].
    top1:       per block position, how often d_k equals the teacher-forced target argmax.
    """
    d = dcfg.block_size - 1
    weights = position_weights(dcfg.block_size, gamma)
    rng = np.random.default_rng(seed)
    anchors_all = sample_anchors(rng, len(sequences), sequences.shape[1], anchors_per_seq, dcfg.block_size)

    @jax.jit
    def batch_stats(dparams, tparams, tokens, anchors, w):
        d_logits, teacher, lab = _forward_pass(dparams, dcfg, tparams, tcfg, tokens, anchors, compute_dtype)
        logp = jax.nn.log_softmax(d_logits, axis=-1)
        if labels == "distill":
            ce = -jnp.sum(jax.nn.softmax(teacher, axis=-1) * logp, axis=-1)
        else:
            ce = -jnp.take_along_axis(logp, lab[..., None], axis=-1)[..., 0]
        loss = jnp.sum(ce * weights, axis=-1) / jnp.sum(weights)  # [B, A]
        draft = jnp.argmax(d_logits, axis=-1).astype(jnp.int32)  # [B, A, D]
        tf_match = draft == jnp.argmax(teacher, axis=-1)
        # Verify each block's chain with the target: x[0..a] then the drafted tokens.
        b, a = anchors.shape
        t = tokens.shape[1]
        pos = jnp.arange(t, dtype=jnp.int32)
        rel = pos[None, None, :] - anchors[:, :, None] - 1  # index into the draft, valid in [0, D)
        inside = (rel >= 0) & (rel < d)
        drafted = jnp.take_along_axis(draft, jnp.clip(rel, 0, d - 1), axis=-1)
        vt = jnp.where(inside, drafted, tokens[:, None, :]).reshape(b * a, t)
        tp = cast_tree(tparams, compute_dtype)
        vpos = jnp.broadcast_to(pos, (b * a, t))
        h, _, _ = forward(tp, tcfg, vt, vpos, None, None, causal_mask(b * a, t))
        idx = (anchors[:, :, None] + jnp.arange(d, dtype=jnp.int32)).reshape(b * a, d)
        hv = jnp.take_along_axis(h, idx[..., None], axis=1)
        verified = jnp.argmax(lm_head(tp, tcfg, hv), axis=-1).reshape(b, a, d)
        exact = draft == verified
        wa = w[:, None]
        return (jnp.sum(loss * wa), jnp.sum(acceptance(exact) * wa), jnp.sum(acceptance(tf_match) * wa),
                jnp.sum(tf_match * wa[..., None], axis=(0, 1)), jnp.sum(wa) * a)

    def evaluate(dparams, tparams, n_seqs: int | None = None) -> dict[str, Any]:
        n = len(sequences) if n_seqs is None else min(n_seqs, len(sequences))
        tot = np.zeros(4)
        top1 = np.zeros(d)
        for i in range(0, n, batch_size):
            chunk, anc = sequences[i:min(i + batch_size, n)], anchors_all[i:min(i + batch_size, n)]
            w = np.zeros(batch_size, np.float32)
            w[:len(chunk)] = 1
            if len(chunk) < batch_size:
                pad = batch_size - len(chunk)
                chunk = np.concatenate([chunk, np.repeat(chunk[:1], pad, 0)])
                anc = np.concatenate([anc, np.repeat(anc[:1], pad, 0)])
            s_loss, s_acc, s_acc_tf, s_top1, cnt = jax.device_get(
                batch_stats(dparams, tparams, jnp.asarray(chunk), jnp.asarray(anc), jnp.asarray(w)))
            tot += [s_loss, s_acc, s_acc_tf, cnt]
            top1 += s_top1
        return {"eval_loss": float(tot[0] / tot[3]), "acc_len": float(tot[1] / tot[3]),
                "acc_len_tf": float(tot[2] / tot[3]), "top1": [round(float(x), 4) for x in top1 / tot[3]],
                "anchors": int(tot[3])}

    return evaluate


def _eval_line(ev: dict[str, Any]) -> str:
    return (f"eval_loss {ev['eval_loss']:.4f} acc_len {ev['acc_len']:.3f} acc_len_tf {ev['acc_len_tf']:.3f} "
            f"top1[k=1] {ev['top1'][0]:.3f} ({ev['anchors']} anchors)")


def check_target_dir(target_dir: str | Path) -> Path:
    """One-line errors unless `target_dir` is a HF Qwen3 checkpoint directory (config only)."""
    p = Path(target_dir)
    if not p.is_dir():
        raise UserError(f"--target {p} not found; pass the target's Hugging Face directory (OUT/hf of the target command)")
    if not (p / "config.json").is_file():
        raise UserError(f"--target {p} has no config.json; pass a Hugging Face Qwen3 checkpoint directory")
    try:
        raw = json.loads((p / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"--target {p}/config.json is not valid JSON; pass a Hugging Face Qwen3 checkpoint directory") from None
    arch = (raw.get("architectures") or [None])[0] if isinstance(raw, dict) else None
    if arch != "Qwen3ForCausalLM":
        raise UserError(f"--target {p} is not a Qwen3 checkpoint (architectures: {arch}); pass the Qwen3ForCausalLM "
                        f"directory written by `python -m ddtree_jax.train target` (OUT/hf)")
    return p


def load_target(target_dir: str | Path, dtype: str):
    """(cfg, params) of a HF Qwen3 target directory, on the host; names and shapes checked by the
    converter's table (checkpoint.load_hf)."""
    from ddtree_jax.checkpoint import load_hf

    ck = load_hf(check_target_dir(target_dir), dtype=dtype)
    return ck.target_cfg, ck.target_params


def run_drafter_command(args) -> int:
    """`python -m ddtree_jax.train drafter`: validate, train, evaluate, export (all atomic)."""
    from ddtree_jax.train.data import PackedData, check_data_file, eval_sequences, load_docs
    from ddtree_jax.train.export import drafter_hf_config, export_drafter
    from ddtree_jax.train.target import _check_training_args, _jsonable
    from ddtree_jax.train.tokenizer import load_tokenizer, mask_token_id

    t_begin = time.time()
    check_data_file(args.data)
    tok_dir = args.tokenizer or args.target
    check_target_dir(args.target)
    tokenizer = load_tokenizer(tok_dir)
    _check_training_args(args)
    for name in ("anchors", "eval_anchors"):
        if getattr(args, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not math.isfinite(args.gamma) or args.gamma <= 0:
        raise UserError(f"--gamma must be a finite number > 0, got {args.gamma}")
    if not args.resume:  # a resumed run takes its shape from the checkpoint
        check_shape_options(layers=args.layers, intermediate=args.intermediate, heads=args.heads,
                            kv_heads=args.kv_heads, head_dim=args.head_dim, block_size=args.block_size)
    run = RunDir(args.out, resume=args.resume, force=args.force)
    compute_dtype = DTYPES[args.compute_dtype]
    tcfg, tparams = load_target(args.target, args.compute_dtype)
    if len(tokenizer) > tcfg.vocab_size:
        raise UserError(f"the tokenizer in {tok_dir} has {len(tokenizer)} tokens but the target's vocabulary is "
                        f"{tcfg.vocab_size}; pass the target's own tokenizer")
    if args.seq_len > tcfg.max_position:
        raise UserError(f"--seq-len {args.seq_len} exceeds the target's max_position_embeddings {tcfg.max_position}")

    if args.resume:
        meta = run.read_meta()
        if meta.get("kind") != "drafter":
            raise UserError(f"{run.ckpt} is a {meta.get('kind')} checkpoint, not a drafter one")
        dcfg = DrafterConfig.from_hf(meta["hf_config"])
        check_pair(tcfg, dcfg)
        log(f"resuming from {run.ckpt} at step {meta['step']} (drafter shape from the checkpoint)")
    else:
        dcfg = drafter_config(tcfg, mask_token_id=mask_token_id(tokenizer), layers=args.layers,
                              intermediate=args.intermediate, heads=args.heads, kv_heads=args.kv_heads,
                              head_dim=args.head_dim, block_size=args.block_size,
                              target_layer_ids=args.target_layer_ids)
    if args.anchors * 1 > args.seq_len - dcfg.block_size:
        raise UserError(f"--anchors {args.anchors} does not fit in --seq-len {args.seq_len} with blocks of {dcfg.block_size}")

    t0 = time.time()
    train_docs = load_docs(tokenizer, args.data, "train", args.token_cache)
    eval_docs = load_docs(tokenizer, args.data, "eval", args.token_cache)
    data = PackedData(train_docs, args.seq_len, args.batch_size, seed=args.seed)
    eval_all = eval_sequences(eval_docs, args.seq_len)
    log(f"data: {data.num_tokens:,} training tokens ({data.num_sequences:,} sequences of {args.seq_len}), "
        f"{len(eval_all)} held-out sequences; tokenized in {time.time() - t0:.1f} s")

    tx = make_optimizer(args.weight_decay, args.grad_clip)
    dparams = init_params(dcfg, jax.random.PRNGKey(args.seed + 1))
    opt_state = tx.init(dparams)
    start_step, metrics, last_ckpt = 0, {"train": [], "eval": []}, None
    if args.resume:
        dparams, opt_state, meta, _ = run.load(dparams, opt_state)
        start_step, metrics, last_ckpt = meta["step"], meta.get("metrics", metrics), meta["step"]
    n_params = count_params(dparams)
    log(f"drafter: {dcfg.num_layers} layers, hidden {dcfg.hidden_size}, intermediate {dcfg.intermediate_size}, "
        f"block {dcfg.block_size}, taps {list(dcfg.target_layer_ids)}, mask id {dcfg.mask_token_id}: "
        f"{n_params:,} params; labels {args.labels}, {args.anchors} anchors/sequence, gamma {args.gamma}")

    hf_config = drafter_hf_config(dcfg, tcfg, dtype=args.export_dtype)
    tparams = jax.device_put(tparams)
    step_jit = make_train_step(dcfg, tcfg, tx, compute_dtype, args.gamma, args.labels)
    eval_bs = max(1, min(args.batch_size, 128 // args.eval_anchors))
    evaluator = make_evaluator(dcfg, tcfg, eval_all, eval_bs, args.eval_anchors, compute_dtype, args.gamma, args.labels)
    summary: dict[str, Any] = {"kind": "drafter", "args": _jsonable(vars(args)), "num_params": n_params,
                               "target": str(args.target)}

    def batch_at(step: int):
        rng = np.random.default_rng([args.seed, 7, step])
        anchors = sample_anchors(rng, args.batch_size, args.seq_len, args.anchors, dcfg.block_size)
        return jnp.asarray(data.batch(step)), jnp.asarray(anchors)

    def step_fn(p, o, batch, lr):
        return step_jit(p, o, tparams, batch[0], batch[1], lr)

    def write_metrics():
        write_json_atomic(run.out / "metrics.json", {**summary, "metrics": metrics})

    def checkpoint(p, o, step, planned):
        run.save(p, o, {"kind": "drafter", "step": step, "planned_steps": planned, "hf_config": hf_config,
                        "target": str(args.target), "metrics": metrics, "args": _jsonable(vars(args))})

    def periodic_eval(p, step):
        ev = evaluator(p, tparams, args.eval_sequences)
        return {k: v for k, v in ev.items() if k != "top1"}

    loop_cfg = LoopConfig(steps=args.steps, time_budget=args.time_budget,
                          schedule=Schedule(args.lr, args.warmup, args.min_lr_ratio), log_every=args.log_every,
                          eval_every=args.eval_every, ckpt_every=args.ckpt_every,
                          tokens_per_step=args.batch_size * args.seq_len)
    log(f"training for {describe_budget(args)} from step {start_step}, batch {args.batch_size} x {args.seq_len}")
    with SigtermAsInterrupt():
        res = train_loop(cfg=loop_cfg, params=jax.device_put(dparams), opt_state=jax.device_put(opt_state),
                         start_step=start_step, step_fn=step_fn, batch_at=batch_at, evaluate=periodic_eval,
                         checkpoint=checkpoint, metrics=metrics, write_metrics=write_metrics,
                         last_ckpt_step=last_ckpt, ckpt_dir=run.ckpt)
        t_eval = time.time()
        ev = evaluator(res.params, tparams, args.final_eval_sequences or None)
        t_eval = time.time() - t_eval
        metrics["eval"].append({"step": res.step, **ev})
        train_tail = [m["loss"] for m in metrics["train"][-5:]]
        tok_s = [m["tokens_per_s"] for m in metrics["train"] if np.isfinite(m["tokens_per_s"])]
        summary["final"] = {
            "step": res.step, "stopped_by": res.stopped_by, "train_seconds": round(res.train_seconds, 1),
            "sequences_total": res.step * args.batch_size, "blocks_total": res.step * args.batch_size * args.anchors,
            "epochs": round(res.step / data.steps_per_epoch, 2),
            "train_loss": float(np.mean(train_tail)) if train_tail else None, **ev,
            "eval_seconds": round(t_eval, 1),
            "target_tokens_per_s_median": float(np.median(tok_s)) if tok_s else None,
        }
        log(f"final: step {res.step} ({res.stopped_by}) in {res.train_seconds:.0f} s; train loss "
            f"{summary['final']['train_loss']:.4f}; " + _eval_line(ev))
        log("  top1 by block position: " + " ".join(f"{x:.2f}" for x in ev["top1"]))
        if args.ckpt_every and res.step != last_ckpt:
            checkpoint(res.params, res.opt_state, res.step, res.planned_steps)
        export_drafter(run.hf, dcfg, jax.device_get(res.params), tcfg, tokenizer_dir=tok_dir, dtype=args.export_dtype)
        summary["wall_seconds"] = round(time.time() - t_begin, 1)
        write_metrics()
    log(f"exported the DFlash drafter to {run.hf} ({args.export_dtype}); metrics in {run.out / 'metrics.json'}")
    return 0
