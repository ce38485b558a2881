"""The README, docs/*.md and benchmarks/BENCHMARKS.md speak of the project only: not of how the work on it
was organised (who ran what in which sitting, whose deadline, which private design file). Technical uses of
the same words stay: a process session (``setsid``, bubblewrap's ``--new-session``), an HTTP
``requests.Session``, a helper process or function."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", ROOT / "benchmarks" / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]

ORGANISATION = {
    # a sitting of work ("this session", "second session"), not a process session or an HTTP session object
    "session": re.compile(r"(?<!process )(?<!new-)(?<!\.)\bsessions?\b", re.IGNORECASE),
    # a numbered step of a work plan ("stop 32")
    "stop N": re.compile(r"\bstop \d+\b", re.IGNORECASE),
    # a person or worker, not a helper process/function/thread/module
    "helper": re.compile(r"\bhelpers?(?:'s?)?\b(?! (?:process|function|method|thread|module|script|class)e?s?\b)",
                         re.IGNORECASE),
    "subagent": re.compile(r"\bsub-?agents?\b", re.IGNORECASE),
    # a design file that is not in the repository
    "shared/DESIGN.md": re.compile(r"shared/DESIGN\.md"),
    # the instructions a worker was given
    "the brief": re.compile(r"\b(?:the brief|brief's)\b", re.IGNORECASE),
    # other workers loading the machine (an RL agent is "the agent", "both agents' scores")
    "other agents": re.compile(r"\bother\s+agents\b", re.IGNORECASE),
    "my own": re.compile(r"\bmy own\b", re.IGNORECASE),
}


def organisation_words(text: str) -> list[tuple[int, str, str]]:
    """(line number, rule, matched text) of every word about how the work was organised."""
    return [(n, rule, m.group(0)) for n, line in enumerate(text.splitlines(), 1)
            for rule, pattern in ORGANISATION.items() for m in pattern.finditer(line)]


def test_docs_speak_of_the_project_only():
    found = [f"{path.relative_to(ROOT).as_posix()}:{n}: {hit!r} ({rule})"
             for path in FILES for n, rule, hit in organisation_words(path.read_text())]
    assert found == [], "words about how the work was organised (say it of the project):\n" + "\n".join(found)


def test_the_rules_catch_organisation_and_leave_technical_uses():
    bad = ("measured in this session", "(2026-11-23, second session)", "after the sampler (stop 32: ...)",
           "RePO, another helper's strategy", "ask a helper", "a subagent ran it", "see `shared/DESIGN.md`",
           "the 60 s the brief allows", "Of the brief's other ideas", "shared with about 6 other agents",
           "my own short measurements", "Sessions were short")
    assert [bool(organisation_words(line)) for line in bad] == [True] * len(bad)
    good = ("in a new process session (`setsid`)", "`bwrap --new-session --die-with-parent`",
            "an HTTP `requests.Session` per worker", "the backend's helper processes are added",
            "a helper function in tests", "both agents' scores", "the run stops at step 3",
            "classic.train.stop_at_return=475", "stop strings", "a brief pause", "your own reward function")
    assert [organisation_words(line) for line in good] == [[]] * len(good)
