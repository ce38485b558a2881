"""StepSearch: step-wise rewards for search agents, trained with PPO (Wang et al. 2025, "StepSearch:
Igniting LLMs Search Ability via Step-Wise Proximal Policy Optimization", arXiv:2505.15107; StePPO).

Each search turn k of an episode is scored against the task's gold evidence documents d*_1..d*_J
(the paper's supporting documents): with c_{k,j} = max over the documents retrieved at turn k of
their similarity to d*_j, and the memory m_{k,j} = max(m_{k-1,j}, c_{k,j}) of the best match so far
(m_{-1} = 0),

    IG_k = (1/J) sum_j max(c_{k,j} - m_{k-1,j}, 0)        information gain: new coverage of the gold
    P_k  = (number of turn k's documents retrieved at an earlier turn) / (number of turn k's documents)

and the turn's step reward lambda_s (IG_k - P_k) is a per-token reward on the last token of the turn
(the end of its search query), the outcome reward R on the last token of the episode. The advantage
is GAE with a critic over these per-token rewards (gamma = lam = 1 and whitened advantages, the
authors' configuration), so the critic's targets hold the step rewards too.

Split of the work: this module holds the tensor maths (``search_step_scores``, the estimator); the
similarities (TF-IDF cosine after SQuAD normalisation, as the authors' ``subm_tfidf_cosine``), the
retrieved documents (the lines of the environment's answers to each turn) and the gold evidence
(``task.metadata["evidence"]``) are orchestrate/search_steps.py's, the stage of the need
``search_steps``; it adds lambda_s (IG_k - P_k) to each row's ``token_rewards``, which the estimator
reads like ``gae`` does. Read in the authors' code (github.com/Zillwang/StepSearch:
verl/utils/reward_score/qa_step.py ``step_information_gain``, verl/trainer/main_ppo.py, train.sh):
lambda_s = 0.6 (``step_reward_scale``), both terms on. Departures: their search-key reward (the
F1 of the queries against annotated sub-question keywords, weight 0.618, from their MuSiQue
pipeline) is not reproduced: the tasks carry no keywords; the outcome is the run's reward R (the
environment's exact match), not their answer F1 with a -1 format penalty.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from reinforge.algo.advantage_estimators import ADVANTAGES, GAESettings, gae_advantage


class StepSearchSettings(GAESettings):
    """StePPO: GAE's options (the authors' gamma = lam = 1) and the weights of the step rewards."""

    gamma: float = Field(1.0, ge=0, le=1, description="discount of the per-token rewards (the authors': 1)")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda (the authors': 1)")
    step_scale: float = Field(0.6, ge=0, description="lambda_s: weight of each search turn's IG - P (the "
                              "authors' step_reward_scale: 0.6)")
    information_gain: bool = Field(True, description="reward each search turn's information gain IG_k")
    redundancy_penalty: bool = Field(True, description="subtract each search turn's redundancy P_k")


def search_step_scores(similarity: Tensor, repeated: Tensor, retrieved: Tensor) -> tuple[Tensor, Tensor]:
    """(IG [K], P [K]) of one episode's K turns: ``similarity`` [K, J] is c_{k,j} (0 for a turn that
    retrieved nothing), ``repeated`` [K] and ``retrieved`` [K] count turn k's documents seen at an
    earlier turn and all of them. No gold document (J = 0): IG = 0."""
    c = similarity.to(torch.float64)
    if c.shape[1] == 0:
        gain = torch.zeros(c.shape[0], dtype=torch.float64)
    else:
        memory = torch.cat([c.new_zeros(1, c.shape[1]), c.cummax(dim=0).values[:-1]], dim=0).clamp(min=0)
        gain = (c - memory).clamp(min=0).mean(dim=1)
    penalty = repeated.to(torch.float64) / retrieved.to(torch.float64).clamp(min=1)
    return gain, penalty


@ADVANTAGES.register(
    "stepsearch",
    formula="r_t = R [t = last] + lambda_s (IG_k - P_k) [t = last token of search turn k], IG_k = mean_j "
            "max(c_{k,j} - max_{m<k} c_{m,j}, 0), P_k = repeated / retrieved documents; A = GAE(gamma, lam) with "
            "a critic, whitened",
    paper="Wang et al. 2025, StepSearch: Step-Wise Proximal Policy Optimization (StePPO, arXiv:2505.15107)",
    needs=("values", "search_steps"),
    settings=StepSearchSettings,
)
def stepsearch_advantage(rewards: Tensor, mask: Tensor, values: Tensor | None, cfg: StepSearchSettings,
                         token_rewards: Tensor | None = None) -> Tensor:
    """StePPO's advantage: ``gae`` over the outcome and the step rewards the need ``search_steps`` put in
    ``token_rewards`` (module docstring)."""
    return gae_advantage(rewards, mask, values, cfg, token_rewards)
