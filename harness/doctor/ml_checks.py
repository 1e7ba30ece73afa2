"""The ML checks of `harness doctor`: will the configured EAGLE-3 run work on this host?

Facts come from the host in few round trips: ONE probe (harness/host_helpers/ml_probe.py) run by the
stage interpreter through the host's runtime (inside the container: versions, GPUs visible,
a FlexAttention forward+backward, the verifier's config.json, the sample count), one `df` on
the host, and, where the stages run in an image, its tags looked up on the engine. Each check is
a pure verdict on those facts, the configuration and the runtime's words, so the verdicts are
unit-tested with a fake command runner.

`ml_checks(config, host)` returns the checks, sharing one gathering per doctor run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from harness import compat, helpers
from harness.config import Config, HostConfig
from harness.data_cost import seq_len_bound
from harness.doctor.base import Check, CheckResult, CommandRunner, describe
from harness.doctor.verifier_checks import verdict_quantization, verdict_remote_code
from harness.errors import HarnessError
from harness.host_helpers.wire import default_target_layers
from harness.pipeline import online_training, store_root
from harness.runtime.base import Runtime
from harness.runtime.image import built_container_hash, current_inputs, current_ref, image_id, image_ref
from harness.runtime.preflight import ImageNotBuilt, check_container, not_built
from harness.stages import SCRIPTS_DIR
from harness.transport.remote_shell import sh_expand_home

PROBE_MARKER = "@@harness-ml-probe@@ "
PROBE_TIMEOUT_S = 900.0  # torch import + a first Triton compile of flex attention
BF16_BYTES = 2
DEFAULT_TARGET_LAYERS = 3  # speculators' default [2, N//2, N-3]
GIB = 2**30
DISK_HEADROOM = 1.2  # checkpoints and logs share the disk with the hidden states

# The train stage's own flags (remote_scripts/train_draft.py parse_args; harness.pipeline turns
# [pipeline.stages.train] keys into flags: attn_impl -> --attn-impl). The choices mirror the
# script's, and `resolve_*` below mirror how it resolves "auto"; tests/test_doctor_ml.py checks
# both against the script itself, since the laptop side never imports remote_scripts/.
ATTN_KEY = "attn_impl"
LOSS_KEY = "loss_implementation"
ATTN_CHOICES = ("auto", "simple_flex_attention", "sdpa", "eager")
LOSS_CHOICES = ("auto", "eager", "fused")
FLEX_ATTN = "simple_flex_attention"  # the only one for which speculators' draft builds a flex BlockMask

# docker's words when the container cannot get a GPU (no NVIDIA runtime / toolkit)
GPU_RUNTIME_ERRORS = ("could not select device driver", "nvidia-container-cli", "unknown or invalid runtime name: nvidia", "libnvidia-ml")
NO_IMAGE_ERRORS = ("not built: harness build", "Unable to find image", "No such image", "pull access denied", "manifest unknown")


# ---------------------------------------------------------------------------------------------
# What the configured run needs (laptop side)


@dataclass(frozen=True)
class RunNeeds:
    verifier: str
    data: str
    prepared: str
    hidden_states: str
    max_seq_len: int
    target_layer_ids: list[int]
    train: dict[str, Any]
    trust_remote_code: bool = False
    extract_backend: str = "transformers"
    online: bool = False  # [pipeline.stages.train] online = true: states from a running vLLM, none stored

    @classmethod
    def from_config(cls, config: Config) -> "RunNeeds":
        p = config.pipeline
        # The hidden states go into the store (harness/artifacts.py): its free space is what matters;
        # which prepared data a run will read is known by its key on the host alone: the chat data is counted.
        return cls(
            p.verifier, p.data, "", f"{store_root(p)}/extract", p.max_seq_len, list(p.target_layer_ids), dict(p.stages.get("train", {})),
            trust_remote_code=p.trust_remote_code, extract_backend=str(p.stages.get("extract", {}).get("backend", "transformers")),
            online=online_training(p),
        )

    @property
    def saved_layers(self) -> int:
        """k + 1: the k target (auxiliary) layers plus the verifier's last hidden state."""
        return (len(self.target_layer_ids) or DEFAULT_TARGET_LAYERS) + 1

    @property
    def attention(self) -> str:
        """As configured: "auto" unless [pipeline.stages.train] sets attn_impl."""
        return str(self.train.get(ATTN_KEY, "auto"))

    @property
    def loss(self) -> str:
        """As configured: "auto" unless [pipeline.stages.train] sets loss_implementation."""
        return str(self.train.get(LOSS_KEY, "auto"))


def resolve_attention(setting: str, device_type: str) -> str:
    """What train_draft runs for --attn-impl SETTING (draft_attention.default_attn_impl for auto)."""
    if setting != "auto":
        return setting
    return "sdpa" if device_type == "cpu" else FLEX_ATTN


def resolve_loss(setting: str, device_type: str, torch_version: str) -> str:
    """What train_draft runs for --loss-implementation SETTING (its choose_loss_implementation
    for auto: eager on CPU, where there is no Triton, and on torch 2.11, where the fused loss
    crashes under torch.compile; fused otherwise)."""
    if setting != "auto":
        return setting
    if device_type == "cpu":
        return "eager"
    major_minor = ".".join(torch_version.split("+")[0].split(".")[:2])
    return "eager" if major_minor == "2.11" else "fused"


def hidden_state_bytes(samples: int, seq_len: int, layers: int, hidden: int) -> int:
    """samples x seq_len x (k+1) x hidden x 2 bytes (bf16): an upper bound, as samples shorter
    than max_seq_len store fewer tokens."""
    return samples * seq_len * layers * hidden * BF16_BYTES


# ---------------------------------------------------------------------------------------------
# Facts from the host


@dataclass
class ProbeOutcome:
    facts: dict[str, Any] | None  # None when the probe did not answer
    exit_code: int = 0
    error: str = ""  # stderr's last lines when it did not answer


@dataclass(frozen=True)
class FreeSpace:
    path: str  # as configured
    existing: str  # the nearest existing directory that df measured
    free_bytes: int


# df of each path (relative to the workdir unless absolute) at its nearest existing parent.
_DF_SCRIPT = rf'''
w=$1; shift
{sh_expand_home("w")}
for p in "$@"; do
  d=$p; {sh_expand_home("d")}
  case $d in /*) ;; *) d=$w/$d;; esac
  while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done
  printf '%s\t%s\t%s\n' "$p" "$d" "$(df -Pk -- "$d" | tail -n 1)"
done
'''


def free_space(runner: CommandRunner, workdir: str, paths: list[str]) -> dict[str, FreeSpace]:
    r = runner.run(["sh", "-c", _DF_SCRIPT, "sh", workdir, *paths])
    out: dict[str, FreeSpace] = {}
    for line in r.stdout.decode("utf-8", "replace").splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        fields = parts[2].split()
        try:
            out[parts[0]] = FreeSpace(parts[0], parts[1], int(fields[3]) * 1024)
        except (IndexError, ValueError):
            continue
    return out


def private_network_source(config: Config) -> str | None:
    """The project's remote_scripts/common/private_network.py (what its stages run), for the probe
    to ask its --check where the stages run; None when the project has none."""
    try:
        return (config.root / SCRIPTS_DIR / "common" / "private_network.py").read_text()
    except OSError:
        return None


def parse_probe(stdout: bytes) -> dict[str, Any] | None:
    for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
        if line.startswith(PROBE_MARKER):
            return json.loads(line[len(PROBE_MARKER):])
    return None


def _tail(data: bytes, lines: int = 3) -> str:
    text = [line.strip() for line in data.decode("utf-8", "replace").strip().splitlines() if line.strip()]
    return " | ".join(text[-lines:])


class MLDoctor:
    """Gathers the host's facts once (lazily, on first use by a check) for all ML checks."""

    def __init__(self, config: Config, host: HostConfig, runtime: Runtime, image_ref_factory: Callable | None = None):
        self.config = config
        self.host = host
        self.runtime = runtime  # the stage environment, on the connection the checks run through
        self.plan = RunNeeds.from_config(config)
        self._image_ref_factory = image_ref_factory
        self._probe: ProbeOutcome | None = None
        self._container: CheckResult | None = None
        self._space: dict[str, FreeSpace] | None = None
        self._inputs = None  # the build inputs, gathered once (the CA bundle is read from the host)

    def container(self, runner) -> CheckResult:
        """An image runtime: the image is built and a throwaway container starts with the configured
        options (ulimits, shm, mounts; harness.runtime.preflight), before the probe or any stage."""
        if self._container is None:
            self._container = verdict_container(self.runtime, runner)
        return self._container

    def probe(self, runner: CommandRunner) -> ProbeOutcome:
        if self._probe is None:
            runtime = self.runtime
            if runtime.uses_image and self.container(runner).status == "fail":
                # no image or an engine that refuses the options: the probe would fail the same
                # way (or, without --pull=never, try a registry): say why once
                self._probe = ProbeOutcome(None, 125, self.container(runner).message)
                return self._probe
            request = {"verifier": self.plan.verifier, "prepared": self.plan.prepared, "data": self.plan.data, "flex": True,
                       "private_network": private_network_source(self.config)}
            # a helper call like every other (the runner doctor's checks take is the host's transport)
            r = helpers.call(runner, "ml_probe.py", request, where=runtime, env=runtime.host.env_values(), timeout=PROBE_TIMEOUT_S)
            facts = parse_probe(r.stdout)
            self._probe = ProbeOutcome(facts, r.exit_code, "" if facts else (_tail(r.stderr) or _tail(r.stdout) or "no output"))
        return self._probe

    def space(self, runner: CommandRunner) -> dict[str, FreeSpace]:
        if self._space is None:
            paths = [self.plan.hidden_states] + ([self.host.data_dir] if self.host.data_dir else [])
            self._space = free_space(runner, self.host.workdir, paths)
        return self._space

    def container_hash(self, runner: CommandRunner) -> str | None:
        """BuildInputs.container_hash of the current container/ (None with injected refs)."""
        if self._image_ref_factory is not None:
            return None
        return self.build_inputs(runner).container_hash

    def build_inputs(self, runner: CommandRunner):
        """What `harness build` would send now, as it computes it (once per doctor)."""
        if self._inputs is None:
            self._inputs = current_inputs(runner, self.config, self.host)
        return self._inputs

    def image_refs(self, runner: CommandRunner) -> tuple[str, str]:
        """(the tag of the image for the current container/, the tag stages run)."""
        if self._image_ref_factory is not None:
            return self._image_ref_factory(self.config, self.host)
        return image_ref(self.host.container, self.build_inputs(runner).content_hash), current_ref(self.host.container)

    # -- the checks -------------------------------------------------------------------------

    @classmethod
    def catalogue(cls) -> list[Check]:
        """The checks, in order, for their names (`harness doctor --help`): checks() only defines
        them, so no config or host is needed to list them."""
        return cls.__new__(cls).checks()

    def checks(self) -> list[Check]:
        @describe("hidden-state-disk", "room for extract's hidden states")
        def check_hidden_state_disk(runner, host):
            return verdict_hidden_state_disk(self.plan, self.probe(runner), self.space(runner), host)

        @describe("stage-gpus", "GPUs visible where the stages run, usable by torch")
        def check_gpus_in_stage_env(runner, host):
            return verdict_gpus_in_stage_env(self.probe(runner), self.runtime)

        @describe("image", "the image for the current container/ is built on the host")
        def check_image_current(runner, host):
            if not self.runtime.uses_image:
                return CheckResult("image", "ok", f'no image: runtime = "{host.runtime}"')
            try:
                current, latest = self.image_refs(runner)
            except Exception as e:  # no container/ next to harness.toml, unreadable files
                return CheckResult("image", "warn", f"cannot compute the image tag here: {e}", "run doctor from the project (next to container/)")
            # strict=False: no engine reads as no image here (the docker check says which)
            current_id, latest_id = image_id(runner, current, strict=False), image_id(runner, latest, strict=False)
            scripts_only = None
            if current_id is None and latest_id is not None:
                built = built_container_hash(runner, latest)
                scripts_only = built is not None and built == self.container_hash(runner)
            return verdict_image(current, current_id, latest, latest_id, host, scripts_only)

        @describe("container", "a container starts with the configured options")
        def check_container_starts(runner, host):
            if not self.runtime.uses_image:
                return CheckResult("container", "ok", f'no container: runtime = "{host.runtime}"')
            return self.container(runner)

        @describe("versions", "torch, transformers, speculators, vllm against the tested matrix")
        def check_library_versions(runner, host):
            return verdict_library_versions(self.probe(runner), self.runtime)

        @describe("flex-attention", "flex_attention compiles on the GPU")
        def check_flex_attention(runner, host):
            return verdict_flex_attention(self.probe(runner))

        @describe("verifier", "the verifier's config loads")
        def check_verifier_config(runner, host):
            return verdict_verifier_config(self.plan, self.probe(runner))

        @describe("verifier-dtype", "the verifier's dtype")
        def check_verifier_dtype(runner, host):
            return verdict_verifier_dtype(self.probe(runner))

        @describe("verifier-code", "the verifier's own code vs trust_remote_code")
        def check_verifier_code(runner, host):
            probe = self.probe(runner)
            return _not_probed("verifier-code", probe) if probe.facts is None else verdict_remote_code(probe.facts["verifier"], self.plan.trust_remote_code)

        @describe("verifier-quantization", "its quantization vs the extraction backend")
        def check_verifier_quantization(runner, host):
            probe = self.probe(runner)
            return _not_probed("verifier-quantization", probe) if probe.facts is None else verdict_quantization(probe.facts["verifier"], self.plan.extract_backend)

        @describe("target-layers", "the layers the draft reads exist")
        def check_target_layers(runner, host):
            return verdict_target_layers(self.plan, self.probe(runner))

        @describe("vllm-network", "vLLM's workers' listeners reach no one else on the box")
        def check_vllm_network(runner, host):
            return verdict_vllm_network(self.probe(runner), self.runtime)

        @describe("train-settings", "the train settings fit the data and GPUs")
        def check_train_settings(runner, host):
            return verdict_train_settings(self.plan, self.probe(runner))

        return [
            check_image_current, check_container_starts, check_gpus_in_stage_env, check_library_versions, check_flex_attention,
            check_verifier_config, check_verifier_dtype, check_verifier_code, check_verifier_quantization, check_target_layers,
            check_hidden_state_disk,
            check_train_settings, check_vllm_network,
        ]


def ml_checks(config: Config, host: HostConfig, runtime: Runtime) -> list[Check]:
    """The ML check group for one host (registered in harness.doctor)."""
    return MLDoctor(config, host, runtime).checks()


ml_checks.catalogue = MLDoctor.catalogue  # the checks it makes, without a config: their names (doctor --help)


# ---------------------------------------------------------------------------------------------
# Verdicts (pure)


def _not_probed(name: str, probe: ProbeOutcome) -> CheckResult:
    return CheckResult(name, "warn", f"not checked: the stage interpreter did not answer (exit {probe.exit_code}): {probe.error}", "fix the stage-gpus/image check above, then re-run doctor")


def verdict_gpus_in_stage_env(probe: ProbeOutcome, runtime: Runtime) -> CheckResult:
    """A GPU visible where the stages run (inside the container: the NVIDIA runtime works),
    how many, the driver, and whether torch can use them."""
    name = "stage-gpus"
    host, where = runtime.host, runtime.where
    if probe.facts is None:
        if any(e in probe.error for e in GPU_RUNTIME_ERRORS):
            return CheckResult(name, "fail", f"a container cannot get a GPU: {probe.error}", "install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure --runtime=docker && systemctl restart docker`")
        if any(e in probe.error for e in NO_IMAGE_ERRORS):
            return CheckResult(name, "fail", f"the image is not on the host: {probe.error}", f"harness build {host.name}")
        if "container.ulimits" in probe.error:
            return CheckResult(name, "fail", f"no container starts: {probe.error}", "see the container check")
        return CheckResult(name, "fail", f"the stage interpreter did not start (exit {probe.exit_code}): {probe.error}", f"try it by hand: harness exec {host.name} python3 -c 'print(1)'")
    if runtime.configured_gpu_count() == 0:
        return CheckResult(name, "warn", "no GPUs requested (container.gpus = \"none\"): the stages run on the CPU", 'set container.gpus = "all" for real runs')
    smi, torch = probe.facts["nvidia_smi"], probe.facts["torch"]
    gpus = smi.get("gpus") or []
    if not gpus:
        status, note = runtime.no_gpu_verdict(bool(smi.get("found")))
        why = (smi.get("error") or "no GPU listed") + note
        return CheckResult(name, status, f"no GPU visible {where}: {why}", "install the NVIDIA driver (and the NVIDIA Container Toolkit for docker), then re-run doctor")
    names = sorted({g[0] for g in gpus})
    driver = gpus[0][1] if len(gpus[0]) > 1 else "?"
    message = f"{len(gpus)} GPU(s) visible {where}: {', '.join(names)} (driver {driver})"
    if "import_error" in torch:
        return CheckResult(name, "warn", message + "; torch does not import", "see the library-versions check")
    if not torch.get("cuda_available"):
        cpu_build = "+cpu" in (torch.get("version") or "") or not torch.get("cuda_version")
        why = "torch is a CPU-only build" if cpu_build else f"torch (CUDA {torch.get('cuda_version')}) cannot use them: {torch.get('cuda_error', 'driver too old for this CUDA?')}"
        return CheckResult(name, "fail", f"{message}, but {why}", "install a CUDA build of torch matching the driver (the image's base pins it)")
    if len(torch.get("devices") or []) != len(gpus):
        return CheckResult(name, "warn", f"{message}, but torch sees {len(torch['devices'])}", "check CUDA_VISIBLE_DEVICES in the stage environment")
    caps = sorted({"sm_%d%d" % tuple(d["capability"]) for d in torch["devices"]})
    return CheckResult(name, "ok", f"{message}; torch {torch.get('version')} (CUDA {torch.get('cuda_version')}) uses them ({', '.join(caps)})")


def verdict_container(runtime, runner) -> CheckResult:
    name = "container"
    try:
        facts = check_container(runner, runtime)
    except ImageNotBuilt as e:
        return CheckResult(name, "fail", e.message, f"harness build {runtime.host.name}")
    except HarnessError as e:  # an engine that refuses the ulimits (or another start failure)
        return CheckResult(name, "fail", e.message, e.hint or "run the container by hand: harness exec " + runtime.host.name + " true")
    limits = ", ".join(f"{k}={v}" for k, v in runtime.ulimits().items())
    held = ", ".join(f"{k} {v or 'absent'}" for k, v in facts.versions.items()) if facts.versions else "no versions recorded at build time"
    return CheckResult(name, "ok", f"{facts.ref} starts with the configured options (ulimits {limits}); image holds {held}")


def verdict_image(current_ref: str, current_id: str | None, latest_ref: str, latest_id: str | None, host: HostConfig,
                  scripts_only: bool | None = None) -> CheckResult:
    """scripts_only: the last build differs from the current files in remote_scripts/ alone."""
    if current_id is None and scripts_only:
        return CheckResult("image", "ok", f"{latest_ref} built from the current container/; remote_scripts/ changed since, "
                           "and runs use the synced copy (a rebuild only refreshes the image's own)")
    if current_id is None:
        return CheckResult("image", "fail", f"{not_built(current_ref, host.name)} (the image for the current container/ and remote_scripts/)", f"harness build {host.name}")
    if latest_id != current_id:
        return CheckResult("image", "warn", f"{latest_ref} is not the current build {current_ref}: stages would run an older image", f"harness build {host.name} (re-tags, nothing rebuilds)")
    return CheckResult("image", "ok", f"{current_ref} built and current ({current_id[:19]})")


def verdict_library_versions(probe: ProbeOutcome, runtime: Runtime) -> CheckResult:
    name = "versions"
    if probe.facts is None:
        return _not_probed(name, probe)
    installed: dict[str, str | None] = probe.facts["versions"]
    shown = ", ".join(f"{p}=={installed.get(p)}" for p in (*compat.REQUIRED, *compat.OPTIONAL) if installed.get(p))
    fix_build = runtime.install_fix()
    missing = [p for p in compat.REQUIRED if not installed.get(p)]
    if missing:
        return CheckResult(name, "fail", f"not installed: {', '.join(missing)}" + (f" (found {shown})" if shown else ""), fix_build)
    torch = probe.facts.get("torch") or {}
    if "import_error" in torch:
        return CheckResult(name, "fail", f"torch {installed['torch']} is installed but does not import: {torch['import_error']}", fix_build)
    try:
        broken = compat.violations(installed)
    except ValueError as e:
        return CheckResult(name, "warn", f"cannot compare versions ({e}): {shown}", "check the versions by hand against harness/compat.py")
    if broken:
        return CheckResult(name, "fail", "; ".join(str(v) for v in broken), fix_build)
    unvetted = [f"{p} {installed[p]}" for p in ("speculators", "vllm") if installed.get(p) and compat.vetted(p) and installed[p] not in compat.vetted(p)]
    if unvetted:
        return CheckResult(name, "warn", f"{shown}; not in the compatibility matrix: {', '.join(unvetted)}", "vet them and add rows to harness/compat.py, or pin the vetted versions")
    return CheckResult(name, "ok", shown + ("" if installed.get("vllm") else " (no vllm: the transformers extraction backend only)"))


def verdict_vllm_network(probe: ProbeOutcome, runtime: Runtime) -> CheckResult:
    """Whether the vLLM a stage starts gets a network namespace of its own (docs/security.md): its
    workers' listeners (torch's store, gloo's pairs) have no key. In a container on docker's bridge
    the container's network is its own already; on the host runtime a refusal puts them on the
    box's loopback."""
    name = "vllm-network"
    if probe.facts is None:
        return _not_probed(name, probe)
    fact = probe.facts.get("private_network")
    if fact is None:
        return CheckResult(name, "warn", f"not checked: no {SCRIPTS_DIR}/common/private_network.py in this project", "run doctor from the project")
    if fact["allowed"]:
        return CheckResult(name, "ok", "vLLM's workers get a network namespace of their own: their listeners (no key) reach no one else")
    if runtime.uses_image:
        return CheckResult(name, "ok", f"vLLM's workers listen in the container's own network ({fact['reason']}); "
                                       "a group's stages on the host network share the box's")
    return CheckResult(name, "warn", f"vLLM's workers would listen on the box's loopback, where every local user reaches them (no key): {fact['reason']}",
                       'runtime = "docker", or allow unprivileged user namespaces (Ubuntu: sysctl kernel.apparmor_restrict_unprivileged_userns=0)')


def verdict_flex_attention(probe: ProbeOutcome) -> CheckResult:
    name = "flex-attention"
    if probe.facts is None:
        return _not_probed(name, probe)
    flex, torch = probe.facts["flex"], probe.facts["torch"]
    if flex["status"] == "skipped":
        return CheckResult(name, "warn", f"not tested: {flex.get('reason')}", "see the library-versions check")
    device = (torch.get("devices") or [{}])[0]
    smem = device.get("smem_per_block_optin")
    gpu = f"{device.get('name')} sm_{''.join(map(str, device.get('capability', [])))}" if device else "CPU"
    smem_text = f", {smem // 1024} KiB shared memory per block" if smem else ""
    if flex.get("device") == "cpu":
        return CheckResult(name, "warn", f"no CUDA GPU: {flex.get('error') or 'FlexAttention backward is unsupported on CPU'}", 'CPU hosts run only the demo, with pipeline.stages.train.attn_impl = "sdpa"')
    if flex["status"] == "ok":
        return CheckResult(name, "ok", f"torch.compile(flex_attention) forward+backward with a BlockMask runs on {gpu} (head_dim {flex.get('head_dim')}{smem_text}, {flex.get('elapsed_s')} s)")
    need = f" (needs {flex['smem_required'] // 1024} KiB shared memory per block, the GPU has {flex['smem_limit'] // 1024} KiB)" if flex.get("smem_required") else ""
    small = flex.get("small_tiles")
    if small and small.get("status") == "ok":
        tiles = ", ".join(f"{k}={v}" for k, v in small["kernel_options"].items())
        return CheckResult(name, "warn", f"the default flex tiles do not fit {gpu}{need}; smaller tiles work", f"train with flex kernel_options {{{tiles}}} (or pipeline.stages.train.attn_impl = \"sdpa\")")
    return CheckResult(name, "fail", f"flex_attention does not compile on {gpu}{need}: {flex.get('error')}", 'set pipeline.stages.train.attn_impl = "sdpa", or use a torch/triton that supports this GPU')


def verdict_verifier_config(plan: RunNeeds, probe: ProbeOutcome) -> CheckResult:
    name = "verifier"
    if probe.facts is None:
        return _not_probed(name, probe)
    v = probe.facts["verifier"]
    if not v.get("found"):
        return CheckResult(name, "warn", f"{v.get('error')} (on the host, relative to the workdir)", f"check pipeline.verifier = {plan.verifier!r} (a model directory, or a hub id already in the Hugging Face cache); the demo builds it with the verifier stage")
    missing = [k for k in ("num_hidden_layers", "hidden_size") if not v.get(k)]
    where = f"nested text_config (model_type {v.get('model_type')} -> {v.get('text_model_type')})" if v.get("nested_text_config") else f"model_type {v.get('model_type')}"
    if missing:
        return CheckResult(name, "fail", f"{plan.verifier}: {where} has no {', '.join(missing)}", "point pipeline.verifier at the language model's config (for multimodal models, its text_config must hold these)")
    return CheckResult(name, "ok", f"{plan.verifier}: {where}, {v['num_hidden_layers']} layers, hidden {v['hidden_size']}")


def verdict_verifier_dtype(probe: ProbeOutcome) -> CheckResult:
    name = "verifier-dtype"
    if probe.facts is None:
        return _not_probed(name, probe)
    v = probe.facts["verifier"]
    if not v.get("found"):
        return CheckResult(name, "warn", "not checked: no verifier config", "see the verifier check")
    dtype = str(v.get("dtype") or "").replace("torch.", "")
    if dtype == "bfloat16":
        return CheckResult(name, "ok", "bfloat16, as the hidden states are stored")
    if not dtype:
        return CheckResult(name, "warn", "the config names no dtype: the verifier may load in float32 (twice the memory)", "set \"dtype\": \"bfloat16\" in the verifier's config.json")
    if dtype == "float16":
        return CheckResult(name, "warn", "float16 verifier; hidden states are stored as bfloat16, which keeps fewer mantissa bits", "extract in bfloat16 if the model was trained in it, or check the draft's acceptance")
    return CheckResult(name, "warn", f"{dtype} verifier; hidden states are stored as bfloat16 (2 bytes): extraction casts them", "load the verifier in bfloat16 to halve its memory")


def verdict_target_layers(plan: RunNeeds, probe: ProbeOutcome) -> CheckResult:
    name = "target-layers"
    if probe.facts is None:
        return _not_probed(name, probe)
    v = probe.facts["verifier"]
    n = v.get("num_hidden_layers")
    if not v.get("found") or not n:
        return CheckResult(name, "warn", "not checked: no layer count from the verifier config", "see the verifier check")
    explicit = bool(plan.target_layer_ids)
    ids = plan.target_layer_ids if explicit else default_target_layers(n)
    source = "pipeline.target_layer_ids" if explicit else "speculators' default [2, N//2, N-3]"
    if min(ids) < 0 or max(ids) > n or len(set(ids)) != len(ids):
        fix = "set pipeline.target_layer_ids to distinct layers in [0, %d)" % n
        if not explicit:
            fix = f"the default needs N >= 7 layers: {fix}"
        return CheckResult(name, "fail", f"{source} = {ids} is invalid for a verifier with N = {n} layers (distinct ids in [0, {n}] needed)", fix)
    if n in ids:
        return CheckResult(name, "warn", f"{source} = {ids} includes {n}, the final hidden state, which is already saved as the last layer", f"use ids < {n}")
    return CheckResult(name, "ok", f"{source} = {ids} (N = {n})")


def verdict_hidden_state_disk(plan: RunNeeds, probe: ProbeOutcome, space: dict[str, FreeSpace], host: HostConfig) -> CheckResult:
    name = "hidden-state-disk"
    target = space.get(plan.hidden_states)
    if target is None:
        return CheckResult(name, "warn", f"cannot measure free space for {plan.hidden_states} under {host.workdir}", "check that df works on the host")
    free = f"{target.free_bytes / GIB:.1f} GiB free at {target.existing}"
    data = space.get(host.data_dir) if host.data_dir else None
    if probe.facts is None:
        return CheckResult(name, "warn", f"{free}; the need is unknown: the stage interpreter did not answer", "fix the stage-gpus/image check above, then re-run doctor")
    samples, hidden = probe.facts["samples"], probe.facts["verifier"].get("hidden_size")
    if samples.get("count") is None or not hidden:
        why = samples.get("source") if samples.get("count") is None else "no hidden_size in the verifier config"
        return CheckResult(name, "warn", f"{free}; cannot size the hidden states yet: {why}", "run the prepare stage (and make the verifier available), then re-run doctor")
    seq_len = seq_len_bound(plan.max_seq_len)  # max_seq_len = 0 (sized to the data): its ceiling
    need = hidden_state_bytes(samples["count"], seq_len, plan.saved_layers, hidden)
    formula = f"{samples['count']} samples x {seq_len} tokens x {plan.saved_layers} layers x {hidden} x 2 B = {_size(need)} at most"
    if plan.online:
        per_row = hidden_state_bytes(1, seq_len, plan.saved_layers, hidden)
        return CheckResult(name, "ok", f"training online: no hidden states stored (offline they would need {formula}); at most one row's, "
                                       f"{_size(per_row)}, per dataloader process at once (train's summary reports the peak); {free}")
    message = f"hidden states need {formula}; {free}"
    elsewhere = f" (data_dir {host.data_dir} has {data.free_bytes / GIB:.1f} GiB free)" if data and data.free_bytes > target.free_bytes else ""
    fix = f"free space, or set pipeline.output_dir to a larger disk{elsewhere}, or train online: [pipeline.stages.train] online = true (states from a running vLLM, none stored)"
    if target.free_bytes < need:
        return CheckResult(name, "fail", message, fix)
    if target.free_bytes < need * DISK_HEADROOM:
        return CheckResult(name, "warn", message + "; little room left for checkpoints", fix)
    return CheckResult(name, "ok", message)


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 10 else f"{n / 2**20:.2f} MiB"


def verdict_train_settings(plan: RunNeeds, probe: ProbeOutcome) -> CheckResult:
    """The train stage's attention and loss implementations, as train_draft.py will RESOLVE them
    on this host ("auto" included), against the combinations known to fail."""
    name = "train-settings"
    attn_setting, loss_setting = plan.attention, plan.loss
    if attn_setting not in ATTN_CHOICES:
        return CheckResult(name, "fail", f"unknown attention implementation {ATTN_KEY} = {attn_setting!r} (train_draft.py would refuse it)", f"use one of: {', '.join(ATTN_CHOICES)}")
    if loss_setting not in LOSS_CHOICES:
        return CheckResult(name, "fail", f"unknown loss implementation {LOSS_KEY} = {loss_setting!r} (train_draft.py would refuse it)", f"use one of: {', '.join(LOSS_CHOICES)}")
    if probe.facts is None:
        return CheckResult(name, "warn", f"attention {attn_setting}, loss {loss_setting}; not resolved against the host: the stage interpreter did not answer", "fix the stage-gpus/image check above, then re-run doctor")
    torch = probe.facts.get("torch") or {}
    device = "cuda" if torch.get("cuda_available") else "cpu"
    torch_version = str(probe.facts["versions"].get("torch") or torch.get("version") or "")
    attn = resolve_attention(attn_setting, device)
    loss = resolve_loss(loss_setting, device, torch_version)

    def shown(resolved: str, setting: str) -> str:
        return f"{resolved} (auto)" if setting == "auto" else resolved

    setting = f"attention {shown(attn, attn_setting)}, loss {shown(loss, loss_setting)} on {'CUDA' if device == 'cuda' else 'CPU'}"
    if device == "cpu":
        if attn == FLEX_ATTN:
            return CheckResult(name, "fail", f"{setting}: no CUDA GPU, and FlexAttention has no backward on CPU", f'set pipeline.stages.train.{ATTN_KEY} = "sdpa" (or "auto") on CPU hosts')
        if loss == "fused":
            return CheckResult(name, "fail", f"{setting}: the fused loss is a Triton kernel, and there is no Triton on CPU", f'set pipeline.stages.train.{LOSS_KEY} = "eager" (or "auto")')
        return CheckResult(name, "ok", setting)
    # On CUDA speculators compiles the draft's forward (torch.compile), which is where the fused
    # loss breaks on some torch versions.
    if loss == "fused" and torch_version:
        for bad in compat.KNOWN_BAD:
            if bad.package == "torch" and bad.setting == "fused loss under torch.compile" and compat.matches(torch_version, bad.spec):
                return CheckResult(name, "fail", f"{setting}, torch {torch_version}: {bad.problem}", bad.fix)
    flex = probe.facts.get("flex") or {}
    flex_works = flex.get("status") == "ok" or (flex.get("small_tiles") or {}).get("status") == "ok"  # train_draft picks the small tiles itself
    if attn == FLEX_ATTN and flex.get("status") == "failed" and not flex_works:
        return CheckResult(name, "fail", f"{setting}: flex_attention does not compile on this GPU (see the flex-attention check)", f'set pipeline.stages.train.{ATTN_KEY} = "sdpa"')
    if attn != FLEX_ATTN and flex_works:
        # speculators' draft builds a dense [T, T x steps] mask for sdpa/eager (a flex BlockMask
        # only for simple_flex_attention): it trains, at quadratic memory in total_seq_len.
        return CheckResult(name, "warn", f"{setting}: a dense attention mask on a GPU where flex attention works (memory grows with total_seq_len squared)", f'set pipeline.stages.train.{ATTN_KEY} = "auto" (simple_flex_attention here)')
    return CheckResult(name, "ok", setting)
