"""``demonstrations``: given answers to train on with a supervised term (SFT, or mixed into RL)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from reinforge.config.base import Part, PartRef, _Strict

# a ``reinforge.config.run.RunConfig`` (not imported: run.py calls check_demonstrations, so no cycle)
RunConfig = Any


class DemonstrationColumns(_Strict):
    """Column names of a demonstrations table: chat rows, or prompt/completion rows."""

    messages: str = Field("messages", description="a list of {role, content}; every assistant message is trained on")
    prompt: str = Field("prompt", description="text or chat messages, encoded as rollout prompts are")
    completion: str = Field("completion", description="the answer (trained on, with the end-of-sequence token)")


class DemonstrationsConfig(_Strict):
    """Where demonstrations come from and how each step's batch uses them (docs/sft.md)."""

    path: str | None = Field(None, description="JSONL, CSV or Parquet file, or a datasets directory, of "
                             "demonstrations; 'task': the run's training tasks with their reference answers")
    split: str | None = Field(None, description="split of a datasets directory")
    per_step: int = Field(16, ge=1, description="demonstration rows in each step's batch")
    mix: bool = Field(False, description="false: each step trains on demonstrations only (SFT); true: "
                      "per_step demonstrations join every RL batch (their own term, e.g. nll, trains on them)")
    placement: Literal["own_group", "in_group"] = Field(
        "own_group", description="own_group: each demonstration a group of its own, trained on by its terms (SFT, "
        "CHORD); in_group (LUFFY, needs mix: true): each rollout group gains its prompt's demonstration as a "
        "member, scored by the verifier, and per_step is not used")
    guidance: Annotated[PartRef, Part("demo_guidance")] = Field(
        "every_group", validate_default=True, description="with placement in_group: which groups gain their prompt's demonstration and "
        "how (every_group: LUFFY, all of them; failed_groups: PVPO, in place of a sample of a group that all failed)")
    columns: DemonstrationColumns = Field(default_factory=DemonstrationColumns)


class PreferenceColumns(_Strict):
    """Column names of a preference table."""

    prompt: str = Field("prompt", description="text or chat messages, encoded as rollout prompts are")
    chosen: str = Field("chosen", description="the preferred answer")
    rejected: str = Field("rejected", description="the other answer")


class PreferencesConfig(_Strict):
    """Preference pairs for offline preference learning (DPO, IPO; docs/sft.md): each step trains on
    ``per_step`` pairs, a group of two given rows each (chosen reward 1, rejected 0)."""

    path: str | None = Field(None, description="JSONL, CSV or Parquet file, or a datasets directory, of "
                             "{prompt, chosen, rejected}; 'task': the training tasks, the reference answer over a "
                             "wrong number next to it")
    split: str | None = Field(None, description="split of a datasets directory")
    per_step: int = Field(16, ge=1, description="pairs in each step's batch")
    columns: PreferenceColumns = Field(default_factory=PreferenceColumns)


def check_demonstrations(cfg: RunConfig) -> None:
    """A part that trains on demonstrations needs them, and demonstrations need such a part."""
    from reinforge.algo.objective import required_inputs
    from reinforge.algo.policy_losses import POLICY_LOSSES

    needs, d = required_inputs(cfg.algo), cfg.demonstrations
    if "demonstrations" in needs and d.path is None:
        raise ValueError("algo: a part trains on demonstrations (e.g. nll, luffy); set demonstrations.path "
                         "(a file, or 'task' for the task's reference answers)")
    if d.path is not None and "demonstrations" not in needs:
        raise ValueError("demonstrations.path: no part of algo trains on demonstrations; add algo.loss_terms: "
                         "[{name: nll, coef: 1.0}] (or run reinforge sft)")
    if d.path is not None and not d.mix and cfg.orchestrate.mode == "async":
        raise ValueError("demonstrations.mix=false trains on demonstrations only: there is no rollout to run "
                         "asynchronously; use orchestrate.mode=sync")
    guided = "demonstrations" in POLICY_LOSSES.needs(cfg.algo.policy_loss)
    if d.path is not None and guided != (d.placement == "in_group"):
        raise ValueError(f"demonstrations.placement={d.placement}: algo.policy_loss={cfg.algo.policy_loss} "
                         + ("trains on demonstrations in the rollout groups; set demonstrations.placement=in_group"
                            if guided else "does not train on demonstrations in a group; use placement=own_group "
                            "or a policy loss that does (luffy)"))
    if d.placement == "in_group" and not d.mix:
        raise ValueError("demonstrations.placement=in_group adds demonstrations to rollout groups; set "
                         "demonstrations.mix=true")
    if d.path is not None and "values" in needs:
        raise ValueError("demonstrations: not supported with a critic (algo.advantage=gae): the value model "
                         "would fit the demonstrations' rewards")
