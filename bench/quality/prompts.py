#!/usr/bin/env python3
"""Real prompts for a real chat verifier, offline: built from what this machine has, no network.

    python bench/quality/prompts.py --train 2000 --heldout 64 --output chat.jsonl [--seed 0] [--json]

Sources (each optional but the first; a missing one is reported with 0 items):
  stdlib    the Python standard library, through inspect: public functions, classes and methods
            with a docstring -> explain / write an example / how to use / arguments / write it
            yourself / summarize its documentation (code and instructions)
  man       man pages' NAME lines (/usr/share/man/man{1,5,7,8}) -> what a command does, how to
            use it, an example (how-to)
  doc       README paragraphs under /usr/share/doc -> explain / summarize / questions (reading)
  countries ISO 3166 names (/usr/share/zoneinfo/iso3166.tab) and the cities of zone1970.tab ->
            general knowledge (capital, languages, history, a trip, ...)
A source item (a function, a command, a README paragraph, a country) gives several prompts from
varied templates. The held-out split is BY SOURCE ITEM: an item's hash with the seed puts all of
its prompts in one split, so no held-out prompt shares an item with a training prompt. Prompts
are deduplicated by their text. The same seed on the same machine gives the same file. Held-out
prompts take one template per item (varied templates, one item each).

Rows: {"id", "split": "train"|"heldout", "source", "item", "messages": [{"role": "user", ...}]},
prompts only (the regenerate stage writes the verifier's replies).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import importlib
import inspect
import io
import json
import pkgutil
import random
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# Modules whose import does something (opens a browser, prints, needs a display or Windows) or
# that are tests and tooling rather than the library.
SKIP_MODULES = {
    "antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3", "ensurepip",
    "pydoc_data", "__hello__", "__phello__", "msilib", "winreg", "winsound", "msvcrt", "nt", "_winapi",
    "distutils", "venv", "sre_compile", "sre_constants", "sre_parse", "xxsubtype", "xxlimited", "xxlimited_35",
    "__main__", "tty", "pty", "readline", "curses", "lib2to3", "unittest.__main__", "pip",
}
MAX_DOC_CHARS = 360
MAN_SECTIONS = ("man1", "man8", "man5", "man7")


@dataclass
class Item:
    """One source item: all of its prompts go to one split."""

    source: str
    key: str  # unique within the source; the split is decided by its hash
    prompts: list[str] = field(default_factory=list)


# --- sources ---------------------------------------------------------------------------------


def _first_paragraph(doc: str) -> str:
    para = re.split(r"\n\s*\n", inspect.cleandoc(doc).strip(), maxsplit=1)[0]
    para = " ".join(para.split())
    return para if len(para) <= MAX_DOC_CHARS else para[: MAX_DOC_CHARS].rsplit(" ", 1)[0] + " ..."


def _first_sentence(text: str) -> str:
    m = re.match(r"(.+?[.!?])(\s|$)", text)
    return (m.group(1) if m else text).rstrip(".")


def _signature(obj) -> str:
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    sig = re.sub(r" at 0x[0-9a-fA-F]+", "", sig)  # defaults' reprs hold addresses: not deterministic
    return sig if len(sig) <= 120 else ""


def _stdlib_modules() -> Iterator[str]:
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in SKIP_MODULES)
    for name in names:
        yield name
        try:
            with _quiet():
                mod = importlib.import_module(name)
        except BaseException:  # noqa: BLE001 -- a module this platform lacks, or one that refuses to import here
            continue
        if hasattr(mod, "__path__"):  # a package: its public submodules (one level)
            for info in sorted(pkgutil.iter_modules(mod.__path__), key=lambda i: i.name):
                full = f"{name}.{info.name}"
                if not info.name.startswith("_") and full not in SKIP_MODULES and name != "encodings" and info.name not in ("test", "tests", "__main__"):
                    yield full


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _function_prompts(name: str, sig: str, doc: str, kind: str) -> list[str]:
    para, sentence = _first_paragraph(doc), _first_sentence(_first_paragraph(doc))
    what = {"function": "function", "method": "method", "class": "class"}[kind]
    prompts = [
        f"Explain what the Python {what} `{name}` does, with a short example.",
        f"How do I use `{name}{sig}` in Python? Its documentation says: \"{para}\"",
        f"Write a short Python script that uses `{name}` and explain each line.",
        f"In Python's standard library, what is `{name}` for, and when would I reach for it?",
        f"Summarize this documentation of `{name}` in plain words for a beginner:\n\n{para}",
    ]
    if kind == "class":
        prompts += [f"Show how to create a `{name}` object and use two of its methods.", f"What problem does the class `{name}` solve? Give an example."]
    else:
        prompts += [f"Write a Python function that does the following without calling `{name}`: {sentence}.", f"What arguments does `{name}{sig}` take, and what does it return?"]
    return prompts


def stdlib_items() -> list[Item]:
    items: dict[str, Item] = {}
    for modname in _stdlib_modules():
        try:
            with _quiet():
                mod = importlib.import_module(modname)
        except BaseException:  # noqa: BLE001 -- see _stdlib_modules
            continue
        public = getattr(mod, "__all__", None)
        for attr in sorted(vars(mod)):
            if attr.startswith("_") or (public is not None and attr not in public):
                continue
            obj = getattr(mod, attr, None)
            if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj)):
                continue
            if getattr(obj, "__module__", None) != modname:  # re-exported: its own module lists it
                continue
            doc = inspect.getdoc(obj)
            if not doc or len(doc) < 20:
                continue
            name = f"{modname}.{attr}"
            kind = "class" if inspect.isclass(obj) else "function"
            items.setdefault(name, Item("stdlib", name, _function_prompts(name, _signature(obj), doc, kind)))
            if kind != "class":
                continue
            for meth_name in sorted(vars(obj)):
                meth = vars(obj)[meth_name]
                if meth_name.startswith("_") or not (inspect.isfunction(meth) or inspect.ismethoddescriptor(meth)):
                    continue
                mdoc = inspect.getdoc(meth)
                if not mdoc or len(mdoc) < 20:
                    continue
                full = f"{name}.{meth_name}"
                items.setdefault(full, Item("stdlib", full, _function_prompts(full, _signature(meth), mdoc, "method")))
    return list(items.values())


def man_items(root: Path = Path("/usr/share/man")) -> list[Item]:
    items: dict[str, Item] = {}
    for section in MAN_SECTIONS:
        d = root / section
        if not d.is_dir():
            continue
        for page in sorted(d.iterdir()):
            try:
                opener = gzip.open if page.suffix == ".gz" else open
                with opener(page, "rt", errors="replace") as f:
                    head = f.read(4096)
            except (OSError, EOFError):
                continue
            m = re.search(r"^\.S[Hh] \"?NAME\"?\s*\n(.+?)(?=^\.S[Hh] |\Z)", head, re.M | re.S)
            if not m:
                continue
            line = " ".join(re.sub(r"^\.[A-Za-z]+ ?", "", ln) for ln in m.group(1).splitlines()).replace("\\-", "-").replace("\\(em", "-")
            line = re.sub(r"\\f[BIRP]|\\&|\\\(..|\\", "", line).strip()
            cmd, sep, desc = line.partition(" - ")
            cmd, desc = cmd.split(",")[0].strip(), desc.strip().rstrip(".")
            if not sep or not desc or not re.fullmatch(r"[A-Za-z0-9_.+:-]{2,40}", cmd) or cmd in items:
                continue
            kind = {"man1": "command", "man8": "administration command", "man5": "file format", "man7": "topic"}[section]
            if section in ("man1", "man8"):
                prompts = [f"What does the Linux {kind} `{cmd}` do? Give two examples.", f"How do I use `{cmd}` to {desc[0].lower() + desc[1:]}?",
                           f"Explain the most useful options of `{cmd}` ({desc}).", f"Write a shell one-liner that uses `{cmd}`, and explain it."]
            else:
                prompts = [f"Explain the Linux {kind} `{cmd}`: {desc}.", f"What is `{cmd}` ({desc}) and where would I meet it on a Linux system?"]
            items[cmd] = Item("man", f"{section}/{cmd}", prompts)
    return list(items.values())


def doc_items(root: Path = Path("/usr/share/doc")) -> list[Item]:
    items = []
    if not root.is_dir():
        return items
    for readme in sorted(root.glob("*/README*")):
        if not readme.is_file():
            continue
        try:
            opener = gzip.open if readme.suffix == ".gz" else open
            with opener(readme, "rt", errors="replace") as f:
                text = f.read(20000)
        except (OSError, EOFError, UnicodeError):
            continue
        pkg = readme.parent.name
        for n, para in enumerate(re.split(r"\n\s*\n", text)):
            words = para.split()
            if not (25 <= len(words) <= 70) or sum(c.isalpha() for c in para) < 0.7 * len(para.replace(" ", "").replace("\n", "")):
                continue
            para = " ".join(words)
            items.append(Item("doc", f"{readme.relative_to(root)}#{n}", [
                f"Explain this paragraph from the documentation of the Debian package {pkg} in simpler words:\n\n{para}",
                f"Summarize in one sentence:\n\n{para}",
                f"Read this and list the key points as bullets:\n\n{para}",
            ]))
    return items


COUNTRY_TEMPLATES = [
    "What is the capital of {c}, and what is it known for?", "Tell me three interesting facts about {c}.",
    "Which languages are spoken in {c}?", "Describe the geography and climate of {c} in a few sentences.",
    "Plan a three-day trip to {c} for a first-time visitor.", "Give a short overview of the history of {c}.",
    "What are some traditional dishes from {c}?", "Write a short poem about {c}.",
]
CITY_TEMPLATES = ["Tell me about the city of {city} in {c}.", "What time zone is {city} in, and how far is it from UTC?", "What should a visitor see in {city}?"]


def country_items(root: Path = Path("/usr/share/zoneinfo")) -> list[Item]:
    names: dict[str, str] = {}
    items = []
    tab = root / "iso3166.tab"
    if tab.is_file():
        for line in tab.read_text(errors="replace").splitlines():
            if line and not line.startswith("#") and "\t" in line:
                code, name = line.split("\t", 1)
                names[code] = name.strip()
                items.append(Item("countries", f"country/{code}", [t.format(c=names[code]) for t in COUNTRY_TEMPLATES]))
    zones = root / "zone1970.tab"
    if zones.is_file() and names:
        for line in zones.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if line.startswith("#") or len(parts) < 3 or "/" not in parts[2]:
                continue
            city = parts[2].rsplit("/", 1)[1].replace("_", " ")
            country = names.get(parts[0].split(",")[0])
            if country:
                items.append(Item("countries", f"city/{parts[2]}", [t.format(city=city, c=country) for t in CITY_TEMPLATES]))
    return items


SOURCES: dict[str, Callable[[], list[Item]]] = {"stdlib": stdlib_items, "man": man_items, "doc": doc_items, "countries": country_items}


# --- the split and the selection ----------------------------------------------------------------


def is_heldout(item: Item, seed: int, fraction: float) -> bool:
    digest = hashlib.sha256(f"{seed}:{item.source}:{item.key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def build(n_train: int, n_heldout: int, seed: int = 0, heldout_fraction: float = 0.1, sources: list[str] | None = None) -> tuple[list[dict], dict]:
    """(rows, summary): up to n_train training prompts and n_heldout held-out prompts (one per
    held-out item), shuffled with the seed; the summary says what each source gave."""
    started = time.monotonic()
    summary: dict = {"seed": seed, "heldout_fraction": heldout_fraction, "sources": {}}
    train: list[tuple[str, str, str]] = []  # (source, item key, prompt)
    heldout: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    rng = random.Random(seed)
    for name in sources or list(SOURCES):
        try:
            items = SOURCES[name]()
        except OSError as e:  # an optional source that cannot be read here
            items = []
            summary["sources"][name] = {"error": str(e)}
        counts = {"items": len(items), "train_prompts": 0, "heldout_items": 0}
        for item in items:
            prompts = [p for p in dict.fromkeys(item.prompts) if " ".join(p.split()).lower() not in seen]
            seen.update(" ".join(p.split()).lower() for p in prompts)
            if not prompts:
                continue
            if is_heldout(item, seed, heldout_fraction):
                heldout.append((item.source, item.key, rng.choice(prompts)))
                counts["heldout_items"] += 1
            else:
                train += [(item.source, item.key, p) for p in prompts]
                counts["train_prompts"] += len(prompts)
        summary["sources"].setdefault(name, counts)
    if not summary["sources"].get("stdlib", {}).get("items"):
        raise SystemExit("prompts: the Python standard library gave no items (inspect found no documented functions)")
    rng.shuffle(train)
    rng.shuffle(heldout)
    if n_train > len(train) or n_heldout > len(heldout):
        raise SystemExit(f"prompts: asked for {n_train} training and {n_heldout} held-out prompts; this machine's sources give {len(train)} and {len(heldout)} ({json.dumps(summary['sources'])})")
    rows = [{"id": f"{split}-{i}", "split": split, "source": src, "item": key, "messages": [{"role": "user", "content": text}]}
            for split, chosen in (("train", train[:n_train]), ("heldout", heldout[:n_heldout])) for i, (src, key, text) in enumerate(chosen)]
    summary.update({"available_train": len(train), "available_heldout": len(heldout), "train": n_train, "heldout": n_heldout,
                    "chosen_by_source": {s: sum(1 for r in rows if r["source"] == s) for s in SOURCES}, "seconds": round(time.monotonic() - started, 1)})
    return rows, summary


def write(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", type=int, required=True, help="training prompts")
    p.add_argument("--heldout", type=int, required=True, help="held-out prompts (one per held-out item)")
    p.add_argument("--output", required=True, help="chat JSONL to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heldout-fraction", type=float, default=0.1, help="share of the source items held out")
    p.add_argument("--sources", nargs="+", choices=sorted(SOURCES), default=None, help="default: all")
    args = p.parse_args(argv)
    rows, summary = build(args.train, args.heldout, args.seed, args.heldout_fraction, args.sources)
    write(rows, Path(args.output))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
