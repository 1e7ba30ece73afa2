"""The k to deploy, read from a measured table (common/served_table.py): the fastest k at each
concurrency whose speedup stands above 1 by more than its spread, else no draft; the schedule of k
built from the choices; the fallback to one k where the installed vLLM would not apply a schedule
or the schedule, served once more, was slower. Tables are made up here; the real server fills one
in tests/test_serve_vllm.py."""

from __future__ import annotations

import random
import sys
import textwrap

import pytest

from tests.fixtures.pipeline_data import SCRIPTS_DIR

sys.path.insert(0, str(SCRIPTS_DIR))

from common.served_table import LAST_BATCH, SCHEDULE_FIELD, Table, best_k, recommend, schedule, schedule_holds  # noqa: E402

BASE = {"method": "eagle3", "model": "/e"}


def table_of(speedups: dict[int, dict[int, tuple[float, float]]], base: float = 100.0) -> Table:
    """A table whose (k, level) cell measured `base * a` and `base * b` tokens/s (the verifier alone:
    `base` twice): speedup (a + b) / 2, spread |a - b| / 2."""
    ks = sorted(speedups)
    levels = sorted({c for row in speedups.values() for c in row})
    table = Table(ks, levels, 2)
    for c in levels:
        table.baseline[c] = [base, base]
    for k, row in speedups.items():
        for c, (a, b) in row.items():
            cell = table.cell(k, c)
            cell.tokens_per_s = [base * a, base * b]
            cell.served_tau = [1.5 + k / 4, 1.5 + k / 4]
    return table


def test_the_fastest_k_at_each_concurrency_and_no_draft_where_none_beats_the_verifier():
    table = table_of({1: {1: (1.20, 1.22), 4: (1.10, 1.12), 16: (0.95, 0.97)},
                      3: {1: (1.50, 1.52), 4: (1.05, 1.07), 16: (0.80, 0.82)}})
    assert [(c.level, c.k) for c in (best_k(table, c) for c in table.levels)] == [(1, 3), (4, 1), (16, 0)]
    assert best_k(table, 16).speedup == 0.96  # the best k's figure, said beside "no draft"
    rec = recommend(table, BASE, target=1, schedule_unsupported="the installed vLLM has none")
    assert rec.speculative_config == {**BASE, "num_speculative_tokens": 3} and rec.schedule is None
    assert "one k for concurrency 1: the installed vLLM has none" in rec.line
    assert "16: no draft (best 0.96x" in rec.line
    at_16 = recommend(table, BASE, target=16, schedule_unsupported="none here")
    assert at_16.speculative_config is None and "no --speculative-config (the verifier alone) at concurrency 16" in at_16.line
    assert recommend(table, BASE, target=5, schedule_unsupported="x").target == 4  # the nearest measured level


def test_a_speedup_within_its_spread_of_one_is_no_draft():
    table = table_of({2: {1: (0.98, 1.10)}})  # 1.04 +- 0.06
    assert best_k(table, 1).k == 0
    table = table_of({2: {1: (1.08, 1.10)}})  # 1.09 +- 0.01
    assert best_k(table, 1).k == 2


def test_the_recommendation_follows_the_table_not_a_constant():
    rng = random.Random(7)
    seen = set()
    for _ in range(200):
        speedups = {k: {c: (x := rng.uniform(0.6, 1.8), x + rng.uniform(0, 0.1)) for c in (1, 4, 16)} for k in (1, 2, 3, 4)}
        table = table_of(speedups)
        for c in (1, 4, 16):
            means = {k: sum(speedups[k][c]) / 2 for k in speedups}
            k, mean = max(means.items(), key=lambda kv: kv[1])
            expected = k if mean - abs(speedups[k][c][1] - speedups[k][c][0]) / 2 > 1.0 else 0
            assert best_k(table, c).k == expected
            seen.add(expected)
        rec = recommend(table, BASE, target=4, schedule_unsupported="x")
        assert (rec.speculative_config or {}).get("num_speculative_tokens", 0) == best_k(table, 4).k
    assert seen == {0, 1, 2, 3, 4}


def test_the_schedule_splits_at_the_geometric_middle_and_merges_neighbours():
    table = table_of({1: {1: (1.2, 1.2), 4: (1.1, 1.1), 16: (1.05, 1.05), 64: (0.9, 0.9)},
                      3: {1: (1.5, 1.5), 4: (1.0, 1.0), 16: (0.9, 0.9), 64: (0.8, 0.8)}})
    rec = recommend(table, BASE, target=1, schedule_unsupported=None)
    assert rec.schedule == [[1, 2, 3], [3, 32, 1], [33, LAST_BATCH, 0]]
    assert rec.speculative_config == {**BASE, "num_speculative_tokens": 3, SCHEDULE_FIELD: rec.schedule}
    assert schedule([c for c in rec.choices]) == rec.schedule
    same = table_of({2: {1: (1.3, 1.3), 8: (1.2, 1.2)}})
    assert recommend(same, BASE, target=1, schedule_unsupported=None).schedule is None  # one k is best everywhere: no schedule


def test_a_schedule_slower_than_the_best_fixed_k_falls_back_to_one_k():
    table = table_of({1: {1: (1.2, 1.2), 4: (1.1, 1.1)}, 3: {1: (1.5, 1.5), 4: (1.0, 1.0)}})
    rec = recommend(table, BASE, target=4, schedule_unsupported=None)
    assert rec.schedule == [[1, 2, 3], [3, LAST_BATCH, 1]]
    fast = {1: [150.0, 151.0], 4: [110.0, 111.0]}
    holds, said = schedule_holds(table, fast, rec.choices)
    kept = rec.checked(fast, holds, said)
    assert holds and kept.schedule == rec.schedule and kept.to_json()["scheduled_tokens_per_s"] == {"1": fast[1], "4": fast[4]}
    slow = {1: [120.0, 121.0], 4: [110.0, 111.0]}
    holds, said = schedule_holds(table, slow, rec.choices)
    fallen = rec.checked(slow, holds, said)
    assert not holds and "1: 1.21x against 1.50x" in said
    assert fallen.schedule is None and fallen.speculative_config == {**BASE, "num_speculative_tokens": 1}  # concurrency 4's k
    assert "one k for concurrency 4 instead" in fallen.line


def test_a_table_to_json_and_the_summary_for_status():
    table = table_of({2: {1: (1.3, 1.4), 4: (1.1, 1.2)}})
    table.dropped = {"64": "only 8 prompts: at most 8 requests in flight"}
    data = table.to_json()
    assert data["speedup"]["2"]["1"] == {"mean": 1.35, "spread": 0.05} and data["baseline"]["4"]["mean_tokens_per_s"] == 100.0
    assert data["cells"]["2"]["4"]["mean_served_tau"] == 2.0 and data["dropped"] == table.dropped
    summary = recommend(table, BASE, target=1, schedule_unsupported="x").summary()
    assert summary["recommended_k"] == 2 and summary["recommended_speedup"] == 1.35 and summary["target_concurrency"] == 1


def test_the_recommendation_recomputed_from_the_written_table_is_the_same():
    """served.json's rounds are the figures the recommendation came from: a reader (or a test)
    recomputing it from the file gets the same speedup and spread to the last digit (rounded to
    two decimals, these rounds gave a spread of 0.359 written and 0.358 recomputed: CI, 2026-12-06)."""
    import json

    rng = random.Random(7)
    for _ in range(200):
        table = Table([1, 2], [1, 4], 2)
        for c in table.levels:
            table.baseline[c] = [rng.uniform(50, 150) for _ in range(4)]
            for k in table.ks:
                table.cell(k, c).tokens_per_s = [rng.uniform(40, 200) for _ in range(2)]
                table.cell(k, c).served_tau = [1.5, 1.6]
        data = json.loads(json.dumps(table.to_json()))
        again = Table(data["k"], data["concurrency"], data["repeats"])
        for c in again.levels:
            again.baseline[c] = data["baseline"][f"{c}"]["tokens_per_s"]
            for k in again.ks:
                again.cell(k, c).tokens_per_s = data["cells"][f"{k}"][f"{c}"]["tokens_per_s"]
        assert [best_k(again, c) for c in again.levels] == [best_k(table, c) for c in table.levels]


def test_concurrency_levels_above_the_prompts_are_dropped_and_said():
    import serve_check

    assert serve_check.concurrency_levels([1, 4, 16, 64], 8) == ([1, 4], {"16": "only 8 prompts: at most 8 requests in flight",
                                                                         "64": "only 8 prompts: at most 8 requests in flight"})
    assert serve_check.concurrency_levels([64], 8)[0] == [8]


@pytest.mark.parametrize("source, data_parallel, expected", [
    ("class SpeculativeConfig:\n    num_speculative_tokens: int\n", 1, "has no num_speculative_tokens_per_batch_size"),
    (f"class SpeculativeConfig:\n    {SCHEDULE_FIELD}: list | None = None\n", 1, None),
    (f"class SpeculativeConfig:\n    {SCHEDULE_FIELD}: list | None = None\n", 2, "drops num_speculative_tokens_per_batch_size under data parallelism"),
])
def test_schedule_support_is_read_in_the_installed_source(tmp_path, monkeypatch, source, data_parallel, expected):
    """A vllm package of files only (never imported): the check reads its source."""
    package = tmp_path / "vllm"
    (package / "config").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('read, never imported')\n")
    (package / "config" / "speculative.py").write_text(source)
    (package / "config" / "vllm.py").write_text(textwrap.dedent("""\
        class VllmConfig:
            def _maybe_disable_dynamic_sd_for_data_parallel(self):
                pass
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    from common.draft_serving import schedule_unsupported

    said = schedule_unsupported(data_parallel)
    assert said is None if expected is None else expected in said


def test_harness_diff_shows_each_runs_speedups_and_recommended_k():
    from harness.jobs import RunStatus, StageStatus
    from harness.run_diff import served_rows

    def run(run_id: str, speedup_at_1: float, k: int) -> RunStatus:
        summary = {"event": "finished", "status": "ok", "served_tau": 2.5, "recommended_k": k, "recommended_speedup": speedup_at_1,
                   "target_concurrency": 1, "speedup": {"2": {"1": 1.1, "4": 0.9}, "3": {"1": speedup_at_1, "4": 0.8}}}
        return RunStatus(run_id, "ok", [StageStatus("serve_check", "ok", last_event=summary)])

    rows = {(r.section, r.name): (r.a, r.b) for r in served_rows(run("20261206-000000-aaaaaa", 1.3, 3), run("20261206-000001-bbbbbb", 1.05, 2))}
    assert rows[("served", "recommended_k")] == (3, 2) and rows[("served", "recommended_speedup")] == (1.3, 1.05)
    assert rows[("speedup", "k=3 at 1")] == (1.3, 1.05) and rows[("speedup", "k=2 at 4")] == (0.9, 0.9)
