"""Pallas GPU kernels, each with a plain-JAX reference beside it."""

from .attention_reference import attention_reference
from .tree_attention import (KernelConfig, attention, attention_pallas, auto_impl,
                             auto_impl_for_kind, available_impls, default_config, takes_kernels)
from .norms import add_rms_norm, norm_impl_for, qk_norm_rope, rms_norm  # noqa: F401


def check_tuned_tables() -> None:
    """Read and check the tuned-config tables in effect now (the shipped ones, or the files that
    $DDTREE_ATTENTION_TABLE / $DDTREE_MATMUL_TABLE name), the Mosaic GPU attention's settings
    ($DDTREE_MGPU_ATTENTION / $DDTREE_MGPU_CONFIG) and the float32 products' algorithm
    ($DDTREE_F32_ATTENTION_DOT), so that a bad one is reported before a model
    is loaded rather than while a program compiles. Raises ValueError naming the file or the
    variable."""
    from . import matmul, tree_attention, tree_attention_mgpu
    tree_attention.attention_table()
    matmul.matmul_table()
    tree_attention_mgpu.auto_t_range()      # $DDTREE_MGPU_ATTENTION
    tree_attention_mgpu.config_for(0)       # $DDTREE_MGPU_CONFIG
    tree_attention.f32_dot()                # $DDTREE_F32_ATTENTION_DOT


__all__ = [
    "attention", "attention_reference", "attention_pallas", "available_impls", "auto_impl",
    "auto_impl_for_kind", "KernelConfig", "default_config", "check_tuned_tables", "takes_kernels",
]
