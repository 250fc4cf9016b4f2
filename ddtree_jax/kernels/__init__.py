"""Pallas GPU kernels, each with a plain-JAX reference beside it; dispatch.py picks which runs."""

from .attention_reference import attention_reference
from .tree_attention import KernelConfig, attention, attention_pallas, default_config
from .norms import add_rms_norm, qk_norm_rope, rms_norm  # noqa: F401


__all__ = ["attention", "attention_reference", "attention_pallas", "KernelConfig", "default_config"]
