"""Sentence BLEU as BLEUBERI computes it (Chang et al. 2025, arXiv:2505.11080): Hugging Face ``evaluate``'s
``bleu`` metric with ``smooth=True`` on one hypothesis and its references, in pure Python.

- Tokens: the ``13a`` tokenizer (``mteval-v13a``, as in sacrebleu and ``evaluate``): ``<skipped>`` dropped,
  hyphenated line breaks joined, newlines made spaces, ``&quot; &amp; &lt; &gt;`` unescaped; then
  ASCII punctuation and symbols split off, except ``.`` and ``,`` between digits and ``-`` after a digit
  (which is split off on its own).
- Counts (Papineni et al. 2002): for n = 1..N (N = ``max_order``, 4), ``m_n`` = the hypothesis's n-grams
  clipped by their largest count in any one reference, ``l_n = max(len(h) - n + 1, 0)``.
- Smoothing (Lin and Och 2004, "add-one", what ``evaluate`` and tensorflow/nmt call ``smooth``):
  ``p_n = (m_n + 1) / (l_n + 1)`` for every n, unigrams included; without it ``p_n = m_n / l_n``
  (0 when ``l_n = 0``).
- ``BLEU = BP * exp(sum_n log(p_n) / N)`` (0 if some ``p_n`` is 0), ``BP = 1`` if ``len(h) > r`` else
  ``exp(1 - r / len(h))``, with ``r`` the length of the *shortest* reference (nmt's choice; sacrebleu
  takes the closest); an empty hypothesis or reference gives 0. The score is in [0, 1].

sacrebleu's ``sentence_bleu`` would give the same tokens but differs in smoothing (its default is
``exp``; its ``add-k`` leaves unigrams unsmoothed), reference length (closest) and scale (0-100).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

_13A_RULES = (
    (re.compile(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])"), r" \1 "),  # ASCII symbols and punctuation
    (re.compile(r"([^0-9])([\.,])"), r"\1 \2 "),  # . and , unless preceded by a digit
    (re.compile(r"([\.,])([^0-9])"), r" \1 \2"),  # . and , unless followed by a digit
    (re.compile(r"([0-9])(-)"), r"\1 \2 "),  # - after a digit
)
_ENTITIES = (("&quot;", '"'), ("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">"))


@lru_cache(maxsize=4096)
def tokenize_13a(text: str) -> tuple[str, ...]:
    """The ``13a`` tokens of ``text`` (the module docstring)."""
    line = text.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    if "&" in line:
        for entity, char in _ENTITIES:
            line = line.replace(entity, char)
    line = f" {line} "
    for pattern, repl in _13A_RULES:
        line = pattern.sub(repl, line)
    return tuple(line.split())


def ngram_counts(tokens: Sequence[str], max_order: int) -> Counter[tuple[str, ...]]:
    """Every n-gram of ``tokens`` for n = 1..max_order, with its count."""
    return Counter(tuple(tokens[i:i + n]) for n in range(1, max_order + 1) for i in range(len(tokens) - n + 1))


def sentence_bleu(hypothesis: str, references: Sequence[str], max_order: int = 4, smooth: bool = True) -> float:
    """BLEU of one hypothesis against its references, in [0, 1] (the module docstring). ValueError without a
    reference or with ``max_order < 1``."""
    if not references:
        raise ValueError("sentence_bleu needs at least one reference")
    if max_order < 1:
        raise ValueError(f"max_order must be >= 1, got {max_order}")
    hyp = tokenize_13a(hypothesis)
    refs = [tokenize_13a(r) for r in references]
    ref_len = min(len(r) for r in refs)
    if not hyp or ref_len == 0:
        return 0.0
    merged: Counter[tuple[str, ...]] = Counter()
    for ref in refs:
        merged |= ngram_counts(ref, max_order)
    matches = [0] * max_order
    for gram, count in (ngram_counts(hyp, max_order) & merged).items():
        matches[len(gram) - 1] += count
    precisions = []
    for n in range(1, max_order + 1):
        possible = max(len(hyp) - n + 1, 0)
        if smooth:
            precisions.append((matches[n - 1] + 1.0) / (possible + 1.0))
        else:
            precisions.append(matches[n - 1] / possible if possible else 0.0)
    if min(precisions) <= 0:
        return 0.0
    geo_mean = math.exp(sum(math.log(p) for p in precisions) / max_order)
    ratio = len(hyp) / ref_len
    brevity = 1.0 if ratio > 1.0 else math.exp(1.0 - 1.0 / ratio)
    return geo_mean * brevity
