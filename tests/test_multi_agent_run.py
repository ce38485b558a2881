"""A tiny multi-agent training run in the default suite (docs/multi_agent.md): tiny-agent plays `first` in
Nim against the random opponent (`second`) with `at_grpo`. Checked on the run's own batches and policy:

- every advantage the learner trained on equals AT-GRPO recomputed here from the logged turn roles and
  per-role rewards (groups of the same prompt, role and turn index; alpha * team return + role return);
- the trained role's expected reward, computed exactly from the policy's move probabilities over the
  whole game tree (no sampling), rises from the first policy to the last.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from reinforge.types import Trajectory

RUN = ["env.opponent=random", "env.policy_role=first", "env.max_turns=3", "task.low=3", "task.high=5",
       "task.repeats=4", "task.heldout_size=2", "train.steps=3", "rollout.prompts_per_step=4", "rollout.group_size=8",
       "train.lr=2e-3", "train.time_limit_s=0", "eval.final_samples=0", "log.report=false", "log.samples_per_step=0"]
PILES = (3, 4, 5)


def hand_at_grpo(kept: list[Trajectory], alpha: float, gamma: float, eps: float) -> dict[tuple[int, int], float]:
    """AT-GRPO from the trajectories' metadata: {(row, turn): advantage} over the trained turns."""
    samples: dict[tuple[int, str, int], list[tuple[int, float]]] = {}
    for row, t in enumerate(kept):
        steps = t.metadata["role_rewards"]
        for k, ((a, b), role) in enumerate(zip(t.turn_spans, t.metadata["turn_roles"], strict=True)):
            if not t.trainable or not any(t.loss_mask[a:b]):
                continue
            team = sum(gamma ** (m - k) * r for m, r in enumerate(t.turn_rewards) if m >= k)
            own = sum(gamma ** (m - k) * steps[m].get(role, 0.0) for m in range(k, len(steps)))
            samples.setdefault((t.group_id, role, k), []).append((row, alpha * team + own))
    out = {}
    for (_, _, k), members in samples.items():
        rewards = [r for _, r in members]
        mean = statistics.fmean(rewards)
        std = statistics.stdev(rewards) if len(rewards) > 1 else 0.0
        for row, r in members:
            out[(row, k)] = (r - mean) / (std + eps) if len(rewards) > 1 else 0.0
    return out


def expected_first_reward(model, tok, pile: int) -> float:
    """E[reward of `first`] against the random opponent: +1 win, -1 loss or forfeit, from the policy's
    probabilities of '1' and '2' at every state (the conversation rendered by the chat template)."""
    ids = {m: tok.convert_tokens_to_ids(str(m)) for m in (1, 2)}

    def value(messages: list[dict], left: int) -> float:
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        with torch.no_grad():
            probs = model(torch.tensor([prompt])).logits[0, -1].float().softmax(-1)
        total = -(1.0 - sum(float(probs[i]) for i in ids.values()))  # any other move forfeits: -1
        for move, token in ids.items():
            p = float(probs[token])
            rest = left - move
            if rest < 0:  # more than the pile: a forfeit too
                total -= p
            elif rest == 0:  # the last one: a win
                total += p
            else:  # the random opponent takes 1 or 2 (what the pile allows), then it is our turn again
                opp = [m for m in (1, 2) if m <= rest]
                for taken in opp:
                    after = rest - taken
                    outcome = -1.0 if after == 0 else value(
                        [*messages, {"role": "assistant", "content": str(move)},
                         {"role": "user", "content": f"they took {taken}, left {after}: first"}], after)
                    total += p * outcome / len(opp)
        return total

    return float(value([{"role": "user", "content": f"nim {pile}: first, take 1 or 2"}], pile))


def _run(tmp_path, monkeypatch, seed: int):
    import reinforge.orchestrate.loop as loop
    from reinforge.config import load_config
    from reinforge.orchestrate.run import train

    batches = []
    original = loop.build_batch

    def recording(trajs, *args, **kwargs):
        batch, counts = original(trajs, *args, **kwargs)
        batches.append((list(trajs), batch))  # the learner fills batch.advantages in place
        return batch, counts

    monkeypatch.setattr(loop, "build_batch", recording)
    cfg = load_config("multi_agent_nim", [f"output_dir={tmp_path}", f"seed={seed}", *RUN])
    return cfg, train(cfg), batches


def test_a_tiny_run_trains_on_at_grpo_advantages_and_raises_the_trained_roles_reward(tmp_path, monkeypatch):
    from reinforge.learn.checkpoint import latest_checkpoint
    from reinforge.models.loading import load_model, load_tokenizer

    cfg, result, batches = _run(tmp_path, monkeypatch, seed=0)
    assert len(batches) == 3
    settings = cfg.algo.advantage.settings
    assert cfg.algo.advantage == "at_grpo" and settings.scale_by_std
    alpha, eps, gamma = settings.alpha, settings.adv_eps, cfg.algo.discount.gamma
    checked = 0
    for kept, batch in batches:
        assert batch is not None and batch.advantages is not None
        expected = hand_at_grpo(kept, alpha, gamma, eps)
        for (row, k), adv in expected.items():
            a, b = kept[row].turn_spans[k]
            got = batch.advantages[row, a:b][batch.loss_mask[row, a:b] > 0]
            assert torch.allclose(got, torch.full_like(got, adv), atol=1e-5), (row, k, got, adv)
            checked += 1
        trained = {(row, k) for row, t in enumerate(kept) for k, (a, b) in enumerate(t.turn_spans)
                   if t.trainable and any(t.loss_mask[a:b])}
        assert set(expected) == trained
        assert any(abs(v) > 0.1 for v in expected.values())  # not a run of all-equal groups
    assert checked > 50

    tok = load_tokenizer("tiny-agent")
    before = load_model("tiny-agent", "float32", "cpu").eval()
    after = load_model(str(latest_checkpoint(result.run_dir)), "float32", "cpu").eval()
    v0 = statistics.fmean(expected_first_reward(before, tok, p) for p in PILES)
    v1 = statistics.fmean(expected_first_reward(after, tok, p) for p in PILES)
    assert v1 >= v0 + 0.1, (v0, v1)


@pytest.mark.parametrize("pile", [1, 2, 3])
def test_expected_reward_of_a_policy_that_always_takes_one(pile):
    """The game-tree expectation against a hand-computed case: a policy that always says '1'. Pile 1: it
    takes the last, +1. Pile 2: it leaves 1, the random opponent takes it, -1. Pile 3: it leaves 2; the opponent
    takes 2 (-1) or 1, and then '1' takes the last (+1): 0."""

    class Ones(torch.nn.Module):
        def __init__(self, vocab: int, one: int) -> None:
            super().__init__()
            self.vocab, self.one = vocab, one

        def forward(self, ids):
            logits = torch.full((1, ids.shape[1], self.vocab), -1e9)
            logits[..., self.one] = 0.0
            return type("Out", (), {"logits": logits})()

    from reinforge.models.loading import load_tokenizer

    tok = load_tokenizer("tiny-agent")
    model = Ones(len(tok), tok.convert_tokens_to_ids("1"))
    assert expected_first_reward(model, tok, pile) == pytest.approx({1: 1.0, 2: -1.0, 3: 0.0}[pile])
