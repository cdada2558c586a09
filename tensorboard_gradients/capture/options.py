"""Checks of the arguments the training monitors share (Keras, PyTorch): one wording of each error."""

import re

import numpy as np

from tensorboard_gradients.format import metadata


def positive_int(argument, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{argument} must be a positive integer, got {value!r}")
    return int(value)


def stats_every(value):
    """``stats_every_n_steps``: a positive integer up to `metadata.MAX_STATS_EVERY` (what
    readers accept: a stream keeps that many times the rules' windows)."""
    value = positive_int("stats_every_n_steps", value)
    if value > metadata.MAX_STATS_EVERY:
        raise ValueError(f"stats_every_n_steps must be at most {metadata.MAX_STATS_EVERY} (every "
                         f"statistic at least that often), got {value}")
    return value


def positive_number(argument, value):
    """A finite number above 0, as a float (a clipping threshold)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
            or not np.isfinite(value) or value <= 0):
        raise ValueError(f"{argument} must be a positive number, got {value!r}")
    return float(value)


def optional_positive_int(argument, value):
    return None if value is None else positive_int(argument, value)


def patterns(argument, value):
    """None, or compiled regular expressions from one pattern or a list of them."""
    if value is None:
        return None
    if isinstance(value, (str, re.Pattern)):
        value = [value]
    try:
        return [re.compile(p) for p in value]
    except (re.error, TypeError) as error:
        raise ValueError(f"{argument} must be regular expressions: {error}") from error


def selected(names, include, exclude):
    """Whether a variable, known by any of ``names``, passes ``include`` / ``exclude`` (searched)."""
    matches = lambda found: any(p.search(n) for p in found for n in names)  # noqa: E731
    return (include is None or matches(include)) and not (exclude and matches(exclude))


def non_empty_name(name):
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    return name
