"""Code-interpreter environment in the style of ReTool (Feng et al. 2025, "ReTool: Reinforcement Learning
for Strategic Tool Use in LLMs"): the model writes Python, the sandbox runs it, the model continues from
its output and finally gives an integer answer, rewarded by outcome only.

Episode: reset -> the task prompt as a user message (``"sum 17..342="``). A turn with ``<tool_call>``
blocks calls the ``python`` tool: each program runs in `reinforge.sandbox` (a fresh subprocess under
resource limits, never in-process; 40-100 ms per run here) and its stdout comes back as a ``tool``
message (a crash, a timeout or too much output is an ``error: ...`` result). The first turn without a
tool call is the final answer: reward 1.0 when its last integer equals the task's answer. More than
``max_tool_calls`` calls end the episode with reward 0. ReTool masks interpreter output out of the loss;
here observations are never trained on either (multi-turn loss mask).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from reinforge.envs.calculator import CalculatorEnv
from reinforge.envs.tools import Toolbox, python_tool
from reinforge.sandbox import SandboxLimits

OUTPUT_BYTES = 64 << 10  # the sandbox kills a program printing more
TOOLBOX_GRACE_S = 2.0  # the toolbox waits this much longer than the sandbox, so the sandbox ends a long run


def _checked(name: str, value: float, low: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= low:
        raise ValueError(f"{name} must be a number >= {low:g}, got {value!r}")
    return float(value)


@cache
def code_toolbox(timeout_s: float = 3.0, memory_mb: int = 256, max_output_chars: int = 300) -> Toolbox:
    """A toolbox with one ``python(code)`` tool run in the sandbox (``timeout_s`` wall and CPU seconds,
    ``memory_mb`` of address space); its stdout without trailing newlines, cut at ``max_output_chars``.
    Shared between environments (cached): it holds the limits and the sandbox backend, no episode state."""
    limits = SandboxLimits(timeout_s=timeout_s, cpu_s=timeout_s, memory_mb=memory_mb, output_bytes=OUTPUT_BYTES)
    run = python_tool(limits, max_output_chars=OUTPUT_BYTES)  # the toolbox cuts the result, once
    return Toolbox([_stripped(run)], timeout_s=timeout_s + TOOLBOX_GRACE_S, max_output_chars=max_output_chars)


def _stripped(run: Callable[[str], str]) -> Callable[[str], str]:
    def python(code: str) -> str:
        """Run a Python program and return what it prints.

        Args:
            code: A complete Python program; print the values you need.
        """
        return run(code).rstrip("\n") or "(no output)"

    return python


class CodeInterpreterEnv(CalculatorEnv):
    """ReTool-style tool use: ``python`` calls run in the sandbox, then a final integer answer.

    Scoring, limits and ``info`` (``tool_calls``, ``tool_errors``, ``correct``, ``reason``) are those of
    `CalculatorEnv`; only the tool differs. ``timeout_s`` bounds each program's wall-clock and CPU
    time, ``memory_mb`` its memory, ``max_output_chars`` the text the model sees of each result.
    """

    def __init__(
        self, max_tool_calls: int = 3, timeout_s: float = 3.0, memory_mb: int = 256, max_output_chars: int = 300,
        system_prompt: str | None = None,
    ) -> None:
        timeout_s = _checked("timeout_s", timeout_s, 0.1)
        memory_mb = int(_checked("memory_mb", memory_mb, 32))
        max_output_chars = int(_checked("max_output_chars", max_output_chars, 1))
        super().__init__(code_toolbox(timeout_s, memory_mb, max_output_chars), max_tool_calls, system_prompt)
