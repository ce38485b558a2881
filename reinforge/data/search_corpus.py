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
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache, partial

from reinforge.data.base import Task, TaskSplits
from reinforge.data.grid import grid_splits

RELATIONS = ("capital", "leader", "currency")
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kl", "tr", "qu", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "eo")
_CODAS = ("", "", "", "n", "r", "l", "m", "s", "k")
MAX_COUNTRIES = 2000


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


def passage(country: Country, relation: str) -> str:
    """The corpus sentence stating ``relation`` of ``country``."""
    value = getattr(country, relation)
    return f"The {relation} of {country.name} is {'the ' if relation == 'currency' else ''}{value}."


@cache
def corpus(countries: int = 200, corpus_seed: int = 0) -> tuple[tuple[Country, ...], tuple[str, ...]]:
    """``countries`` fictional countries and their passages (one per country and relation, in that order).

    Names never repeat and none is a word of another fact's text, so every fact has exactly one
    passage and one answer. Deterministic in ``(countries, corpus_seed)`` (a larger corpus extends a
    smaller one of the same seed); cached.
    """
    if isinstance(countries, bool) or not isinstance(countries, int) or not 2 <= countries <= MAX_COUNTRIES:
        raise ValueError(f"countries must be an integer in 2..{MAX_COUNTRIES}, got {countries!r}")
    rng = random.Random(f"search-corpus-{corpus_seed}")
    reserved = {"The", "Of", "Is", "Land", "Led", "By"}
    names: list[str] = []
    while len(names) < countries * (1 + len(RELATIONS)):
        name = _name(rng)
        if name not in reserved and 4 <= len(name) <= 9:
            reserved.add(name)
            names.append(name)
    people = [Country(*names[i * 4:i * 4 + 4]) for i in range(countries)]
    return tuple(people), tuple(passage(c, r) for c in people for r in RELATIONS)


def search_task(index: int, countries: int, corpus_seed: int, hops: int, relations: tuple[str, ...]) -> Task:
    """Question ``index``: country ``index // len(relations)``, relation ``relations[index % len(relations)]``."""
    country_index, r = divmod(index, len(relations))
    country, relation = corpus(countries, corpus_seed)[0][country_index], relations[r]
    subject = country.name if hops == 1 else f"the land led by {country.leader}"
    return Task(
        id=f"search-{hops}hop-{relation}-{country.name}",
        prompt=[{"role": "user", "content": f"{relation} of {subject}?"}],
        answer=getattr(country, relation),
        metadata={"countries": countries, "corpus_seed": corpus_seed, "hops": hops, "relation": relation,
                  "country": country.name, "leader": country.leader},
    )


def search_splits(
    countries: int = 200, corpus_seed: int = 0, hops: int = 1, relations: str | list[str] | tuple[str, ...] = RELATIONS,
    heldout_size: int = 100, seed: int = 1234,
) -> TaskSplits:
    """One question per country and relation in ``relations`` (``hops=2``: about the country whose leader is
    named; ``leader`` is then not asked), split by question (seeded)."""
    names = tuple(r.strip() for r in relations.split(",")) if isinstance(relations, str) else tuple(relations)
    if not names or any(r not in RELATIONS for r in names) or len(set(names)) != len(names):
        raise ValueError(f"relations must be distinct names from {', '.join(RELATIONS)}, got {relations!r}")
    if hops not in (1, 2) or isinstance(hops, bool):
        raise ValueError(f"hops must be 1 or 2, got {hops!r}")
    if hops == 2:
        names = tuple(r for r in names if r != "leader")
        if not names:
            raise ValueError("hops=2 asks about the country of a named leader: relations needs capital or currency")
    corpus(countries, corpus_seed)  # checks countries
    return grid_splits(countries * len(names), heldout_size, seed,
                  partial(search_task, countries=countries, corpus_seed=corpus_seed, hops=hops, relations=names),
                  f"search(countries={countries}, corpus_seed={corpus_seed}, hops={hops}, relations={','.join(names)})")
