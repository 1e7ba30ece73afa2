"""Shim: save a verifier loaded from a GGUF file as a plain checkpoint (transformers 5.x).

transformers loads a GGUF file through its GGUF "quantizer". Asked to dequantize
(`GgufConfig(dequantize=True)`), it unpacks every weight into a dense tensor of the requested
dtype: the model is an ordinary one. But `save_pretrained` still sees `model.hf_quantizer`,
whose `is_serializable()` is False, and refuses ("quantized with gguf and is not
serializable"). `forget_gguf_quantizer` checks that nothing is left packed, then clears the
quantizer's marks (`hf_quantizer`, `is_quantized`, `quantization_method`,
`config.quantization_config`): the saved checkpoint is a plain one in that dtype, and
import_verifier.py checks that it reloads with identical logits.

It checks the code it relies on and fails naming this shim when transformers changes it.
"""

from __future__ import annotations

import inspect

SHIM = "common/gguf_compat.py (forget_gguf_quantizer)"


class GgufShimError(RuntimeError):
    pass


def forget_gguf_quantizer(model) -> None:
    """Make a dequantized GGUF model savable by save_pretrained (see the module docstring)."""
    import torch
    from transformers import PreTrainedModel
    from transformers.quantizers.quantizer_gguf import GgufHfQuantizer

    if "hf_quantizer.is_serializable(" not in inspect.getsource(PreTrainedModel.save_pretrained):
        raise GgufShimError(f"{SHIM}: transformers' save_pretrained no longer asks hf_quantizer.is_serializable(); re-check the shim")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return
    if not isinstance(quantizer, GgufHfQuantizer):
        raise GgufShimError(f"{SHIM}: the model's quantizer is {type(quantizer).__name__}, not GGUF's: nothing this shim knows how to clear")
    if not quantizer.quantization_config.dequantize or quantizer.packed_modules:
        raise GgufShimError(f"{SHIM}: {len(quantizer.packed_modules)} modules keep packed GGUF weights; load with quantization_config=GgufConfig(dequantize=True)")
    odd = [name for name, p in model.named_parameters() if not p.dtype.is_floating_point or type(p) not in (torch.nn.Parameter, torch.Tensor)]
    if odd:
        raise GgufShimError(f"{SHIM}: parameters that are not dense floating tensors after dequantizing: {odd[:3]}")
    model.hf_quantizer = None
    for attr, value in (("is_quantized", False), ("quantization_method", None)):
        if hasattr(model, attr):
            setattr(model, attr, value)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
