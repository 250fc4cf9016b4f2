"""Bad config values: every field that conversion or loading reads, given a wrong type or an
out-of-range value, is refused with one line naming the field (exit 2, no traceback), and nothing
is written or changed.

Three levels, fastest first:
- `TargetConfig.from_hf` / `DrafterConfig.from_hf`: every field x every bad value of its kind, in
  every base config that reads the field; `FIELDS` must name exactly the fields the parsers read
  (recorded while they parse the bases), so a field added to a parser cannot go unfuzzed;
- `python -m convert` (`convert.main`, in-process) on HF directories whose config.json carries
  seeded-random bad values of every field (the weights are links to a good tiny checkpoint, so a
  value that slipped through would convert and fail the test);
- `python -m ddtree_jax.generate` (`ddtree_jax.cli.main` through `cli_main`, in-process) on
  converted checkpoints whose target/draft config.json carry them, and on bad
  generation_config.json files (the eos ids the CLI stops at).
Cross-field rules (head counts that do not divide, an odd head size, ...) have their own cases.
"""
from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path
from typing import Any, Callable

import pytest

from ddtree_jax.errors import ConfigError, UserError, cli_main
from ddtree_jax.models.config import DrafterConfig, TargetConfig, check_pair

NAN, INF = float("nan"), float("inf")

# ---------------------------------------------------------------------------------------------
# Bad values by the kind of field: (value, what the one line must name; None: the field itself)

INT = ["four", "64", 64.5, 2.0, True, False, None, [4], {"n": 4}, 0, -3, 2**31, 1e300, NAN]
INT_OR_NULL = [v for v in INT if v is not None]          # null means "absent" (num_key_value_heads, head_dim)
NUM = ["abc", "1e-6", True, None, [1.0], {}, 0, 0.0, -1, -1e-6, NAN, INF, -INF, 10**400]
NUM_OR_NULL = [v for v in NUM if v is not None]          # attention_factor
BOOL = ["false", "true", 0, 1, None, [], 1.0]
BOOL_OR_NULL = [v for v in BOOL if v is not None]       # is_causal: null leaves z-lab's default
OBJECT = ["linear", 5, [1], True, 0.5]
ARCH = ["Qwen3ForCausalLM", 5, [5], {"a": 1}, True]
ACT = ["gelu", 5, None, ["silu"]]
ROPE_TYPE = ["banana", 5, ["llama3"], True]
BLOCK = ["8", 8.5, True, None, 1, 0, -2]
MASK = ["x", 1.5, True, None, [3]]                        # its range is the pair's check (below)
LAYER_IDS = ["1,2", 5, [], [1, "2"], [1.5], [True], [-1], {"0": 1}]
LAYER_TYPES = ["full_attention", 5, {}, [5, 5], ["banana", "full_attention"], ["full_attention"]]
WINDOW = ["12", 12.5, True, 0, -4, None, [12], 3]        # 3: shorter than the block
LAYER_LIST = ["1", 5, [1.5], [True], [-1], [9], {"0": 1}, True]   # [9]: past the last layer
INT_OR_ZERO = [v for v in INT if v != 0]                 # shared_expert_intermediate_size: 0 is none

ROPE_FIELDS = {"factor": NUM, "low_freq_factor": NUM, "high_freq_factor": NUM, "beta_fast": NUM, "beta_slow": NUM,
               "original_max_position_embeddings": INT, "attention_factor": NUM_OR_NULL}
COMMON = {"architectures": ARCH, "hidden_size": INT, "num_attention_heads": INT, "num_key_value_heads": INT_OR_NULL,
          "head_dim": INT_OR_NULL, "hidden_act": ACT, "attention_bias": BOOL, "vocab_size": INT,
          "intermediate_size": INT, "num_hidden_layers": INT, "rms_norm_eps": NUM, "max_position_embeddings": INT,
          "rope_theta": NUM, "rope_parameters": OBJECT, "rope_scaling": OBJECT,
          "rope_parameters.rope_theta": NUM, "rope_parameters.rope_type": ROPE_TYPE,
          "rope_scaling.rope_type": ROPE_TYPE + [None], "rope_scaling.type": ROPE_TYPE + [None],
          **{f"{p}.{k}": v for p in ("rope_parameters", "rope_scaling") for k, v in ROPE_FIELDS.items()}}
FIELDS = {
    "target": {**COMMON, "tie_word_embeddings": BOOL, "num_experts": INT_OR_NULL, "num_local_experts": INT,
               "num_experts_per_tok": INT, "moe_intermediate_size": INT, "norm_topk_prob": BOOL,
               "decoder_sparse_step": INT, "mlp_only_layers": LAYER_LIST,
               "shared_expert_intermediate_size": INT_OR_ZERO, "qkv_bias": BOOL},
    "drafter": {**COMMON, "num_target_layers": INT, "block_size": BLOCK, "layer_types": LAYER_TYPES,
                "sliding_window": WINDOW, "mask_token_id": MASK, "dflash_config": OBJECT,
                "dflash_config.mask_token_id": MASK, "dflash_config.target_layer_ids": LAYER_IDS,
                "dflash_config.block_size": BLOCK, "is_causal": BOOL_OR_NULL,
                "dflash_config.causal": BOOL_OR_NULL},
}
# the one line names these instead of the field
NEEDLES = {"layer_types": {json.dumps(["banana", "full_attention"]): "layer type", json.dumps([5, 5]): "layer type"},
           # a null num_local_experts leaves num_experts, which that config lacks
           "num_local_experts": {json.dumps(None): "num_experts"}}
# where the pair's check (or the weights) answer: values the parser lets through, the CLIs refuse
PAIR = {"drafter": {"mask_token_id": [(-1, "mask token id"), (384, "mask token id")],
                    "dflash_config.mask_token_id": [(-1, "mask token id"), (10**6, "mask token id")],
                    "dflash_config.target_layer_ids": [([0, 4], "tapped layers"), ([9], "tapped layers")]}}

# ---------------------------------------------------------------------------------------------
# Base configs (the tiny fixtures' shapes: tests/hf_fixtures.py), each variant reading other fields

TARGET = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "head_dim": 16,
          "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 512,
          "num_attention_heads": 4, "num_hidden_layers": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
          "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": False,
          "vocab_size": 384, "dtype": "float32"}
DRAFTER = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "attention_bias": False, "hidden_act": "silu",
           "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "num_hidden_layers": 2, "num_target_layers": 4, "vocab_size": 384, "rms_norm_eps": 1e-06,
           "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 512, "block_size": 8,
           "dflash_config": {"mask_token_id": 383, "target_layer_ids": [1, 2]},
           "layer_types": ["full_attention", "full_attention"], "sliding_window": None, "dtype": "float32"}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 128, "rope_theta": 10000.0}
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32.0, "beta_slow": 1.0,
        "attention_factor": 1.1}


def _edit(d: dict, **changes) -> dict:
    """A copy of `d` with fields set (a value of ... removes the field)."""
    d = copy.deepcopy(d)
    for k, v in changes.items():
        if v is ...:
            d.pop(k, None)
        else:
            d[k] = v
    return d


VARIANTS: dict[str, dict[str, Callable[[dict], dict]]] = {
    "target": {
        "qwen3": lambda d: copy.deepcopy(d),
        "llama3": lambda d: _edit(d, architectures=["LlamaForCausalLM"], rope_parameters=dict(LLAMA3)),
        "qwen2_yarn": lambda d: _edit(d, architectures=["Qwen2ForCausalLM"], head_dim=..., rope_parameters=...,
                                      rope_theta=10000.0, rope_scaling=dict(YARN)),
        "llama_linear": lambda d: _edit(d, architectures=["LlamaForCausalLM"], rope_parameters=..., rope_theta=1e6,
                                        rope_scaling={"rope_type": "linear", "factor": 2.0}),
        "qwen3_moe": lambda d: _edit(d, architectures=["Qwen3MoeForCausalLM"], num_experts=8, num_experts_per_tok=2,
                                     moe_intermediate_size=32, norm_topk_prob=True, decoder_sparse_step=1,
                                     mlp_only_layers=[1]),
        # transformers 5's spelling of the expert count; every layer sparse, so intermediate_size sizes nothing
        "qwen2_moe": lambda d: _edit(d, architectures=["Qwen2MoeForCausalLM"], head_dim=..., num_local_experts=8,
                                     num_experts_per_tok=2, moe_intermediate_size=32,
                                     shared_expert_intermediate_size=48, qkv_bias=True),
    },
    "drafter": {
        "zlab": lambda d: copy.deepcopy(d),
        "sliding": lambda d: _edit(d, layer_types=["sliding_attention", "full_attention"], sliding_window=12,
                                   mask_token_id=d["dflash_config"]["mask_token_id"], dflash_config={"block_size": 8},
                                   block_size=..., head_dim=..., rope_scaling={"type": "linear", "factor": 2.0}),
        "yarn": lambda d: _edit(d, rope_theta=..., rope_scaling=None,
                                rope_parameters=_edit(YARN, type=..., rope_type="yarn", rope_theta=5e5)),
    },
}
BASES = {"target": TARGET, "drafter": DRAFTER}
PARSE = {"target": TargetConfig.from_hf, "drafter": DrafterConfig.from_hf}


class _Recorder(dict):
    """A config dict that notes every field read (get, [], in), nested objects as "a.b"."""

    def __init__(self, d: dict, seen: set, prefix: str = ""):
        super().__init__({k: _Recorder(v, seen, f"{prefix}{k}.") if isinstance(v, dict) else v for k, v in d.items()})
        self._seen, self._prefix = seen, prefix

    def _note(self, key):
        self._seen.add(self._prefix + str(key))

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)


def fields_read(kind: str, config: dict) -> set[str]:
    seen: set[str] = set()
    PARSE[kind](_Recorder(config, seen))
    return seen


def inject(config: dict, field: str, value: Any) -> dict:
    """A copy of `config` with `field` ("a" or "a.b") set to `value`."""
    d = copy.deepcopy(config)
    *parents, key = field.split(".")
    obj = d
    for p in parents:
        obj = obj[p]
    obj[key] = value
    return d


def needle(field: str, value: Any) -> str:
    return NEEDLES.get(field, {}).get(json.dumps(value), field)


def cases(kind: str, base: dict) -> list[tuple[str, str, Any, str]]:
    """(variant, field, bad value, needle) for every field a variant of `base` reads."""
    out = []
    for name, make in VARIANTS[kind].items():
        config = make(base)
        for field in sorted(fields_read(kind, config) & set(FIELDS[kind])):
            for value in FIELDS[kind][field]:
                out.append((name, field, value, needle(field, value)))
    return out


# ---------------------------------------------------------------------------------------------
# The parsers: every field x every bad value


@pytest.mark.parametrize("kind", ["target", "drafter"])
def test_the_bases_parse_and_the_table_names_every_field_read(kind):
    """The bases are good configs, and FIELDS is exactly what the parser reads over all of them."""
    read = set()
    for make in VARIANTS[kind].values():
        config = make(BASES[kind])
        PARSE[kind](json.loads(json.dumps(config)))  # a good config, as JSON gives it
        read |= fields_read(kind, config)
    assert read - set(FIELDS[kind]) == set(), f"fields the {kind} parser reads that FIELDS does not fuzz"
    assert set(FIELDS[kind]) - read == set(), f"FIELDS entries no {kind} variant reads (stale or untested)"


@pytest.mark.parametrize("kind", ["target", "drafter"])
def test_every_bad_value_of_every_field_is_one_line_naming_it(kind):
    checked = 0
    for variant, field, value, name in cases(kind, BASES[kind]):
        config = json.loads(json.dumps(inject(VARIANTS[kind][variant](BASES[kind]), field, value)))
        with pytest.raises(ConfigError) as e:
            PARSE[kind](config)
        msg = str(e.value)
        assert "\n" not in msg and name in msg, (variant, field, value, msg)
        checked += 1
    assert checked > 300


@pytest.mark.parametrize("kind, variant, edits, name", [
    ("target", "qwen3", {"num_key_value_heads": 3}, "num_key_value_heads (3)"),
    ("target", "qwen3", {"num_attention_heads": 5}, "num_attention_heads (5)"),
    ("target", "qwen3", {"head_dim": 15}, "head_dim is 15"),
    ("target", "qwen2_yarn", {"hidden_size": 66}, "hidden_size (66) is not a multiple of num_attention_heads (4)"),
    ("target", "qwen2_yarn", {"hidden_size": 12}, "hidden_size / num_attention_heads = 3 is odd"),
    ("target", "qwen2_yarn", {"rope_theta": 1}, "rope_theta is 1"),
    ("target", "llama3", {"rope_parameters": {**LLAMA3, "high_freq_factor": 1.0}},
     "rope_parameters.high_freq_factor"),
    ("target", "qwen3", {"architectures": ["MambaForCausalLM"]},
     "architecture 'MambaForCausalLM' is not supported"),
    ("target", "qwen3", {"architectures": []}, "architecture None is not supported"),
    ("target", "qwen3_moe", {"num_experts_per_tok": 9}, "num_experts_per_tok is 9; it must be at most num_experts (8)"),
    ("target", "qwen2_moe", {"num_local_experts": 1}, "num_experts_per_tok is 2; it must be at most num_experts (1)"),
    ("drafter", "zlab", {"num_key_value_heads": 3}, "num_key_value_heads (3)"),
    ("drafter", "sliding", {"hidden_size": 62}, "hidden_size (62) is not a multiple"),
    ("drafter", "sliding", {"sliding_window": 7}, "sliding_window 7 is shorter than block_size 8"),
    ("drafter", "zlab", {"layer_types": ["full_attention"] * 3}, "layer_types has 3 entries but num_hidden_layers is 2"),
    ("drafter", "zlab", {"architectures": ["EagleDraftModel"], "dflash_config": None}, "'EagleDraftModel'"),
    ("drafter", "zlab", {"dflash_config": {"target_layer_ids": [1, 2]}}, "lacks the field 'dflash_config.mask_token_id'"),
])
def test_fields_that_do_not_fit_each_other(kind, variant, edits, name):
    config = VARIANTS[kind][variant](BASES[kind])
    config.update(copy.deepcopy(edits))
    with pytest.raises(ConfigError) as e:
        PARSE[kind](config)
    assert name in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("value", [[1, 2], "config", 5, None])
def test_a_config_that_is_not_an_object(value):
    for kind in ("target", "drafter"):
        with pytest.raises(ConfigError, match="not a JSON object"):
            PARSE[kind](value)


@pytest.mark.parametrize("field, value", [(f, v) for f, vs in PAIR["drafter"].items() for v, _ in vs])
def test_ids_out_of_the_targets_range_are_the_pairs_check(field, value):
    """The parser takes any integer mask id and tapped layers >= 0; check_pair bounds them by the target."""
    target = TargetConfig.from_hf(TARGET)
    variant = "sliding" if field == "mask_token_id" else "zlab"
    drafter = DrafterConfig.from_hf(inject(VARIANTS["drafter"][variant](DRAFTER), field, value))
    with pytest.raises(ConfigError, match="the drafter does not fit the target"):
        check_pair(target, drafter)


# ---------------------------------------------------------------------------------------------
# The CLIs: seeded-random bad values of every field, one line each, nothing written or changed

PER_FIELD = 2  # bad values per field and CLI (all of them at the parser level above)


def cli_cases(kind: str, base: dict, seed: str) -> list[tuple[str, str, Any, str]]:
    """PER_FIELD seeded-random bad values of every field, and the values only the pair's check refuses."""
    rng = random.Random(seed)
    by_field: dict[tuple[str, str], list] = {}
    for variant, field, value, name in cases(kind, base):
        by_field.setdefault((variant, field), []).append((value, name))
    out = [(variant, field, *pick) for (variant, field), vals in sorted(by_field.items())
           for pick in rng.sample(vals, min(PER_FIELD, len(vals)))]
    for field, vals in PAIR.get(kind, {}).items():
        variant = "sliding" if field == "mask_token_id" else "zlab"
        out += [(variant, field, v, name) for v, name in vals]
    return out


def _one_line(rc: int, err: str, prog: str, name: str, case) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (case, rc, err)
    assert "Traceback" not in err and len(lines) == 1, (case, err)
    assert lines[0].startswith(f"{prog}: error: ") and name in lines[0], (case, lines[0])


def _links(src: Path, dst: Path, but: tuple[str, ...] = ()) -> Path:
    """dst/ with a link to every entry of src/ except those named in `but` (the caller writes them)."""
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.name not in but:
            (dst / p.name).symlink_to(p)
    return dst


def _tree(path: Path) -> dict[str, bytes | str]:
    """Every file written under `path` (its content) and every link (its target), links not followed."""
    out: dict[str, bytes | str] = {}
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            p = Path(root) / name
            out[str(p.relative_to(path))] = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else ""
    return out


@pytest.mark.parametrize("kind", ["target", "drafter"])
def test_convert_refuses_bad_fields(qwen3_pair, tmp_path, capsys, kind):
    from convert import main as convert_main

    src = qwen3_pair.hf_target if kind == "target" else qwen3_pair.hf_draft
    base = json.loads((src / "config.json").read_text())
    capsys.readouterr()
    todo = cli_cases(kind, base, f"convert-{kind}")
    for i, (variant, field, value, name) in enumerate(todo):
        config = inject(VARIANTS[kind][variant](base), field, value)
        hf = _links(src, tmp_path / f"hf{i}", but=("config.json",))
        (hf / "config.json").write_text(json.dumps(config))
        out = tmp_path / f"out{i}"
        pair = ["--target", hf] if kind == "target" else ["--target", qwen3_pair.hf_target, "--draft", hf]
        rc = convert_main([str(a) for a in (*pair, "--out", out, "--dtype", "float32")])
        cap = capsys.readouterr()
        _one_line(rc, cap.err, "convert", name, (variant, field, value))
        assert cap.out == "" and not out.exists() and not list(tmp_path.glob(f"out{i}.*")), (variant, field, value)
    assert len(todo) > 40


@pytest.mark.parametrize("kind", ["target", "drafter"])
def test_generate_refuses_bad_fields_of_a_converted_checkpoint(qwen3_pair, tmp_path, capsys, kind):
    from ddtree_jax.cli import main as generate_main

    part = "target" if kind == "target" else "draft"
    base = json.loads((qwen3_pair.out / part / "config.json").read_text())
    capsys.readouterr()
    todo = cli_cases(kind, base, f"generate-{kind}")
    for i, (variant, field, value, name) in enumerate(todo):
        ck = _links(qwen3_pair.out, tmp_path / f"ck{i}", but=(part,))
        _links(qwen3_pair.out / part, ck / part, but=("config.json",))
        (ck / part / "config.json").write_text(json.dumps(inject(VARIANTS[kind][variant](base), field, value)))
        before = _tree(ck)
        rc = cli_main(generate_main, ["--ckpt", str(ck), "--prompt", "x", "--max-new-tokens", "1"],
                      prog="ddtree_jax.generate")
        cap = capsys.readouterr()
        _one_line(rc, cap.err, "ddtree_jax.generate", name, (variant, field, value))
        assert cap.out == "" and _tree(ck) == before, (variant, field, value)
    assert len(todo) > 40


# ---------------------------------------------------------------------------------------------
# generation_config.json: the eos ids the generate CLI stops at


class _Tok:
    eos_token_id = 0


@pytest.mark.parametrize("text, ids", [
    ('{"eos_token_id": 7}', [0, 7]),
    ('{"eos_token_id": [3, 0, null]}', [0, 3]),
    ('{"eos_token_id": null}', [0]),
    ('{"bos_token_id": 1}', [0]),
])
def test_stop_ids_of_good_generation_configs(tmp_path, text, ids):
    from ddtree_jax.cli import stop_ids_for

    (tmp_path / "generation_config.json").write_text(text)
    assert stop_ids_for(_Tok(), tmp_path) == ids


BAD_GENERATION_CONFIGS = [
    ('{"eos_token_id": 7', "not valid JSON"),
    ('[{"eos_token_id": 7}]', "not a JSON object"),
    ('{"eos_token_id": "7"}', "eos_token_id is \"7\""),
    ('{"eos_token_id": 7.5}', "eos_token_id is 7.5"),
    ('{"eos_token_id": true}', "eos_token_id is true"),
    ('{"eos_token_id": -1}', "eos_token_id is -1"),
    ('{"eos_token_id": [1, "x"]}', "eos_token_id is [1, \"x\"]"),
    ('{"eos_token_id": {"id": 1}}', "eos_token_id is {\"id\": 1}"),
]


@pytest.mark.parametrize("text, name", BAD_GENERATION_CONFIGS)
def test_bad_generation_configs(tmp_path, text, name):
    from ddtree_jax.cli import stop_ids_for

    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(UserError) as e:
        stop_ids_for(_Tok(), tmp_path)
    assert name in str(e.value) and "generation_config.json" in str(e.value) and "\n" not in str(e.value)


def test_generate_refuses_a_bad_generation_config(qwen3_pair, tmp_path, capsys):
    from ddtree_jax.cli import main as generate_main

    capsys.readouterr()
    for i, (text, name) in enumerate(BAD_GENERATION_CONFIGS[:3]):
        ck = _links(qwen3_pair.out, tmp_path / f"ck{i}", but=("tokenizer",))
        _links(qwen3_pair.out / "tokenizer", ck / "tokenizer", but=("generation_config.json",))
        (ck / "tokenizer" / "generation_config.json").write_text(text)
        rc = cli_main(generate_main, ["--ckpt", str(ck), "--prompt", "x", "--max-new-tokens", "1"],
                      prog="ddtree_jax.generate")
        cap = capsys.readouterr()
        _one_line(rc, cap.err, "ddtree_jax.generate", name, text)
        assert cap.out == ""


def test_convert_refuses_unreadable_configs(qwen3_pair, tmp_path, capsys):
    """config.json that is not UTF-8, not JSON, or JSON but not an object: one line, nothing written."""
    from convert import main as convert_main

    capsys.readouterr()
    for i, (raw, name) in enumerate([(b"\xff\xfe{", "not UTF-8"), (b"{\"vocab_size\": 3", "not valid JSON"),
                                     (b"[1, 2]", "not a JSON object"), (b"NaN", "not a JSON object")]):
        hf = _links(qwen3_pair.hf_target, tmp_path / f"hf{i}", but=("config.json",))
        (hf / "config.json").write_bytes(raw)
        rc = convert_main(["--target", str(hf), "--out", str(tmp_path / f"out{i}")])
        cap = capsys.readouterr()
        _one_line(rc, cap.err, "convert", name, raw)
        assert not (tmp_path / f"out{i}").exists()


# ---------------------------------------------------------------------------------------------
# Hybrid Qwen3.5 targets (models/hybrid.py): the same fuzz over the fields their parser reads


def _hybrid_parse(d):
    from ddtree_jax.models.family import target_config_from_hf

    return target_config_from_hf(d)


HYBRID = {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "hidden_act": "silu",
          "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6, "attention_bias": False,
          "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention"],
          "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
          "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "tie_word_embeddings": False, "vocab_size": 384,
          "max_position_embeddings": 512,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}
HYBRID_LAYER_TYPES = ["linear_attention", 5, {}, ["linear_attention"] * 3, ["banana"] * 4,
                      ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]]
FIELDS["hybrid"] = {
    **{k: v for k, v in COMMON.items() if k != "architectures"},
    "architectures": ["Qwen3MoeForCausalLM", 5, [5], {"a": 1}, True], "tie_word_embeddings": BOOL,
    "text_config": OBJECT,
    "num_experts": INT_OR_NULL, "num_experts_per_tok": INT, "moe_intermediate_size": INT,
    "shared_expert_intermediate_size": INT, "layer_types": HYBRID_LAYER_TYPES, "full_attention_interval": INT,
    "partial_rotary_factor": NUM + [1.5, 0.01], "rope_parameters.partial_rotary_factor": NUM + [1.5, 0.01],
    "linear_num_key_heads": INT, "linear_num_value_heads": INT, "linear_key_head_dim": INT,
    "linear_value_head_dim": INT, "linear_conv_kernel_dim": INT,
}
VARIANTS["hybrid"] = {
    "qwen3_5": lambda d: copy.deepcopy(d),
    # transformers' defaults: every 4th layer full attention, the rotary share at the top level
    "interval": lambda d: _edit(d, layer_types=..., full_attention_interval=4, partial_rotary_factor=0.25,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "rope_scaling": lambda d: _edit(d, rope_parameters=..., rope_theta=1e6, partial_rotary_factor=0.5,
                                    rope_scaling=dict(YARN)),
    "yarn": lambda d: _edit(d, rope_parameters=_edit(YARN, type=..., rope_type="yarn", rope_theta=5e5,
                                                     partial_rotary_factor=0.25)),
    # qwen3_5_moe: every MLP an MoE block with a shared expert; intermediate_size unread
    "qwen3_5_moe": lambda d: _edit(d, architectures=["Qwen3_5MoeForCausalLM"], intermediate_size=..., num_experts=8,
                                   num_experts_per_tok=2, moe_intermediate_size=32,
                                   shared_expert_intermediate_size=48),
}
BASES["hybrid"] = HYBRID
PARSE["hybrid"] = _hybrid_parse


def test_the_hybrid_bases_parse_and_the_table_names_every_field_read():
    test_the_bases_parse_and_the_table_names_every_field_read("hybrid")


def test_every_bad_value_of_every_hybrid_field_is_one_line_naming_it():
    checked = 0
    for variant, field, value, name in cases("hybrid", HYBRID):
        config = json.loads(json.dumps(inject(VARIANTS["hybrid"][variant](HYBRID), field, value)))
        with pytest.raises(ConfigError) as e:
            PARSE["hybrid"](config)
        msg = str(e.value)
        assert "\n" not in msg and name in msg, (variant, field, value, msg)
        checked += 1
    assert checked > 300
