"""common/batch_memory.py: the GPU batch rule of evaluate and regenerate (pure arithmetic; the
free memory is the only input faked, as this machine has no GPU)."""

from __future__ import annotations

import sys
from types import SimpleNamespace


from tests.fixtures.pipeline_data import SCRIPTS_DIR
from tests.fixtures.requires import require_module

sys.path.insert(0, str(SCRIPTS_DIR))
torch = require_module("torch")

from common import batch_memory  # noqa: E402

# SmolLM2-135M's shape: 30 layers, 3 KV heads of 64, hidden 576, vocab 49,152.
SMOLLM2 = SimpleNamespace(num_hidden_layers=30, num_key_value_heads=3, num_attention_heads=9, head_dim=64, hidden_size=576, vocab_size=49152)


def test_per_sequence_bytes_counts_kv_cache_activations_and_logits():
    per = batch_memory.per_sequence_bytes(SMOLLM2, 1000, 2)
    assert per == 2 * 30 * 3 * 64 * 1000 * 2 + 1000 * 576 * 4 * 2 + 2 * 49152 * 4


def test_gpu_batch_size_is_a_third_of_free_memory_capped(monkeypatch):
    model = torch.nn.Linear(2, 2).to(torch.bfloat16)
    model.config = SMOLLM2
    per = batch_memory.per_sequence_bytes(SMOLLM2, 1000, 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (30 * per, 100 * per))
    assert batch_memory.gpu_batch_size(model, "cuda:0", 1000, 500) == 10
    assert batch_memory.gpu_batch_size(model, "cuda:0", 1000, 4) == 4  # never more than the prompts
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (10**13, 10**13))
    assert batch_memory.gpu_batch_size(model, "cuda:0", 1000, 500) == 64
    assert batch_memory.gpu_batch_size(model, "cuda:0", 1000, 500, cap=256) == 256
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (per, 100 * per))
    assert batch_memory.gpu_batch_size(model, "cuda:0", 1000, 500) == 1  # at least one
