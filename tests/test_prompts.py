"""bench/quality/prompts.py: real prompts built offline, held out by source item, deterministic,
and enough from the standard library alone (a machine without man pages or /usr/share/doc)."""

from __future__ import annotations

import sys

import pytest

from tests.fixtures.pipeline_data import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench" / "quality"))
import prompts  # noqa: E402


@pytest.fixture(scope="module")
def stdlib_only():
    return prompts.build(2000, 64, seed=3, sources=["stdlib"])


def test_no_source_item_is_in_both_splits(stdlib_only):
    rows, summary = stdlib_only
    train = {r["item"] for r in rows if r["split"] == "train"}
    heldout = [r["item"] for r in rows if r["split"] == "heldout"]
    assert len(train) > 300 and len(heldout) == 64
    assert not train & set(heldout)
    assert len(set(heldout)) == len(heldout)  # one prompt per held-out item
    texts = [r["messages"][0]["content"] for r in rows]
    assert len(set(texts)) == len(texts)  # deduplicated


def test_the_stdlib_alone_gives_the_gpu_size_and_the_seed_fixes_the_file(stdlib_only):
    rows, summary = stdlib_only
    assert summary["available_train"] >= 20000, summary  # the gpu size's 20,480 need other sources too, or not
    again, _ = prompts.build(2000, 64, seed=3, sources=["stdlib"])
    assert again == rows
    other, _ = prompts.build(2000, 64, seed=4, sources=["stdlib"])
    assert {r["item"] for r in other if r["split"] == "heldout"} != {r["item"] for r in rows if r["split"] == "heldout"}


def test_missing_optional_sources_give_nothing_and_break_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(prompts.SOURCES, "man", lambda: prompts.man_items(tmp_path / "no-man"))
    monkeypatch.setitem(prompts.SOURCES, "doc", lambda: prompts.doc_items(tmp_path / "no-doc"))
    monkeypatch.setitem(prompts.SOURCES, "countries", lambda: prompts.country_items(tmp_path / "no-zoneinfo"))
    rows, summary = prompts.build(500, 16, seed=0)
    assert {s: summary["sources"][s]["items"] for s in ("man", "doc", "countries")} == {"man": 0, "doc": 0, "countries": 0}
    assert len(rows) == 516 and {r["source"] for r in rows} == {"stdlib"}


def test_each_source_parses_its_files(tmp_path):
    import gzip

    man1 = tmp_path / "man" / "man1"
    man1.mkdir(parents=True)
    with gzip.open(man1 / "frob.1.gz", "wt") as f:
        f.write('.TH FROB 1\n.SH NAME\nfrob \\- turn the \\fBknob\\fR of a file\n.SH SYNOPSIS\n')
    (man1 / "broken.1").write_text(".TH X 1\nno name section\n")
    [item] = prompts.man_items(tmp_path / "man")
    assert item.key == "man1/frob" and "How do I use `frob` to turn the knob of a file?" in item.prompts
    zone = tmp_path / "zoneinfo"
    zone.mkdir()
    (zone / "iso3166.tab").write_text("# comment\nFR\tFrance\nJP\tJapan\n")
    (zone / "zone1970.tab").write_text("#c\nFR,MC\t+4852+00220\tEurope/Paris\n")
    items = prompts.country_items(zone)
    assert [i.key for i in items] == ["country/FR", "country/JP", "city/Europe/Paris"]
    assert "Tell me about the city of Paris in France." in items[2].prompts


def test_asking_for_more_than_the_sources_give_is_one_clear_error():
    with pytest.raises(SystemExit, match="asked for 10000000 training"):
        prompts.build(10_000_000, 8, sources=["stdlib"])
