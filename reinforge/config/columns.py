"""``task.columns``: which columns of a data file hold what (docs/data.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ColumnsConfig(BaseModel):
    """Which columns hold what. ``None`` = not used.

    - ``prompt``: raw text or a list of ``{"role", "content"}`` messages (required).
    - ``answer``: the reference answer, read as ``str`` (``None``: no answer, ``Task.answer == ""``).
    - ``id``: unique task ids (default: the reader's, e.g. ``"<file stem>:<row index>"``).
    - ``system``: a per-row system prompt, put first in the prompt's messages.
    - ``images``: a picture or a list of them (a path relative to the file, bytes, a PIL image) -> ``Task.images``.
    - ``tests``: unit tests for the ``code_tests`` verifier: a string or list of assert strings
      (-> ``metadata["asserts"]``), a list of ``{"input", "output"}`` (-> ``metadata["io"]``), or an
      object with ``asserts`` and/or ``io``.
    - ``difficulty``, ``source``: copied to ``metadata["difficulty"]`` / ``metadata["source"]``
      (evaluation reports break results down by these keys).
    - ``metadata``: columns copied into ``metadata`` under their own names; ``None`` (default)
      copies every column not named above, ``[]`` copies none.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    prompt: str = "prompt"
    answer: str | None = "answer"
    id: str | None = None
    system: str | None = None
    images: str | None = None
    tests: str | None = None
    difficulty: str | None = None
    source: str | None = None
    metadata: list[str] | None = Field(None, description="columns copied into Task.metadata; null = all other columns")

    def named(self) -> dict[str, str]:
        """Role -> column, for the roles in use."""
        roles = ("prompt", "answer", "id", "system", "images", "tests", "difficulty", "source")
        return {r: c for r in roles if (c := getattr(self, r)) is not None}
