"""`[pipeline.stages.NAME]` checked on the laptop against what each stage really accepts.

The one definition of a stage's options is its script's own argparse parser: every stage script
in remote_scripts/ builds it in `build_parser()` and imports torch and the like only inside the
functions that run the stage. `check_stage_tables` loads, for each configured table, the script
that `harness sync` will push (remote_scripts/ beside the config file), asks it for its parser
and checks every key against the parser's options (and a value against the option's type and
choices). A wrong table or key is one ConfigError with the nearest name, at config load (exit 2).
Loading leaves the laptop process as it was, and what each parser takes is cached in the
project's .harness/stage-options.json, so while the code is unchanged no script is loaded.

How a script is loaded and the cache stamped: docs/architecture/config.md, stage_options.py.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, UsageError, did_you_mean

SCRIPTS_DIR = "remote_scripts"  # beside the config file; what sync pushes
CACHE_PATH = ".harness/stage-options.json"  # beside it too (the project's .harness/, never synced)


def _nearest(word: str, choices: list[str]) -> str:
    hint = did_you_mean(word, choices)
    return f" ({hint})" if hint else ""


def _suggest_option(key: str, options: dict[str, dict[str, Any]]) -> str:
    """The nearest option name, else one whose help names the key's words
    (`learning_rate` -> `lr`: "peak learning rate ...")."""
    near = _nearest(key, sorted(options))
    if near:
        return near
    words = key.replace("_", " ").lower()
    by_help = [k for k, o in options.items() if words in o["help"].lower()]
    return f" (did you mean {by_help[0]!r}?)" if by_help else ""


def stage_parser(script_path: Path) -> argparse.ArgumentParser:
    """The parser `script_path` builds (its build_parser()), loaded without leaving a trace."""
    source = script_path.read_text(encoding="utf-8")
    if "\ndef build_parser(" not in source:
        raise LookupError(f"{script_path} defines no build_parser()")
    saved_path = list(sys.path)
    before = set(sys.modules)
    name = f"_harness_stage_{script_path.stem}"
    try:
        spec = importlib.util.spec_from_file_location(name, script_path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is made
        spec.loader.exec_module(module)
        return module.build_parser()
    finally:
        sys.path[:] = saved_path
        here = str(script_path.parent.resolve())
        for added in set(sys.modules) - before:
            file = getattr(sys.modules[added], "__file__", None) or ""
            if added == name or str(Path(file).resolve()).startswith(here + "/"):
                del sys.modules[added]


def describe(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    """Config key -> what its --long-option takes (`max_seq_len` -> `--max-seq-len`), as JSON:
    `flag` (the option), `nargs` (argparse's; 0 for a flag), `type` ("int", "float", or null:
    a string or a type not checked here), `choices`, `help`, `dest` (argparse's: `--no-x` sets x),
    `default` (as JSON has it)."""
    out = {}
    for opt, action in parser._option_string_actions.items():
        if not opt.startswith("--") or isinstance(action, argparse._HelpAction):
            continue
        typ = {int: "int", float: "float"}.get(action.type) if action.type is not None else None
        choices = [c if isinstance(c, (str, int, float)) else str(c) for c in action.choices] if action.choices is not None else None
        default = json.loads(json.dumps(action.default, default=str))
        out[opt[2:].replace("-", "_")] = {"flag": opt, "nargs": action.nargs, "type": typ, "choices": choices, "help": action.help or "",
                                          "dest": action.dest, "default": default}
    return out


DESCRIPTION_FORMAT = 2  # of describe()'s entries: a cache of another format is read again


def code_stamp(scripts: Path) -> str:
    """Size and mtime of every .py the stage scripts are made of: a parser can change only with it."""
    files = sorted([*scripts.glob("*.py"), *scripts.glob("common/*.py")])
    table = [(p.relative_to(scripts).as_posix(), st.st_size, st.st_mtime_ns) for p in files for st in [p.stat()]]
    return hashlib.sha256(json.dumps([DESCRIPTION_FORMAT, table]).encode()).hexdigest()


class _Descriptions:
    """Each script's describe(), kept in <project>/.harness/stage-options.json under the code's
    stamp, so a command whose config has stage tables loads no script while the code is unchanged
    (a script's first load costs 0.05-0.4 s on the shared 2-core machine; the cache, a stat per file)."""

    def __init__(self, scripts: Path):
        self.scripts = scripts
        self.path = scripts.parent / CACHE_PATH
        self.stamp = code_stamp(scripts)
        try:
            cached = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cached = {}
        self.table = cached.get("scripts", {}) if isinstance(cached, dict) and cached.get("stamp") == self.stamp else {}
        self.changed = False

    def __getitem__(self, script: str) -> dict[str, dict[str, Any]]:
        if script not in self.table:
            self.table[script] = describe(stage_parser(self.scripts / script))
            self.changed = True
        return self.table[script]

    def save(self) -> None:
        if not self.changed:
            return
        try:  # a read-only checkout: no cache, the same checks
            self.path.parent.mkdir(exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(json.dumps({"stamp": self.stamp, "scripts": self.table}), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass


def stage_descriptions(config_path: Path) -> "_Descriptions | None":
    """What each stage script beside the config takes (None: no remote_scripts/ there, the box
    has code that was not synced from here: only it can check)."""
    scripts = Path(config_path).resolve().parent / SCRIPTS_DIR
    return _Descriptions(scripts) if scripts.is_dir() else None


_LOADING = threading.Lock()  # loading a script changes sys.modules and sys.path: one at a time (a group's nodes plan in threads)


def stage_options(config_path: Path, script: str) -> dict[str, dict[str, Any]] | None:
    """describe() of one stage script beside the config, or None where there is none."""
    with _LOADING:
        descriptions = stage_descriptions(config_path)
        if descriptions is None or not (descriptions.scripts / script).is_file():
            return None
        try:
            return descriptions[script]
        finally:
            descriptions.save()


def table_problem(stages: dict[str, dict[str, Any]], config_path: Path, known: dict[str, str]) -> tuple[str, str | None, str] | None:
    """The first unknown stage, option or unusable value among `stages` (stage -> {option: value}),
    as (stage, option or None, what is wrong with the nearest name), else None. The one check of
    `[pipeline.stages.*]`, `[sweep.grid.*]` and every `--set`. `known`: stage name -> script file
    under remote_scripts/ (harness.pipeline.STAGES)."""
    descriptions = None
    _LOADING.acquire()
    try:
        for stage, table in stages.items():
            if stage not in known:
                return stage, None, f"no stage {stage!r}{_nearest(stage, list(known))} (stages: {', '.join(known)})"
            if not table:
                continue
            descriptions = descriptions or stage_descriptions(config_path)
            if descriptions is None or not (descriptions.scripts / known[stage]).is_file():
                continue  # the box has code that was not synced from here: only it can check
            try:
                options = descriptions[known[stage]]
            except LookupError as e:
                return stage, None, f"cannot check its options: {e}"
            for key, value in table.items():
                option = options.get(key)
                if option is None:
                    return stage, key, f"{known[stage]} takes no --{key.replace('_', '-')}{_suggest_option(key, options)}"
                if key in RESERVED:
                    return stage, key, RESERVED[key]
                problem = _value_problem(option, value)
                if problem:
                    return stage, key, problem
        return None
    finally:
        if descriptions is not None:
            descriptions.save()
        _LOADING.release()


# Options harness sets itself, which a table may not: where a stage writes is its artifact's path in the store.
RESERVED = {"output": "a stage's --output is its artifact in the store, kept under a key of what made it (`harness pull` brings it): remove it"}


def check_stage_tables(stages: dict[str, dict[str, Any]], config_path: Path, known: dict[str, str], table: str = "pipeline.stages") -> None:
    """Raise ConfigError for the first unknown stage, option or unusable value of `[table.STAGE]`."""
    found = table_problem(stages, config_path, known)
    if found is not None:
        stage, key, problem = found
        raise ConfigError(str(config_path), f"[{table}.{stage}]" + (f" {key}" if key else ""), problem)


# -- `--set STAGE.FLAG=VALUE` (harness run, harness sweep): the same check, one line on the command line


def parse_value(text: str) -> Any:
    """A command-line value as TOML reads it (1e-3 -> 0.001, 5 -> 5, true -> True, [1, 3, 6] ->
    a list), else the text."""
    import tomllib

    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_setting(item: str) -> tuple[str, str, str]:
    """`STAGE.FLAG=VALUE` -> (stage, flag with _ for -, the value's text)."""
    key, sep, raw = item.partition("=")
    stage, dot, flag = key.strip().partition(".")
    if not sep or not raw.strip() or not dot or not stage or not flag:
        raise UsageError(f"--set {item!r}: expected STAGE.FLAG=VALUE, e.g. --set train.lr=3e-4")
    return stage, flag.replace("-", "_"), raw.strip()


def check_settings(settings: dict[str, dict[str, Any]], config_path: Path, known: dict[str, str], where: str = "--set") -> None:
    """One line (UsageError) for the first setting the stage's parser would refuse."""
    found = table_problem(settings, config_path, known)
    if found is not None:
        stage, key, problem = found
        raise UsageError(f"{where} {stage}" + (f".{key}" if key else "") + f": {problem}")


def _value_problem(option: dict[str, Any], value: Any) -> str | None:
    """Why the option would refuse this value on the box, or None. Flags (store_true and its
    kind) take booleans; other options a value or, where they take several, a list."""
    flag, nargs = option["flag"], option["nargs"]
    if nargs == 0:
        return None if isinstance(value, bool) else f"expected true or false (a flag), got {value!r}"
    if isinstance(value, bool):
        return None if value is False else f"expected a value for {flag}, got true"
    if isinstance(value, list) and nargs in (None, "?"):
        return f"expected one value, got a list {value!r}"
    convert = {"int": int, "float": float}.get(option["type"] or "", str)
    for item in value if isinstance(value, list) else [value]:
        try:
            converted = convert(str(item))
        except ValueError as e:
            return f"invalid value {item!r} for {flag} ({e})"
        choices = option["choices"]
        if choices is not None and converted not in choices:
            return f"invalid value {item!r} (choices: {', '.join(map(str, choices))}){_nearest(str(item), [str(c) for c in choices])}"
    return None
