"""`Thresholds`: the frozen dataclass of every rule's parameters, assembled from `rules.RULES`.

Its fields, defaults, types and docstring come from the rules' `Parameter`s, so a rule's
thresholds are written once, next to the code that uses them.
"""

import dataclasses
import math
from typing import Mapping

from tensorboard_gradients.analysis.rules import PARAMETERS, RULES

_INTRODUCTION = """The diagnosis rules' parameters. Every default, with its rationale and source.

    Norms are per-variable gradient L2 norms (``l2_norm``) unless said otherwise. "Logged steps"
    are the steps present in the log (with ``every_n_steps=10``, 5 logged steps = 50 steps).
    Each rule's parameters are documented (and defined) in its module, named below.
"""


def _literal(value) -> str:
    """A default as one would write it: ``1e-7`` rather than ``1e-07``, ``25``, ``0.25``."""
    if isinstance(value, float) and value != 1 and math.log10(value).is_integer():
        return f"1e{int(math.log10(value))}"
    return repr(value)


def _docstring() -> str:
    sections = [_INTRODUCTION]
    for rule in RULES:
        if not rule.parameters:
            continue
        sections.append(f"    The {rule.name} rule ({type(rule).__module__}):\n")
        for parameter in rule.parameters:
            lines = parameter.doc.strip().splitlines()
            body = "\n".join(f"        {line}".rstrip() for line in lines)
            sections.append(f"    {parameter.name} = {_literal(parameter.default)}\n{body}\n")
    return "\n".join(sections)


class _Validated:
    """What `Thresholds` adds to its generated fields: validation and parsing."""

    def __post_init__(self):
        for parameter in PARAMETERS:
            parameter.check_type(getattr(self, parameter.name))
        for parameter in PARAMETERS:
            parameter.check_maximum(getattr(self, parameter.name))
        for rule in RULES:
            rule.check(self)

    @classmethod
    def names(cls):
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_strings(cls, overrides: Mapping[str, str]) -> "Thresholds":
        """Thresholds from text (HTTP query parameters, CLI flags); `ValueError` on bad input."""
        parameters = {parameter.name: parameter for parameter in PARAMETERS}
        parsed = {}
        for name, text in overrides.items():
            if name not in parameters:
                raise ValueError(
                    f"unknown threshold {name!r}; known thresholds: {', '.join(parameters)}"
                )
            parsed[name] = parameters[name].parse(text)
        return cls(**parsed)


Thresholds = dataclasses.make_dataclass(
    "Thresholds",
    [(p.name, p.type, dataclasses.field(default=p.default)) for p in PARAMETERS],
    bases=(_Validated,),
    frozen=True,
    namespace={"__doc__": _docstring(), "__module__": __name__},
)
