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
    return prompts.build(2000, 64, seed=3, sources=["stdlib"], n_selection=32)


def test_no_source_item_is_in_two_splits(stdlib_only):
    rows, summary = stdlib_only
    items = {split: {r["item"] for r in rows if r["split"] == split} for split in prompts.SPLITS}
    assert len(items["train"]) > 300 and sum(r["split"] == "heldout" for r in rows) == 64 and sum(r["split"] == "selection" for r in rows) == 32
    assert not items["train"] & items["heldout"] and not items["train"] & items["selection"] and not items["selection"] & items["heldout"]
    texts = [" | ".join(m["content"] for m in r["messages"]) for r in rows]
    assert len(set(texts)) == len(texts)  # deduplicated


def test_held_out_prompts_are_spread_over_the_categories(stdlib_only):
    """The standard library gives chat, coding, qa, retrieval, rewriting and summarization prompts;
    the held-out splits take them round-robin (so evaluate's tau per category has prompts in each)."""
    rows, summary = stdlib_only
    for split, n in (("heldout", 64), ("selection", 32)):
        counts = summary["chosen_by_category"][split]
        assert set(counts) == {"chat", "coding", "qa", "retrieval", "rewriting", "summarization"}, counts
        assert max(counts.values()) - min(counts.values()) <= 1 and sum(counts.values()) == n
    chat = next(r for r in rows if r["category"] == "chat")
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "user"]
    retrieval = [r for r in rows if r["category"] == "retrieval" and r["split"] != "train"]
    for r in retrieval:  # its distractors come from items of its own split
        quoted = {line.split(": ", 1)[0].split("] ", 1)[1].strip("`") for line in r["messages"][0]["content"].splitlines() if line.startswith("[")}
        assert r["item"] in quoted and len(quoted) == prompts.RETRIEVAL_DOCUMENTS
        assert not quoted & {x["item"] for x in rows if x["split"] != r["split"]}


def test_the_stdlib_alone_gives_the_gpu_size_and_the_seed_fixes_the_file(stdlib_only):
    rows, summary = stdlib_only
    assert summary["available_train"] >= 20000, summary  # the gpu size's 20,480 need other sources too, or not
    again, _ = prompts.build(2000, 64, seed=3, sources=["stdlib"], n_selection=32)
    assert again == rows
    other, _ = prompts.build(2000, 64, seed=4, sources=["stdlib"])
    assert {r["item"] for r in other if r["split"] == "heldout"} != {r["item"] for r in rows if r["split"] == "heldout"}


def test_missing_optional_sources_give_nothing_and_break_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(prompts.SOURCES, "man", lambda: prompts.man_items(tmp_path / "no-man"))
    monkeypatch.setitem(prompts.SOURCES, "doc", lambda: prompts.doc_items(tmp_path / "no-doc"))
    monkeypatch.setitem(prompts.SOURCES, "countries", lambda: prompts.country_items(tmp_path / "no-zoneinfo"))
    monkeypatch.setitem(prompts.SOURCES, "translation", lambda: prompts.translation_items(tmp_path / "no-locale"))
    rows, summary = prompts.build(500, 16, seed=0)
    assert {s: summary["sources"][s]["items"] for s in ("man", "doc", "countries", "translation")} == {"man": 0, "doc": 0, "countries": 0, "translation": 0}
    assert len(rows) == 516 and {r["source"] for r in rows} == {"stdlib", "math"}


def test_each_source_parses_its_files(tmp_path):
    import gzip

    man1 = tmp_path / "man" / "man1"
    man1.mkdir(parents=True)
    with gzip.open(man1 / "frob.1.gz", "wt") as f:
        f.write('.TH FROB 1\n.SH NAME\nfrob \\- turn the \\fBknob\\fR of a file\n.SH SYNOPSIS\n')
    (man1 / "broken.1").write_text(".TH X 1\nno name section\n")
    [item] = prompts.man_items(tmp_path / "man")
    assert item.key == "man1/frob" and "How do I use `frob` to turn the knob of a file?" in item.texts()
    zone = tmp_path / "zoneinfo"
    zone.mkdir()
    (zone / "iso3166.tab").write_text("# comment\nFR\tFrance\nJP\tJapan\n")
    (zone / "zone1970.tab").write_text("#c\nFR,MC\t+4852+00220\tEurope/Paris\n")
    items = prompts.country_items(zone)
    assert [i.key for i in items] == ["country/FR", "country/JP", "city/Europe/Paris"]
    assert "Tell me about the city of Paris in France." in items[2].texts()
    locale = tmp_path / "locale" / "de" / "LC_MESSAGES"
    locale.mkdir(parents=True)
    write_mo(locale / "frob.mo", {"": "Content-Type: text/plain; charset=UTF-8", "The knob of the file could not be turned": "Der Knopf der Datei konnte nicht gedreht werden",
                                  "%s: bad": "%s: schlecht", "Too short": "Zu kurz"})
    [item] = prompts.translation_items(tmp_path / "locale")
    assert item.texts() == ['Translate into German: "The knob of the file could not be turned"',
                            'Translate this German sentence into English: "Der Knopf der Datei konnte nicht gedreht werden"']
    problems = prompts.math_items(16)
    assert len({i.key for i in problems}) == 16 and all(p.category == "math" for i in problems for p in i.prompts)


def write_mo(path, catalog: dict[str, str]) -> None:
    """A gettext catalog in the .mo format (what msgfmt writes), for translation_items to read."""
    import struct

    keys = sorted(catalog)
    ids, strs = b"", b""
    offsets = []
    for k in keys:
        offsets.append((len(ids), len(k.encode()), len(strs), len(catalog[k].encode())))
        ids += k.encode() + b"\0"
        strs += catalog[k].encode() + b"\0"
    start = 7 * 4 + 16 * len(keys)
    table = b"".join(struct.pack("<2I", n, start + o) for o, n, _, _ in offsets)
    table += b"".join(struct.pack("<2I", n, start + len(ids) + o) for _, _, o, n in offsets)
    path.write_bytes(struct.pack("<7I", 0x950412DE, 0, len(keys), 28, 28 + 8 * len(keys), 0, 0) + table + ids + strs)


def test_asking_for_more_than_the_sources_give_is_one_clear_error():
    with pytest.raises(SystemExit, match="asked for 10000000 training"):
        prompts.build(10_000_000, 8, sources=["stdlib"])
