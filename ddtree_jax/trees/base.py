"""The draft tree, the tree-policy interface and the policy registry.

A `DraftTree` holds `N + 1` slots per batch row: slot 0 is the root (the last committed token,
filled in by the engine), slots `1..N` are draft nodes in topological order (every parent sits in
an earlier slot). `N` is static: it depends only on the policy, the budget and the depth, never
on the data, so a whole generation can run inside one jitted loop.

Conventions every policy obeys (and `tests/test_trees.py` checks):

- `parents[:, 0] == -1`; for a node, `parents[i] < i`; an invalid (padding) node has parent 0.
- `depths[:, 0] == 0`; a node's depth is its parent's depth + 1; an invalid node has depth 1.
- `valid[:, 0]` is True; padding slots that a policy could not fill are False, with token 0.
- Sibling tokens are distinct among valid nodes, so the walk has at most one match per step.
- `ancestor_mask[b, i, j]` is True iff `j == i` or `j` is an ancestor of `i` (root included).
  An invalid node's row is `{root, itself}`: the verify pass still computes it, harmlessly.

Token ranks come from `jax.lax.top_k` over the drafter's log-probs, whose tie rule is: among
equal values the lower token id ranks first.
"""
from __future__ import annotations

import abc
import dataclasses
import functools
import operator
import typing
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp

from ddtree_jax.tuning import TreeTuning

Array = jax.Array
DEFAULT_TUNING = TreeTuning()


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["tokens", "parents", "depths", "valid", "ancestor_mask"],
    meta_fields=[],
)
@dataclasses.dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees with a static node count `N` (shapes below use `Bt` = batch)."""

    tokens: Array  # int32[Bt, N+1]; slot 0 = root token (0 until the engine sets it)
    parents: Array  # int32[Bt, N+1]; -1 for the root
    depths: Array  # int32[Bt, N+1]; 0 for the root
    valid: Array  # bool[Bt, N+1]
    ancestor_mask: Array  # bool[Bt, N+1, N+1]

    @property
    def num_nodes(self) -> int:
        """Static node count `N` (slots minus the root)."""
        return self.tokens.shape[-1] - 1

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def with_root_token(self, root: Array) -> "DraftTree":
        """The same tree with slot 0 set to `root: int32[Bt]`."""
        tokens = self.tokens.at[:, 0].set(jnp.asarray(root, jnp.int32))
        return dataclasses.replace(self, tokens=tokens)

    @staticmethod
    def from_parents(tokens: Array, parents: Array, depths: Array, valid: Array, max_depth: int, *,
                     tuning: TreeTuning = DEFAULT_TUNING) -> "DraftTree":
        """Build a tree from per-slot arrays (root included); derives the ancestor mask.

        `max_depth` (static) bounds the depth of any node; `tuning` picks the mask's construction
        (see `ancestor_mask_from_parents`).
        """
        tokens = jnp.asarray(tokens, jnp.int32)
        parents = jnp.asarray(parents, jnp.int32)
        return DraftTree(
            tokens=tokens,
            parents=parents,
            depths=jnp.asarray(depths, jnp.int32),
            valid=jnp.asarray(valid, bool),
            ancestor_mask=ancestor_mask_from_parents(parents, max_depth, tuning=tuning),
        )

    def first(self, n: int) -> "DraftTree":
        """The tree of the first `n` nodes (static; all of them if it has fewer): a tree, since
        parents come before children in slot order."""
        k = min(n, self.num_nodes) + 1
        return DraftTree(tokens=self.tokens[:, :k], parents=self.parents[:, :k], depths=self.depths[:, :k],
                         valid=self.valid[:, :k], ancestor_mask=self.ancestor_mask[:, :k, :k])

    def path_logp(self, logp: Array) -> Array:
        """float32[Bt, N]: each node's path log-probability under the drafter's log-probs
        float[Bt, D, V] the tree was built from (its tokens index V); a padding node's is -1e30,
        whose probability is 0 (a finite stand-in for -inf, which would make the sum NaN)."""
        bt, d, v = logp.shape
        tokens, depths = self.tokens[:, 1:], self.depths[:, 1:]
        flat = jnp.asarray(logp, jnp.float32).reshape(bt, d * v)
        own = jnp.take_along_axis(flat, jnp.clip(depths - 1, 0, d - 1) * v + jnp.clip(tokens, 0, v - 1), axis=1)
        own = jnp.where(self.valid[:, 1:], jnp.maximum(own, -1e30), -1e30)
        # the ancestor mask holds each node itself and its ancestors below the root
        return jnp.einsum("bij,bj->bi", self.ancestor_mask[:, 1:, 1:].astype(jnp.float32), own,
                          precision=jax.lax.Precision.HIGHEST)

    @staticmethod
    def root_only(batch_size: int) -> "DraftTree":
        """The tree of budget 0 (plain autoregressive decoding): just the root."""
        zeros = jnp.zeros((batch_size, 1), jnp.int32)
        return DraftTree(
            tokens=zeros,
            parents=jnp.full((batch_size, 1), -1, jnp.int32),
            depths=zeros,
            valid=jnp.ones((batch_size, 1), bool),
            ancestor_mask=jnp.ones((batch_size, 1, 1), bool),
        )


def tree_from_nodes(tokens: Array, parents: Array, depths: Array, num_nodes: int, max_depth: int, *,
                    tuning: TreeTuning = DEFAULT_TUNING) -> DraftTree:
    """A tree from node columns `int32[Bt, n]` (root excluded; parents as slot indices, 0 = root),
    padded with invalid nodes (token 0, parent root, depth 1) up to `num_nodes` >= n. `tuning`
    (a policy's `self.tuning`) picks how the ancestor mask is built."""
    batch, n = tokens.shape
    extra = num_nodes - n

    def column(x: Array, root: int, pad: int, dtype) -> Array:
        parts = [jnp.full((batch, 1), root, dtype), jnp.asarray(x, dtype), jnp.full((batch, extra), pad, dtype)]
        return jnp.concatenate(parts, axis=1)

    return DraftTree.from_parents(
        tokens=column(tokens, 0, 0, jnp.int32),
        parents=column(parents, -1, 0, jnp.int32),
        depths=column(depths, 0, 1, jnp.int32),
        valid=column(jnp.ones((batch, n), bool), True, False, bool),
        max_depth=max_depth,
        tuning=tuning,
    )


# How `ancestor_mask_from_parents` closes "self or parent" over the generations: "square"
# squares the relation as a bf16 matmul ceil(log2 D) times; "chain" follows the parent pointers
# D times and compares every (i, j) with the D + 1 ancestors of i (elementwise work on [S, S], no
# matmul). Equal for every tree (tests); `TreeTuning.ancestor_chain_from` picks by slot count. The
# CPU keeps "square": it compiles ~3x faster (0.15-0.19 s against 0.5-0.6 s at S = 65..1025, D = 15).
ANCESTOR_IMPLS = ("square", "chain")


def ancestor_impl(slots: int, tuning: TreeTuning = DEFAULT_TUNING) -> str:
    """The ancestor-mask construction `tuning` uses for trees of `slots` slots."""
    return "chain" if slots >= tuning.ancestor_chain_from else "square"


def ancestor_mask_from_parents(parents: Array, max_depth: int, impl: str | None = None, *,
                               tuning: TreeTuning = DEFAULT_TUNING) -> Array:
    """bool[Bt, S, S] with [b, i, j] = (j == i or j is an ancestor of i), for parents int32[Bt, S].

    `max_depth` (static) bounds the generations followed: the depth of any node. impl: "square"
    or "chain" (None: `ancestor_impl(S, tuning)`). Same result either way.
    """
    slots = parents.shape[-1]
    impl = impl or ancestor_impl(slots, tuning)
    if impl not in ANCESTOR_IMPLS:
        raise ValueError(f"unknown ancestor-mask impl {impl!r}; choose one of {', '.join(ANCESTOR_IMPLS)}")
    ids = jnp.arange(slots, dtype=jnp.int32)
    if impl == "chain":
        # up = the ancestor g generations above each slot (-1 once past the root)
        up = jnp.broadcast_to(ids, parents.shape)
        mask = up[..., :, None] == ids
        for _ in range(max_depth):
            up = jnp.where(up >= 0, jnp.take_along_axis(parents, jnp.maximum(up, 0), axis=-1), -1)
            mask = mask | (up[..., :, None] == ids)
        return mask
    # Reachability by squaring "self or parent" until it spans max_depth generations; exact for
    # 0/1 entries (bf16 inputs, f32 accumulation).
    mask = (parents[..., :, None] == ids) | (ids[:, None] == ids)
    reach = 1
    while reach < max_depth:
        m = mask.astype(jnp.bfloat16)
        mask = jnp.einsum("bij,bjk->bik", m, m, preferred_element_type=jnp.float32) > 0
        reach *= 2
    return mask


@dataclasses.dataclass(frozen=True)
class TreePolicy(abc.ABC):
    """Interface of a tree policy. Subclasses are frozen dataclasses (hashable, so a policy can
    be a static argument of `jax.jit`); their fields are the policy's options.

    - `name`: the registry name, set by `register_policy`.
    - `num_nodes(budget, depth)`: the static `N` that `build` returns for that budget and
      drafter depth `D`.
    - `build(logp, budget)`: `logp: float[Bt, D, V]` (depth d uses `logp[:, d-1]`) -> DraftTree
      with `N = num_nodes(budget, D)`. Must trace under `jax.jit` with `budget` static.
    - `tuning`: how the build runs on this device (inherited; not an option, so not in `spec`):
      set by `with_tuning`, read by the build (`tree_from_nodes(..., tuning=self.tuning)`).
      It never changes the tree, and it is part of the policy's hash (a new one recompiles).
    """

    name: ClassVar[str] = ""
    tuning: TreeTuning = dataclasses.field(default=DEFAULT_TUNING, kw_only=True, metadata={"option": False})

    def with_tuning(self, tuning: TreeTuning) -> "TreePolicy":
        """This policy, built with `tuning`."""
        return dataclasses.replace(self, tuning=tuning)

    @abc.abstractmethod
    def num_nodes(self, budget: int, depth: int) -> int:
        """The static node count N of `build(logp, budget)` for drafter depth `depth`."""

    @abc.abstractmethod
    def build(self, logp: Array, budget: int) -> DraftTree:
        """The tree for log-probs `logp: float[Bt, D, V]`; jit-able with `budget` static."""

    @property
    def spec(self) -> str:
        """The text form that `make_policy` parses back into this policy."""
        opts = ",".join(f"{f.name}={getattr(self, f.name)}" for f in option_fields(type(self)))
        return f"{self.name}:{opts}" if opts else self.name

    def __str__(self) -> str:
        return self.spec


def option_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of a policy class that its spec text sets (not `tuning`)."""
    return [f for f in dataclasses.fields(cls) if f.init and f.metadata.get("option", True)]


def check_logp(logp: Any) -> Array:
    """Validate `logp` as float[Bt, D, V] and return it as float32 (sums of bf16 lose ties)."""
    logp = jnp.asarray(logp)
    if logp.ndim != 3:
        raise ValueError(f"tree policies take log-probs of shape [batch, depth, vocab]; got shape {logp.shape}")
    return logp.astype(jnp.float32)


def check_budget(budget: Any) -> int:
    """The budget as a Python int >= 0; it fixes shapes, so it must be static under `jax.jit`."""
    try:
        value = operator.index(budget)
    except Exception:  # a tracer, a float, None, ...
        value = -1
    if isinstance(budget, bool) or value < 0:
        raise ValueError(f"tree budget must be a static int >= 0 (mark it static under jax.jit); got {budget!r}")
    return value


# ----------------------------------------------------------------------------- registry

_REGISTRY: dict[str, type[TreePolicy]] = {}
SPEC_SYNTAX = "name or name:key=value,key=value (e.g. beam:width=4)"


def register_policy(name: str) -> Callable[[type[TreePolicy]], type[TreePolicy]]:
    """Class decorator: `@register_policy("mine")` on a frozen-dataclass `TreePolicy` subclass."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"tree policy name must be alphanumeric (with - or _); got {name!r}")

    def decorate(cls: type[TreePolicy]) -> type[TreePolicy]:
        if name in _REGISTRY and _REGISTRY[name].__qualname__ != cls.__qualname__:
            raise ValueError(f"tree policy {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        # its own dataclass: TreePolicy's fields alone would leave the subclass's options out
        if not (isinstance(cls, type) and issubclass(cls, TreePolicy) and "__dataclass_params__" in vars(cls)):
            raise ValueError(f"register_policy({name!r}) needs a dataclass subclass of TreePolicy; got {cls!r}")
        if cls.__hash__ is None:  # jit static arguments must be hashable
            raise ValueError(f"tree policy {name!r} must be hashable: use @dataclasses.dataclass(frozen=True)")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def available_policies() -> list[str]:
    """Registered policy names, sorted."""
    return sorted(_REGISTRY)


def make_policy(spec: str) -> TreePolicy:
    """Parse `"name"` or `"name:key=value,key=value"` into a policy (a `TreePolicy` passes through
    unchanged); ValueError with a one-line message on bad input."""
    if isinstance(spec, TreePolicy):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty tree policy spec; expected {SPEC_SYNTAX}; available: {', '.join(available_policies())}")
    name, _, opts_text = spec.strip().partition(":")
    name = name.strip()
    if name not in _REGISTRY:
        raise ValueError(f"unknown tree policy {name!r}; available: {', '.join(available_policies())}")
    cls = _REGISTRY[name]
    fields = {f.name: f for f in option_fields(cls)}
    hints = typing.get_type_hints(cls)
    accepted = ", ".join(fields) or "none"
    kwargs: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in opts_text.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise ValueError(f"malformed option {item!r} in tree policy spec {spec!r}; expected {SPEC_SYNTAX}")
        if key not in fields:
            raise ValueError(f"tree policy {name!r} has no option {key!r}; its options: {accepted}")
        if key in kwargs:
            raise ValueError(f"option {key!r} given twice in tree policy spec {spec!r}")
        kwargs[key] = _convert(name, key, value, hints.get(key, str))
    missing = [k for k, f in fields.items() if k not in kwargs and _is_required(f)]
    if missing:
        raise ValueError(
            f"tree policy {name!r} needs option(s) {', '.join(missing)}: write {name}:{missing[0]}=...; see its docs"
        )
    return cls(**kwargs)


def _is_required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _convert(policy: str, key: str, value: str, typ: Any) -> Any:
    if typ is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"option {key} of tree policy {policy!r} must be true or false; got {value!r}")
    if typ in (int, float):
        try:
            return typ(value)
        except ValueError:
            raise ValueError(
                f"option {key} of tree policy {policy!r} must be {'an int' if typ is int else 'a number'}; got {value!r}"
            ) from None
    return value
