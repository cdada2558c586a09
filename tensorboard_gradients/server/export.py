"""The whole logged matrix of a series as CSV, long format (one row per step and variable).

Columns: ``step, variable, layer`` then every stat of the series in its logged order. Numbers are
written with the precision they were logged at (9 significant digits for float32, 17 for
float64); non-finite values are ``nan``, ``inf``, ``-inf`` (what pandas, numpy and Python's
``float()`` read back). A missing gradient is a row of ``nan`` (``size`` is ``nan`` only then).
"""

import csv
import io
import re
from typing import Iterable, Iterator

import numpy as np

_STEPS_PER_CHUNK = 64


def csv_filename(series) -> str:
    """``<run>_<tag>.csv`` with anything but letters, digits and ``._-`` replaced (a header
    value and a file name on the user's disk)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{series.run}_{series.tag}") + ".csv"


def csv_chunks(pieces: Iterable) -> Iterator[str]:
    """The CSV text of consecutive pieces of a series (a `GradientSeries` each: the whole
    series, or a long run's read a few thousand steps at a time), in chunks of a few steps
    (streamed: a long run never sits in memory)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for number, series in enumerate(pieces):
        if number == 0:
            writer.writerow(["step", "variable", "layer", *series.stat_names])
        yield from _piece_chunks(series, writer, buffer)
    if buffer.tell():
        yield buffer.getvalue()


def _piece_chunks(series, writer, buffer) -> Iterator[str]:
    digits = 17 if series.values.dtype == np.float64 else 9
    fmt = f"{{:.{digits}g}}".format
    names = list(zip(series.variables, series.layers))
    for start in range(0, len(series.steps), _STEPS_PER_CHUNK):
        for index in range(start, min(start + _STEPS_PER_CHUNK, len(series.steps))):
            step = int(series.steps[index])
            for (variable, layer), row in zip(names, series.values[index].tolist()):
                writer.writerow([step, variable, layer, *map(fmt, row)])
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
