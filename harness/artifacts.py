"""Artifacts from the laptop's side: what a run sends so the host can key each stage's output, and
where a recorded run's stages put theirs.

A stage's output is an artifact of the host's store, `<output_dir>/artifacts/<stage>/<key>/`
(harness/host_helpers/artifact_store.py: the keys, the store, the locks; the supervisor reuses a
complete artifact whose key matches and makes a missing one under its lock). The key is computed
on the host, when the stage is about to run: only there are the data, the verifier and the
environment. From here goes each stage's recipe (`recipes`): its resolved flags (the script's own
defaults included, so a changed default is a changed key), which flags name another stage's
artifact and which name a file or directory from outside the store, and the script that runs.
The command lines carry `@artifact:STAGE@` where a path into the store goes (pipeline.artifact_token).

After the run, run.json's `artifacts` says for each stage the key it made, reused or read
(`RunArtifacts`): pull, serve, tensorboard, diff and the demo's summary take a run's own outputs
from there, never from a path another run may have written since.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any, Collection

from harness import box_values
from harness.config import Config
from harness.errors import UsageError
from harness.pipeline import keeps_artifact, stage_args, unknown_stage
from harness.stage_options import stage_options
from harness.stages import INPUT_FLAGS, OPTIONAL_READS, OUTPUT_FLAGS, SCRIPTS_DIR, STAGES

TOKEN_RE = re.compile(r"@artifact:([a-z_]+)@")


def resolved_flags(stage: str, args: dict[str, Any], options: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    """What decides the stage's result besides its inputs: every option of its parser at the
    script's default, the harness's and the config's values over them, each as argparse converts
    it (1 and 1.0 are one value of a float option). Without the parser (no remote_scripts/ beside
    the config): the values given. Inputs and outputs (INPUT_FLAGS, OUTPUT_FLAGS) are not flags."""
    skip = set(INPUT_FLAGS) | set(OUTPUT_FLAGS)
    flags: dict[str, Any] = {}
    if options is not None:
        for key, option in options.items():
            dest = option.get("dest", key)
            if dest not in skip and key == dest:
                flags[dest] = option.get("default")
    for key, value in args.items():
        option = (options or {}).get(key) or {}
        dest = option.get("dest", key)
        if dest in skip:
            continue
        if key != dest and key == "no_" + dest and isinstance(value, bool):  # --no-x (BooleanOptionalAction)
            value = not value
        flags[dest] = _as_parsed(value, option.get("type"))
    return dict(sorted(flags.items()))


def _as_parsed(value: Any, typ: str | None) -> Any:
    convert = {"int": int, "float": float}.get(typ or "")
    if convert is None or isinstance(value, bool):
        return value
    try:
        return [convert(v) for v in value] if isinstance(value, list) else convert(value)
    except (TypeError, ValueError):
        return value


def recipe(config: Config, stage: str, processes: int, fresh: str | None, always_run: bool = False) -> dict[str, Any]:
    """What the host needs to key one stage's artifact (artifact_store.Keys)."""
    args = stage_args(stage, config.pipeline)
    reads, paths = {}, {}
    for flag, value in args.items():
        if flag not in INPUT_FLAGS or value is None or value is False:
            continue
        match = TOKEN_RE.search(str(value))
        if match:
            reads[flag] = match.group(1)
        else:
            paths[flag] = str(value)  # a verifier, the chat data, or an input the config names by path
    script = STAGES[stage].script
    out: dict[str, Any] = {
        "script": f"{SCRIPTS_DIR}/{script}",
        "flags": resolved_flags(stage, args, stage_options(config.path, script)),
        "reads": reads,
        "optional": [flag for flag in reads if (stage, flag) in OPTIONAL_READS],
        "paths": paths,
        "processes": processes if STAGES[stage].processes_matter else 1,
    }
    if fresh:
        out["fresh"] = fresh
    if always_run:
        out["always_run"] = True
    return out


def recipes(config: Config, chain: list[str], processes: int, fresh: Collection[str], run_id: str,
            always_run: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """The recipe of every keyed stage of the chain and of every stage whose artifact one of them
    reads, directly or not (made by an earlier run: the host finds it by its key). `fresh`: the
    chain's stages made anew whatever the store holds (their key takes the run's id).
    `always_run`: the chain's stages that run even when their artifact is complete, resuming
    into it (a group run's distributed stages: every node must take part)."""
    out: dict[str, dict[str, Any]] = {}
    todo = [s for s in chain if keeps_artifact(s, config.pipeline)]
    while todo:
        stage = todo.pop(0)
        if stage in out:
            continue
        in_chain = stage in chain
        out[stage] = recipe(config, stage, processes, run_id if in_chain and stage in fresh else None, in_chain and stage in always_run)
        todo += [upstream for upstream in out[stage]["reads"].values() if upstream not in out]
    return out


def check_fresh(fresh: Collection[str], chain: list[str], where: str = "HOST") -> list[str]:
    """`--fresh` (every stage of the run: "all") or `--fresh STAGE`: the stages made anew."""
    if "all" in fresh:
        return [s for s in chain if STAGES[s].keyed]
    for stage in fresh:
        if stage not in STAGES:
            raise unknown_stage(stage)
        if stage not in chain:
            raise UsageError(f"--fresh {stage}: {stage} is not a stage of this run ({', '.join(chain)})",
                             f"add it: harness run {where} {' '.join(dict.fromkeys([stage, *chain]))} --fresh {stage}")
        if not STAGES[stage].keyed:
            raise UsageError(f"--fresh {stage}: {stage} keeps no artifact (it runs every time)")
    return list(fresh)


# ---------------------------------------------------------------------------------------------
# A recorded run's artifacts


@dataclass(frozen=True)
class StageArtifact:
    stage: str
    key: str
    path: str  # absolute on the host
    role: str  # made | reused | read
    made_by: str | None  # the run whose stage made it; None until it is complete


class RunArtifacts:
    """What run.json says of a run's artifacts. Every value came from the box: a key must be a
    key, a path must lie in the run's store (harness never acts on a path outside it)."""

    def __init__(self, record: dict[str, Any], workdir: str):
        self.record = record
        self.workdir = workdir
        self.keyed = bool(record.get("recipes"))  # runs made before the store have none
        store = str(record.get("store") or "")
        self.store = posixpath.normpath(store if store.startswith("/") else posixpath.join(workdir, store)) if store else ""
        self.by_stage: dict[str, StageArtifact] = {}
        raw = record.get("artifacts")
        for stage, entry in (raw.items() if isinstance(raw, dict) else ()):
            artifact = self._checked(stage, entry)
            if artifact is not None:
                self.by_stage[stage] = artifact

    def _checked(self, stage: Any, entry: Any) -> StageArtifact | None:
        key = box_values.or_none(box_values.artifact_key, entry.get("key")) if isinstance(entry, dict) else None
        if stage not in STAGES or key is None:
            return None
        path = posixpath.join(self.store, stage, key)  # made here, never taken from the record
        return StageArtifact(stage, key, path, str(entry.get("role")), box_values.or_none(box_values.run_id, entry.get("made_by")))

    def path(self, stage: str) -> str | None:
        artifact = self.by_stage.get(stage)
        return artifact.path if artifact is not None else None

    def read_by(self, stage: str, flag: str) -> str | None:
        """What the run's `stage` read for `flag`, absolute on the host: the artifact of the stage
        it names, or the path the recipe gave (the user's config: read, never written)."""
        recipe = (self.record.get("recipes") or {}).get(stage)
        if not isinstance(recipe, dict):
            return None
        upstream = (recipe.get("reads") or {}).get(flag)
        if upstream is not None:
            return self.path(upstream) if isinstance(upstream, str) else None
        given = (recipe.get("paths") or {}).get(flag)
        if not isinstance(given, str) or not given:
            return None
        return given if given.startswith("/") else posixpath.join(self.workdir, given)


LEGACY_NOTE = ("run {run} was made before artifacts were kept per run: its outputs are the shared "
               "{output_dir}/, as the newest run of that time left them")
