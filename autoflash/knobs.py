"""What every kernel family's knobs share: the `knob` declaration and the `Knobs` base class.

A family declares its knobs once, as frozen dataclasses (autoflash/families/<family>/knobs.py), one per
direction it implements; every field is a `knob`, the first one, `family`, names the family. Everything else
derives from them: the template context (`template_context`), the search space (`search_space`), the
database record and the export header (`to_json`; `autoflash.families.knobs_from_json` reads them back) and
the cache key. A new knob is one field there, one use in the family's template or launcher, one test.
"""

import json
from dataclasses import asdict, field, fields
from functools import cache
from typing import ClassVar



def knob(default, choices, doc, searched=None):
    """A knob: its default, every valid value, a line of doc, and the values the tuner searches
    (all of them unless given)."""
    return field(default=default, metadata={"choices": tuple(choices), "doc": doc,
                                            "searched": tuple(choices if searched is None else searched)})


class Knobs:
    """Validation against the declared choices, the template context, JSON for the database, the search
    space. Subclasses are frozen dataclasses whose every field is a `knob`."""

    DIRECTION: ClassVar[str]
    family: str

    def __post_init__(self):
        for name, allowed in _typed_choices(type(self)).items():
            value = getattr(self, name)
            try:
                valid = (type(value), value) in allowed  # 64.0 == 64 and True == 1: the type must match too
            except TypeError:  # an unhashable value (a list from a JSON record) is no choice
                valid = False
            if not valid:
                raise ValueError(f"{type(self).__name__}.{name}={value!r} is not one of {self.choices()[name]}")

    def template_context(self) -> dict:
        """Jinja context: each knob under its upper-case name (BLOCK_M, LOADS, ...)."""
        return {name.upper(): value for name, value in asdict(self).items()}

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str):
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict):
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown knobs {sorted(unknown)}: this record comes from another autoflash version")
        return cls(**data)

    @classmethod
    def of_point(cls, point: dict):
        """The knobs of a point of `search_space`, not validated again: its values are declared choices (the tuner
        builds every point of a family's space, ~55k a problem, and validating them was a third of it, NOTES 143)."""
        knobs = object.__new__(cls)
        knobs.__dict__.update(point)
        return knobs

    def as_point(self) -> dict:
        """The knobs as a point of `search_space`."""
        return asdict(self)

    @classmethod
    def search_space(cls) -> dict[str, tuple]:
        """Each knob's name and the values the tuner searches, in declaration order."""
        return {f.name: f.metadata["searched"] for f in fields(cls)}

    @classmethod
    def choices(cls) -> dict[str, tuple]:
        """Each knob's name and every valid value."""
        return {f.name: f.metadata["choices"] for f in fields(cls)}

    @classmethod
    def docs(cls) -> dict[str, str]:
        return {f.name: f.metadata["doc"] for f in fields(cls)}


@cache
def _typed_choices(cls) -> dict[str, frozenset]:
    """Each knob's valid values as (type, value) pairs, once per class: validating is a set lookup (the tuner
    builds every point of a family's search space, ~50k a problem)."""
    return {f.name: frozenset((type(c), c) for c in f.metadata["choices"]) for f in fields(cls)}


def family_knob(name: str, doc: str):
    """The `family` knob of a family's knobs classes: one value, its name."""
    return knob(name, (name,), doc)


# triton.next_power_of_2 and triton.cdiv in plain Python: Triton's are ConstexprFunctions (~5 µs a call), and
# enumerating a search space asks them hundreds of thousands of times.
def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 0 else 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def head_dim_pad(head_dim: int) -> int:
    """Tiles span the head dim padded to a power of two (tl.arange and tl.dot need one; at least 16)."""
    return max(16, next_power_of_2(head_dim))


# CUDA launches at most 65535 blocks along a grid's y axis (x allows 2^31 - 1).
MAX_GRID_Y = 65535


class InvalidKnobs(ValueError):
    pass
