"""The k to deploy: a draft's served speedup at each k and concurrency, and what it recommends.

serve_check.py fills a Table: output tokens/s of the verifier served alone at each concurrency
(the baseline: the rounds of its one or two starts), and with the draft at each k (one server per k), each cell repeated;
served tau from vLLM's counters in every draft cell. `recommend` reads it: at each concurrency the
fastest k whose speedup stands above 1 by more than its spread (else none: the verifier alone
is faster there, and that is a result), the `--speculative-config` for the concurrency the user
names, and where the installed vLLM takes one (`num_speculative_tokens_per_batch_size`) the
batch-size schedule of k built from the table. Pure: no vLLM, no server (tests feed it tables).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

SCHEDULE_FIELD = "num_speculative_tokens_per_batch_size"  # vLLM's SpeculativeConfig field (0.32.0)
LAST_BATCH = 65536  # the schedule's last range ends past any max_num_seqs: vLLM caps it at its own


def half_range(values: list[float]) -> float:
    """The spread of repeated measurements: half their range (0 for one)."""
    return (max(values) - min(values)) / 2 if len(values) > 1 else 0.0


@dataclass
class Cell:
    """One k at one concurrency: each repeat's output tokens/s and served tau."""

    tokens_per_s: list[float] = field(default_factory=list)
    served_tau: list[float | None] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        taus = [t for t in self.served_tau if t is not None]
        # each round's tokens/s as measured, unrounded: the recommendation is computed from these, and a
        # reader recomputing it from served.json must get the same figures (rounded, the spread's last
        # digit could differ)
        return {"tokens_per_s": list(self.tokens_per_s), "served_tau": [None if t is None else round(t, 4) for t in self.served_tau],
                "mean_tokens_per_s": round(statistics.mean(self.tokens_per_s), 2) if self.tokens_per_s else None,
                "mean_served_tau": round(statistics.mean(taus), 4) if taus else None}


@dataclass
class Table:
    ks: list[int]
    levels: list[int]  # concurrency levels, ascending
    repeats: int
    dropped: dict[str, str] = field(default_factory=dict)  # a level asked for and not measured -> why
    baseline: dict[int, list[float]] = field(default_factory=dict)  # level -> tokens/s of each round of each start, the verifier alone
    cells: dict[tuple[int, int], Cell] = field(default_factory=dict)  # (k, level) -> Cell

    def cell(self, k: int, level: int) -> Cell:
        return self.cells.setdefault((k, level), Cell())

    def speedup(self, k: int, level: int) -> tuple[float, float] | None:
        """(mean, spread) of the draft's tokens/s over the verifier's alone at `level`: the spread
        adds the relative spreads of both sides' repeats. None where a side was not measured."""
        base = self.baseline.get(level) or []
        cell = self.cells.get((k, level))
        if not base or cell is None or not cell.tokens_per_s or statistics.mean(base) <= 0:
            return None
        mean_base = statistics.mean(base)
        mean = statistics.mean(cell.tokens_per_s) / mean_base
        relative = half_range(cell.tokens_per_s) / statistics.mean(cell.tokens_per_s) + half_range(base) / mean_base
        return mean, mean * relative

    def to_json(self) -> dict[str, Any]:
        speedups = {f"{k}": {f"{c}": self._speedup_json(k, c) for c in self.levels} for k in self.ks}
        return {"k": self.ks, "concurrency": self.levels, "repeats": self.repeats, "dropped": self.dropped,
                "baseline": {f"{c}": {"tokens_per_s": list(ts), "mean_tokens_per_s": round(statistics.mean(ts), 2)}
                             for c, ts in self.baseline.items() if ts},
                "cells": {f"{k}": {f"{c}": cell.to_json() for (kk, c), cell in self.cells.items() if kk == k} for k in self.ks},
                "speedup": speedups}

    def _speedup_json(self, k: int, level: int) -> dict[str, float] | None:
        s = self.speedup(k, level)
        return None if s is None else {"mean": round(s[0], 3), "spread": round(s[1], 3)}


@dataclass(frozen=True)
class Choice:
    level: int
    k: int  # 0: no draft (the verifier alone is as fast or faster there)
    speedup: float | None  # of k (of the best k, when k is 0)
    spread: float | None


def best_k(table: Table, level: int) -> Choice:
    """The fastest k at `level`, if its speedup stands above 1 by more than its spread."""
    measured = [(k, s) for k in table.ks if (s := table.speedup(k, level)) is not None]
    if not measured:
        return Choice(level, 0, None, None)
    k, (mean, spread) = max(measured, key=lambda item: item[1][0])
    return Choice(level, k if mean - spread > 1.0 else 0, round(mean, 3), round(spread, 3))


def schedule(choices: list[Choice]) -> list[list[int]]:
    """`num_speculative_tokens_per_batch_size` from the choice at each measured concurrency:
    inclusive batch-size ranges, each measured level in its own, split at the geometric middle
    between neighbours, the first from 1 and the last to LAST_BATCH; neighbours with the same k
    merged."""
    ranges: list[list[int]] = []
    for i, choice in enumerate(choices):
        start = 1 if i == 0 else ranges[-1][1] + 1
        end = LAST_BATCH if i == len(choices) - 1 else max(start, math.isqrt(choice.level * choices[i + 1].level))
        if ranges and ranges[-1][2] == choice.k:
            ranges[-1][1] = end
        else:
            ranges.append([start, end, choice.k])
    return ranges


@dataclass
class Recommendation:
    choices: list[Choice]
    target: int  # the concurrency the one fixed k is for (a measured one)
    base: dict[str, Any]  # the export's speculative config without its k (method, model)
    schedule: list[list[int]] | None = None  # a batch-size schedule of k, where the installed vLLM takes one
    note: str = ""  # why there is no schedule, or how its check went
    scheduled: dict[int, list[float]] | None = None  # the schedule served once more: level -> tokens/s of each repeat

    @property
    def at_target(self) -> Choice:
        return next(c for c in self.choices if c.level == self.target)

    @property
    def speculative_config(self) -> dict[str, Any] | None:
        """What to paste: the schedule where there is one, else the target's k; None: no draft."""
        if self.schedule:
            return {**self.base, "num_speculative_tokens": max(r[2] for r in self.schedule), SCHEDULE_FIELD: self.schedule}
        return {**self.base, "num_speculative_tokens": self.at_target.k} if self.at_target.k else None

    @property
    def line(self) -> str:
        """The stage's last line: the k at each concurrency, and what to paste."""
        per = ", ".join(f"{c.level}: " + (f"k={c.k} ({c.speedup:.2f}x ±{c.spread:.2f})" if c.k else "no draft" + (f" (best {c.speedup:.2f}x ±{c.spread:.2f})" if c.speedup else ""))
                        for c in self.choices)
        config = self.speculative_config
        paste = f"--speculative-config '{json.dumps(config)}'" if config else f"no --speculative-config (the verifier alone) at concurrency {self.target}"
        return f"recommended by concurrency {{{per}}}: {paste}" + (f"; {self.note}" if self.note else "")

    def checked(self, scheduled: dict[int, list[float]], holds: bool, said: str) -> "Recommendation":
        """After the schedule was served once more: kept where it held, else the one fixed k."""
        if holds:
            return replace(self, scheduled=scheduled, note=said)
        return replace(self, schedule=None, scheduled=scheduled, note=f"{said}: one k for concurrency {self.target} instead")

    def summary(self) -> dict[str, Any]:
        """For the stage's finished event (harness status and diff)."""
        at = self.at_target
        return {"recommended_k": at.k, "recommended_speedup": at.speedup, "target_concurrency": self.target,
                "recommended_schedule": self.schedule, "recommended_config": self.speculative_config}

    def to_json(self) -> dict[str, Any]:
        return {"per_concurrency": {f"{c.level}": {"k": c.k, "speedup": c.speedup, "spread": c.spread} for c in self.choices},
                "target_concurrency": self.target, "speculative_config": self.speculative_config, "schedule": self.schedule,
                "scheduled_tokens_per_s": {f"{c}": ts for c, ts in (self.scheduled or {}).items()} or None, "note": self.note, "line": self.line}


def nearest_level(levels: list[int], target: int) -> int:
    """The measured concurrency closest to `target` on a log scale."""
    return min(levels, key=lambda level: abs(math.log(level / target)))


def recommend(table: Table, base_config: dict[str, Any], target: int, schedule_unsupported: str | None) -> Recommendation:
    """What to deploy, from the table. `base_config`: the export's speculative config (method,
    model). `target`: the concurrency the one fixed k is for (the nearest measured one).
    `schedule_unsupported`: None where the installed vLLM takes a batch-size schedule of k for
    this serving, else why not."""
    choices = [best_k(table, level) for level in table.levels]
    level = nearest_level(table.levels, max(1, target))
    if len({c.k for c in choices}) == 1:
        return Recommendation(choices, level, base_config, None, "one k is best at every measured concurrency")
    if schedule_unsupported is not None:
        return Recommendation(choices, level, base_config, None, f"one k for concurrency {level}: {schedule_unsupported}")
    return Recommendation(choices, level, base_config, schedule(choices), f"a batch-size schedule of k ({SCHEDULE_FIELD}), to be served once more")


def schedule_holds(table: Table, scheduled: dict[int, list[float]], choices: list[Choice]) -> tuple[bool, str]:
    """Whether the schedule, served once more (`scheduled`: level -> tokens/s of each repeat), is
    at least as fast as the best fixed k at every measured concurrency, within the spread."""
    worse = []
    for choice in choices:
        runs, base = scheduled.get(choice.level) or [], table.baseline.get(choice.level) or []
        if not runs or not base:
            continue
        mean_base = statistics.mean(base)
        ratio = statistics.mean(runs) / mean_base
        best = choice.speedup if choice.k else 1.0
        slack = (choice.spread or 0.0) + ratio * half_range(runs) / statistics.mean(runs)
        if ratio < (best or 1.0) - slack:
            worse.append(f"{choice.level}: {ratio:.2f}x against {best:.2f}x")
    if worse:
        return False, "the schedule served slower than the best fixed k at " + ", ".join(worse)
    return True, "the schedule served at least as fast as the best fixed k at every measured concurrency"
