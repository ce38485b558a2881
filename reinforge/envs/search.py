"""Search environment in the style of Search-R1 (Jin et al. 2025) and ZeroSearch (Sun et al. 2025): the
model calls a local ``search(query)`` tool, reads the top-k passages and answers; exact match scores it.

Retrieval is BM25 over the corpus of `reinforge.data.search_corpus` (fictional facts built from a seed,
so answers cannot be guessed without searching), like Search-R1's local retriever and unlike a live
engine: no network, no API cost, and documents of known quality (ZeroSearch's two complaints).

BM25 comes from ``bm25s``: a maintained library (2024-, regular releases) that needs only numpy,
precomputes each document's term scores into a sparse matrix at indexing time (a query is a sparse
lookup, a few milliseconds for thousands of passages) and reproduces the Lucene BM25 variant;
``rank_bm25`` is the older alternative, unreleased since 2022 and scoring every document per query.

Episode: reset -> the question (``"capital of Zorvia?"``). A turn with ``<tool_call>`` blocks runs each
``search``; the observation is one ``tool`` message per call with the top ``k`` passages, one a line
(passages sharing no word with the query are left out; none left: ``no results``). The first turn
without a tool call is the answer: reward 1.0 when it equals ``task.answer`` after SQuAD-style
normalisation (lower case, punctuation and articles dropped; an ``<answer>...</answer>`` span, when
present, is what is compared), else 0.0. More than ``max_tool_calls`` calls: reward 0, done.
"""

from __future__ import annotations

import re
import string
import threading
from functools import cache
from typing import Any

import bm25s
import numpy as np

from reinforge.data.search_corpus import corpus
from reinforge.envs.base import Message
from reinforge.envs.calculator import CalculatorEnv, task_messages
from reinforge.envs.tools import Toolbox, ToolError
from reinforge.types import Task

_ANSWER_SPAN = re.compile(r"<answer>(.*?)</answer>", re.S)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


class SearchIndex:
    """A BM25 index over ``passages`` (lower-cased words of 2+ characters, no stemming, no stop words).
    Read-only after construction and shared between threads; `search` is serialised by a lock."""

    def __init__(self, passages: tuple[str, ...]) -> None:
        self.passages = passages
        self._bm25 = bm25s.BM25()
        self._bm25.index(bm25s.tokenize(list(passages), stopwords=None, show_progress=False), show_progress=False)
        self._lock = threading.Lock()

    def search(self, query: str, k: int) -> list[str]:
        """The up-to-``k`` best passages for ``query``, best first; passages scoring 0 are left out."""
        words = bm25s.tokenize([query], stopwords=None, show_progress=False, return_ids=False)
        if not words[0]:
            return []
        with self._lock:
            found = self._bm25.retrieve(words, k=min(k, len(self.passages)), show_progress=False)
        docs, scores = np.asarray(found.documents)[0], np.asarray(found.scores)[0]
        return [self.passages[int(d)] for d, s in zip(docs, scores, strict=True) if s > 0]


@cache
def search_index(countries: int, corpus_seed: int, names: str = "syllables", layout: str = "value_last") -> SearchIndex:
    """The index of ``corpus(countries, corpus_seed, names, layout)``, built once per process."""
    return SearchIndex(corpus(countries, corpus_seed, names, layout)[1])


def normalize_answer(text: str) -> str:
    """SQuAD / Search-R1 exact-match normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def final_answer(text: str) -> str:
    """The answer in a final turn: the last ``<answer>...</answer>`` span if there is one, else the whole text."""
    spans = _ANSWER_SPAN.findall(text)
    return spans[-1] if spans else text


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class SearchEnv(CalculatorEnv):
    """Question answering with a ``search`` tool over the task's corpus, scored by exact match.

    The episode, limits and ``info`` are `CalculatorEnv`'s (``tool_calls`` and ``tool_errors`` on every
    step; ``correct`` on the last, and ``reason`` when the tool-call limit ended it); the tool and
    the scoring differ. A task must carry ``countries`` and ``corpus_seed`` (and ``names`` unless it
    is ``syllables``, ``layout`` unless it is ``value_last``) in its metadata (`reinforge.data.search_corpus.search_splits` tasks do).
    """

    def __init__(self, k: int = 3, max_tool_calls: int = 3, max_query_chars: int = 200,
                 system_prompt: str | None = None) -> None:
        self.k, self.max_query_chars = _positive_int("k", k), _positive_int("max_query_chars", max_query_chars)
        self.index: SearchIndex | None = None
        super().__init__(Toolbox([self.search], timeout_s=10.0, max_output_chars=100 * k + 200), max_tool_calls,
                         system_prompt)

    def search(self, query: str) -> str:
        """Search the knowledge base and return the best matching passages, one per line.

        Args:
            query: Words to look for, e.g. capital of Zorvia
        """
        if self.index is None:
            raise ToolError("no episode is running")
        if len(query) > self.max_query_chars:
            raise ToolError(f"query too long ({len(query)} > {self.max_query_chars} chars)")
        found = self.index.search(query, self.k)
        return "\n".join(found) if found else "no results"

    def reset(self, task: Task, seed: int = 0) -> list[Message]:
        try:
            index = search_index(int(task.metadata["countries"]), int(task.metadata["corpus_seed"]),
                                 str(task.metadata.get("names", "syllables")),
                                 str(task.metadata.get("layout", "value_last")))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"SearchEnv needs a task from search_splits (metadata 'countries' and 'corpus_seed'); "
                             f"task {task.id!r} has metadata {task.metadata!r}: {e}") from None
        self.task, self.index, self.answer = task, index, normalize_answer(task.answer)
        self.calls, self.errors, self.done = 0, 0, False
        return task_messages(task, self.system_prompt)

    def is_correct(self, text: str) -> bool:
        """Exact match of the final answer (its ``<answer>`` span, if any) after normalisation."""
        return normalize_answer(final_answer(text)) == self.answer
