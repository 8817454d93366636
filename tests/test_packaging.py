"""A regular (non-editable) wheel works outside the source tree: it carries the kernel sources,
the agent presets and the paper's score tables under rfwp_rl/_data, and the package finds them
there (rfwp_rl.resources.data_dir). The wheel is built offline from a copy of the checkout (so
the build never writes build/ or egg-info into the repository) and installed with --target."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rfwp_rl import resources
from rfwp_rl.errors import UserError
from rfwp_rl.kernels import _build
from rfwp_rl.presets import load_preset
from rfwp_rl.scores import load_paper

REPO = Path(__file__).resolve().parents[1]
# what the build reads; results/ and env_specs/ whole, so the test sees that only results/paper ships
BUILD_INPUTS = (
    "pyproject.toml",
    "setup.py",
    "MANIFEST.in",
    "README.md",
    "rfwp_rl",
    "csrc",
    "agents",
    "results",
    "env_specs",
)
DATA = "rfwp_rl/_data"


def _setup_shipped() -> dict[str, tuple[str, ...]]:
    """setup.py's SHIPPED table, read without running setup.py."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SHIPPED" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no SHIPPED table")


# ------------------------------------------------------------------ lookup (in process)


def test_setup_ships_exactly_the_folders_the_package_looks_up():
    assert tuple(_setup_shipped()) == resources.SHIPPED


@pytest.mark.parametrize("name", resources.SHIPPED)
def test_checkout_reads_the_repository_folders_in_place(name):
    assert resources.data_dir(name) == REPO / name
    assert resources.data_dir(name, required=False) == REPO / name


def test_checkout_call_sites_use_the_repository_folders():
    assert _build.CSRC == REPO / "csrc"
    from rfwp_rl import presets, scores

    assert presets.AGENTS_DIR == REPO / "agents"
    assert scores.paper_dir() == REPO / "results" / "paper"


def test_unknown_folder_is_a_one_line_error():
    with pytest.raises(UserError, match=r"unknown data folder 'agent'; did you mean 'agents'\?") as e:
        resources.data_dir("agent")
    assert "\n" not in str(e.value)


def test_missing_folder_names_both_places(tmp_path, monkeypatch):
    fake_repo, shipped = tmp_path / "repo", tmp_path / "site" / "rfwp_rl" / "_data"
    fake_repo.mkdir()
    (fake_repo / "pyproject.toml").write_text('[project]\nname = "rfwp_rl"\n')
    monkeypatch.setattr(resources, "SOURCE_ROOT", fake_repo)
    monkeypatch.setattr(resources, "SHIPPED_ROOT", shipped)
    with pytest.raises(UserError) as e:
        resources.data_dir("results/paper")
    msg = str(e.value)
    assert "\n" not in msg and "results/paper/ folder is missing" in msg
    assert str(fake_repo / "results" / "paper") in msg and str(shipped / "results" / "paper") in msg
    # not required: where a checkout keeps it (the caller reports it)
    assert resources.data_dir("csrc", required=False) == fake_repo / "csrc"
    # the shipped copy is used when the checkout lacks the folder
    (shipped / "agents").mkdir(parents=True)
    assert resources.data_dir("agents") == shipped / "agents"


def test_folder_beside_an_installed_package_is_not_a_checkout(tmp_path, monkeypatch):
    # site-packages/agents of some other distribution must not shadow the shipped presets
    site = tmp_path / "site"
    (site / "agents").mkdir(parents=True)
    (site / "rfwp_rl" / "_data" / "agents").mkdir(parents=True)
    monkeypatch.setattr(resources, "SOURCE_ROOT", site)
    monkeypatch.setattr(resources, "SHIPPED_ROOT", site / "rfwp_rl" / "_data")
    assert resources.data_dir("agents") == site / "rfwp_rl" / "_data" / "agents"
    (site / "pyproject.toml").write_text('[project]\nname = "other"\n')
    resources._is_source_tree.cache_clear()
    assert resources.data_dir("agents") == site / "rfwp_rl" / "_data" / "agents"
    with pytest.raises(UserError, match="csrc/ folder is missing"):
        resources.data_dir("csrc")
    assert resources.data_dir("csrc", required=False) == site / "rfwp_rl" / "_data" / "csrc"


# ------------------------------------------------------------------ a real wheel


def _pip(args: list[str], cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")  # offline
    proc = subprocess.run(
        ["nice", "-n", "15", sys.executable, "-m", "pip", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel_build")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.o", "*.egg-info", "build")
    for item in BUILD_INPUTS:
        if (REPO / item).is_dir():
            shutil.copytree(REPO / item, src / item, ignore=ignore)
        else:
            shutil.copy2(REPO / item, src / item)
    _pip(["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src)], cwd=tmp)
    wheels = list((tmp / "dist").glob("rfwp_rl-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_carries_sources_presets_and_paper_tables(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        expected = {f"{DATA}/csrc/{p.relative_to(REPO / 'csrc').as_posix()}": p for p in _build.source_files()}
        expected |= {f"{DATA}/agents/{p.name}": p for p in (REPO / "agents").glob("*.toml")}
        expected |= {f"{DATA}/results/paper/{p.name}": p for p in (REPO / "results" / "paper").glob("*.csv")}
        assert len([n for n in expected if "/csrc/" in n]) >= 15
        assert {
            f"{DATA}/agents/atari_rdn.toml",
            f"{DATA}/results/paper/table9.csv",
            f"{DATA}/csrc/bindings.cpp",
            f"{DATA}/csrc/cuda_emu/cuda_emulation.h",
        } <= set(expected)
        assert sorted(set(expected) - names) == []
        for name, path in expected.items():
            assert z.read(name) == path.read_bytes(), name
    # nothing else from the repository: no bench/measured results, runs, env_specs, tests, build output
    data = {n for n in names if n.startswith(DATA + "/")}
    assert {n.split("/")[2] for n in data} == {"csrc", "agents", "results"}
    assert {n.split("/")[3] for n in data if n.split("/")[2] == "results"} == {"paper"}
    assert {n.split("/")[0] for n in names} == {"rfwp_rl", "rfwp_rl-0.1.0.dist-info"}
    assert not any(n.endswith((".so", ".o", ".pyc")) for n in names)


PROBE = """
import json
import rfwp_rl
from rfwp_rl import resources
from rfwp_rl.kernels import _build
from rfwp_rl.presets import AGENTS_DIR, available_presets, load_preset
from rfwp_rl.scores import load_paper, paper_dir
print(json.dumps({
    "file": rfwp_rl.__file__,
    "agents": str(AGENTS_DIR), "paper": str(paper_dir()), "csrc": str(_build.CSRC),
    "presets": available_presets(),
    "rdn": load_preset("atari_rdn").to_dict(),
    "n_paper": len(load_paper()),
    "sources": [str(p.relative_to(_build.CSRC)) for p in _build.source_files()],
    "extension": _build.extension_name(False),
}))
"""


def test_installed_wheel_finds_its_data_outside_the_source_tree(wheel, tmp_path):
    site = tmp_path / "site"
    _pip(["install", "--no-deps", "--target", str(site), str(wheel)], cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site), RFWP_RL_KERNELS="0", RFWP_CACHE=str(tmp_path / "cache"))
    env.pop("RFWP_RL_KERNEL_CACHE", None)
    proc = subprocess.run(
        ["nice", "-n", "15", sys.executable, "-c", PROBE],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    pkg = site / "rfwp_rl"
    assert Path(got["file"]) == pkg / "__init__.py"  # the installed copy, not the checkout
    assert Path(got["agents"]) == pkg / "_data" / "agents"
    assert Path(got["paper"]) == pkg / "_data" / "results" / "paper"
    assert Path(got["csrc"]) == pkg / "_data" / "csrc"
    assert got["presets"] == sorted(p.stem for p in (REPO / "agents").glob("*.toml"))
    rdn = load_preset("atari_rdn").to_dict()
    assert got["rdn"] == rdn and rdn["core"] == "rdn" and rdn["core_config"]["hidden_size"] == 128
    assert got["n_paper"] == len(load_paper()) > 200
    assert got["sources"] == [str(p.relative_to(REPO / "csrc")) for p in _build.source_files()]
    # same sources -> same build key: a wheel install reuses a checkout's cached kernel build
    assert got["extension"] == _build.extension_name(False)
