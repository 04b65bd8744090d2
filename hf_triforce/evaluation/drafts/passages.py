"""Random passages for copy tasks, drawn from a seed: prose, numbers and identifiers, code, a table row.

Each kind is built from word lists and random numbers, so every seed gives a passage no model has seen and
that appears nowhere in the haystacks: copying it right needs the passage's own tokens in view.

Example:
    >>> import random
    >>> p = make_passage("identifiers", random.Random(0))
    >>> p.kind, p.label
    ('identifiers', 'inventory record')
    >>> make_passage("code", random.Random(3)).text == make_passage("code", random.Random(3)).text
    True
"""

from __future__ import annotations

import random
from dataclasses import dataclass

PASSAGE_KINDS = ("prose", "identifiers", "code", "table")

_FIRST = "Marisol Tobias Ingrid Osei Lucian Petra Anselm Yara Dorian Nadia Emeric Saoirse Thaddeus Wilhelmina".split()
_LAST = "Quenby Wren Halloran Achterberg Mbeki Castellane Fairweather Lindqvist Okonkwo Pemberton Szabo Vance".split()
_PLACES = "harbour,observatory,orchard,lighthouse,glasshouse,boathouse,mill,archive,chapel,vineyard".split(",")
_THINGS = "copper kettle,walnut desk,tin box,green scarf,brass telescope,oak chest,clay jar,linen map".split(",")
_ANIMALS = "cat,heron,goat,spaniel,tortoise,parrot,ferret,mule".split(",")
_COLOURS = "violet,amber,slate,crimson,olive,ivory,teal,ochre".split(",")
_DAYS = "Monday,Tuesday,Wednesday,Thursday,Friday,Saturday,Sunday".split(",")
_GOODS = "lamp oil,oranges,flour,rope,candles,salt,tea,nails,paraffin,apples".split(",")
_VERBS = "merge,parse,resolve,rotate,encode,filter,collect,render".split(",")
_NOUNS = "ledger,voucher,segment,bucket,tariff,beacon,shipment,quota".split(",")
_COLUMNS = ("part", "supplier", "quantity", "unit price", "bin", "checked by")


@dataclass(frozen=True)
class Passage:
    """A copy task's passage: its text, its kind and what the request calls it (``label``)."""

    kind: str
    text: str
    label: str


def make_passage(kind: str, rng: random.Random) -> Passage:
    """A random passage of ``kind`` (one of :data:`PASSAGE_KINDS`), 60-120 tokens for a BPE tokenizer.

    Raises:
        ValueError: an unknown kind.

    Example:
        >>> import random
        >>> make_passage("table", random.Random(1)).text.startswith("| part |")
        True
    """
    makers = {"prose": _prose, "identifiers": _identifiers, "code": _code, "table": _table}
    if kind not in makers:
        raise ValueError(f"unknown passage kind {kind!r}: choose from {PASSAGE_KINDS}.")
    text, label = makers[kind](rng)
    return Passage(kind, text, label)


def _person(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"


def _prose(rng: random.Random) -> tuple[str, str]:
    place, things = rng.choice(_PLACES), rng.sample(_THINGS, 2)
    pet = f"{_article(rng.choice(_COLOURS))} {rng.choice(_ANIMALS)}"
    goods = rng.sample(_GOODS, 2)
    clauses = [
        f"the keeper of the {place} is {_person(rng)}",
        f"{pet} called {rng.choice(_FIRST)} sleeps by the {things[0]}",
        f"the spare key hangs behind the {things[1]} on the {rng.choice(['north', 'east', 'west'])} wall",
        f"the password is {rng.choice(_COLOURS)} {rng.choice(_NOUNS)} {rng.randint(11, 99)}",
        f"the supply boat comes every {rng.choice(_DAYS)} with {goods[0]} and {goods[1]}",
        f"the logbook lies under stair number {rng.randint(3, 40)}, left there by {_person(rng)}",
    ]
    rng.shuffle(clauses)
    return f"Registry entry of the {place}: " + ", ".join(clauses) + ".", "registry entry"


def _article(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _code_word(rng: random.Random) -> str:
    return f"{rng.choice('BCDFGHJKLMNPQRSTVWXZ')}{rng.choice('AEIOUY')}{rng.randint(10, 99)}"


def _identifiers(rng: random.Random) -> tuple[str, str]:
    fields = [
        f"serial {_code_word(rng)}-{rng.randint(1000, 9999)}-{rng.choice('ABCDEFGH')}",
        f"batch {rng.randint(10000, 99999)}",
        f"checksum 0x{rng.getrandbits(32):08x}",
        f"account ACC-{rng.randint(100, 999)}-{rng.randint(100, 999)}",
        f"routing {rng.randint(10**8, 10**9 - 1)}",
        f"issued {rng.randint(2001, 2029)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        f"operator {_person(rng)}",
        f"bay {rng.choice('KLMNPR')}{rng.randint(1, 64)}",
    ]
    rng.shuffle(fields)
    return f"Inventory record {rng.randint(100, 999)}/{_code_word(rng)}: " + "; ".join(fields) + ".", "inventory record"


def _code(rng: random.Random) -> tuple[str, str]:
    verb, noun = rng.choice(_VERBS), rng.choice(_NOUNS)
    limit, factor, name = rng.randint(3, 97), rng.randint(2, 9), _code_word(rng).lower()
    lines = [
        f"def {verb}_{noun}s(items, limit={limit}):",
        f'    """{verb.capitalize()} the {noun}s of {_person(rng)}, at most {limit}."""',
        f"    {name} = []",
        "    for index, item in enumerate(items):",
        f"        if index >= limit or item.{noun}_id % {factor} == 0:",
        "            continue",
        f"        {name}.append(item.weight * {factor} + {rng.randint(1, 999)})",
        f"    return sorted({name}, reverse={rng.choice(['True', 'False'])})",
    ]
    return "\n".join(lines), "Python function"


def _table(rng: random.Random) -> tuple[str, str]:
    row = [
        f"{_code_word(rng)}-{rng.randint(100, 999)}",
        f"{rng.choice(_LAST)} & {rng.choice(_LAST)} Ltd",
        str(rng.randint(2, 5000)),
        f"{rng.randint(1, 899)}.{rng.randint(0, 99):02d}",
        f"{rng.choice('KLMNPR')}{rng.randint(1, 64)}-{rng.randint(1, 9)}",
        _person(rng),
    ]
    header = "| " + " | ".join(_COLUMNS) + " |"
    rule = "|" + "---|" * len(_COLUMNS)
    return f"{header}\n{rule}\n| " + " | ".join(row) + " |", "parts table"
