"""The target families behind one interface: what the engine and the Generator call to run a
target, chosen by its config (or its cache) with `family_of`.

    Dense   Qwen3 / Llama / Qwen2 and their MoE forms (models/target.py): the cache is a KVCache; a
            verify pass returns every node's K/V and the commit appends the accepted path's.
    Hybrid  Qwen3.5 (models/hybrid.py): the cache is a HybridCache (the attention layers' KV
            cache, the GDN layers' conv and recurrent states); a verify pass runs the tree through
            the recurrence (gdn.tree_verify, parents and ancestor mask) and the commit leaves the
            states plain decoding of the accepted path would leave (hybrid.commit).

Every function takes the engine's lengths (int32 [Bt], the committed tokens a row): the engine's
State.length is the one count of a row's text, the caches hold none of their own.

    new_cache(cfg, batch, positions, dtype)                         a fresh cache
    prefill(params, cfg, cache, tokens, first, prompt_len, offset, *, taps, kernels)
        one prompt piece tokens [Bt, T] at positions first.. (the prompt's tokens offset..);
        -> (cache, final-normed h [Bt, T, H], taps or None)
    verify(params, cfg, tokens, positions, parents, mask, cache, lengths, *, taps, kernels)
        a tree (or the root alone) over the cache, which is only read; -> (h, taps, new)
    take_path(new, path)                                            new of the path's nodes, in order
    commit(cache, new, lengths, path, path_len, active, *, kernels)  the cache after the path
    embed, lm_head, fuse_params, cache_bytes
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from typing import Any

from ddtree_jax.models import hybrid
from ddtree_jax.models import target as tmodel
from ddtree_jax.models.config import HYBRID_TARGETS, TargetConfig, _Fields
from ddtree_jax.models.layers import KVCache, append
from ddtree_jax.tuning import KernelTuning


class Dense:
    """Qwen3 / Llama / Qwen2 (and MoE) targets: models/target.py over a KVCache."""

    needs_parents = False  # the tree reaches the layers as its ancestor mask alone
    continues = True  # a conversation's next prompt may start inside the cache (it keeps K/V by position)
    embed = staticmethod(tmodel.embed)
    lm_head = staticmethod(tmodel.lm_head)
    fuse_params = staticmethod(tmodel.fuse_params)

    @staticmethod
    def new_cache(cfg, batch: int, positions: int, dtype) -> KVCache:
        return KVCache.zeros(cfg.num_layers, batch, cfg.num_kv_heads, positions, cfg.head_dim, dtype)

    @staticmethod
    def cache_bytes(cfg, batch: int, positions: int, itemsize: int) -> int:
        return batch * positions * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize

    @staticmethod
    def prefill(params, cfg, cache: KVCache, tokens, first, prompt_len, offset, *, taps, kernels: KernelTuning):
        del prompt_len, offset  # padding's K/V land past each row's length, never read
        pos = first[:, None] + jnp.arange(tokens.shape[1], dtype=jnp.int32)
        causal = pos[:, :, None] >= pos[:, None, :]
        h, tapped, new_kv = tmodel.forward(params, cfg, tokens, pos, cache, first, causal, taps=taps, kernels=kernels)
        return append(cache, *new_kv, first), h, tapped

    @staticmethod
    def verify(params, cfg, tokens, positions, parents, mask, cache: KVCache, lengths, *, taps,
               kernels: KernelTuning):
        del parents
        return tmodel.forward(params, cfg, tokens, positions, cache, lengths, mask, taps=taps, kernels=kernels)

    @staticmethod
    def take_path(new_kv, path):
        return jax.tree_util.tree_map(lambda x: jnp.take_along_axis(x, path[:, :, None, None], axis=1), new_kv)

    @staticmethod
    def commit(cache: KVCache, new_kv, lengths, path, path_len, active, *, kernels: KernelTuning) -> KVCache:
        # all P path rows are written: those past a row's new length (or an inactive row's) are never read
        del path_len, active
        return append(cache, *new_kv, lengths, rows=path, kernels=kernels)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["kv", "conv", "rec"], meta_fields=["cfg"])
@dataclasses.dataclass
class HybridCache:
    """A hybrid target's committed text (hybrid.HybridState less its lengths, which the engine
    keeps): kv over the attention layers, conv and rec over the GDN layers. cfg (static) lets the
    commit, which is given no config, run the GDN layers' path states."""

    kv: KVCache
    conv: jax.Array
    rec: jax.Array
    cfg: hybrid.HybridConfig

    def state(self, lengths) -> hybrid.HybridState:
        return hybrid.HybridState(kv=self.kv, conv=self.conv, rec=self.rec, lengths=lengths)

    @staticmethod
    def of(state: hybrid.HybridState, cfg: hybrid.HybridConfig) -> "HybridCache":
        return HybridCache(kv=state.kv, conv=state.conv, rec=state.rec, cfg=cfg)


class Hybrid:
    """Qwen3.5 targets: models/hybrid.py over a HybridCache."""

    needs_parents = True  # each node's conv window and state come from its parent
    continues = False  # the recurrent state holds the whole text: it cannot restart inside it
    embed = staticmethod(tmodel.embed)
    lm_head = staticmethod(hybrid.lm_head)

    @staticmethod
    def fuse_params(params: dict, *, stack: bool = True) -> dict:
        """The inference layout: each layer's products that read one input fused (hybrid.fuse_layer).
        The layers an iterable, taken once."""
        del stack  # no norm kernels read them
        return {**params, "layers": [hybrid.fuse_layer(p) for p in params["layers"]]}

    @staticmethod
    def new_cache(cfg: hybrid.HybridConfig, batch: int, positions: int, dtype) -> HybridCache:
        return HybridCache.of(hybrid.HybridState.zeros(cfg, batch, positions, dtype), cfg)

    @staticmethod
    def cache_bytes(cfg: hybrid.HybridConfig, batch: int, positions: int, itemsize: int) -> int:
        g = cfg.gdn
        kv = positions * 2 * len(cfg.attn_layers) * cfg.num_kv_heads * cfg.head_dim * itemsize
        states = len(cfg.gdn_layers) * ((g.conv_kernel - 1) * g.conv_dim * itemsize
                                        + g.num_v_heads * g.head_k_dim * g.head_v_dim * 4)
        return batch * (kv + states)

    @staticmethod
    def prefill(params, cfg, cache: HybridCache, tokens, first, prompt_len, offset, *, taps, kernels: KernelTuning):
        # a padding token must not reach the recurrent state: each row's real tokens of this piece
        live = jnp.clip(prompt_len.astype(jnp.int32) - offset, 0, tokens.shape[1])
        h, tapped, state = hybrid.prefill_hidden(params, cfg, tokens, cache.state(first), live, taps=taps,
                                                 kernels=kernels)
        return HybridCache.of(state, cfg), h, tapped

    @staticmethod
    def verify(params, cfg, tokens, positions, parents, mask, cache: HybridCache, lengths, *, taps,
               kernels: KernelTuning):
        return hybrid.verify_hidden(params, cfg, tokens, positions, parents, mask, cache.state(lengths), taps=taps,
                                    kernels=kernels)

    take_path = staticmethod(hybrid.take_path)

    @staticmethod
    def commit(cache: HybridCache, new: hybrid.VerifyOut, lengths, path, path_len, active, *,
               kernels: KernelTuning) -> HybridCache:
        state = hybrid.commit(cache.cfg, cache.state(lengths), new, path, path_len, active, kernels=kernels)
        return HybridCache.of(state, cache.cfg)


def family_of(cfg_or_cache) -> type[Dense] | type[Hybrid]:
    """The family of a target config (TargetConfig, HybridConfig) or of a cache it made."""
    return Hybrid if isinstance(cfg_or_cache, (hybrid.HybridConfig, HybridCache)) else Dense


def target_config_from_hf(d: dict[str, Any], where: str = "config.json") -> TargetConfig | hybrid.HybridConfig:
    """The config of any supported target from its config.json: a HybridConfig for a Qwen3.5 one,
    else a TargetConfig. One ConfigError line for a bad one."""
    if _Fields(d, where).architecture() in HYBRID_TARGETS:
        return hybrid.HybridConfig.from_hf(d, where)
    return TargetConfig.from_hf(d, where)
