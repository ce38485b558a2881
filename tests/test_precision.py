"""``models/precision.py``: the compute dtype, and where bf16 forwards are native (``train.autocast=auto``)."""

from __future__ import annotations

import pytest
import torch

from reinforge.models import precision
from reinforge.models.precision import (
    CPU_BF16_ENV,
    autocast_bf16,
    compute_dtype,
    cpu_has_bf16,
    cpuinfo_has_bf16,
)

X86 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f {extra}\nbogomips\t: 4800\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd sve {extra}\n"


def test_bf16_instructions_are_read_from_the_cpu_flags(tmp_path):
    cases = {X86.format(extra="avx512_bf16"): True, X86.format(extra="amx_bf16 amx_tile"): True,
             X86.format(extra="avx512_vnni"): False, ARM.format(extra="bf16 i8mm"): True, ARM.format(extra=""): False,
             "model name\t: bf16 in a name is not a flag\n": False}
    for i, (text, expected) in enumerate(cases.items()):
        path = tmp_path / f"cpuinfo{i}"
        path.write_text(text)
        assert cpuinfo_has_bf16(str(path)) is expected, text
    assert cpuinfo_has_bf16(str(tmp_path / "missing")) is False  # no /proc/cpuinfo (macOS): float32


def test_autocast_settings_resolve_per_device(monkeypatch):
    cpu = torch.device("cpu")
    assert autocast_bf16("bf16", cpu) is True and autocast_bf16("none", cpu) is False
    for native in (True, False):
        monkeypatch.setattr(precision, "cpu_has_bf16", lambda native=native: native)
        assert autocast_bf16("auto", cpu) is native
        assert autocast_bf16("none", cpu) is False
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert autocast_bf16("auto", torch.device("cuda")) is False
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert autocast_bf16("auto", torch.device("cuda")) is True
    assert autocast_bf16("auto", torch.device("meta")) is False


def test_losses_are_float32_for_low_precision_models_and_float64_for_float64():
    assert compute_dtype(torch.bfloat16) == compute_dtype(torch.float16) == torch.float32
    assert compute_dtype(torch.float64) == torch.float64


def test_a_run_with_auto_autocast_says_what_it_chose(tmp_path, monkeypatch, capsys):
    import reinforge

    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    reinforge.train(model="tiny-base", task="arithmetic", output_dir=str(tmp_path),
                    train={"steps": 1, "time_limit_s": 0, "autocast": "auto"},
                    rollout={"prompts_per_step": 2, "group_size": 2},
                    eval={"final_samples": 0}, log={"report": False}, **{"task.heldout_size": 4})
    assert "train.autocast=auto: the learner's forwards in bf16" in capsys.readouterr().out


def test_the_environment_overrides_the_cpu_flags(monkeypatch):
    """``REINFORGE_CPU_BF16`` = 1 or 0 decides; unset, the flags do (the tests run with 0: tests/conftest.py)."""
    monkeypatch.setattr(precision, "cpuinfo_has_bf16", lambda: True)
    for value, expected in (("1", True), ("0", False), (" 0 ", False)):
        monkeypatch.setenv(CPU_BF16_ENV, value)
        assert cpu_has_bf16() is expected
        assert autocast_bf16("auto", torch.device("cpu")) is expected
    monkeypatch.delenv(CPU_BF16_ENV)
    assert cpu_has_bf16() is True
    monkeypatch.setenv(CPU_BF16_ENV, "yes")
    with pytest.raises(ValueError, match="REINFORGE_CPU_BF16='yes': 0 or 1"):
        cpu_has_bf16()
