"""`[pipeline.stages.NAME]` checked on the laptop against what each stage really accepts.

The one definition of a stage's options is its script's own argparse parser: every stage script
in remote_scripts/ builds it in `build_parser()` (its `parse_args` calls that), and imports
torch and the other heavy libraries only inside the functions that run the stage, so the
module loads on the laptop in milliseconds. `check_stage_tables` loads, for each configured
table, the script that `harness sync` will push (remote_scripts/ beside the config file), asks
it for its parser and checks every key against the parser's options (and a value against the
option's type and choices). A wrong table or key is one ConfigError with the nearest name
(difflib), at config load: `hosts`, `doctor` and `run` all refuse it with exit 2.

Loading a script runs its module level: the script's own `sys.path.insert` and the `common`
modules it imports are taken back out afterwards, so the laptop process is left as it was
(but for standard-library modules). A script without `build_parser` is refused by name rather
than executed: its module level might be the stage itself.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from harness.errors import ConfigError

SCRIPTS_DIR = "remote_scripts"  # beside the config file; what sync pushes


def _nearest(word: str, choices: list[str]) -> str:
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _suggest_option(key: str, options: dict[str, argparse.Action]) -> str:
    """The nearest option name, else one whose help names the key's words
    (`learning_rate` -> `lr`: "peak learning rate ...")."""
    near = _nearest(key, sorted(options))
    if near:
        return near
    words = key.replace("_", " ").lower()
    by_help = [k for k, a in options.items() if a.help and words in a.help.lower()]
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


def options_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Config key -> the action of its --long-option (`max_seq_len` -> `--max-seq-len`)."""
    return {opt[2:].replace("-", "_"): action for opt, action in parser._option_string_actions.items()
            if opt.startswith("--") and not isinstance(action, argparse._HelpAction)}


def check_stage_tables(stages: dict[str, dict[str, Any]], config_path: Path, known: dict[str, str]) -> None:
    """Raise ConfigError for the first unknown stage, option or unusable value.
    `known`: stage name -> script file under remote_scripts/ (harness.pipeline.STAGES)."""
    file = str(config_path)
    scripts = Path(config_path).resolve().parent / SCRIPTS_DIR
    for stage, table in stages.items():
        where = f"[pipeline.stages.{stage}]"
        if stage not in known:
            raise ConfigError(file, where, f"no stage {stage!r}{_nearest(stage, list(known))} (stages: {', '.join(known)})")
        script = scripts / known[stage]
        if not table or not script.is_file():
            continue  # the box has code that was not synced from here: only it can check
        try:
            parser = stage_parser(script)
        except LookupError as e:
            raise ConfigError(file, where, f"cannot check its options: {e}") from None
        options = options_of(parser)
        for key, value in table.items():
            action = options.get(key)
            if action is None:
                raise ConfigError(file, f"{where} {key}", f"{known[stage]} takes no --{key.replace('_', '-')}{_suggest_option(key, options)}")
            problem = _value_problem(action, value)
            if problem:
                raise ConfigError(file, f"{where} {key}", problem)


def _value_problem(action: argparse.Action, value: Any) -> str | None:
    """Why the option would refuse this value on the box, or None. Flags (store_true and its
    kind) take booleans; other options a value or, where they take several, a list."""
    takes_value = action.nargs != 0
    if not takes_value:
        return None if isinstance(value, bool) else f"expected true or false (a flag), got {value!r}"
    if isinstance(value, bool):
        return None if value is False else f"expected a value for {action.option_strings[-1]}, got true"
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) and action.nargs in (None, "?"):
        return f"expected one value, got a list {value!r}"
    for item in items:
        text = str(item)
        if action.type is not None and callable(action.type):
            try:
                converted = action.type(text)
            except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
                return f"invalid value {item!r} for {action.option_strings[-1]} ({e})"
        else:
            converted = text
        if action.choices is not None and converted not in action.choices:
            return f"invalid value {item!r} (choices: {', '.join(map(str, action.choices))}){_nearest(text, [str(c) for c in action.choices])}"
    return None
