"""``demonstrations``: given answers to train on with a supervised term (SFT, or mixed into RL)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from reinforge.config.base import Part, PartRef, _Strict


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
