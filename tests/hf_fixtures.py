"""Tiny random Hugging Face checkpoints for tests (no downloads are possible here).

    make_target(dir, "qwen3" | "llama" | "qwen2", ...)  a transformers model, save_pretrained'ed
    make_target(dir, "qwen3_moe" | "qwen2_moe", ...)     a mixture-of-experts one (experts=, top_k=, ...;
                                                         expert_layout= "per_expert" | "fused" rewrites
                                                         the saved experts into that layout)
    make_drafter(dir, target, ...)                       a z-lab DFlash drafter (config + safetensors)
    make_copy_drafter(dir, target, ...)                  a DFlash drafter that proposes what the target's
                                                         last-layer tap predicts (long acceptances)
    make_tokenizer(dir, vocab_size)                      a tiny byte-level BPE tokenizer (HF files)

Weights are re-drawn with a fixed torch seed at scales that keep activations O(1) and give
logits with a few units of spread (the default 0.02 init makes near-uniform logits, where a
parity test cannot tell a bug from a tie). Norm weights are 1 + noise, so a norm applied in the
wrong place shows up too. Experts have unit gain over their fan-in like every matrix; routers
give logits of std ~3, so that the top-k choice is decisive (not a near-tie a rounding flips).
Everything is float32 unless `dtype` says otherwise.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FAMILIES = {
    # family -> (transformers config class name, architecture)
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
}
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe")
EXPERT_LAYOUTS = ("per_expert", "fused")
EOS = "<|endoftext|>"


def _torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _draw(name: str, shape: tuple[int, ...], gen, *, hidden: int):
    """A weight for parameter `name`, drawn from `gen` at a scale fit for its role."""
    import torch

    x = torch.randn(shape, generator=gen, dtype=torch.float32)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * x
    if name.endswith(".bias"):
        return 0.1 * x
    if "embed_tokens" in name or name.startswith("lm_head"):
        return x * (3.0 / math.sqrt(hidden))  # logits of std ~3 through the final norm
    if name.endswith(".mlp.gate.weight"):
        return x * (3.0 / math.sqrt(shape[1]))  # router [E, H]: logits of std ~3, decisive routing
    if len(shape) == 2:
        return x / math.sqrt(shape[1])  # [out, in]: unit gain
    if len(shape) == 3:
        return x / math.sqrt(shape[2])  # experts [E, out, in]: unit gain
    return x


def make_target(
    dir: str | Path,
    family: str = "qwen3",
    *,
    sharded: bool = False,
    tie: bool = False,
    vocab: int = 384,
    hidden: int = 64,
    layers: int = 4,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    intermediate: int = 128,
    seed: int = 0,
    dtype: str = "float32",
    rope_scaling: dict[str, Any] | None = None,
    rope_theta: float = 10000.0,
    max_position: int = 512,
    rms_eps: float = 1e-6,
    final_norm_noise: float | None = None,
    experts: int = 8,
    top_k: int = 2,
    expert_intermediate: int = 32,
    shared_intermediate: int = 48,
    norm_topk_prob: bool = False,
    decoder_sparse_step: int = 1,
    mlp_only_layers: list[int] | None = None,
    expert_layout: str | None = None,
) -> Path:
    """Build and save a tiny random `family` model in `dir`; returns `dir`.

    `sharded=True` saves with a small `max_shard_size` so there are at least 3 safetensors files
    plus model.safetensors.index.json. `tie=True` ties lm_head to the embeddings.
    `final_norm_noise`: the final norm's weights are 1 + this x N(0, 1) (default: 0.1, as every
    norm's); near 1 or above, some turn negative, so the final-normed state points far from the
    last layer's raw output.

    MoE families: `experts` experts of width `expert_intermediate`, `top_k` a token, a shared expert
    of width `shared_intermediate` (qwen2_moe only); `decoder_sparse_step` and `mlp_only_layers`
    choose the sparse layers as transformers does (the others are dense, of width `intermediate`).
    `expert_layout`: None keeps what save_pretrained writes; "per_expert" (the hub's
    mlp.experts.{e}.{gate,up,down}_proj.weight) or "fused" (mlp.experts.gate_up_proj [E, 2*Ie, H]
    and down_proj [E, H, Ie]) rewrites the saved files into that layout, shards and index included.
    """
    import torch
    import transformers

    dir = Path(dir)
    cls_name, arch = FAMILIES[family]
    kwargs = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_position,
        tie_word_embeddings=tie, rope_theta=rope_theta, rms_norm_eps=rms_eps, hidden_act="silu",
    )
    if family in ("qwen2", "qwen2_moe") and head_dim != hidden // heads:
        raise ValueError(f"{family} has no head_dim field: head_dim must be hidden // heads = {hidden // heads}")
    if family not in ("qwen2", "qwen2_moe"):
        kwargs["head_dim"] = head_dim
    if family in MOE_FAMILIES:
        kwargs.update(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=expert_intermediate,
                      norm_topk_prob=norm_topk_prob, decoder_sparse_step=decoder_sparse_step,
                      mlp_only_layers=list(mlp_only_layers or []))
        if family == "qwen2_moe":
            kwargs["shared_expert_intermediate_size"] = shared_intermediate
    elif expert_layout is not None:
        raise ValueError(f"expert_layout is for the MoE families {MOE_FAMILIES}, not {family}")
    if rope_scaling is not None:
        kwargs["rope_scaling"] = dict(rope_scaling)
    config = getattr(transformers, cls_name)(**kwargs)
    config.architectures = [arch]
    model = transformers.AutoModelForCausalLM.from_config(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):  # tied lm_head is listed once, as the embedding
            p.copy_(_draw(name, tuple(p.shape), gen, hidden=hidden))
        if final_norm_noise is not None:
            w = model.model.norm.weight
            w.copy_(1.0 + final_norm_noise * torch.randn(tuple(w.shape), generator=gen))
    model = model.to(_torch_dtype(dtype)).eval()
    save: dict[str, Any] = dict(safe_serialization=True)
    if sharded:
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        save["max_shard_size"] = max(total // 5, 1)
    model.save_pretrained(dir, **save)
    cfg_path = dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = cfg["dtype"] = dtype  # transformers 4 and 5 spell it differently
    cfg_path.write_text(json.dumps(cfg, indent=2))
    if expert_layout is not None:
        rewrite_experts(dir, expert_layout)
    if sharded:
        n = len(list(dir.glob("*.safetensors")))
        assert n >= 3, f"expected >= 3 shards, got {n}"
    return dir


def rewrite_experts(dir: str | Path, layout: str) -> None:
    """Rewrite the MoE experts of HF directory `dir` into `layout` ("per_expert" or "fused"), each
    layer's new tensors in the file that held its expert 0 (or its fused tensor); the index follows."""
    import re

    import torch
    from safetensors.torch import load_file, save_file

    if layout not in EXPERT_LAYOUTS:
        raise ValueError(f"expert_layout {layout!r}: one of {EXPERT_LAYOUTS}")
    dir = Path(dir)
    files = {f.name: load_file(str(f)) for f in sorted(dir.glob("*.safetensors"))}
    per_expert = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight")
    fused = re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)")
    for tensors in files.values():
        for name in sorted(tensors):
            if layout == "fused" and (m := per_expert.fullmatch(name)) and m[2] == "0" and m[3] == "gate":
                pre = m[1]
                n = sum(1 for t in files.values() for k in t if per_expert.fullmatch(k) and k.startswith(pre + ".")
                        and k.endswith(".gate_proj.weight"))

                def take(proj: str) -> list:
                    out = []
                    for e in range(n):
                        key = f"{pre}.{e}.{proj}_proj.weight"
                        out.append(next(t.pop(key) for t in files.values() if key in t))
                    return out

                gate, up, down = take("gate"), take("up"), take("down")
                tensors[pre + ".gate_up_proj"] = torch.stack([torch.cat([g, u]) for g, u in zip(gate, up)])
                tensors[pre + ".down_proj"] = torch.stack(down)
            elif layout == "per_expert" and (m := fused.fullmatch(name)):
                t = tensors.pop(name)
                for e in range(t.shape[0]):
                    if m[2] == "down_proj":
                        tensors[f"{m[1]}.{e}.down_proj.weight"] = t[e].clone()
                    else:
                        gate, up = t[e].chunk(2, dim=0)
                        tensors[f"{m[1]}.{e}.gate_proj.weight"] = gate.clone()
                        tensors[f"{m[1]}.{e}.up_proj.weight"] = up.clone()
    for fname, tensors in files.items():
        if not tensors:  # every tensor of this shard moved to another
            (dir / fname).unlink()
            continue
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(dir / fname), metadata={"format": "pt"})
    index = dir / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {k: fname for fname, tensors in files.items() for k in sorted(tensors)}
        index.write_text(json.dumps(data, indent=2))


def make_tokenizer(dir: str | Path, vocab_size: int = 320) -> int:
    """Train a tiny byte-level BPE tokenizer and save it as HF files in `dir`; returns its size.

    The eos (and pad) token is "<|endoftext|>", id 0. Use a model vocab >= the returned size.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    dir = Path(dir)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        "def main(argv=None):\n    return 0\n",
        "import os\nimport sys\nprint('hello world')\n",
        "for i in range(10):\n    if i % 2 == 0:\n        yield i\n",
        "The quick brown fox jumps over the lazy dog.",
        "class Tree:\n    def __init__(self, nodes):\n        self.nodes = nodes\n",
    ] * 4
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.save_pretrained(dir)
    size = tok.get_vocab_size()
    if size > vocab_size:
        raise AssertionError(f"tokenizer has {size} tokens, more than the requested {vocab_size}")
    return size


def make_drafter(
    dir: str | Path,
    target: str | Path | dict[str, Any],
    *,
    layers: int = 2,
    block_size: int = 8,
    target_layer_ids: list[int] | None = None,
    mask_token_id: int | None = None,
    sliding_window: int | None = None,
    layer_types: list[str] | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    intermediate: int | None = None,
    hidden: int | None = None,
    vocab: int | None = None,
    seed: int = 0,
    dtype: str = "float32",
    name_prefix: str = "",
) -> Path:
    """Write a z-lab format DFlash drafter for `target` (a HF model dir or its config dict) in `dir`.

    Sizes default to the target's. `target_layer_ids=None` leaves the field out of
    `dflash_config`, so the loader's default rule applies (spread over 1..L-3). `mask_token_id`
    defaults to the target's last vocab id. `layer_types` defaults to all "full_attention";
    give "sliding_attention" entries together with `sliding_window`. `hidden`/`vocab` override
    the target's (to build drafters that do not fit), and `name_prefix="model."` stores the
    tensors under a "model." prefix, as some exports do.
    """
    import torch
    from safetensors.torch import save_file

    dir = Path(dir)
    t = target if isinstance(target, dict) else json.loads((Path(target) / "config.json").read_text())
    hidden = hidden or t["hidden_size"]
    vocab = vocab or t["vocab_size"]
    heads = heads or t["num_attention_heads"]
    kv_heads = kv_heads or t.get("num_key_value_heads") or heads
    head_dim = head_dim or t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    intermediate = intermediate or t["intermediate_size"]
    n_target = t["num_hidden_layers"]
    rope = t.get("rope_parameters") or {}
    dflash: dict[str, Any] = {"mask_token_id": vocab - 1 if mask_token_id is None else mask_token_id}
    if target_layer_ids is not None:
        dflash["target_layer_ids"] = list(target_layer_ids)
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": layers,
        "num_target_layers": n_target,
        "vocab_size": vocab,
        "rms_norm_eps": t.get("rms_norm_eps", 1e-6),
        "rope_theta": t.get("rope_theta", rope.get("rope_theta", 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": t.get("max_position_embeddings", 512),
        "block_size": block_size,
        "dflash_config": dflash,
        "layer_types": list(layer_types or ["full_attention"] * layers),
        "sliding_window": sliding_window,
        "use_sliding_window": sliding_window is not None,
        "tie_word_embeddings": False,
        "dtype": dtype,
        "torch_dtype": dtype,
    }
    n_taps = len(target_layer_ids) if target_layer_ids is not None else None
    if n_taps is None:
        from ddtree_jax.models.config import default_target_layer_ids

        n_taps = len(default_target_layer_ids(n_target, layers))
    q, kv = heads * head_dim, kv_heads * head_dim
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (hidden, n_taps * hidden), "hidden_norm.weight": (hidden,),
                                          "norm.weight": (hidden,)}
    for i in range(layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (q, hidden),
            p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden),
            p + "self_attn.o_proj.weight": (hidden, q),
            p + "self_attn.q_norm.weight": (head_dim,),
            p + "self_attn.k_norm.weight": (head_dim,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "mlp.gate_proj.weight": (intermediate, hidden),
            p + "mlp.up_proj.weight": (intermediate, hidden),
            p + "mlp.down_proj.weight": (hidden, intermediate),
        })
    gen = torch.Generator().manual_seed(seed)
    tensors = {name_prefix + n: _draw(n, s, gen, hidden=hidden).to(_torch_dtype(dtype)).contiguous()
               for n, s in sorted(shapes.items())}
    dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dir / "model.safetensors"), metadata={"format": "pt"})
    (dir / "config.json").write_text(json.dumps(config, indent=2))
    return dir


def make_copy_drafter(dir: str | Path, target: str | Path, *, target_layer_ids: list[int], block_size: int = 8,
                      context: int = 3, gain: float = 16.0) -> Path:
    """A one-layer DFlash drafter for `target` whose every block position proposes the token that
    the target's states at the last `context` context positions predict, read from the tap of the
    target's last layer (which must be in `target_layer_ids`): where the target repeats a token,
    whole blocks are accepted, so acceptance lengths are worth comparing.

    How: `fc` keeps only the last layer's tap; the block's own tokens are zeroed by the input norm
    (weight 0), so every query is 0 and attends uniformly to the keys of a sliding window of
    `block_size + context`, whose values are the last `context` context features (v = identity);
    o = `gain` x identity adds their sum to the mask embedding, no MLP (down = 0), and the final
    norm is plain. The logits are then ~ the sum of the target's logits at those positions.
    Needs the target's head count x head_dim = hidden size (the tiny targets' defaults).
    """
    import torch
    from safetensors.torch import load_file, save_file

    t = json.loads((Path(target) / "config.json").read_text())
    hidden, heads = t["hidden_size"], t["num_attention_heads"]
    last = t["num_hidden_layers"] - 1
    if last not in target_layer_ids:
        raise ValueError(f"target_layer_ids {target_layer_ids} must include the last layer, {last}")
    head_dim = t.get("head_dim") or hidden // heads
    if heads * head_dim != hidden:
        raise ValueError("the copy drafter needs heads x head_dim = hidden")
    dir = make_drafter(dir, target, layers=1, block_size=block_size, target_layer_ids=target_layer_ids,
                       kv_heads=heads, sliding_window=block_size + context, layer_types=["sliding_attention"])
    sd = load_file(str(dir / "model.safetensors"))
    eye = torch.eye(hidden)
    fc = torch.zeros_like(sd["fc.weight"])
    k = target_layer_ids.index(last)
    fc[:, k * hidden:(k + 1) * hidden] = eye
    sd.update({
        "fc.weight": fc,
        "hidden_norm.weight": torch.ones(hidden), "norm.weight": torch.ones(hidden),
        "layers.0.input_layernorm.weight": torch.zeros(hidden),
        "layers.0.self_attn.v_proj.weight": eye.clone(),
        "layers.0.self_attn.o_proj.weight": gain * eye,
        "layers.0.mlp.down_proj.weight": torch.zeros_like(sd["layers.0.mlp.down_proj.weight"]),
    })
    save_file({n: a.contiguous() for n, a in sd.items()}, str(dir / "model.safetensors"), metadata={"format": "pt"})
    return dir


HYBRID_TYPES = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]


def make_hybrid_target(dir: str | Path, *, vocab: int = 128, hidden: int = 64, layer_types: list[str] | None = None,
                       heads: int = 4, kv_heads: int = 2, head_dim: int = 32, intermediate: int = 96,
                       linear_k_heads: int = 2, linear_v_heads: int = 4, linear_k_dim: int = 16,
                       linear_v_dim: int = 8, conv_kernel: int = 4, tie: bool = False, max_position: int = 512,
                       seed: int = 0, experts: int = 0, top_k: int = 2, expert_intermediate: int = 32,
                       shared_intermediate: int = 48) -> Path:
    """A tiny random transformers `Qwen3_5ForCausalLM` (qwen3_5: Gated DeltaNet and gated attention
    layers, partial rotary 0.25), float32, save_pretrained'ed in `dir`; returns `dir`. Weights drawn
    so that every part shows: decays 0.02..0.8 (some heads remember the whole prompt), the 1 + w
    norms' w far from 0, the gated norm 1 + noise, a sharp LM head (few near-ties).
    experts > 0: a `Qwen3_5MoeForCausalLM` (qwen3_5_moe) instead, every MLP `experts` experts of
    width `expert_intermediate`, `top_k` a token, and a shared expert; routers of std ~3 (decisive)."""
    import torch

    if experts:
        from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig as Config
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM as Model
        extra = dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=expert_intermediate,
                     shared_expert_intermediate_size=shared_intermediate)
    else:
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig as Config
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM as Model
        extra = dict(intermediate_size=intermediate)

    types = list(layer_types or HYBRID_TYPES)
    config = Config(
        **extra, vocab_size=vocab, hidden_size=hidden, num_hidden_layers=len(types),
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=1e-6,
        layer_types=types, linear_num_key_heads=linear_k_heads, linear_num_value_heads=linear_v_heads,
        linear_key_head_dim=linear_k_dim, linear_value_head_dim=linear_v_dim, linear_conv_kernel_dim=conv_kernel,
        tie_word_embeddings=tie, max_position_embeddings=max_position,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})
    config.architectures = ["Qwen3_5MoeForCausalLM" if experts else "Qwen3_5ForCausalLM"]
    torch.manual_seed(seed)
    model = Model(config).float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, w in sorted(model.named_parameters()):
            x = torch.randn(w.shape, generator=gen)
            if name.endswith("A_log"):
                w.copy_(torch.log(0.02 + 0.78 * torch.rand(w.shape, generator=gen)))
            elif name.endswith("dt_bias"):
                w.copy_(0.5 * x)
            elif name.endswith("linear_attn.norm.weight"):  # the gated norm: no 1 + w
                w.copy_(1.0 + 0.1 * x)
            elif name.endswith("conv1d.weight"):
                w.copy_(0.6 * x)
            elif w.ndim == 1:  # the 1 + w norms
                w.copy_(0.3 * x)
            elif name.endswith("embed_tokens.weight"):
                w.copy_(x)
            elif name.endswith("mlp.gate.weight"):  # the router [E, H]
                w.copy_(3.0 * x / w.shape[-1] ** 0.5)
            else:  # unit gain over the fan-in; the LM head sharper
                w.copy_((3.0 if name == "lm_head.weight" else 1.0) * x / w.shape[-1] ** 0.5)
    dir = Path(dir)
    model.save_pretrained(dir, safe_serialization=True)
    cfg_path = dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return dir


def as_multimodal(src: str | Path, dir: str | Path) -> Path:
    """The text model of Qwen3.5 directory `src` as a Qwen3_5ForConditionalGeneration checkpoint
    in `dir`: its config nested as text_config, its tensors under model.language_model., and a
    vision tensor and an MTP tensor beside them (which loaders skip)."""
    import torch
    from safetensors.torch import load_file, save_file

    src, dir = Path(src), Path(dir)
    text = json.loads((src / "config.json").read_text())
    config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
              "text_config": {**text, "model_type": "qwen3_5_text"}, "vision_config": {"depth": 1},
              "tie_word_embeddings": text.get("tie_word_embeddings", False), "torch_dtype": "float32"}
    tensors = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
               for k, v in load_file(str(src / "model.safetensors")).items()}
    tensors["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    tensors["mtp.fc.weight"] = torch.zeros(2, 2)
    dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(dir / "model.safetensors"), metadata={"format": "pt"})
    (dir / "config.json").write_text(json.dumps(config, indent=2))
    return dir
