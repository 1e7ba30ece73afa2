"""What the draft sees of the verifier, taken by hooks during the verifier's own forward.

The extract stage stores it as the training target and evaluate feeds it to the draft when it
measures: both take it from this one class, so the two agree by construction
(tests/test_hidden_state_capture.py holds them to the same tensors).

Layer id i < N (N decoder layers) is the INPUT of decoder layer i; id N, and the `last` entry,
is the last layer's output BEFORE the final norm (HF's output_hidden_states[-1] is after it).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported late: the stages' --help stays light
    import torch

    from common.verifier import DecoderParts


class HiddenStateCapture:
    """Hooks on `parts.layers` that keep, inside `capturing()`, the states of `layer_ids` and the
    last layer's output. Outside it the hooks pass everything untouched (transformers' generate
    runs through the same model without keeping a tensor a step)."""

    class _Stop(Exception):
        """Raised after the last layer when no later part (final norm, lm_head) is wanted."""

    def __init__(self, parts: "DecoderParts", layer_ids: list[int]):
        self.parts = parts
        self.layer_ids = list(layer_ids)
        self._captured: dict[Any, "torch.Tensor"] = {}
        self._active = False
        self._stop_after_last = False
        n = parts.num_layers
        self._handles = [parts.layers[lid].register_forward_pre_hook(self._pre_hook(lid), with_kwargs=True) for lid in sorted(set(self.layer_ids)) if lid < n]
        self._handles.append(parts.layers[n - 1].register_forward_hook(self._last_hook))

    def _pre_hook(self, lid: int):
        def hook(module, args, kwargs):
            if self._active:
                self._captured[lid] = args[0] if args else kwargs["hidden_states"]

        return hook

    def _last_hook(self, module, args, output):
        if not self._active:
            return
        self._captured["last"] = output[0] if isinstance(output, (tuple, list)) else output
        if self._stop_after_last:
            raise self._Stop

    @contextlib.contextmanager
    def capturing(self, stop_after_last: bool = False):
        """Keeps the states of the forward run inside; with `stop_after_last` that forward ends
        at the last decoder layer (no final norm, no lm_head: extract needs neither)."""
        self._captured, self._active, self._stop_after_last = {}, True, stop_after_last
        try:
            yield self
        except self._Stop:
            pass
        finally:
            self._active = self._stop_after_last = False

    def _state(self, lid: int) -> "torch.Tensor":
        return self._captured["last" if lid == self.parts.num_layers else lid]

    def stacked(self) -> "torch.Tensor":
        """[B, S, k+1, H]: the k layers' states, then the last layer's pre-norm output (the
        extract stage's file layout)."""
        import torch

        return torch.stack([self._state(lid) for lid in self.layer_ids] + [self._captured["last"]], dim=2)

    def draft_input(self) -> "torch.Tensor":
        """[B, S, k*H]: the k layers' states side by side, what the draft's input layer takes
        (speculators concatenates a file's first k entries the same way)."""
        import torch

        return torch.cat([self._state(lid) for lid in self.layer_ids], dim=-1)

    def run(self, input_ids, attention_mask) -> "torch.Tensor":
        """One forward of the text model to the last layer: `stacked()`."""
        with self.capturing(stop_after_last=True):
            self.parts.text_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return self.stacked()

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
