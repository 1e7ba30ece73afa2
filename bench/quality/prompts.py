#!/usr/bin/env python3
"""Real prompts for a real chat verifier, offline: built from what this machine has, no network.

    python bench/quality/prompts.py --train 2000 --selection 64 --heldout 64 --output chat.jsonl [--seed 0]

Sources (each optional but the first; a missing one is reported with 0 items):
  stdlib      the Python standard library, through inspect: public functions, classes and methods
              with a docstring -> explain / how to use / arguments (qa), write a script or the
              function yourself (coding), summarize or rewrite its documentation, a two-turn chat
              whose first reply is the docstring (chat), the docstring among others (retrieval)
  man         man pages' NAME lines (/usr/share/man/man{1,5,7,8}) -> what a command does (qa), a
              shell one-liner (coding), a two-turn chat, which command does X among others (retrieval)
  doc         README paragraphs under /usr/share/doc -> summarize, explain in simpler words (rewriting)
  countries   ISO 3166 names (/usr/share/zoneinfo/iso3166.tab) and the cities of zone1970.tab ->
              general knowledge (qa), a trip or a poem (writing), a two-turn chat on a city
  math        word problems generated here (templates, numbers drawn per item: GSM8K's shape)
  translation programs' messages and their translations in the gettext catalogs installed here
              (/usr/share/locale/{de,fr,es,it,pt}/LC_MESSAGES/*.mo) -> translate either way
Categories (a row's "category"; evaluate reports tau per category): Spec-Bench's multi-turn chat,
translation, summarization, question answering (qa), math, retrieval; coding; rewriting; writing.
A source item (a function, a command, a README paragraph, a country, a problem, a message) gives
several prompts. The held-out items are chosen BY SOURCE ITEM: an item's hash with the seed puts
all of its prompts in one split (train; selection: harness sweep chooses recipes on it; heldout:
the test split, only reported), so no held-out prompt shares an item with a training prompt or
with the other held-out split; a retrieval prompt's distractors come from its own split. Prompts are
deduplicated by their text. Held-out prompts are spread evenly over the categories (one per item
and category). The same seed on the same machine gives the same file.

Rows: {"id", "split": "train"|"selection"|"heldout", "source", "item", "category", "messages": [...]}
whose last turn is the user's (the regenerate stage writes the verifier's replies; a two-turn chat's
first reply comes from the source).
"""

from __future__ import annotations

import argparse
import collections
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
import struct
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


@dataclass(frozen=True)
class Prompt:
    """One conversation to answer: its category and its turns (the last a user's)."""

    category: str  # CATEGORIES
    messages: tuple[tuple[str, str], ...]  # (role, content)

    @property
    def key(self) -> str:
        """What deduplicates prompts: the turns' text, whitespace and case folded."""
        return " | ".join(" ".join(text.split()).lower() for _, text in self.messages)


def ask(category: str, text: str) -> Prompt:
    return Prompt(category, (("user", text),))


def follow_up(category: str, question: str, answer: str, then: str) -> Prompt:
    """A two-turn chat whose first reply comes from the source itself (a docstring, a man page's
    NAME line, a zone table), so no model is needed to build it."""
    return Prompt(category, (("user", question), ("assistant", answer), ("user", then)))


@dataclass
class Item:
    """One source item: all of its prompts go to one split."""

    source: str
    key: str  # unique within the source; the split is decided by its hash
    prompts: list[Prompt] = field(default_factory=list)
    # (title, text) a retrieval prompt quotes, and the question it asks about it: the other
    # documents beside it are distractors from items of the same split.
    passage: tuple[str, str] | None = None
    question: str = ""

    def texts(self) -> list[str]:
        return [p.messages[-1][1] for p in self.prompts]


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


def _function_prompts(name: str, sig: str, doc: str, kind: str) -> list[Prompt]:
    para, sentence = _first_paragraph(doc), _first_sentence(_first_paragraph(doc))
    what = {"function": "function", "method": "method", "class": "class"}[kind]
    prompts = [
        ask("qa", f"Explain what the Python {what} `{name}` does, with a short example."),
        ask("qa", f"How do I use `{name}{sig}` in Python? Its documentation says: \"{para}\""),
        ask("coding", f"Write a short Python script that uses `{name}` and explain each line."),
        ask("qa", f"In Python's standard library, what is `{name}` for, and when would I reach for it?"),
        ask("summarization", f"Summarize this documentation of `{name}` in plain words for a beginner:\n\n{para}"),
        ask("rewriting", f"Rewrite this passage of Python's documentation in plain, friendly English, keeping its meaning:\n\n{para}"),
        follow_up("chat", f"What is `{name}` in Python?", para, "Thanks. Can you show me a short example of using it?"),
    ]
    if kind == "class":
        prompts += [ask("coding", f"Show how to create a `{name}` object and use two of its methods."), ask("qa", f"What problem does the class `{name}` solve? Give an example.")]
    else:
        prompts += [ask("coding", f"Write a Python function that does the following without calling `{name}`: {sentence}."), ask("qa", f"What arguments does `{name}{sig}` take, and what does it return?")]
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
            items.setdefault(name, Item("stdlib", name, _function_prompts(name, _signature(obj), doc, kind), (f"`{name}`", _first_paragraph(doc)), f"What does `{name}` do, according to the documents?"))
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
                items.setdefault(full, Item("stdlib", full, _function_prompts(full, _signature(meth), mdoc, "method"), (f"`{full}`", _first_paragraph(mdoc)), f"What does `{full}` do, according to the documents?"))
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
            task = desc[0].lower() + desc[1:]
            if section in ("man1", "man8"):
                prompts = [ask("qa", f"What does the Linux {kind} `{cmd}` do? Give two examples."), ask("qa", f"How do I use `{cmd}` to {task}?"),
                           ask("qa", f"Explain the most useful options of `{cmd}` ({desc})."), ask("coding", f"Write a shell one-liner that uses `{cmd}`, and explain it."),
                           follow_up("chat", f"What is `{cmd}` on Linux?", f"`{cmd}` - {desc}.", "How would I use it in a script? Show an example.")]
                question = f"Which command would I use to {task}, according to the documents?"
            else:
                prompts = [ask("qa", f"Explain the Linux {kind} `{cmd}`: {desc}."), ask("qa", f"What is `{cmd}` ({desc}) and where would I meet it on a Linux system?")]
                question = f"What is `{cmd}`, according to the documents?"
            items[cmd] = Item("man", f"{section}/{cmd}", prompts, (f"`{cmd}`", desc + "."), question)
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
                ask("rewriting", f"Explain this paragraph from the documentation of the Debian package {pkg} in simpler words:\n\n{para}"),
                ask("summarization", f"Summarize in one sentence:\n\n{para}"),
                ask("summarization", f"Read this and list the key points as bullets:\n\n{para}"),
            ]))
    return items


COUNTRY_TEMPLATES = [
    ("qa", "What is the capital of {c}, and what is it known for?"), ("qa", "Tell me three interesting facts about {c}."),
    ("qa", "Which languages are spoken in {c}?"), ("qa", "Describe the geography and climate of {c} in a few sentences."),
    ("writing", "Plan a three-day trip to {c} for a first-time visitor."), ("qa", "Give a short overview of the history of {c}."),
    ("qa", "What are some traditional dishes from {c}?"), ("writing", "Write a short poem about {c}."),
]
CITY_TEMPLATES = [("qa", "Tell me about the city of {city} in {c}."), ("qa", "What time zone is {city} in, and how far is it from UTC?"), ("qa", "What should a visitor see in {city}?")]


def country_items(root: Path = Path("/usr/share/zoneinfo")) -> list[Item]:
    names: dict[str, str] = {}
    items = []
    tab = root / "iso3166.tab"
    if tab.is_file():
        for line in tab.read_text(errors="replace").splitlines():
            if line and not line.startswith("#") and "\t" in line:
                code, name = line.split("\t", 1)
                names[code] = name.strip()
                items.append(Item("countries", f"country/{code}", [ask(cat, t.format(c=names[code])) for cat, t in COUNTRY_TEMPLATES]))
    zones = root / "zone1970.tab"
    if zones.is_file() and names:
        for line in zones.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if line.startswith("#") or len(parts) < 3 or "/" not in parts[2]:
                continue
            city = parts[2].rsplit("/", 1)[1].replace("_", " ")
            country = names.get(parts[0].split(",")[0])
            if country:
                chat = follow_up("chat", f"Which time zone does {city} use?", f"{city} ({country}) uses the time zone {parts[2]}.", f"What should a visitor see in {city}?")
                items.append(Item("countries", f"city/{parts[2]}", [*(ask(cat, t.format(city=city, c=country)) for cat, t in CITY_TEMPLATES), chat]))
    return items


# Word problems with numbers drawn per item (GSM8K's shape: the same kinds of problem, other numbers).
MATH_TEMPLATES = [
    "A shop sells pencils at {a} cents each. {name} buys {b} pencils and pays with a {c}-dollar bill. How much change does {name} get?",
    "A train travels {a} km in {b} hours, then {c} km more in 2 hours. What is its average speed over the whole trip?",
    "{name} reads {a} pages a day. The book has {m} pages, and {name} has already read {b} pages. How many more days does it take to finish it?",
    "A recipe needs {a} grams of flour for {b} cookies. How much flour is needed for {m} cookies?",
    "A tank holds {m} litres. It is filled at {a} litres a minute while it leaks {b} litres a minute. How long until it is full, starting empty?",
    "{name} saves {a} dollars a week and spends {b} dollars every 4 weeks. How much has {name} saved after {c} weeks?",
    "A rectangle is {a} cm long and {b} cm wide. A square has the same perimeter. What is the area of the square?",
    "There are {m} students in a school; {a}% of them walk to school and {b} of the others come by bus. How many come another way?",
]
NAMES = ["Maya", "Ravi", "Lena", "Tom", "Aiko", "Omar", "Sofia", "Jonas", "Zara", "Diego"]
MATH_ITEMS = 4000


def math_items(count: int = MATH_ITEMS) -> list[Item]:
    """Generated word problems: each a template with its own numbers (one item each)."""
    rng = random.Random("math")  # the items are the same on every machine; the split's seed picks among them
    items = []
    for i in range(count):
        t = i % len(MATH_TEMPLATES)
        values = {"a": rng.randint(3, 60), "b": rng.randint(2, 20), "c": rng.randint(2, 12), "m": rng.randint(10, 40) * 10, "name": rng.choice(NAMES)}
        text = MATH_TEMPLATES[t].format(**values)
        items.append(Item("math", f"{t}/{values['a']}/{values['b']}/{values['c']}/{values['m']}/{values['name']}",
                          [ask("math", text + " Think step by step."), ask("math", f"Solve this word problem and explain your reasoning:\n\n{text}")]))
    return items


TRANSLATION_ITEMS = 3000  # of ~13,000 messages here: translation would otherwise be most of the training prompts
TRANSLATION_LANGUAGES = {"de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "pt": "Portuguese"}


def read_mo(path: Path) -> dict[str, str]:
    """A gettext catalog (.mo): {message: translation}, singular messages only (no context, no plural)."""
    data = path.read_bytes()
    if len(data) < 20:
        return {}
    for order in ("<", ">"):
        magic, _, count, originals, translations = struct.unpack(order + "5I", data[:20])
        if magic == 0x950412DE:
            break
    else:
        return {}
    out = {}
    for i in range(count):
        olen, ooff = struct.unpack(order + "2I", data[originals + 8 * i: originals + 8 * i + 8])
        tlen, toff = struct.unpack(order + "2I", data[translations + 8 * i: translations + 8 * i + 8])
        original, translated = data[ooff: ooff + olen], data[toff: toff + tlen]
        if original and b"\x00" not in original and b"\x04" not in original and b"\x00" not in translated:
            out[original.decode("utf-8", "replace")] = translated.decode("utf-8", "replace")
    return out


def translation_items(root: Path = Path("/usr/share/locale")) -> list[Item]:
    """Programs' messages and their translations, from the gettext catalogs installed here (coreutils,
    apt, git, ...: /usr/share/locale/<lang>/LC_MESSAGES/*.mo). An item is one English message with
    every translation of it: translate it into a language, or a translation back into English."""
    by_message: dict[tuple[str, str], dict[str, str]] = {}
    for lang in TRANSLATION_LANGUAGES:
        d = root / lang / "LC_MESSAGES"
        if not d.is_dir():
            continue
        for mo in sorted(d.glob("*.mo")):
            if mo.stem.startswith("iso_"):  # names of countries and languages: not sentences
                continue
            try:
                catalog = read_mo(mo)
            except (OSError, struct.error):
                continue
            for message, translated in catalog.items():
                words = message.split()
                if not (5 <= len(words) <= 30) or not translated.strip() or translated == message or re.search(r"%|\{|\\|<|\n|--", message) or sum(c.isalpha() for c in message) < 0.75 * len(message.replace(" ", "")):
                    continue
                by_message.setdefault((mo.stem, message), {})[lang] = " ".join(translated.split())
    items = []
    for (domain, message), translations in by_message.items():
        digest = hashlib.sha256(f"{domain}:{message}".encode()).hexdigest()
        langs = sorted(translations)
        into, back = langs[int(digest[:4], 16) % len(langs)], langs[int(digest[4:8], 16) % len(langs)]  # one language each way
        items.append(Item("translation", f"{domain}/{digest[:12]}", [ask("translation", f"Translate into {TRANSLATION_LANGUAGES[into]}: \"{message}\""),
                                                                     ask("translation", f"Translate this {TRANSLATION_LANGUAGES[back]} sentence into English: \"{translations[back]}\"")]))
    items.sort(key=lambda i: i.key.split("/")[-1])  # by digest: the cap keeps a mix of programs
    return items[:TRANSLATION_ITEMS]


SOURCES: dict[str, Callable[[], list[Item]]] = {"stdlib": stdlib_items, "man": man_items, "doc": doc_items, "countries": country_items,
                                                "math": math_items, "translation": translation_items}
# Spec-Bench's categories (multi-turn chat, translation, summarization, question answering, math
# reasoning, retrieval-augmented generation), coding, and writing (the countries' trips and poems).
CATEGORIES = ("chat", "coding", "math", "qa", "summarization", "rewriting", "translation", "retrieval", "writing")
RETRIEVAL_DOCUMENTS = 4  # the item's passage and three distractors


def add_retrieval(items: list[Item], rng: random.Random) -> None:
    """A retrieval prompt for each item with a passage: the passage among distractors of other items
    (of the same source and split: the caller passes one split's items), then the item's question."""
    by_source: dict[str, list[Item]] = {}
    for item in items:
        if item.passage:
            by_source.setdefault(item.source, []).append(item)
    for group in by_source.values():
        if len(group) < RETRIEVAL_DOCUMENTS:
            continue
        for i, item in enumerate(group):
            others = [j for j in rng.sample(range(len(group)), RETRIEVAL_DOCUMENTS) if j != i][: RETRIEVAL_DOCUMENTS - 1]
            docs = [item.passage, *(group[j].passage for j in others)]
            rng.shuffle(docs)
            context = "\n".join(f"[{i + 1}] {title}: {text}" for i, (title, text) in enumerate(docs))
            item.prompts.append(ask("retrieval", f"Answer using only the documents below, and say which one you used.\n\n{context}\n\nQuestion: {item.question}"))


# --- the split and the selection ----------------------------------------------------------------


SPLITS = ("train", "selection", "heldout")  # heldout: the test split (evaluate's default), only reported


def split_of(item: Item, seed: int, fraction: float) -> str:
    """An item's split from its hash with the seed: `fraction` of the items are held out, half of
    them for selection (choosing recipes: harness sweep) and half for the test (reporting)."""
    digest = hashlib.sha256(f"{seed}:{item.source}:{item.key}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return "heldout" if u < fraction / 2 else "selection" if u < fraction else "train"


def balanced(candidates: list[tuple[str, str, Prompt]], n: int, rng: random.Random) -> list[tuple[str, str, Prompt]]:
    """n held-out prompts spread evenly over the categories (round-robin, each category shuffled),
    one prompt per item and category."""
    by_category: dict[str, list[tuple[str, str, Prompt]]] = {}
    seen: set[tuple[str, str, str]] = set()
    for c in candidates:
        mark = (c[0], c[1], c[2].category)
        if mark not in seen:
            seen.add(mark)
            by_category.setdefault(c[2].category, []).append(c)
    for group in by_category.values():
        rng.shuffle(group)
    chosen: list[tuple[str, str, Prompt]] = []
    while len(chosen) < n and any(by_category.values()):
        for category in sorted(by_category):
            if by_category[category] and len(chosen) < n:
                chosen.append(by_category[category].pop())
    return chosen


def build(n_train: int, n_heldout: int, seed: int = 0, heldout_fraction: float = 0.1, sources: list[str] | None = None, n_selection: int = 0) -> tuple[list[dict], dict]:
    """(rows, summary): up to n_train training prompts, n_selection selection prompts and
    n_heldout test prompts (split "heldout"), the held-out ones spread over the categories,
    shuffled with the seed; the summary says what each source and category gave."""
    started = time.monotonic()
    summary: dict = {"seed": seed, "heldout_fraction": heldout_fraction, "sources": {}}
    pools: dict[str, list[tuple[str, str, Prompt]]] = {split: [] for split in SPLITS}  # (source, item key, prompt)
    seen: set[str] = set()
    rng = random.Random(seed)
    for name in sources or list(SOURCES):
        try:
            items = SOURCES[name]()
        except OSError as e:  # an optional source that cannot be read here
            items = []
            summary["sources"][name] = {"error": str(e)}
        counts = {"items": len(items), "train_prompts": 0, "selection_items": 0, "heldout_items": 0}
        split_items: dict[str, list[Item]] = {split: [] for split in SPLITS}
        for item in items:
            split_items[split_of(item, seed, heldout_fraction)].append(item)
        for split, group in split_items.items():
            add_retrieval(group, rng)
            for item in group:
                prompts = [p for p in dict.fromkeys(item.prompts) if p.key not in seen]
                seen.update(p.key for p in prompts)
                if not prompts:
                    continue
                pools[split] += [(item.source, item.key, p) for p in prompts]
                counts["train_prompts" if split == "train" else f"{split}_items"] += len(prompts) if split == "train" else 1
        summary["sources"].setdefault(name, counts)
    if not summary["sources"].get("stdlib", {}).get("items"):
        raise SystemExit("prompts: the Python standard library gave no items (inspect found no documented functions)")
    rng.shuffle(pools["train"])
    chosen = {"train": pools["train"][:n_train], "selection": balanced(pools["selection"], n_selection, rng), "heldout": balanced(pools["heldout"], n_heldout, rng)}
    if n_train > len(pools["train"]) or len(chosen["selection"]) < n_selection or len(chosen["heldout"]) < n_heldout:
        raise SystemExit(f"prompts: asked for {n_train} training, {n_selection} selection and {n_heldout} held-out prompts; this machine's sources give "
                         f"{len(pools['train'])}, {len(chosen['selection'])} and {len(chosen['heldout'])} ({json.dumps(summary['sources'])})")
    for split in ("selection", "heldout"):
        rng.shuffle(chosen[split])
    rows = [{"id": f"{split}-{i}", "split": split, "source": src, "item": key, "category": p.category, "messages": [{"role": r, "content": t} for r, t in p.messages]}
            for split in SPLITS for i, (src, key, p) in enumerate(chosen[split])]
    summary.update({"available_train": len(pools["train"]), "train": n_train, "selection": n_selection, "heldout": n_heldout,
                    "available_by_category": {split: dict(sorted(collections.Counter(p.category for _, _, p in pools[split]).items())) for split in ("selection", "heldout")},
                    "chosen_by_source": {s: sum(1 for r in rows if r["source"] == s) for s in SOURCES},
                    "chosen_by_category": {split: dict(sorted(collections.Counter(r["category"] for r in rows if r["split"] == split).items())) for split in SPLITS},
                    "seconds": round(time.monotonic() - started, 1)})
    return rows, summary


def write(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", type=int, required=True, help="training prompts")
    p.add_argument("--heldout", type=int, required=True, help="test prompts (split heldout), spread over the categories")
    p.add_argument("--selection", type=int, default=0, help="selection prompts (split selection: harness sweep chooses recipes on them), spread over the categories")
    p.add_argument("--output", required=True, help="chat JSONL to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heldout-fraction", type=float, default=0.1, help="share of the source items held out")
    p.add_argument("--sources", nargs="+", choices=sorted(SOURCES), default=None, help="default: all")
    args = p.parse_args(argv)
    rows, summary = build(args.train, args.heldout, args.seed, args.heldout_fraction, args.sources, args.selection)
    write(rows, Path(args.output))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
