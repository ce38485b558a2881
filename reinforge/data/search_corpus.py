"""A corpus of facts about fictional countries, built deterministically from a seed, and its questions.

Every name is made of random syllables (``Zorvia``, ``Qelmu``), distinct from every other name in the
corpus, so no answer can be guessed without reading the corpus. Each country has one passage per
relation::

    The capital of Zorvia is Qelmu.
    The leader of Zorvia is Tarok.
    The currency of Zorvia is the Vobel.

Questions (`search_splits`): single-hop ``"capital of Zorvia?"`` -> ``Qelmu``; with ``hops=2`` the
country is named through its leader, ``"capital of the land led by Tarok?"`` -> ``Qelmu`` (a first
search finds the country, a second its capital). The same ``(countries, corpus_seed)`` always gives
the same corpus; tasks carry both in their metadata, so the search environment finds the corpus of
each task by itself (`corpus` is cached: built once per process, then shared read-only).

``names="digits"`` names each country by a distinct 4-digit id instead (``land 4821``), for models that
can copy digits but not letters from the prompt (the shipped char-level tiny models): ``"The capital of
land 4821 is Qelmu."``, question ``"capital of land 4821?"``, query ``capital of land 4821``. The
values (capitals, leaders, currencies) are the same invented names as with ``names="syllables"`` (the
default), so they still cannot be guessed; BM25 indexes the id as one word (``4821``), the rarest word
of the query. ``names="ids"`` names the values by ids too, all ids distinct (``"The capital of land 4821
is city 3917."`` -> ``city 3917``; leaders ``chief 5120``, currencies ``coin 7716``): for models that
cannot copy letters from a tool's result at all (the agent_search recipe; docs/agent_model.md). Still
not guessable: 4 random digits. ``hops=2`` works with every style (its question names the leader).

``layout="value_first"`` states each fact value first, ``"city 3917 is the capital of land 4821."`` (default
``"value_last"``: ``"The capital of land 4821 is city 3917."``): the value then opens the passage, so the
top passage's value is the first thing in the tool's result, where a code_interpreter output is, which
a small model copies far more easily than a value at the end of a line (docs/agent_model.md). The facts,
questions and answers are the same; only the passages' word order differs (BM25 ignores it).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from functools import cache, partial

from reinforge.data.base import TaskSplits
from reinforge.data.grid import grid_splits
from reinforge.types import Task

RELATIONS = ("capital", "leader", "currency")
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kl", "tr", "qu", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "eo")
_CODAS = ("", "", "", "n", "r", "l", "m", "s", "k")
MAX_COUNTRIES = 2000
NAME_STYLES = ("syllables", "digits", "ids")
LAYOUTS = ("value_last", "value_first")
ID_PREFIXES = ("land", "city", "chief", "coin")  # names="ids": country, capital, leader, currency


@dataclass(frozen=True)
class Country:
    name: str
    capital: str
    leader: str
    currency: str


def _name(rng: random.Random) -> str:
    syllables = rng.choice((2, 2, 3))
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
    return word.capitalize()


def passage(country: Country, relation: str, layout: str = "value_last") -> str:
    """The corpus sentence stating ``relation`` of ``country`` (``layout``: see the module docstring)."""
    value = getattr(country, relation)
    if layout == "value_first":
        return f"{value} is the {relation} of {country.name}."
    return f"The {relation} of {country.name} is {'the ' if relation == 'currency' else ''}{value}."


def _check_names(names: str) -> str:
    if names not in NAME_STYLES:
        raise ValueError(f"names must be one of {', '.join(NAME_STYLES)}, got {names!r}")
    return names


def _check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    return layout


@cache
def corpus(countries: int = 200, corpus_seed: int = 0, names: str = "syllables", layout: str = "value_last",
           ) -> tuple[tuple[Country, ...], tuple[str, ...]]:
    """``countries`` fictional countries and their passages (one per country and relation, in that order).

    Names never repeat and none is a word of another fact's text, so every fact has exactly one
    passage and one answer. ``names="digits"``: each country's name is ``land <id>`` with a distinct
    4-digit id (drawn from its own seeded stream; every value is the same as with ``"syllables"``).
    ``names="ids"``: every entity is a prefix and a 4-digit id, all ids distinct (``land 4821``,
    ``city 3917``, ``chief 5120``, ``coin 7716``). ``layout`` orders each passage's words (the countries do
    not depend on it).
    Deterministic in ``(countries, corpus_seed, names, layout)`` (a larger corpus extends a smaller one of the
    same seed for syllables; digit ids are a seeded sample, not always a prefix of a larger one); cached.
    """
    if isinstance(countries, bool) or not isinstance(countries, int) or not 2 <= countries <= MAX_COUNTRIES:
        raise ValueError(f"countries must be an integer in 2..{MAX_COUNTRIES}, got {countries!r}")
    _check_names(names), _check_layout(layout)
    rng = random.Random(f"search-corpus-{corpus_seed}")
    reserved = {"The", "Of", "Is", "Land", "Led", "By"}
    words: list[str] = []
    while len(words) < countries * (1 + len(RELATIONS)):
        name = _name(rng)
        if name not in reserved and 4 <= len(name) <= 9:
            reserved.add(name)
            words.append(name)
    people = [Country(*words[i * 4:i * 4 + 4]) for i in range(countries)]
    if names == "digits":
        ids = random.Random(f"search-corpus-ids-{corpus_seed}").sample(range(1000, 10000), countries)
        people = [dataclasses.replace(c, name=f"land {i}") for c, i in zip(people, ids, strict=True)]
    elif names == "ids":
        ids = random.Random(f"search-corpus-all-ids-{corpus_seed}").sample(range(1000, 10000), 4 * countries)
        people = [Country(*(f"{prefix} {ids[4 * i + j]}" for j, prefix in enumerate(ID_PREFIXES)))
                  for i in range(countries)]
    return tuple(people), tuple(passage(c, r, layout) for c in people for r in RELATIONS)


def search_task(index: int, countries: int, corpus_seed: int, hops: int, relations: tuple[str, ...],
                names: str = "syllables", layout: str = "value_last") -> Task:
    """Question ``index``: country ``index // len(relations)``, relation ``relations[index % len(relations)]``.
    ``metadata["evidence"]``: the gold passages that answer it (with ``hops=2`` the leader's passage first),
    e.g. for StepSearch's information gain of retrieved documents (orchestrate/search_steps.py)."""
    country_index, r = divmod(index, len(relations))
    country, relation = corpus(countries, corpus_seed, names)[0][country_index], relations[r]
    subject = country.name if hops == 1 else f"the land led by {country.leader}"
    return Task(
        id=f"search-{hops}hop-{relation}-{country.name.replace(' ', '-')}",
        prompt=[{"role": "user", "content": f"{relation} of {subject}?"}],
        answer=getattr(country, relation),
        metadata={"countries": countries, "corpus_seed": corpus_seed, "names": names, "layout": layout, "hops": hops,
                  "relation": relation, "country": country.name, "leader": country.leader,
                  "evidence": [passage(country, r, layout) for r in (("leader",) if hops == 2 else ()) + (relation,)]},
    )


def search_splits(
    countries: int = 200, corpus_seed: int = 0, hops: int = 1, relations: str | list[str] | tuple[str, ...] = RELATIONS,
    heldout_size: int = 100, seed: int = 1234, names: str = "syllables", layout: str = "value_last",
) -> TaskSplits:
    """One question per country and relation in ``relations`` (``hops=2``: about the country whose leader is
    named; ``leader`` is then not asked), split by question (seeded); ``names``: how countries are named
    (``syllables``: ``Zorvia``; ``digits``: ``land 4821``); ``layout``: the passages' word order (module docstring)."""
    asked = tuple(r.strip() for r in relations.split(",")) if isinstance(relations, str) else tuple(relations)
    if not asked or any(r not in RELATIONS for r in asked) or len(set(asked)) != len(asked):
        raise ValueError(f"relations must be distinct names from {', '.join(RELATIONS)}, got {relations!r}")
    if hops not in (1, 2) or isinstance(hops, bool):
        raise ValueError(f"hops must be 1 or 2, got {hops!r}")
    if hops == 2:
        asked = tuple(r for r in asked if r != "leader")
        if not asked:
            raise ValueError("hops=2 asks about the country of a named leader: relations needs capital or currency")
    corpus(countries, corpus_seed, _check_names(names), _check_layout(layout))  # checks countries
    return grid_splits(countries * len(asked), heldout_size, seed,
                       partial(search_task, countries=countries, corpus_seed=corpus_seed, hops=hops, relations=asked,
                               names=names, layout=layout),
                       f"search(countries={countries}, corpus_seed={corpus_seed}, names={names}, layout={layout}, hops={hops}, "
                       f"relations={','.join(asked)})")
