"""Without its package, each adapter's error names the extra to install."""

from __future__ import annotations

import sys

import pytest

from reinforge.envs.registry import build_environment

CASES = [
    ("verifiers", {"id": "anything"}, ("verifiers", "verifiers.v1")),
    ("openenv", {"url": "http://127.0.0.1:1"}, ("openenv", "openenv.core", "openenv.core.generic_client")),
    ("textarena", {"game": "TicTacToe-v0"}, ("textarena",)),
]


@pytest.mark.parametrize(("name", "params", "modules"), CASES)
def test_a_missing_package_names_the_extra(name, params, modules, monkeypatch):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(ImportError, match=rf'env.name={name} needs .*pip install "reinforge\[envs\]"'):
        build_environment(name, None, None, params)
