"""After a sharded extract: does every sample have exactly one valid hidden-state file?

Extraction is sharded by sample range over every GPU of every host (`--rank/--world-size`, from
torchrun), and each shard checks itself when it ends. This is the check across shards and hosts:
remote_scripts/check_extraction.py takes an inventory of each host's output directory (in the
stage runtime: it reads the files with safetensors and the dataset with `datasets`), and the
merge below reports, naming hosts and sample ranges:

  gaps        samples with no valid file on any host                         -> not ok
  invalid     files present but unusable (truncated, wrong shape, other ids) -> not ok
  mismatch    hosts whose extract_meta.json disagree (layers, hidden size)   -> not ok
  duplicates  samples valid on more than one storage (hosts that do not share the directory
              report different storage ids): shards overlapped, or files were copied; allowed,
              reported
  stray       hs_<i> files with i beyond the dataset                          -> reported
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from harness.artifacts import RunArtifacts
from harness.errors import RemoteCommandError, UsageError
from harness.fanout import parallel
from harness.run_pull import read_record
from harness.stages import SCRIPTS_DIR

if TYPE_CHECKING:
    from harness.host import Host

CHECK_SCRIPT = f"{SCRIPTS_DIR}/check_extraction.py"


@dataclass
class HostInventory:
    host: str
    num_samples: int
    valid: set[int]
    invalid: dict[int, str]
    stray: list[str]
    meta: dict[str, Any] | None
    storage_id: str | None
    output: str

    @classmethod
    def from_json(cls, host: str, data: dict[str, Any]) -> "HostInventory":
        valid = {i for lo, hi in data["valid"] for i in range(lo, hi + 1)}
        return cls(host, data["num_samples"], valid, {int(k): v for k, v in data["invalid"].items()}, data["stray"], data.get("meta"),
                   data.get("storage_id"), data.get("output", ""))


@dataclass
class ExtractionReport:
    num_samples: int
    hosts: list[str]
    gaps: list[int] = field(default_factory=list)
    invalid: list[tuple[str, int, str]] = field(default_factory=list)  # (host, sample, why)
    duplicates: dict[int, list[str]] = field(default_factory=dict)
    mismatch: list[str] = field(default_factory=list)
    stray: list[tuple[str, str]] = field(default_factory=list)
    valid_per_host: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.gaps or self.invalid or self.mismatch)

    def lines(self, limit: int = 10) -> list[str]:
        out = [f"{self.num_samples} samples, {', '.join(f'{h}: {n} valid' for h, n in self.valid_per_host.items())}"]
        if self.gaps:
            out.append(f"GAPS: {len(self.gaps)} sample(s) have no valid file on any host: {format_ranges(self.gaps, limit)}")
        for host, i, why in self.invalid[:limit]:
            out.append(f"INVALID: {host}: hs_{i}.safetensors: {why}")
        if len(self.invalid) > limit:
            out.append(f"INVALID: ... and {len(self.invalid) - limit} more")
        out += [f"MISMATCH: {m}" for m in self.mismatch]
        if self.duplicates:
            shown = "; ".join(f"{i} on {', '.join(h)}" for i, h in list(sorted(self.duplicates.items()))[:limit])
            out.append(f"duplicates: {len(self.duplicates)} sample(s) valid on more than one storage: {shown}")
        if self.stray:
            out.append(f"stray: {len(self.stray)} file(s) beyond the dataset, e.g. {self.stray[0][0]}: {self.stray[0][1]}")
        out.append("ok: every sample has exactly one valid hidden-state file" if self.ok else "NOT OK")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "num_samples": self.num_samples, "hosts": self.hosts, "valid_per_host": self.valid_per_host,
            "gaps": format_ranges(self.gaps, limit=None), "invalid": [{"host": h, "sample": i, "why": w} for h, i, w in self.invalid],
            "duplicates": {str(k): v for k, v in sorted(self.duplicates.items())}, "mismatch": self.mismatch,
            "stray": [{"host": h, "file": f} for h, f in self.stray],
        }


def format_ranges(indices: Sequence[int], limit: int | None = 10) -> str:
    spans: list[list[int]] = []
    for i in sorted(indices):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans]
    if limit is not None and len(text) > limit:
        return ", ".join(text[:limit]) + f", ... ({len(text) - limit} more ranges)"
    return ", ".join(text)


def merge(inventories: Sequence[HostInventory]) -> ExtractionReport:
    """Pure logic: the cross-host verdict from each host's inventory."""
    sizes = {inv.num_samples for inv in inventories}
    report = ExtractionReport(num_samples=max(sizes) if sizes else 0, hosts=[inv.host for inv in inventories])
    if len(sizes) > 1:
        report.mismatch.append("hosts see prepared datasets of different sizes: " + ", ".join(f"{i.host}: {i.num_samples}" for i in inventories))
    metas = {inv.host: _meta_key(inv.meta) for inv in inventories if inv.meta}
    if len(set(metas.values())) > 1:
        report.mismatch.append("extract_meta.json differs: " + "; ".join(f"{h}: {m}" for h, m in metas.items()))
    holders: dict[int, set[str]] = {}  # sample -> storage ids with a valid file
    hosts_of: dict[int, list[str]] = {}
    for inv in inventories:
        report.valid_per_host[inv.host] = len(inv.valid)
        storage = inv.storage_id or f"host:{inv.host}"
        for i in inv.valid:
            holders.setdefault(i, set()).add(storage)
            hosts_of.setdefault(i, []).append(inv.host)
        report.invalid += [(inv.host, i, why) for i, why in sorted(inv.invalid.items())]
        report.stray += [(inv.host, name) for name in inv.stray]
    report.gaps = [i for i in range(report.num_samples) if i not in holders]
    report.duplicates = {i: hosts_of[i] for i, storages in holders.items() if len(storages) > 1}
    return report


def _meta_key(meta: dict[str, Any]) -> str:
    return json.dumps({"target_layer_ids": meta.get("target_layer_ids"), "hidden_size": meta.get("hidden_size")}, sort_keys=True)


def inventory_argv(host: "Host", run_id: str) -> list[str]:
    """check_extraction.py over the run's extract artifact and the prepared data it read (from
    the run's record on that host: every node of a group run keeps its own)."""
    workdir = host.runtime.workdir
    artifacts = RunArtifacts(read_record(host.transport, workdir, run_id), workdir)
    extract, prepared = artifacts.path("extract"), artifacts.read_by("extract", "prepared")
    if extract is None or prepared is None:
        raise UsageError(f"{host.name}: run {run_id} has no extract artifact (made, reused or read): name a run that extracted")
    return [host.runtime.python, CHECK_SCRIPT, "--prepared", prepared, "--output", extract]


def check_extraction(hosts: Sequence["Host"], run_id: str) -> ExtractionReport:
    """Take every host's inventory of the run's hidden states (in parallel, in its stage runtime)
    and merge them."""
    def one(host: "Host") -> HostInventory:
        runtime = host.runtime
        result = host.transport.run(runtime.foreground(inventory_argv(host, host.jobs.resolve_run_id(run_id))))
        if not result.ok:
            raise RemoteCommandError(f"{CHECK_SCRIPT} on {host.name}", result.exit_code, result.stderr.decode("utf-8", "replace"))
        return HostInventory.from_json(host.name, json.loads(result.text.strip().splitlines()[-1]))

    inventories = []
    for host, inv, error in parallel(list(hosts), one):
        if error is not None:
            raise error
        inventories.append(inv)
    return merge(inventories)
