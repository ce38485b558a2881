"""`reinforge doctor`: versions, machine, and which sandbox backend runs untrusted code and what it guarantees."""

import torch
from typer.testing import CliRunner

from reinforge import doctor
from reinforge.cli import app
from reinforge.sandbox.backends import BACKENDS
from reinforge.sandbox.detect import available_backends


def test_doctor_names_versions_and_the_sandbox_in_use():
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert f"torch {torch.__version__}" in result.output and "CPU: " in result.output
    for backend in BACKENDS:
        assert f"  {backend} " in result.output
    assert f"in use: {available_backends()[0]}: " in result.output


def test_doctor_says_what_the_unshare_fallback_guarantees(monkeypatch):
    monkeypatch.setattr(doctor, "available_backends", lambda: ["unshare", "rlimits-only"])
    monkeypatch.setattr(doctor, "binary_present", lambda backend: backend != "bubblewrap")
    lines = doctor.sandbox_lines()
    assert "  bubblewrap    not installed (apt-get install bubblewrap)" in lines
    assert lines[-1].startswith("in use: unshare: ") and "private size-limited /tmp, /var/tmp and /dev/shm" in lines[-1]
    monkeypatch.setattr(doctor, "available_backends", lambda: [])
    assert doctor.sandbox_lines()[-1] == "in use: none: untrusted code cannot run here"
