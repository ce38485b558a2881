"""Process reward models (``reinforge prm``): step-labelled rows and their errors, where steps end in the
tokens, a run whose model the ``prm`` step verifier loads and scores with."""

from __future__ import annotations

import json

import pytest

from reinforge.errors import DataError
from reinforge.rm.config import StepColumns, load_prm_config
from reinforge.rm.steps import encode_steps, read_steps, row_steps, step_ends

COLS = StepColumns()


def test_a_row_and_its_labels() -> None:
    ex = row_steps({"prompt": "1+1=", "completions": ["1", "2"], "labels": [True, 0.25]}, "f:1", COLS)
    assert ex.steps == ("1", "2") and ex.labels == (1.0, 0.25)


@pytest.mark.parametrize("row, message", [
    ({"prompt": "q", "completions": ["a"], "labels": [1, 0]}, "2 labels for 1 steps: a step label outside the completion"),
    ({"prompt": "q", "completions": ["a", "b"], "labels": [1]}, "a step without a label"),
    ({"prompt": "q", "completions": ["a"], "labels": [1.5]}, r"label 0: a step label is a bool or a number in \[0, 1\]"),
    ({"prompt": "q", "completions": ["a", " "], "labels": [1, 0]}, "step 1 is empty"),
    ({"prompt": "q", "completions": "a", "labels": [1]}, "non-empty list of step strings"),
    ({"prompt": "q", "labels": [1]}, "'completions' is missing"),
])
def test_bad_rows_name_the_line(row: dict, message: str) -> None:
    with pytest.raises(DataError, match=message) as err:
        row_steps(row, "steps.jsonl:3", COLS)
    assert "steps.jsonl:3" in str(err.value)


def test_a_file_error_names_the_line(tmp_path) -> None:
    path = tmp_path / "steps.jsonl"
    path.write_text(json.dumps({"prompt": "q", "completions": ["a"], "labels": [1]}) + "\n"
                    + json.dumps({"prompt": "q", "completions": ["a"], "labels": [1, 1]}) + "\n")
    with pytest.raises(DataError, match="steps.jsonl:2.*outside the completion"):
        read_steps(str(path), COLS)


def test_step_ends_land_on_each_steps_last_token() -> None:
    from reinforge.models.loading import load_tokenizer

    tok = load_tokenizer("tiny-base")
    assert step_ends(["12", "3", "45"], " ") == [2, 4, 7]
    ids, positions = encode_steps(tok, [{"role": "user", "content": "1+1="}], "12 3 45", [2, 4, 7], "t")
    # '<bos>1+1=' is 5 tokens (bos, 1, +, 1, =); the completion's characters follow one token each
    assert [tok.convert_ids_to_tokens(ids[p]) for p in positions] == ["2", "3", "5"]
    assert positions == [6, 8, 11]


def test_a_run_trains_a_prm_the_step_verifier_scores_with(tmp_path) -> None:
    """Steps ending in 7 are good, steps ending in 3 bad: the trained PRM, loaded by the prm step
    verifier, scores a good step above a bad one."""
    from reinforge.rewards.prm import PRMSettings, prm_steps
    from reinforge.rm.prm import train_process_reward_model
    from reinforge.types import Task

    rows = []
    for i in range(40):
        steps = [f"{i}7", f"{i}3"] if i % 2 else [f"{i}3", f"{i}7"]
        rows.append({"prompt": f"{i}+{i}=", "completions": steps, "labels": [s.endswith("7") for s in steps]})
    data = tmp_path / "steps.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_prm_config(None, [f"data.path={data}", "data.step_separator=' '", "train.steps=30",
                                 "train.batch_size=8", "train.lr=1e-3", "train.eval_every=0",
                                 f"output_dir={tmp_path}", "name=prm"])
    result = train_process_reward_model(cfg)
    assert result.step_accuracy == 1.0
    report = json.loads((tmp_path / "prm" / "eval.json").read_text())["heldout"]
    assert report["steps"] == 8 and report["step_accuracy"] == 1.0
    scored = prm_steps(Task(id="t", prompt="55+55=", answer=""), "557 553",
                       PRMSettings(path=str(result.model_dir), step_separator=" "))
    assert [end for end, _ in scored] == [3, 7]
    assert scored[0][1] > 0.5 > scored[1][1]


def test_a_recipe_names_a_prm_as_its_step_verifier(tmp_path) -> None:
    """reward.step_verifier: {name: prm, ...} validates from a recipe and its scores land on the tokens
    that end each step (coef * sigmoid(logit)), through the run's reward pool."""
    from types import SimpleNamespace

    from reinforge.config import load_config
    from reinforge.models.loading import load_tokenizer
    from reinforge.rewards.build import run_reward_pool
    from reinforge.rm.model import build_reward_model, save_reward_model
    from reinforge.types import Task

    model, tok = build_reward_model("tiny-base", 1, per="token")  # an untrained PRM: every score is sigmoid(0)
    path = save_reward_model(model, tok, tmp_path / "prm")
    cfg = load_config(None, [f"reward.step_verifier={{name: prm, path: {path}, step_separator: ' ', coef: 0.5}}"])
    pool = run_reward_pool(cfg)
    assert pool.steps is not None and pool.steps.settings.step_separator == " "
    tokenizer = load_tokenizer("tiny-base")
    prompt = tokenizer("<bos>1+1=", add_special_tokens=False)["input_ids"]
    generated = tokenizer("12 3", add_special_tokens=False)["input_ids"]
    traj = SimpleNamespace(completion_text="12 3", token_ids=prompt + generated, token_rewards=None)
    counters = pool.steps.apply([Task(id="t", prompt="1+1=", answer="2")], [traj], tokenizer.decode, [len(prompt)])
    assert counters["reward/steps"] == 2.0
    expected = [0.0] * len(prompt) + [0.0, 0.25, 0.0, 0.25]  # 0.5 * sigmoid(0) on '2' and on '3'
    assert traj.token_rewards == pytest.approx(expected)
    pool.close()


def test_math_shepherd_labels_from_the_policys_continuations() -> None:
    """Rows cut every token: the steps join into the completion, each non-final label is a share of N
    continuations (a multiple of 1/N; hard: 0 or 1) and the final label is the completion's correctness."""
    from reinforge.data.arithmetic import arithmetic_problem
    from reinforge.eval.cli_eval import build_eval_engine
    from reinforge.orchestrate.state_values import CutSettings
    from reinforge.rewards.imported import resolve_verifier
    from reinforge.rm.label import label_steps
    from reinforge.rollout.types import SamplingParams

    engine = build_eval_engine("tiny-base", 0)
    verify = resolve_verifier("exact_match")
    tasks = [arithmetic_problem(i, 2, "+") for i in (1234, 5678, 4321)]
    params = SamplingParams(max_new_tokens=8)
    for hard in (False, True):
        rows = label_steps(engine, verify, tasks, params, samples=2, rollouts=4, cut=CutSettings(4, "tokens", 1, 19),
                           hard=hard)
        assert len(rows) == 6
        for row in rows:
            task = next(t for t in tasks if t.id == row["task_id"])
            assert len(row["labels"]) == len(row["completions"]) >= 1
            assert row["labels"][-1] == float(verify(task, "".join(row["completions"])).correct)
            allowed = {0.0, 1.0} if hard else {k / 4 for k in range(5)}
            assert set(row["labels"][:-1]) <= allowed


def test_best_of_k_picks_the_highest_scored_sample() -> None:
    import numpy as np

    from reinforge.eval.rerank import best_of

    correct = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    scores = np.array([[0.1, 0.9, 0.5], [0.2, 0.2, 0.7]])
    assert best_of(correct, scores, 1).tolist() == [0.0, 1.0]  # only the first sample
    assert best_of(correct, scores, 2).tolist() == [1.0, 1.0]  # a tie goes to the first
    assert best_of(correct, scores, 3).tolist() == [1.0, 0.0]


def test_reinforge_eval_reranks_with_a_prm(tmp_path) -> None:
    """--rerank with a PRM run's model: best-of-k lands in the results, its separator read from the run."""
    from reinforge.eval.cli_eval import run_eval
    from reinforge.rm.model import build_reward_model, save_reward_model

    model, tok = build_reward_model("tiny-base", 1, per="token")
    run = tmp_path / "prm-run"
    save_reward_model(model, tok, run / "model")
    (run / "config.yaml").write_text("data:\n  step_separator: ''\n")
    result = run_eval(["tiny-base"], "arithmetic", None, samples=4, temperature=1.0, max_new_tokens=8,
                      heldout_size=20, seed=0, ks=[1, 4], n_boot=50, rerank={"path": run / "model", "steps": "min"})
    best = result["models"]["tiny-base"]["best_of_k"]
    assert set(best) == {"1", "4"}
    # an untrained PRM scores every step sigmoid(0): all ties, so best-of-k is the first sample, as is mean@1's
    assert best["1"] == best["4"]
