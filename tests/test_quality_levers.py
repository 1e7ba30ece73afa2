"""bench/quality/run.py --study levers end to end at its smallest size: the standard library's toy
verifier, each arm a real `harness run` (regenerate, prepare, extract, train) at two data sizes,
`speculators train`'s defaults beside them, measure.py on the selection and the test split. What
is checked is the table's structure and that each arm's figures are its own run's, never a tau's
value (a toy verifier's draft after one epoch)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.pipeline_data import REPO_ROOT, offline_env

LEVERS = {"baseline": {}, "replies-2": {"regenerate": {"replies_per_prompt": 2}}}


def study(work: Path, levers: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "bench/quality/run.py"), "--study", "levers", "--verifier", "stdlib", "--size", "ci",
         "--levers", str(levers), "--workdir", str(work), "--no-record", *extra],
        capture_output=True, text=True, env=offline_env(PYTHONPATH=str(REPO_ROOT)), timeout=1800,
    )


def finished(artifact: Path) -> dict:
    """The `finished` event the artifact's own record keeps (the run that made it)."""
    record = json.loads(Path(f"{artifact}.json").read_text())
    return next(e for e in record["events"] if e.get("event") == "finished")


@pytest.mark.pipeline
@pytest.mark.timeout(1800)
def test_levers_study_each_arm_its_own_run_chosen_on_selection_and_resumed(tmp_path):
    sys.path.insert(0, str(REPO_ROOT))
    from harness.artifacts import RunArtifacts

    work, levers = tmp_path / "work", tmp_path / "levers.json"
    levers.write_text(json.dumps(LEVERS))
    # --concurrent: every arm at once, each in a queue slot of its own, as on a GPU (where the
    # study's figures come from)
    proc = study(work, levers, "--json", "--concurrent")
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    sizes = r["data_sizes"]
    assert len(sizes) == 2 and sizes[0] < sizes[1]
    arms = {a["arm"]: a for a in r["arms"]}
    assert set(arms) == {f"{name}@{n}" for n in sizes for name in [*LEVERS, "speculators"]}

    taus = {split: json.loads((work / "taus" / f"{split}.json").read_text()) for split in ("selection", "heldout")}
    measured = {split: dict(a.split("=", 1) for a in t["bench_key"]["args"][t["bench_key"]["args"].index("--split") + 3::2]) for split, t in taus.items()}
    ours = [a for a in arms.values() if a["lever"] != "speculators"]
    assert len({a["run"] for a in ours}) == len(ours)  # one pipeline run per arm and size
    for a in arms.values():
        # Its figures are the measurement of its own draft on each split.
        for split, label in (("selection", "selection"), ("heldout", "test")):
            assert a[f"{label}_tau"] == {k: taus[split]["taus"][a["arm"]][k]["tau"] for k in ("3", "5")}
        record = json.loads((work / "runs" / a["run"] / "run.json").read_text())
        paths = RunArtifacts(record, str(work))
        draft = work / "levers" / f"speculators-{a['data_prompts']}-{Path(paths.path('extract')).name}" if a["lever"] == "speculators" else Path(paths.path("train"))
        assert measured["heldout"][a["arm"]] == measured["selection"][a["arm"]] == str(draft)
        # The run's own data: its prompt file, its lever's flags in its record, its costs.
        assert record["recipes"]["regenerate"]["paths"]["data"] == f"outputs/levers/train-{a['data_prompts']}.jsonl"
        assert record["recipes"]["regenerate"]["flags"]["replies_per_prompt"] == (2 if a["lever"] == "replies-2" else 1)
        prepare = finished(Path(paths.path("prepare")))
        assert a["rows"] == prepare["rows_kept"] and a["tokens"] == prepare["total_tokens"]
        assert a["seconds"]["regenerate"] == finished(Path(paths.path("regenerate")))["seconds"]
        assert a["seconds"]["extract"] == finished(Path(paths.path("extract")))["seconds"]
        if a["lever"] == "speculators":
            assert a["seconds"]["train"] == json.loads((draft / "bench_done").read_text())["seconds"]
        else:
            assert a["seconds"]["train"] == finished(draft)["seconds"]
        extract = Path(paths.path("extract"))
        assert a["disk_bytes"]["extract"] == sum(f.stat().st_size for f in extract.rglob("*") if f.is_file()) > 0
    for n in sizes:
        # All arms of one data size ran at once: each in a queue slot of its own.
        slots = [json.loads((work / "runs" / arms[f"{name}@{n}"]["run"] / "run.json").read_text())["queue"]["slot"] for name in LEVERS]
        assert sorted(slots) == list(range(len(LEVERS)))
        # The same prompts, more replies: twice the training rows (every reply kept: --loops keep).
        assert arms[f"replies-2@{n}"]["rows"] == 2 * arms[f"baseline@{n}"]["rows"]
        # The selection split chooses among ours; the test split's figure is only reported.
        candidates = [arms[f"{name}@{n}"] for name in LEVERS]
        assert arms[r["chosen_by_selection"][str(n)]]["selection_tau"]["3"] == max(a["selection_tau"]["3"] for a in candidates)
        assert r["chosen_by_selection"][str(n)] in {a["arm"] for a in candidates}
    # Selection and test prompts are disjoint, and the same for every data size.
    rows = [json.loads(line) for line in (work / "outputs/levers" / f"train-{sizes[1]}.jsonl").read_text().splitlines()]
    small = [json.loads(line) for line in (work / "outputs/levers" / f"train-{sizes[0]}.jsonl").read_text().splitlines()]
    held = [row["messages"] for row in rows if row["split"] != "train"]
    assert held == [row["messages"] for row in small if row["split"] != "train"]
    assert {row["split"] for row in rows} == {"train", "selection", "heldout"}

    # A second call with the same workdir reuses every arm and measurement: no new run, no new
    # training; the same figures, as the table.
    runs_before = sorted(p.name for p in (work / "runs").iterdir())
    again = study(work, levers, "--concurrent")
    assert again.returncode == 0, again.stderr[-4000:]
    assert sorted(p.name for p in (work / "runs").iterdir()) == runs_before
    assert "already trained" in again.stderr and "reusing" in again.stderr
    table = again.stdout.strip().splitlines()
    assert table[0].startswith("| arm (prompts) |") and len(table) == 2 + len(arms) + 1
    for line, a in zip(table[2:], r["arms"]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0].endswith(f"({a['data_prompts']})") and cells[1] == str(a["rows"])
        assert cells[4:6] == [f"{a['test_tau'][k]:.3f}" for k in ("3", "5")]
        assert cells[6].startswith(f"{a['selection_tau']['3']:.3f}") and cells[6].endswith("(chosen)") == (r["chosen_by_selection"][str(a["data_prompts"])] == a["arm"])

    # One GPU session trains a few arms: --arms runs a part (here reusing the runs above), --merge
    # puts the parts together as one study, its choice made again over all arms.
    parts = []
    for name, extra in (("a", ["--arms", "baseline"]), ("b", ["--arms", "replies-2", "--skip-speculators"])):
        part = study(work, levers, "--json", "--concurrent", *extra)
        assert part.returncode == 0, part.stderr[-4000:]
        assert sorted(p.name for p in (work / "runs").iterdir()) == runs_before  # every arm's run reused
        parts.append(tmp_path / f"part-{name}.json")
        parts[-1].write_text(part.stdout.strip().splitlines()[-1])
    assert {a["lever"] for a in json.loads(parts[0].read_text())["arms"]} == {"baseline", "speculators"}
    assert {a["lever"] for a in json.loads(parts[1].read_text())["arms"]} == {"replies-2"}
    merged = subprocess.run([sys.executable, str(REPO_ROOT / "bench/quality/run.py"), "--study", "levers", "--merge", str(parts[0]), "--merge", str(parts[1]), "--no-record", "--json"],
                            capture_output=True, text=True, env=offline_env(PYTHONPATH=str(REPO_ROOT)), timeout=120)
    assert merged.returncode == 0, merged.stderr[-4000:]
    m = json.loads(merged.stdout.strip().splitlines()[-1])
    assert {a["arm"] for a in m["arms"]} == set(arms) and m["data_sizes"] == sizes
    for n in sizes:
        candidates = [a for a in m["arms"] if a["data_prompts"] == n and a["lever"] != "speculators"]
        assert m["chosen_by_selection"][str(n)] == max(candidates, key=lambda a: a["selection_tau"]["3"])["arm"]
    # Parts of different studies, or an arm in two parts, are refused with one line.
    assert m["data_sha256"] == json.loads(parts[0].read_text())["data_sha256"] and len(m["data_sha256"]) == len(sizes)
    other = json.loads(parts[1].read_text())
    other["splits_sha256"] = "0" * 64  # another session's prompts: other selection and test rows
    (tmp_path / "other.json").write_text(json.dumps(other))
    for a, b, said in ((parts[0], tmp_path / "other.json", "differs from"), (parts[0], parts[0], "in more than one part")):
        refused = subprocess.run([sys.executable, str(REPO_ROOT / "bench/quality/run.py"), "--study", "levers", "--merge", str(a), "--merge", str(b), "--no-record"],
                                 capture_output=True, text=True, env=offline_env(PYTHONPATH=str(REPO_ROOT)), timeout=120)
        assert refused.returncode != 0 and said in refused.stderr, refused.stderr[-2000:]

    # The next session (a machine goes back with its disk): the replies regenerate made come back
    # (carried.py pack), the verifier is the same bytes made again (new mtimes), and the reference
    # trains alone there (--reference-only, where one session cannot train both): regenerate's
    # artifact is the carried one, reused by its key; prepare and extract run; none of our training.
    sys.path.insert(0, str(REPO_ROOT / "bench" / "quality"))
    import carried

    archive = tmp_path / "levers-regenerate.tgz"
    assert carried.pack(work, archive, "outputs/stdlib-verifier") == [archive]
    work2, n = tmp_path / "work2", sizes[0]
    (work2 / "outputs").mkdir(parents=True)
    shutil.copytree(work / "outputs/stdlib-verifier", work2 / "outputs/stdlib-verifier", copy_function=shutil.copy)
    shutil.copy(work / "outputs/chat.jsonl", work2 / "outputs/chat.jsonl")
    ref = study(work2, levers, "--json", "--concurrent", "--arms", "baseline", "--reference-only", "--data-size", str(n), "--carried", str(archive))
    assert ref.returncode == 0, ref.stderr[-4000:]
    rr = json.loads(ref.stdout.strip().splitlines()[-1])
    assert [a["arm"] for a in rr["arms"]] == [f"speculators@{n}"] and rr["arms"][0]["carried_regenerate"] is True
    (run2,) = (work2 / "runs").iterdir()
    record2 = json.loads((run2 / "run.json").read_text())
    first_run = RunArtifacts(json.loads((work / "runs" / arms[f"baseline@{n}"]["run"] / "run.json").read_text()), str(work))
    assert Path(RunArtifacts(record2, str(work2)).path("regenerate")).name == Path(first_run.path("regenerate")).name
    assert rr["arms"][0]["seconds"]["regenerate"] == arms[f"baseline@{n}"]["seconds"]["regenerate"]  # the carried record's own
    assert record2["stages"] == ["regenerate", "prepare", "extract"] and record2["artifacts"]["regenerate"]["made_by"] == arms[f"baseline@{n}"]["run"]
    assert not (work2 / "outputs/artifacts/train").exists()


def test_carried_replies_keep_their_key_on_a_verifier_imported_again_and_only_there(tmp_path):
    """bench/quality/carried.py: a session's regenerate artifacts and the next session's verifier,
    the same bytes imported again at another mtime. The store identifies a large file that is not
    safetensors by size and mtime; after restore the verifier's identity (the key's input) is
    the one the artifacts were made with. Only whole artifacts are restored, never over one of
    this store's own; a verifier whose content differs, or an archive that is not ours, restores nothing."""
    sys.path.insert(0, str(REPO_ROOT / "bench" / "quality"))
    import tarfile

    import carried

    from harness.host_helpers import artifact_store

    def make_session(work: Path, tokenizer: bytes) -> Path:
        verifier = work / "outputs/smollm2-verifier"
        (verifier / "real").mkdir(parents=True)
        (verifier / "config.json").write_text('{"hidden_size": 64}')
        (verifier / "tokenizer.json").write_bytes(tokenizer)  # over artifact_store.SMALL_FILE: identified by size and mtime
        (verifier / "real" / "extra.json").write_text("{}")
        (verifier / "linked").symlink_to("real")  # identify() follows links: so must the stamps
        return verifier

    def identity(work: Path) -> dict:
        return artifact_store.identify("outputs/smollm2-verifier", str(work), artifact_store.Digests(str(work)))

    def artifact(store: artifact_store.Store, key: str, seconds: float, record: bool = True) -> None:
        artifact_store.private_dirs(store.dir("regenerate", key))
        Path(store.dir("regenerate", key), "regenerated.jsonl").write_text(f'{{"seconds": {seconds}}}\n')
        if record:
            store.complete("regenerate", key, {"made_by": "20261207-000000-aaaaaa", "events": [{"event": "finished", "seconds": seconds}]})

    k1, k2, k3 = "1" * 20, "2" * 20, "3" * 20
    tokenizer = bytes(range(256)) * (3 << 12)  # 3 MiB
    first = tmp_path / "first"
    made_with = make_session(first, tokenizer)
    made_identity = identity(first)
    store = artifact_store.Store(str(first), carried.STORE)
    artifact(store, k1, 93.0)
    artifact(store, k2, 50.0)
    artifact(store, k3, 1.0, record=False)  # still being made: not carried
    archive = tmp_path / "back" / "levers-regenerate.tgz"
    archive.parent.mkdir()
    assert carried.pack(first, archive, "outputs/smollm2-verifier") == [archive]
    with tarfile.open(archive) as tar:
        assert {m.name.split("/")[1] for m in tar.getmembers() if m.name != carried.MANIFEST} == {k1, f"{k1}.json", k2, f"{k2}.json"}
    archive.unlink()  # a call's files that never came back: the next call writes them again
    assert carried.pack(first, archive, "outputs/smollm2-verifier") == [archive] and archive.is_file()

    # The next session: the same bytes, imported again later; k2 is being made here already.
    second = tmp_path / "second"
    again = make_session(second, tokenizer)
    os.utime(again / "tokenizer.json", ns=(made_with.stat().st_mtime_ns + 10**9,) * 2)
    os.utime(again / "real" / "extra.json", ns=(made_with.stat().st_mtime_ns + 10**9,) * 2)
    assert identity(second) != made_identity  # the key would differ: regenerate would run again
    here = artifact_store.Store(str(second), carried.STORE)
    artifact(here, k2, 7.0, record=False)
    assert carried.restore(second, again, archive) == [k1]
    assert identity(second) == made_identity
    assert here.record("regenerate", k1)["events"][0]["seconds"] == 93.0
    assert Path(here.dir("regenerate", k1), "regenerated.jsonl").read_text() == '{"seconds": 93.0}\n'
    assert Path(here.dir("regenerate", k2), "regenerated.jsonl").read_text() == '{"seconds": 7.0}\n' and here.record("regenerate", k2) is None
    assert [k for st, k in here.artifacts()] == [k1, k2]  # no scratch left behind
    assert carried.restore(second, again, archive) == []  # k1 is here now: kept

    # Another verifier: nothing restored, its files untouched.
    third = tmp_path / "third"
    other = make_session(third, tokenizer[:-1] + b"x")
    mtime = other.joinpath("tokenizer.json").stat().st_mtime_ns
    assert carried.restore(third, other, archive) == []
    assert other.joinpath("tokenizer.json").stat().st_mtime_ns == mtime and not (third / carried.STORE).exists()

    # Archives that are not ours restore nothing and touch nothing: a way out of the store, a
    # link, a key that is not a key; and one whose artifact has no record restores only the whole ones.
    def rewritten(name: str, extra=None, drop: str | None = None, manifest=None) -> Path:
        path = tmp_path / name
        with tarfile.open(archive) as src, tarfile.open(path, "w:gz") as dst:
            for m in src.getmembers():
                if m.name == drop:
                    continue
                data = src.extractfile(m).read() if m.isfile() else None
                if m.name == carried.MANIFEST and manifest:
                    data = json.dumps(manifest(json.loads(data))).encode()
                    m.size = len(data)
                dst.addfile(m, io.BytesIO(data) if data is not None else None)
            if extra:
                dst.addfile(*extra)
        return path

    evil = tarfile.TarInfo(f"regenerate/{k1}/../../../../escaped")
    evil.size = 1
    link = tarfile.TarInfo(f"regenerate/{k1}/passwd")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    for i, bad in enumerate([rewritten("evil.tgz", (evil, io.BytesIO(b"x"))), rewritten("link.tgz", (link,)),
                             rewritten("key.tgz", manifest=lambda m: {**m, "keys": [*m["keys"], "../../x"]})]):
        work = tmp_path / f"bad{i}"
        verifier = make_session(work, tokenizer)
        mtime = verifier.joinpath("tokenizer.json").stat().st_mtime_ns
        assert carried.restore(work, verifier, bad) == []
        assert not (work / carried.STORE).exists() and verifier.joinpath("tokenizer.json").stat().st_mtime_ns == mtime
    assert not (tmp_path / "escaped").exists()
    partial = tmp_path / "partial"
    assert carried.restore(partial, make_session(partial, tokenizer), rewritten("partial.tgz", drop=f"regenerate/{k2}.json")) == [k1]
    assert not Path(artifact_store.Store(str(partial), carried.STORE).dir("regenerate", k2)).exists()
