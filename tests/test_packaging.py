"""A non-editable wheel install works: configs/ and the tokenizer corpus ship as package data, and the
light core (numpy, pydantic, pyyaml, httpx) is enough for the interface, the registry, the rule rewards and
the remote client."""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".venv", ".git", "build", "dist", "runs", "outputs", "__pycache__", ".pytest_cache", ".ruff_cache"}


def source_files() -> list[Path]:
    """What a clean clone plus local additions holds: tracked and untracked-but-not-ignored files."""
    try:
        listed = (
            subprocess.run(
                ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                cwd=REPO,
                capture_output=True,
                check=True,
            )
            .stdout.decode()
            .split("\0")
        )
        present = [name for name in listed if name and ((REPO / name).is_symlink() or (REPO / name).is_file())]
        return sorted({Path(name) for name in present})
    except (OSError, subprocess.CalledProcessError):
        files = []
        for root, dirs, names in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
            files += [Path(root, name).relative_to(REPO) for name in names]
        return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build the wheel from a copy of the source tree (symlinks kept), so the checkout stays untouched."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    for relative in source_files():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / relative, source / relative, follow_symlinks=False)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(work / "dist"),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel_path,) = (work / "dist").glob("vlm_rewards-*.whl")
    return wheel_path


def test_wheel_ships_every_config_and_the_corpus(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder, shipped_as in (("configs", "configs"), ("data/corpus", "corpus")):
        files = [path for path in (REPO / folder).rglob("*") if path.is_file() and "__pycache__" not in path.parts]
        assert files, folder
        for path in files:
            relative = path.relative_to(REPO / folder).as_posix()
            assert f"vlm_rewards/_shipped/{shipped_as}/{relative}" in names, f"{folder}/{relative} is not in the wheel"


def test_wheel_metadata_has_a_light_core_and_pinned_transformers(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (metadata_name,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
    requires = metadata.get_all("Requires-Dist")
    core = sorted(re.match(r"[A-Za-z0-9_.-]+", req).group().lower() for req in requires if "extra ==" not in req)
    assert core == ["httpx", "numpy", "pydantic", "pyyaml"]
    assert any(req.startswith("transformers") and "<5.24" in req for req in requires), requires
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"models", "training", "robotics", "generation", "annotation", "serve", "cli", "dev", "all"} <= extras
    assert metadata["License-Expression"] == "Apache-2.0"


CORE_CHECK = textwrap.dedent(
    """
    import importlib.util, sys
    import numpy as np
    import vlm_rewards
    from vlm_rewards import RewardRequest, build_reward
    from vlm_rewards.registry import REWARDS_DIR
    from vlm_rewards.resources import corpus_file, shipped_configs

    assert "site-packages" in vlm_rewards.__file__, vlm_rewards.__file__
    assert importlib.util.find_spec("torch") is None, "torch must not be installed by the core"
    names = sorted(path.stem for path in REWARDS_DIR.glob("*.yaml"))
    assert {"goal_pixel_progress", "motion_penalty", "demo_composite"} <= set(names), names
    assert (REWARDS_DIR / "motion_penalty.yaml").is_file()
    assert (shipped_configs() / "demo.yaml").is_file()

    frames = np.zeros((4, 16, 16, 3), np.uint8)
    frames[-1] = 255
    goal = np.full((1, 16, 16, 3), 255, np.uint8)
    request = RewardRequest(frames, "move the red circle to the top left", reference=goal)
    progress = build_reward("goal_pixel_progress").score([request])[0].reward
    motion = build_reward("motion_penalty").score([request])[0].reward
    assert np.isfinite(progress) and np.isfinite(motion) and motion < 0, (progress, motion)

    from vlm_rewards.serving.client import RemoteReward  # the remote client works with the core alone
    assert RemoteReward.__name__ == "RemoteReward"

    corpus = corpus_file().read_text(encoding="utf-8").splitlines()
    assert len([line for line in corpus if line.strip()]) > 50
    assert not any(name in sys.modules for name in ("torch", "transformers", "typer", "rich")), sorted(sys.modules)
    print("core install ok:", len(names), "reward configs")
    """
)


def test_wheel_installs_and_works_with_only_the_light_core(wheel, tmp_path):
    environment = tmp_path / "venv"
    try:
        venv.create(environment, with_pip=False, symlinks=os.name != "nt")
    except Exception as error:  # any failure to make a venv means this machine cannot run the test
        pytest.skip(f"cannot create a virtual environment here: {error}")
    python = environment / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    # This interpreter's pip installs into the new environment (pip --python): no pip bootstrap needed.
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr

    checked = subprocess.run([str(python), "-c", CORE_CHECK], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "core install ok" in checked.stdout

    vlmr = environment / ("Scripts/vlmr.exe" if os.name == "nt" else "bin/vlmr")
    cli = subprocess.run([str(vlmr), "--help"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert cli.returncode == 3, cli.stdout + cli.stderr
    assert "pip install 'vlm-rewards[cli]'" in cli.stderr
