"""The Makefile's venv check (issue 43): a .venv made by another or an unsupported Python (a
failed first try leaves one behind) is refused before anything uses it, with the hint to
`make clean`; a PYTHON older than the supported one is named. Fake interpreters (shell scripts
that answer the check's two questions) stand in for the other Pythons: no venv is built."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


def _fake_python(path: Path, version: str) -> Path:
    """A script answering like Python `version`: prints it, and fails the 'supported?' check
    (sys.exit(True)) when it is older than 3.10."""
    old = tuple(map(int, version.split("."))) < (3, 10)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n"
                    f'case "$*" in *sys.exit*) exit {int(old)};; esac\n'
                    f"echo {version}\n")
    path.chmod(0o755)
    return path


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(ROOT), *args], capture_output=True,
                          text=True, timeout=120)


def test_a_venv_of_another_python_is_refused_with_the_cleanup_hint(tmp_path):
    venv = tmp_path / ".venv"
    _fake_python(venv / "bin" / "python", "3.8")  # what a failed first try left behind
    cp = _make("venv", f"VENV={venv}", f"PYTHON={sys.executable}")
    assert cp.returncode != 0
    mine = "{}.{}".format(*sys.version_info[:2])
    assert f"{venv} was made by 3.8, not by PYTHON={sys.executable} ({mine})" in cp.stdout
    assert "make clean" in cp.stdout and f"rm -rf {venv}" in cp.stdout
    assert not (venv / ".installed").exists()  # nothing was installed into it


def test_an_unsupported_python_is_named_before_a_venv_is_made(tmp_path):
    old = _fake_python(tmp_path / "python3.8", "3.8")
    venv = tmp_path / ".venv"
    cp = _make("venv", f"VENV={venv}", f"PYTHON={old}")
    assert cp.returncode != 0
    assert f"mpi_dp needs Python 3.10 or newer; PYTHON={old} is 3.8" in cp.stdout
    assert not venv.exists()


def test_the_venv_of_this_python_passes_the_check(tmp_path):
    venv = tmp_path / ".venv"
    _fake_python(venv / "bin" / "python", "{}.{}".format(*sys.version_info[:2]))
    cp = _make("venv-check", f"VENV={venv}", f"PYTHON={sys.executable}")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout == ""


def test_a_complete_venv_of_another_supported_python_is_kept(tmp_path):
    venv = tmp_path / ".venv"
    other = "3.99" if sys.version_info[:2] != (3, 99) else "3.98"
    _fake_python(venv / "bin" / "python", other)
    (venv / ".installed").touch()  # made by `make demo PYTHON=python3.99` and complete
    cp = _make("venv-check", f"VENV={venv}", f"PYTHON={sys.executable}")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    (venv / ".installed").unlink()  # the same, interrupted before its install completed
    cp = _make("venv-check", f"VENV={venv}", f"PYTHON={sys.executable}")
    assert cp.returncode != 0 and "make clean" in cp.stdout
