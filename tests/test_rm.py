"""Reward-model training (``reinforge rm``): losses against hand values, pairs and their errors, the
held-out split, the run's outputs and the scorer loading what it writes."""

from __future__ import annotations

import json
import math

import pytest
import torch

from reinforge.algo.reward_losses import RM_LOSSES, BradleyTerrySettings, bradley_terry, prm_step_bce
from reinforge.errors import ConfigError, DataError
from reinforge.rm.config import PairColumns, load_rm_config
from reinforge.rm.data import near_miss_pairs, read_pairs, row_pair, split_by_prompt
from reinforge.rm.evaluate import calibration, evaluate_pairs


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


# ---------------------------------------------------------------------------------------------- losses

def test_bradley_terry_matches_hand_values() -> None:
    chosen, rejected = torch.tensor([2.0, 0.5]), torch.tensor([1.0, 1.5])
    loss, metrics = bradley_terry(chosen, rejected, None, BradleyTerrySettings())
    expected = -(math.log(_sig(1.0)) + math.log(_sig(-1.0))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["accuracy"].item() == pytest.approx(0.5)
    assert metrics["gap"].item() == pytest.approx(0.0)
    assert metrics["mean_score"].item() == pytest.approx(1.25)


def test_bradley_terry_margin_and_centering() -> None:
    chosen, rejected, margin = torch.tensor([2.0, 0.5]), torch.tensor([1.0, 1.5]), torch.tensor([0.5, 2.0])
    cfg = BradleyTerrySettings(margin=True, center_coef=0.1)
    loss, _ = bradley_terry(chosen, rejected, margin, cfg)
    bt = -(math.log(_sig(1.0 - 0.5)) + math.log(_sig(-1.0 - 2.0))) / 2
    centering = 0.1 * ((2.0 + 1.0) ** 2 + (0.5 + 1.5) ** 2) / 2
    assert loss.item() == pytest.approx(bt + centering, abs=1e-6)
    # the margin column is ignored unless the option asks for it
    plain, _ = bradley_terry(chosen, rejected, margin, BradleyTerrySettings())
    assert plain.item() == pytest.approx(-(math.log(_sig(1.0)) + math.log(_sig(-1.0))) / 2, abs=1e-6)


def test_bradley_terry_with_heads_is_the_mean_over_heads() -> None:
    chosen = torch.tensor([[2.0, 0.0]])
    rejected = torch.tensor([[1.0, 1.0]])
    loss, metrics = bradley_terry(chosen, rejected, torch.tensor([1.0]), BradleyTerrySettings(margin=True))
    expected = -(math.log(_sig(1.0 - 1.0)) + math.log(_sig(-1.0 - 1.0))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["accuracy"].item() == pytest.approx(0.5)


def test_bradley_terry_is_registered_with_its_options() -> None:
    assert RM_LOSSES.get("bradley_terry") is bradley_terry
    cfg = load_rm_config(None, ["loss={name: bradley_terry, margin: true, center_coef: 0.01}"])
    assert cfg.loss.settings.margin and cfg.loss.settings.center_coef == 0.01
    with pytest.raises(ConfigError, match="loss"):
        load_rm_config(None, ["loss={name: bradley_terry, center: 1}"])


def test_prm_step_loss_matches_hand_values() -> None:
    scores = torch.tensor([[1.0, -2.0, 0.0]])
    labels = torch.tensor([[1.0, 0.25, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third step is not labelled
    loss, metrics = prm_step_bce(scores, labels, mask)
    bce1 = -math.log(_sig(1.0))
    bce2 = -(0.25 * math.log(_sig(-2.0)) + 0.75 * math.log(1 - _sig(-2.0)))
    assert loss.item() == pytest.approx((bce1 + bce2) / 2, abs=1e-6)
    assert metrics["step_accuracy"].item() == pytest.approx(1.0)  # 1 > 0 with y=1; -2 < 0 with y=0.25


# ---------------------------------------------------------------------------------------------- pairs

COLS = PairColumns()


def test_rows_in_both_forms() -> None:
    p = row_pair({"prompt": "2+2=", "chosen": "4", "rejected": "5", "m": 1.5}, "f:1", PairColumns(margin="m"))
    assert (p.prompt, p.chosen, p.rejected, p.margin) == ("2+2=", "4", "5", 1.5)
    conv = row_pair({"chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
                     "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "go away"}]},
                    "f:2", COLS)
    assert conv.prompt == [{"role": "user", "content": "hi"}] and (conv.chosen, conv.rejected) == ("hello", "go away")


@pytest.mark.parametrize("row, message", [
    ({"prompt": "q", "chosen": "a"}, "'rejected' is missing"),
    ({"prompt": "q", "chosen": "a", "rejected": None}, "'rejected' is missing"),
    ({"prompt": "q", "chosen": "  ", "rejected": "b"}, "'chosen' is empty"),
    ({"prompt": "q", "chosen": "same", "rejected": "same"}, "the same answer"),
    ({"chosen": "a", "rejected": "b"}, "'prompt' is missing"),
    ({"prompt": "q", "chosen": 3, "rejected": "b"}, "must be a string"),
    ({"chosen": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"}],
      "rejected": [{"role": "user", "content": "y"}, {"role": "assistant", "content": "b"}]}, "differ before"),
    ({"chosen": [{"role": "user", "content": "x"}], "rejected": [{"role": "user", "content": "x"}]},
     "end with the assistant"),
])
def test_bad_rows_name_the_line(row: dict, message: str) -> None:
    with pytest.raises(DataError, match=message) as err:
        row_pair(row, "pairs.jsonl:7", COLS)
    assert "pairs.jsonl:7" in str(err.value)


def test_a_file_error_names_the_file_and_line(tmp_path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n"
                    + json.dumps({"prompt": "q2", "chosen": "a", "rejected": "a"}) + "\n")
    with pytest.raises(DataError, match=r"pairs.jsonl:2.*same answer"):
        read_pairs(str(path), COLS)


def test_split_by_prompt_keeps_prompts_whole() -> None:
    pairs = [row_pair({"prompt": f"q{i % 10}", "chosen": f"a{i}", "rejected": f"b{i}"}, f"f:{i}", COLS)
             for i in range(40)]
    train, held = split_by_prompt(pairs, 6, seed=0)
    assert len(train) + len(held) == 40 and len(held) >= 6
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert split_by_prompt(pairs, 6, seed=0)[1] == held  # seeded


def test_near_miss_pairs_use_distinct_offsets() -> None:
    from reinforge.data.arithmetic import arithmetic_problem

    task = arithmetic_problem(1234, 2, "+")  # 12+34
    pairs = near_miss_pairs([task], 6)
    assert {int(p.rejected) - 46 for p in pairs} == {1, -1, 10, -10, 2, -2}
    assert all(p.chosen == "46" for p in pairs)


# ---------------------------------------------------------------------------------------------- evaluation

def test_pair_accuracy_interval_and_calibration() -> None:
    chosen = torch.tensor([3.0, 3.0, 0.0, 1.0])
    rejected = torch.tensor([0.0, 0.0, 3.0, 1.0])  # right, right, wrong, tie
    result = evaluate_pairs(chosen, rejected, n_boot=500)
    assert result.accuracy == pytest.approx(2.5 / 4)
    assert result.low <= result.accuracy <= result.high
    ece, bins = calibration(torch.tensor([5.0] * 50), torch.tensor([-5.0] * 50))
    assert ece < 0.01  # confident and right: predictions near 0 or 1 match the frequencies
    assert sum(b["count"] for b in bins) == 50
    ece_wrong, _ = calibration(torch.tensor([-5.0] * 50), torch.tensor([5.0] * 50))
    assert ece_wrong > 0.99  # confident and wrong


def test_unknown_recipe_and_bad_field_are_named() -> None:
    with pytest.raises(ConfigError, match="no_such_recipe"):
        load_rm_config("no_such_recipe")
    with pytest.raises(ConfigError, match="train.batch_size"):
        load_rm_config(None, ["train.batch_size=0"])


# ---------------------------------------------------------------------------------------------- a run

def test_a_run_writes_a_reward_model_the_scorer_loads(tmp_path) -> None:
    """A tiny file of pairs whose chosen answer always ends in 7: the run's model, loaded by the
    reward_model term's scorer unchanged, ranks held-out pairs as trained."""
    from reinforge.rewards.reward_model import RewardModelScorer
    from reinforge.rm.train import train_reward_model
    from reinforge.types import Task

    rows = [{"prompt": [{"role": "user", "content": f"{i}+{i}="}], "chosen": f"{i}7", "rejected": f"{i}3"}
            for i in range(40)]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_rm_config(None, [f"data.path={data}", "train.steps=30", "train.batch_size=8", "train.lr=1e-3",
                                "train.eval_every=0", f"output_dir={tmp_path}", "name=rm"])
    result = train_reward_model(cfg)
    assert result.heldout.pairs == 4 and result.heldout.accuracy == 1.0
    report = json.loads((tmp_path / "rm" / "eval.json").read_text())
    assert report["heldout"]["accuracy"] == 1.0 and (tmp_path / "rm" / "calibration.png").is_file()
    assert (tmp_path / "rm" / "metrics.jsonl").read_text().count("\n") == 30
    scorer = RewardModelScorer(str(result.model_dirs[0]))
    task = Task(id="t", prompt=[{"role": "user", "content": "55+55="}], answer="")
    good, bad = scorer.score([task, task], ["57", "53"])
    assert good > bad


def test_ensemble_aggregates_match_hand_values() -> None:
    from reinforge.algo.reward_ensembles import UWOSettings, mean_aggregate, min_aggregate, uwo_aggregate

    scores = torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    assert mean_aggregate(scores).tolist() == [2.0, 2.0]
    assert min_aggregate(scores).tolist() == [1.0, 2.0]
    # population variance of (1, 3) is 1; of (2, 2) is 0
    assert uwo_aggregate(scores, UWOSettings(coef=0.5)).tolist() == [1.5, 2.0]


def test_an_ensemble_run_is_scored_through_its_aggregate(tmp_path) -> None:
    """ensemble: 2 writes members/0, members/1 and ensemble.json; the reward term loads the directory and
    its aggregate turns the two scores into one (min <= mean)."""
    from reinforge.config import RewardTermConfig
    from reinforge.rewards.build import _term_verifier
    from reinforge.rm.train import train_reward_model
    from reinforge.types import Task

    data = sevens(tmp_path, 12)
    cfg = load_rm_config(None, [f"data.path={data}", "train.steps=3", "train.batch_size=4", "train.eval_every=0",
                                "ensemble=2", "model.heads=2", f"output_dir={tmp_path}", "name=ens"])
    result = train_reward_model(cfg)
    manifest = json.loads((tmp_path / "ens" / "ensemble.json").read_text())
    assert manifest["members"] == ["members/0", "members/1"] and len(result.model_dirs) == 2
    from safetensors.torch import load_file

    head = load_file(str(tmp_path / "ens" / "members" / "0" / "model.safetensors"))["score.weight"]
    assert head.shape[0] == 2 and not torch.allclose(head[0], head[1])  # the heads are not one head twice
    task = Task(id="t", prompt="5+5=", answer="")
    scores = {}
    for aggregate in ("mean", "min", "{name: uwo, coef: 2.0}"):
        term = RewardTermConfig.model_validate(
            {"name": "rm", "reward_model": {"path": str(tmp_path / "ens"), "aggregate": yaml_value(aggregate)}})
        verifier = _term_verifier(term, "cpu")
        assert verifier.scorer.heads == 4
        scores[aggregate] = verifier(task, "57").reward
    assert scores["min"] <= scores["mean"] and scores["{name: uwo, coef: 2.0}"] <= scores["mean"]
    assert scores["min"] < scores["mean"]  # four differently seeded heads disagree


def sevens(tmp_path, n: int):
    """A file of n pairs whose chosen answer ends in 7 and rejected one in 3 (text prompts)."""
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "chosen": f"{i}7", "rejected": f"{i}3"}) + "\n"
                            for i in range(n)))
    return data


def yaml_value(text: str):
    import yaml

    return yaml.safe_load(text)


def test_warm_averages_the_members_weights(tmp_path) -> None:
    """combine: warm writes one model/ whose weights are the members' element-wise mean."""
    from safetensors.torch import load_file

    from reinforge.rm.train import average_weights, train_reward_model

    a, b = {"w": torch.tensor([1.0, 3.0]), "n": torch.tensor([7])}, {"w": torch.tensor([3.0, 5.0]), "n": torch.tensor([9])}
    avg = average_weights([a, b])
    assert avg["w"].tolist() == [2.0, 4.0] and avg["n"].tolist() == [7]
    data = sevens(tmp_path, 12)
    cfg = load_rm_config(None, [f"data.path={data}", "train.steps=3", "train.batch_size=4", "train.eval_every=0",
                                "ensemble=2", "combine=warm", f"output_dir={tmp_path}", "name=warm"])
    result = train_reward_model(cfg)
    assert result.model_dirs == [tmp_path / "warm" / "model"]
    weights = [load_file(str(tmp_path / "warm" / d / "model.safetensors")) for d in ("members/0", "members/1", "model")]
    for name in ("score.weight", "model.layers.0.mlp.up_proj.weight"):
        assert torch.allclose(weights[2][name], (weights[0][name] + weights[1][name]) / 2, atol=1e-6)
    report = json.loads((tmp_path / "warm" / "eval.json").read_text())
    assert set(report["accuracy_of"]) == {"member_0", "member_1", "prediction_ensemble"}
    from reinforge.rewards.reward_model import ensemble_members

    assert ensemble_members(str(tmp_path / "warm")) == [tmp_path / "warm" / "members" / str(k) for k in (0, 1)]


def test_the_classifier_reads_the_reference_answer_after_the_question(tiny_tokenizer) -> None:
    """With data.reference_template each side of a near-miss pair is the question, the reference answer in
    the template, then the side's answer: the two sides differ only in their answers, and the reference is
    what the score head can compare them with. Without a template, no reference is in the input."""
    from reinforge.data.arithmetic import arithmetic_problem
    from reinforge.rm.train import EncodedPairs

    [pair] = near_miss_pairs([arithmetic_problem(1234, 2, "+")], 1)  # 12+34: "46" over a near miss
    for template, shown in ((" {answer} ", "12+34= 46 "), (None, "12+34=")):
        (chosen, c_start), (rejected, r_start) = EncodedPairs([pair], tiny_tokenizer, 64, template).sides(0)
        prompt = tiny_tokenizer.decode(chosen[:c_start], skip_special_tokens=True)
        assert prompt.endswith(shown) and chosen[:c_start] == rejected[:r_start]
        assert tiny_tokenizer.decode(chosen[c_start:], skip_special_tokens=True).strip() == "46"
        assert tiny_tokenizer.decode(rejected[r_start:], skip_special_tokens=True).strip() == pair.rejected


# 80-110 s on one core: make test-learning. In make test: the reference in the input (above) and the recipe end to
# end, its template saved with the model and read by the reward term (tests/test_rm_pipeline.py); a reward model
# learning near misses in make test: tests/test_rm_arm.py (the autoregressive kind, 250 steps).
@pytest.mark.learning
def test_a_reference_based_reward_model_tells_near_misses_apart(tmp_path) -> None:
    """The shipped arithmetic_verify recipe, shortened: from tiny-base, held-out pair accuracy on near-miss
    addition pairs (the reference answer over the answer +-1, +-2, +-10) of held-out problems reaches 0.9.
    600 steps of 16 pairs (80-95 s on one core): 0.952, 0.969 and 0.945 with torch's AVX-512, AVX2 and scalar
    CPU kernels; 450 steps read 0.970 with AVX2 but 0.851 with AVX-512 (0.908 with seed 1): too near the edge."""
    from reinforge.rm.train import train_reward_model

    cfg = load_rm_config("arithmetic_verify", ["train.steps=600", "train.batch_size=16", "train.head_lr=3e-3",
                                               "train.eval_every=0",
                                               f"output_dir={tmp_path}", "name=verify"])
    result = train_reward_model(cfg)
    assert result.heldout.pairs == 3000
    assert result.heldout.accuracy >= 0.9, result.heldout
    trained = json.loads((result.model_dirs[0] / "reinforge_rm.json").read_text())
    assert trained == {"reference_template": " {answer} "}


def test_pairs_from_parquet_and_a_datasets_directory(tmp_path) -> None:
    """The same rows as Parquet and as a saved ``datasets`` directory (a split of a DatasetDict)."""
    import datasets

    rows = [{"prompt": "1+1=", "chosen": "2", "rejected": "3", "reference": "2"},
            {"prompt": "2+2=", "chosen": "4", "rejected": "5", "reference": "4"}]
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "pairs.parquet"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "pairs_ds"))
    for path, split in ((tmp_path / "pairs.parquet", None), (tmp_path / "pairs_ds", "train")):
        pairs = read_pairs(str(path), COLS, split)
        assert [(p.prompt, p.chosen, p.rejected, p.reference) for p in pairs] == [
            ("1+1=", "2", "3", "2"), ("2+2=", "4", "5", "4")]
