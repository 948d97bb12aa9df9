"""The installed package carries every data file the code reads (a non-editable install has no tree)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER_TO_PACKAGE = {
    "trex_compiler": "trex",
    "passes": "trex/passes",
    "backends": "trex/backends",
    "runtime": "trex/runtime",
    "cost_model": "trex/cost_model",
    "workloads": "trex/workloads",
}


def test_the_wheel_holds_every_file_of_the_package_folders(tmp_path):
    # Build from a clean copy: a checkout's build/ and *.egg-info/ (left by editable installs) would
    # hand setuptools file lists that a fresh machine does not have.
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    source.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in FOLDER_TO_PACKAGE:
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("trex_compiler-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for folder, package in FOLDER_TO_PACKAGE.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and not path.name.endswith(".pyc"):
                expected.add(f"{package}/{path.relative_to(ROOT / folder).as_posix()}")
    assert "trex/cost_model/data/published_runs.csv" in expected
    assert expected - shipped == set()
