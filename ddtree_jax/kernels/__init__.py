"""Pallas GPU kernels, each with a plain-JAX reference beside it."""

from .attention_reference import attention_reference
from .tree_attention import (KernelConfig, attention, attention_pallas, auto_impl,
                             auto_impl_for_kind, available_impls, default_config, takes_kernels)
from .norms import add_rms_norm, norm_impl_for, qk_norm_rope, rms_norm  # noqa: F401


__all__ = [
    "attention", "attention_reference", "attention_pallas", "available_impls", "auto_impl",
    "auto_impl_for_kind", "KernelConfig", "default_config", "takes_kernels",
]
