"""The query string of a request, validated: a missing or invalid parameter is a `BadRequest`
(400), a variable the tag does not have an `UnknownError` (404)."""

from typing import Optional, Sequence, Tuple

from tensorboard_gradients import analysis
from tensorboard_gradients.server.store import UnknownError

# Event steps are int64; a larger query integer could only overflow the arithmetic on them.
INT64_MAX = 2**63 - 1


class BadRequest(ValueError):
    """A missing, unknown, repeated or invalid query parameter (the plugin answers 400)."""


class Query:
    """The query string of one request: only ``names`` (and, with ``thresholds``, the field
    names of `analysis.Thresholds`), each at most once."""

    def __init__(self, request, names: Sequence[str], thresholds=False):
        self._args = request.args
        allowed = set(names) | (set(analysis.Thresholds.names()) if thresholds else set())
        for name in self._args:
            if name not in allowed:
                raise BadRequest(
                    f"unknown parameter {name!r}; this route takes {', '.join(sorted(allowed))}"
                )
            if len(self._args.getlist(name)) > 1:
                raise BadRequest(f"parameter {name!r} was given more than once")

    def __contains__(self, name):
        return name in self._args

    def text(self, name):
        value = self._args.get(name)
        if value is None or value == "":
            raise BadRequest(f"missing parameter {name!r}")
        return value

    def integer(self, name, minimum, maximum=INT64_MAX, required=False):
        if name not in self._args and not required:
            return None
        text = self.text(name)
        try:
            value = int(text)
        except ValueError:
            raise BadRequest(f"parameter {name!r} must be an integer, got {text[:40]!r}") from None
        if not minimum <= value <= maximum:
            raise BadRequest(
                f"parameter {name!r} must be an integer from {minimum} to {maximum}, "
                f"got {text[:40]}{'...' if len(text) > 40 else ''}"
            )
        return value

    def choice(self, name, options):
        value = self._args.get(name, options[0])
        if value not in options:
            raise BadRequest(f"parameter {name!r} must be one of {', '.join(options)}")
        return value

    def thresholds(self) -> analysis.Thresholds:
        given = {n: self._args[n] for n in analysis.Thresholds.names() if n in self._args}
        try:
            return analysis.Thresholds.from_strings(given)
        except ValueError as error:  # a value out of range, or not a number
            raise BadRequest(str(error)) from None

    def step_range(self) -> Optional[Tuple[int, int]]:
        """``first_step``/``last_step`` (inclusive) as ``(first, last)``, None when neither."""
        first_step = self.integer("first_step", minimum=0)
        last_step = self.integer("last_step", minimum=0)
        if first_step is None and last_step is None:
            return None
        step_range = (first_step or 0, INT64_MAX if last_step is None else last_step)
        if step_range[0] > step_range[1]:
            raise BadRequest("parameter 'first_step' must not exceed 'last_step'")
        return step_range

    def row(self, variables: Sequence[str], run: str, tag: str) -> int:
        """The row the request names by ``variable`` or ``variable_index`` (exactly one of them)
        among a tag's ``variables``. Asked once they are known, so that an unknown run or tag
        is reported before a malformed variable."""
        if ("variable" in self) == ("variable_index" in self):
            raise BadRequest("give exactly one of the parameters 'variable' and 'variable_index'")
        if "variable_index" in self:
            index = self.integer("variable_index", minimum=0, required=True)
            if index >= len(variables):
                raise UnknownError(
                    f"no variable index {index} in run {run!r}, tag {tag!r} "
                    f"({len(variables)} variables)"
                )
            return index
        variable = self.text("variable")
        try:
            return variables.index(variable)
        except ValueError:
            raise UnknownError(f"no variable {variable!r} in run {run!r}, tag {tag!r}") from None
