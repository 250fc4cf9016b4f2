"""Every layer's array stacked in one ([L, ...]) and a layer index read at run time.

The engine keeps per-layer arrays that its kernels read one layer at a time (the KV caches:
models.layers.KVCache) stacked along a leading layer axis: a jitted call spends host time on
each buffer it takes (~7.7 us a donated one, ~2.7 us a weight, on the H200), so two arrays cost
far less than two a layer. A kernel then takes the stacked array and the layer as an int32[1]
input (`layer_index`), read at run time: one compiled kernel serves every layer of a forward (a
static index would compile a kernel a layer), and no layer is sliced out (for a kernel operand,
XLA would copy the slice).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["StackedRow", "as_stack", "check_layer", "clamp_layer", "layer_index", "one_layer", "split_row"]


class StackedRow(NamedTuple):
    """Row `layer` of a stacked per-layer weight [L, ...]: what a model passes where a kernel
    takes one layer's weight (a norm's), so that the kernel gets the stacked array and the layer
    (models.layers.layer_view makes them)."""
    stacked: jax.Array
    layer: object   # a Python int or an int32 scalar


def split_row(w, layer=None):
    """(weight, layer) of a kernel's weight argument: a StackedRow's stacked array and layer,
    else w and `layer` as given."""
    if isinstance(w, StackedRow):
        if layer is not None:
            raise ValueError("a StackedRow weight carries its own layer: pass no layer with it")
        return w.stacked, w.layer
    return w, layer


def check_layer(layer, n_layers: int, out_of_range: str, name: str = "layer") -> None:
    """ValueError, one line, unless `layer` is a Python or NumPy int in [0, n_layers) (else the
    caller's `out_of_range` message) or an integer scalar array, traced or not (clamped at run
    time: clamp_layer)."""
    if isinstance(layer, (int, np.integer)):
        if not 0 <= layer < n_layers:
            raise ValueError(out_of_range)
    elif jnp.ndim(layer) > 1 or jnp.size(layer) != 1 or not jnp.issubdtype(jnp.result_type(layer), jnp.integer):
        raise ValueError(f"{name} must be a Python int or an integer scalar, got "
                         f"{jnp.result_type(layer)}{list(jnp.shape(layer))}")


def as_stack(layer, *arrays):
    """(layer, *arrays) as the kernels take them: one layer's arrays (layer None) become stacks
    of one (a reshape: free), read at layer 0; stacked ones pass as they are."""
    if layer is not None:
        return (layer, *arrays)
    return (0, *(a.reshape(1, *a.shape) for a in arrays))


def clamp_layer(layer, n_layers: int):
    """A run-time layer index clamped into [0, n_layers), as XLA's dynamic index clamps one: no
    read of a kernel (or of one_layer) leaves the stack."""
    return jnp.clip(layer, 0, n_layers - 1)


def layer_index(layer) -> jax.Array:
    """A layer index (a Python int or an int32 scalar, traced or not) as the int32[1] array the
    kernels read it from: one scalar load a program, and the same compiled kernel for every
    layer of a forward."""
    return jnp.asarray(layer, jnp.int32).reshape(1)


def one_layer(stacked, layer=None) -> jax.Array:
    """Layer `layer` of a stacked array [L, ...] (a static or traced index; a traced one is
    clamped into [0, L), as the kernels clamp it), or a StackedRow's row; XLA fuses the read
    into what reads it on the XLA paths. layer None: the array itself (one layer's).

    A static layer is read with a run-time index too, an int32 behind an optimization barrier:
    a constant index puts each layer's own constant into the fusion that reads the row, and XLA
    compiles such fusions once a layer, where identical ones (the per-layer weights' before
    stacking) compile once: a 36-layer round on XLA:CPU took 8.4 s to compile with constant rows
    of the stacked norms, 4.8 with the barrier (4.7 with per-layer weights). XLA
    may still drop the barrier and fold the index (XLA:CPU did in the prefill); the kernels take
    the layer as an input and never see this."""
    stacked, layer = split_row(stacked, layer)
    if layer is None:
        return stacked
    if isinstance(layer, (int, np.integer)):
        if not 0 <= layer < stacked.shape[0]:
            raise IndexError(f"layer {layer} of a stack of {stacked.shape[0]}")
        index = lax.optimization_barrier(jnp.asarray(layer, jnp.int32))
    else:
        index = clamp_layer(jnp.asarray(layer, jnp.int32).reshape(()), stacked.shape[0])
    return lax.dynamic_index_in_dim(stacked, index, 0, keepdims=False)
