"""vLLM's speculative-decoding counters, read from its Prometheus /metrics: how a served draft does.

The counters (`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`,
`..._num_accepted_tokens_per_pos`, `vllm:generation_tokens`; one series per engine, summed here)
only grow: take them before and after the requests and subtract (`SpecCounters.minus`). Two
acceptance lengths come out of them, and evaluate.py has the same two: `tau` = 1 + accepted /
drafts (vLLM's "mean acceptance length") and `delivered_tau` = (generated tokens - requests) /
drafts (exactly evaluate's tau). The names, where vLLM defines them and how each tau compares
with evaluate's: docs/pipeline.md, "Served acceptance and the k to deploy"; docs/architecture/common-modules.md,
common/spec_metrics.py.
Pure: no vLLM import (the CLI and tests read a /metrics text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from common.vllm_server import ServeOptions

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"

_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition -> (name, labels, value) per sample line."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        samples.append((m["name"], dict(_LABEL.findall(m["labels"] or "")), value))
    return samples


@dataclass(frozen=True)
class SpecCounters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    generation_tokens: int = 0
    speculating: bool = False  # the server exposes the spec-decode counters (a draft is configured)

    @classmethod
    def parse(cls, text: str) -> "SpecCounters":
        sums: dict[str, float] = {}
        positions: dict[int, float] = {}
        for name, labels, value in parse_samples(text):
            if name == ACCEPTED_PER_POSITION:
                pos = int(labels.get("position", "0"))
                positions[pos] = positions.get(pos, 0.0) + value
            elif name in (DRAFTS, DRAFT_TOKENS, ACCEPTED, GENERATION_TOKENS):
                sums[name] = sums.get(name, 0.0) + value
        per_position = [int(positions.get(i, 0)) for i in range(max(positions) + 1)] if positions else []
        return cls(int(sums.get(DRAFTS, 0)), int(sums.get(DRAFT_TOKENS, 0)), int(sums.get(ACCEPTED, 0)), per_position,
                   int(sums.get(GENERATION_TOKENS, 0)), speculating=DRAFTS in sums)

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        return self._combine(before, -1)

    def plus(self, other: "SpecCounters") -> "SpecCounters":
        return self._combine(other, 1)

    def _combine(self, other: "SpecCounters", sign: int) -> "SpecCounters":
        n = max(len(self.accepted_per_position), len(other.accepted_per_position))
        pad = lambda xs: list(xs) + [0] * (n - len(xs))  # noqa: E731
        return SpecCounters(
            self.drafts + sign * other.drafts, self.draft_tokens + sign * other.draft_tokens, self.accepted + sign * other.accepted,
            [a + sign * b for a, b in zip(pad(self.accepted_per_position), pad(other.accepted_per_position))],
            self.generation_tokens + sign * other.generation_tokens, self.speculating or other.speculating,
        )

    @property
    def tau(self) -> float | None:
        """vLLM's mean acceptance length: 1 + accepted / drafts."""
        return 1 + self.accepted / self.drafts if self.drafts else None

    def delivered_tau(self, requests: int) -> float | None:
        """Tokens per verify step, after each request's prefill token (evaluate's tau)."""
        return (self.generation_tokens - requests) / self.drafts if self.drafts else None

    @property
    def acceptance_per_position(self) -> list[float]:
        """Fraction of drafts whose proposal i was accepted (vLLM accepts a prefix: i implies i-1)."""
        return [round(a / self.drafts, 4) if self.drafts else 0.0 for a in self.accepted_per_position]

    def summary(self, requests: int | None = None) -> dict:
        out = {
            "tau": round(self.tau, 4) if self.tau is not None else None,
            "acceptance_per_position": self.acceptance_per_position,
            "drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted,
            "accepted_per_position": list(self.accepted_per_position), "generation_tokens": self.generation_tokens,
        }
        if requests is not None:
            delivered = self.delivered_tau(requests)
            out["delivered_tau"] = round(delivered, 4) if delivered is not None else None
        return out


def read_counters(server: "ServeOptions", timeout: float = 10.0) -> SpecCounters:
    """GET /metrics from the server and parse it (OSError when it does not answer 200)."""
    from common.vllm_server import auth_headers, http_request

    status, body = http_request(server, "GET", "/metrics", auth_headers(), timeout=timeout)
    if status != 200:
        raise OSError(f"GET /metrics: HTTP {status}")
    return SpecCounters.parse(body.decode("utf-8", "replace"))
