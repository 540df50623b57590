"""setup.py declares compatible ranges (a user's CUDA torch stays); requirements.txt pins what is tested."""

import ast
import json
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def install_requires():
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "INSTALL_REQUIRES" for t in node.targets):
            return [Requirement(r) for r in ast.literal_eval(node.value)]
    raise AssertionError("setup.py has no INSTALL_REQUIRES")


def pins():
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    pinned = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {r.name.lower(): Version(next(iter(r.specifier)).version) for r in pinned}


def test_every_declared_dependency_is_pinned_and_the_pin_satisfies_its_range():
    pinned = pins()
    for requirement in install_requires():
        assert requirement.name.lower() in pinned, f"{requirement.name} is declared but not pinned in requirements.txt"
        assert requirement.specifier.contains(pinned[requirement.name.lower()]), (requirement, pinned[requirement.name.lower()])


def test_no_exact_pins_and_cuda_builds_of_torch_are_accepted():
    requirements = {r.name: r for r in install_requires()}
    assert all(not str(r.specifier).startswith("==") for r in requirements.values())
    for version in ("2.11.0+cu128", "2.13.0", "2.13.0+cu128"):  # the lent GPU machines run torch 2.11
        assert requirements["torch"].specifier.contains(Version(version), prereleases=True)


def test_every_pin_has_a_python_3_12_build_on_the_registry(tmp_path):
    """setup.py admits Python 3.12 (the GPU machines run it): each pinned package but torch (whose
    3.12 builds are the user's CUDA ones) and the fairseq fork resolves to a wheel for CPython 3.12
    (hydra's antlr4-python3-runtime, not pinned here, is a pure-Python source archive for every
    Python). Asks the registry, installs nothing."""
    pinned = [line for line in (ROOT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith(("#", "torch=="))]
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps", "--quiet",
           "--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:",
           "--target", str(tmp_path / "target"), "--report", str(report), "ve-fairseq==0.12.3", *pinned]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    files = {item["metadata"]["name"].lower(): item["download_info"]["url"].rsplit("/", 1)[-1]
             for item in json.loads(report.read_text())["install"]}
    assert len(files) == len(pinned) + 1, sorted(files)
    for name, filename in files.items():
        tags = filename[:-len(".whl")].split("-")[-3:]
        assert tags[0] in ("cp312", "py3", "py2.py3", "cp310") and tags[1] in ("cp312", "none", "abi3"), (name, filename)
