"""The extract stage's output layout: one `hs_<i>.safetensors` per prepared row, and its meta file.

extract_hidden_states.py writes them, check_extraction.py (and train, through speculators) read
them; the format is described in extract_hidden_states.py's docstring.
"""

from __future__ import annotations

from pathlib import Path

META_FILE = "extract_meta.json"


def hs_path(output: Path, index: int) -> Path:
    return output / f"hs_{index}.safetensors"


def check_file(path: Path, input_ids: list[int], num_layers: int | None = None, hidden: int | None = None) -> str | None:
    """None if `path` is a complete hidden-state file for `input_ids`, else why it is not.

    Opens it with safetensors (header and buffer-size validation, no tensor data read), checks
    names, dtype and shapes, and compares token_ids with the row's input_ids.
    """
    from safetensors import SafetensorError, safe_open

    if not path.exists():
        return "missing"
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            if keys != {"hidden_states", "token_ids"}:
                return f"tensors {sorted(keys)}"
            hs = f.get_slice("hidden_states")
            shape, dtype = hs.get_shape(), hs.get_dtype()
            token_ids = f.get_tensor("token_ids")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        return f"unreadable ({str(e)[:80] or type(e).__name__})"
    expected = [len(input_ids), num_layers, hidden]
    if dtype != "BF16":
        return f"hidden_states dtype {dtype}, expected BF16 (extract writes bf16; a vLLM server must run with --dtype bfloat16)"
    if len(shape) != 3 or any(e is not None and s != e for s, e in zip(shape, expected)):
        return f"hidden_states shape {shape}, expected {expected}"
    if token_ids.tolist() != list(input_ids):
        return "token_ids differ from the row's input_ids"
    return None
