"""The images from the Dockerfile, built by hack/images.sh and run the way the pods run them: as uid 65532, with a
read-only root filesystem, no capabilities, no network, and only /tmp and HOME's cache writable (tmpfs, as the
rendered pod's emptyDirs). The trainer image trains the builtin tiny model on the CPU.

Runs as root where buildah and podman are installed or apt can install them; skipped with the reason elsewhere.
The first build downloads torch and its CUDA libraries (3 GB of wheels; 6 minutes on 2 cores); later runs reuse
hack/images.sh's caches and take seconds to build.

    pytest tests/images -m images -x
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.images

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "images.sh"
IMAGE_REPO = "localhost/finetune-operator"
TAG = "dev"
UID = 65532
TRAINER_CACHE = "/home/ftjob/.cache"
BUILD_TIMEOUT = 3600


def missing_prerequisite() -> str | None:
    """Why the images cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (debootstrap, buildah's chroot isolation and overlay mounts)"
    tools = [t for t in ("buildah", "podman", "debootstrap", "runc") if shutil.which(t) is None]
    if tools and shutil.which("apt-get") is None:
        return f"{', '.join(tools)} missing and no apt-get to install them"
    return None


@dataclass(frozen=True)
class Images:
    """The built images and the podman that sees hack/images.sh's store."""

    env: dict[str, str]

    def image(self, name: str) -> str:
        return f"{IMAGE_REPO}/{name}:{TAG}"

    def podman(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def inspect(self, name: str) -> dict[str, Any]:
        proc = self.podman("image", "inspect", self.image(name))
        assert proc.returncode == 0, proc.stderr
        result: dict[str, Any] = json.loads(proc.stdout)[0]
        return result

    def run(
        self, name: str, *argv: str, entrypoint: str | None = None, volumes: tuple[str, ...] = (), timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """Run like the rendered pod: uid 65532, read-only root, no capabilities or privilege escalation,
        no network, tmpfs where the pod has emptyDirs: writable by the user (U: podman chowns it; an emptyDir is
        world-writable) and not noexec, as an emptyDir (DeepSpeed loads the ops it compiles into the cache)."""
        container = f"ftjob-images-test-{uuid.uuid4().hex[:8]}"
        cmd = [
            "run", "--rm", "--name", container, "--user", f"{UID}:{UID}", "--read-only", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--network", "none", "--shm-size", "1g",
            "--tmpfs", "/tmp:rw,exec,mode=1777", "--tmpfs", f"{TRAINER_CACHE}:rw,exec,U",
        ]
        for volume in volumes:
            cmd += ["--volume", volume]
        if entrypoint is not None:
            cmd += ["--entrypoint", entrypoint]
        try:
            return self.podman(*cmd, self.image(name), *argv, timeout=timeout)
        finally:
            self.podman("rm", "--force", "--ignore", container, timeout=120)


@pytest.fixture(scope="module")
def images() -> Iterator[Images]:
    reason = missing_prerequisite()
    if reason:
        pytest.skip(f"images not built: {reason}")
    print("[images] hack/images.sh --no-load (the first build takes about 6 minutes)", file=sys.stderr, flush=True)
    build = subprocess.run(
        [str(SCRIPT), "--no-load", "operator", "trainer"], capture_output=True, text=True, timeout=BUILD_TIMEOUT
    )
    assert build.returncode == 0, f"hack/images.sh exited {build.returncode}\n{build.stderr[-8000:]}"
    exports = subprocess.run([str(SCRIPT), "--print-env"], capture_output=True, text=True, check=True).stdout
    env = dict(os.environ)
    for assignment in exports.split()[1:]:  # "export A=1 B=2"
        key, _, value = assignment.partition("=")
        env[key] = value
    yield Images(env)


def test_the_build_is_cached_by_content(images: Images) -> None:
    """A second run with unchanged inputs builds nothing: each image is reported up to date by its inputs hash."""
    again = subprocess.run([str(SCRIPT), "--no-load"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    for name in ("operator", "trainer"):
        label = images.inspect(name)["Labels"]["finetune.dev/inputs"]
        assert f"{images.image(name)} is up to date (inputs {label})" in again.stderr, again.stderr


def test_image_configs(images: Images) -> None:
    operator, trainer = images.inspect("operator")["Config"], images.inspect("trainer")["Config"]
    assert (operator["User"], operator["Entrypoint"], operator["Cmd"]) == (f"{UID}:{UID}", ["ftjob"], ["operator"])
    assert (trainer["User"], trainer["Entrypoint"]) == (f"{UID}:{UID}", ["/usr/bin/tini", "-g", "--"])
    env = dict(item.split("=", 1) for item in trainer["Env"])
    for var in ("HF_HOME", "FTJOB_CACHE", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME"):
        assert env[var].startswith(TRAINER_CACHE + "/") or env[var] == TRAINER_CACHE, (var, env[var])


def test_operator_runs_as_65532_with_a_read_only_root(images: Images) -> None:
    ids = images.run("operator", "-c", "import os; print(os.getuid(), os.getgid())", entrypoint="python")
    assert ids.returncode == 0 and ids.stdout.split() == [str(UID), str(UID)], ids.stderr
    crd = images.run("operator", "crd")
    assert crd.returncode == 0, crd.stderr
    body = yaml.safe_load(crd.stdout)
    assert body["kind"] == "CustomResourceDefinition"
    assert body["metadata"]["name"] == "finetunejobs.finetune.dev"


def test_trainer_stack_imports_as_65532_with_a_read_only_root(images: Images) -> None:
    code = (
        "import os, torch, transformers, peft, trl, accelerate, deepspeed, finetune_trainer; "
        "print(os.getuid(), torch.__version__, torch.version.cuda, transformers.__version__, deepspeed.__version__)"
    )
    proc = images.run("trainer", "python", "-c", code)
    assert proc.returncode == 0, proc.stderr[-4000:]
    uid, torch_version, cuda, transformers_version, _ = proc.stdout.split()[-5:]
    assert uid == str(UID)
    # One image for CPU and GPU nodes: PyPI's torch, built with CUDA, running here on the CPU.
    assert torch_version.split("+")[0] == "2.14.1" and cuda != "None", proc.stdout
    assert transformers_version == "5.24.0"


def test_trainer_image_trains_the_tiny_example_on_cpu(images: Images, tmp_path: Path) -> None:
    """`ftjob run` of the tiny CPU example (2 processes, DeepSpeed ZeRO-3 on CPU) for 4 steps inside the image;
    checkpoints and the adapter go to a mounted volume, as in a pod."""
    job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    job["spec"]["training"].update(maxSteps=4, loggingSteps=1, saveSteps=2)
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "tiny.yaml").write_text(yaml.safe_dump(job))
    out = tmp_path / "out"
    out.mkdir()
    os.chown(out, UID, UID)
    proc = images.run(
        "trainer", "ftjob", "run", "--fresh", "--workdir", "/checkpoints/run", "/job/tiny.yaml",
        volumes=(f"{tmp_path / 'job'}:/job:ro", f"{out}:/checkpoints"), timeout=1800,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    assert "step 4/4" in log and "loss by step: 1:" in log, log[-6000:]
    adapter = out / "run" / "checkpoints" / "adapter"
    assert (adapter / "adapter_model.safetensors").stat().st_size > 0, sorted(p.name for p in out.rglob("*"))
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8
    losses = [json.loads(line)["loss"] for line in (out / "run" / "checkpoints" / "metrics.jsonl").read_text()
              .splitlines() if "\"loss\"" in line]
    assert len(losses) >= 4 and all(loss > 0 for loss in losses), losses
