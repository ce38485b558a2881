"""The name -> function registries of algorithm parts."""

import pytest

from reinforge.algo import ADVANTAGES, KL_ESTIMATORS, LOSS_AGG, MIXING, POLICY_LOSSES, REGISTRIES
from reinforge.algo.advantage_estimators import grpo_advantage
from reinforge.algo.registry import Registry
from reinforge.errors import ConfigError


def _fresh() -> Registry:
    reg: Registry = Registry("widget")

    @reg.register("beta", formula="b = 2", paper="P2")
    def beta() -> int:
        """Beta."""
        return 2

    @reg.register("alpha", formula="a = 1", paper="P1")
    def alpha() -> int:
        """Alpha."""
        return 1

    return reg


def test_get_and_names_sorted():
    reg = _fresh()
    assert reg.get("alpha")() == 1
    assert reg.get("beta")() == 2
    assert reg.names() == ["alpha", "beta"]
    assert [e.name for e in reg.entries()] == ["alpha", "beta"]
    assert reg.entries()[0].formula == "a = 1" and reg.entries()[1].paper == "P2"
    assert "alpha" in reg and "gamma" not in reg


def test_a_part_without_a_formula_gives_a_description():
    """Environments and rollout engines are described, not given a formula; a part gives one or the other."""
    from reinforge.parts import all_kinds

    for registry in (all_kinds()["env"], all_kinds()["engine"]):
        for entry in registry.entries():
            assert entry.formula == "" and entry.description == entry.fn.description != "", entry.name
    reg = _fresh()
    reg.register("gamma", description="a plain part", paper="-")(lambda: 3)
    assert reg.entry("gamma").description == "a plain part" and reg.entry("gamma").formula == ""
    with pytest.raises(TypeError, match="formula"):
        reg.register("delta", paper="-")


def test_unknown_name_raises_config_error_listing_allowed():
    reg = _fresh()
    with pytest.raises(ConfigError) as info:
        reg.get("gamma")
    msg = str(info.value)
    assert "gamma" in msg and "widget" in msg
    assert "alpha" in msg and "beta" in msg


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_real_registries_unknown_name_lists_all(kind):
    reg = REGISTRIES[kind]
    with pytest.raises(ConfigError) as info:
        reg.get("no-such-part")
    msg = str(info.value)
    assert "no-such-part" in msg
    for name in reg.names():
        assert name in msg


def test_register_twice_raises():
    reg = _fresh()
    with pytest.raises(ValueError, match="alpha"):
        reg.register("alpha", formula="x", paper="y")(lambda: 3)
    assert reg.get("alpha")() == 1  # the first registration is kept


def test_register_twice_on_real_registry_raises_and_keeps_original():
    with pytest.raises(ValueError):
        ADVANTAGES.register("grpo", formula="x", paper="y")(lambda *a: None)
    assert ADVANTAGES.get("grpo") is grpo_advantage


def test_registries_hold_the_expected_parts():
    assert REGISTRIES == {
        "advantage": ADVANTAGES,
        "policy_loss": POLICY_LOSSES,
        "loss_agg": LOSS_AGG,
        "kl_estimator": KL_ESTIMATORS,
        "mixing": MIXING,
    }
    assert "grpo" in ADVANTAGES
    assert "ppo_clip" in POLICY_LOSSES
    assert {"sum", "convex", "chord"} <= set(MIXING.names())
    assert {"token_mean", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"} <= set(
        LOSS_AGG.names()
    )
    assert {"k1", "k2", "k3"} <= set(KL_ESTIMATORS.names())


def test_every_entry_is_documented():
    n = 0
    for kind, reg in REGISTRIES.items():
        assert reg.entries(), kind
        for entry in reg.entries():
            where = f"{kind}/{entry.name}"
            assert isinstance(entry.formula, str) and entry.formula.strip(), where
            assert isinstance(entry.paper, str) and entry.paper.strip(), where
            assert entry.fn.__doc__ and entry.fn.__doc__.strip(), where
            assert reg.get(entry.name) is entry.fn
            n += 1
    assert n >= 9


def test_a_part_declares_only_known_needs_and_readable_fields():
    from reinforge.errors import ConfigError
    from reinforge.registry import NEEDS, Registry

    reg = Registry("thing", inputs=frozenset({"rewards", "mask", "cfg"}))
    reg.register("ok", formula="f", paper="p", needs=("values",))(lambda rewards, mask, cfg: rewards)
    assert reg.entry("ok").params == ("rewards", "mask", "cfg")
    with pytest.raises(ConfigError, match=r"thing 'bad': unknown need 'valuse' \(did you mean 'values'\?\)"):
        reg.register("bad", formula="f", paper="p", needs=("valuse",))(lambda rewards: rewards)
    with pytest.raises(ConfigError, match=r"thing 'bad': parameter 'maks' is not a field it can read \(did you mean "
                                          r"'mask'\?\); fields: cfg, mask, rewards"):
        reg.register("bad", formula="f", paper="p")(lambda rewards, maks: rewards)
    assert "bad" not in reg
    anything = Registry("other")  # no inputs declared: any parameter name
    anything.register("free", formula="f", paper="p")(lambda whatever: whatever)
    assert "cpu_bound" in NEEDS and "whole_groups" in NEEDS
