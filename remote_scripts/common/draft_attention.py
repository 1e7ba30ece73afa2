"""The draft's attention implementation: choose it explicitly, refuse a mask it cannot consume,
and size flex_attention's Triton tiles for GPUs with little shared memory.

Why a guard: speculators' Eagle3DraftModel picks how it BUILDS its attention mask from the
config's `_attn_implementation` (a flex BlockMask for "simple_flex_attention", an additive float
mask for "eager", a dense boolean mask otherwise), while the decoder layers pick how they CONSUME
it from the same field at call time. A hand-made LlamaConfig carries `_attn_implementation=None`,
a saved config never carries it at all, and an sdpa kernel handed a BlockMask either crashes deep
in a step or computes something else. So the combination is checked on the built model, before
the first step, by building a real (tiny) mask with the model's own code.
"""

from __future__ import annotations

from typing import Any

# Implementations that consume a flex_attention BlockMask, and those that consume dense masks.
FLEX_FAMILY = frozenset({"simple_flex_attention", "flex_attention"})
DENSE_FAMILY = frozenset({"sdpa", "eager"})
DEFAULT_GPU_IMPL = "simple_flex_attention"  # speculators' own flex kernel wrapper
DEFAULT_CPU_IMPL = "sdpa"  # torch refuses FlexAttention backward on CPU

# Shared memory per block (opt-in) at or above which flex_attention's default tiles fit:
# A100 163 KiB, H100/H200 227 KiB. Workstation Blackwell (sm_120) and Ada have ~99 KiB.
LARGE_SHARED_MEMORY = 160 * 1024


class AttentionMismatch(ValueError):
    """The draft's attention implementation cannot consume the mask the model builds."""


def default_attn_impl(device_type: str) -> str:
    return DEFAULT_CPU_IMPL if device_type == "cpu" else DEFAULT_GPU_IMPL


def mask_kind(mask: Any) -> str:
    """'block' for a flex BlockMask, 'dense' for a tensor mask, 'none' for None."""
    from torch import Tensor
    from torch.nn.attention.flex_attention import BlockMask

    if mask is None:
        return "none"
    if isinstance(mask, BlockMask):
        return "block"
    if isinstance(mask, Tensor):
        return "dense"
    return type(mask).__name__


def check_mask_compatible(attn_impl: str | None, mask: Any, *, device_type: str = "cuda") -> None:
    """Raise AttentionMismatch unless `attn_impl` can consume `mask` (pure; no model needed)."""
    kind = mask_kind(mask)
    if attn_impl is None:
        raise AttentionMismatch(
            "the draft's attention implementation is not set (_attn_implementation is None): "
            f"set it explicitly, e.g. --attn-impl {default_attn_impl(device_type)}"
        )
    if attn_impl in FLEX_FAMILY:
        if kind != "block":
            raise AttentionMismatch(f"attention implementation {attn_impl!r} needs a flex BlockMask, but the draft builds a {kind} mask")
        if device_type == "cpu":
            raise AttentionMismatch(f"attention implementation {attn_impl!r} cannot train on CPU (torch has no FlexAttention backward there): use --attn-impl sdpa")
        return
    if attn_impl in DENSE_FAMILY:
        if kind != "dense":
            raise AttentionMismatch(
                f"attention implementation {attn_impl!r} cannot consume a {kind} mask"
                + (" (a flex BlockMask): use --attn-impl simple_flex_attention, or build a dense mask" if kind == "block" else "")
            )
        return
    raise AttentionMismatch(f"unknown attention implementation {attn_impl!r} (known: {', '.join(sorted(FLEX_FAMILY | DENSE_FAMILY))})")


def check_draft_attention(model: Any, device_type: str) -> str:
    """Check a built speculators Eagle3 draft: every decoder layer's attention implementation
    against a mask built by the model's own `_build_attn_mask`. Returns the implementation."""
    import torch

    impls = {getattr(layer.self_attn.config, "_attn_implementation", None) for layer in model.layers}
    if len(impls) != 1:
        raise AttentionMismatch(f"draft layers disagree on their attention implementation: {sorted(map(str, impls))}")
    (impl,) = impls
    # A 2-document toy sequence, with the model's own mask builder (the one its forward uses).
    seq_len = 8
    doc_ids = torch.tensor([0] * 5 + [1] * 3)
    # Built on the CPU: only its type matters here, and the model may not be on its device yet.
    mask = model._build_attn_mask(doc_ids, seq_len, "cpu")
    check_mask_compatible(impl, mask, device_type=device_type)
    declared = getattr(model, "_attn_impl", impl)
    if declared != impl:  # e.g. a float mask for eager handed to sdpa: consumable, but not what was chosen
        raise AttentionMismatch(f"the draft builds masks for {declared!r} but its layers run {impl!r}")
    return impl


def flex_kernel_options(shared_memory_per_block: int, head_dim: int = 128) -> dict[str, int] | None:
    """Triton tile sizes for flex_attention, or None to keep torch's defaults.

    torch's default flex tiles assume a data-centre GPU's shared memory; on ~100 KiB parts they
    fail with 'No valid triton configs ... Required 106496, limit 101376'. Smaller tiles (and a
    single pipeline stage) fit; head dims above 128 halve them again. Forward keys: BLOCK_M/N;
    backward: BLOCK_M1/N1/M2/N2 (BLOCK_N1 % BLOCK_M1 == 0 and BLOCK_M2 % BLOCK_N2 == 0 hold).
    """
    if shared_memory_per_block <= 0:
        raise ValueError(f"shared memory per block must be positive, got {shared_memory_per_block}")
    if shared_memory_per_block >= LARGE_SHARED_MEMORY:
        return None
    big, small = (64, 32) if head_dim <= 128 else (32, 16)
    return {
        "BLOCK_M": big,
        "BLOCK_N": small,
        "num_stages": 1,
        "num_warps": 4,
        "BLOCK_M1": small,
        "BLOCK_N1": big,
        "BLOCK_M2": big,
        "BLOCK_N2": small,
    }


def device_shared_memory_per_block(device_index: int = 0) -> int | None:
    """Shared memory per block the kernels may opt into, or None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)) or None
