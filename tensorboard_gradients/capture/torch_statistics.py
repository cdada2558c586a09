"""The stats matrix of one logged step of the PyTorch monitor (`capture.torch`), on the host.

Two kinds of step (format 1.6, `columns.EVERY_STEP_STATS`):

* `FullSteps`: every statistic the monitor logs: the passes the stats need on the device, ONE
  copy of the small ``[parameters, passes]`` matrix to the host, which checks whether the fast
  pass can be trusted, in Python floats (`statistics.surely_trusted_passes`; where that gives
  no verdict, in numpy: the rare step with NaN/Inf, overflow or underflowing squares takes the
  masked pass on the device and a second copy); the matrices are finished in numpy, the
  common steps' in batches.
* `NormsOnly` (`norms_only_matrix` where a norm is doubtful): the norms only, the steps
  between: the clip's norm vector when it clips, else one multi-tensor
  ``torch._foreach_norm`` of the gradients (and one of the weights), one copy; the non-finite
  counts are 0 where a norm is finite, and the rare parameter whose norm is not (or is so
  small that its squares may have underflowed) takes the masked pass alone.

No per-parameter ``.item()`` or ``.cpu()``, no other host sync. Both return a `HostStats`: what
must happen while the gradients are as logged (the passes, the copy, the checks) is done; the
numpy that finishes the matrix is left to the writer's thread
(`GradientWriter.write_statistics_later`), which runs the steps queued every second back to back
with warm caches, where the training thread would run it cold after every ``backward``.
"""

import dataclasses
import math
import threading
from typing import Callable, NamedTuple, Optional

import numpy as np
import torch

from tensorboard_gradients.capture.torch_ops import TorchOps
from tensorboard_gradients.format import columns, statistics

# The dtypes the matrices are computed in, and numpy's for them.
_NUMPY_DTYPES = {torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64)}


def gradient_entries(parameters, sizes, loss_scale, missing):
    """The gradients of the (name, parameter) pairs ``parameters`` of the dense ``sizes`` as
    `statistics`' entries: per parameter None (no gradient: ``missing``, a
    `layout.MissingGradientWarnings`, warns of it) or (present values, dense size), divided by
    ``loss_scale`` (None: not), in one dtype on the first gradient's device (a model split over
    devices is reduced there); and that dtype. ``(None, None)`` without any gradient."""
    gradients = [p.grad for _, p in parameters]
    if loss_scale:
        gradients = [None if g is None else g / loss_scale for g in gradients]
    present = [g for g in gradients if g is not None]
    if len(present) < len(gradients):
        missing.warn([n for (n, _), g in zip(parameters, gradients) if g is None])
    if not present:
        return None, None
    dtype, device = TorchOps.computation_dtype([g.dtype for g in present]), present[0].device
    entries = []
    for gradient, size in zip(gradients, sizes):
        if gradient is None:
            entries.append(None)
        elif gradient.is_sparse:  # nn.Embedding(sparse=True): repeated rows summed
            values = gradient.coalesce().values()
            entries.append((on_device(values.reshape(-1), device, dtype), int(size)))
        else:
            entries.append((on_device(gradient, device, dtype), gradient.numel()))
    return entries, dtype


def on_device(tensor, device, dtype):
    """``tensor.to(device, dtype)`` without the call when it is there already: a per-parameter
    no-op that still costs a dispatch."""
    if tensor.device == device and tensor.dtype == dtype:
        return tensor
    return tensor.to(device=device, dtype=dtype)


class HostStats(NamedTuple):  # a tuple: made at every logged step
    """A logged step's stats matrix whose device work is done: ``finish()`` returns it (numpy,
    ``dtype``), from host arrays nothing changes later."""

    dtype: np.dtype
    finish: Callable[[], np.ndarray]

    def then(self, step: Callable[[np.ndarray], np.ndarray]) -> "HostStats":
        """This matrix with ``step`` applied after `finish`."""
        return HostStats(self.dtype, lambda: step(self.finish()))

    def with_global_norm(self, l2_column: int, clip_coefficient: Optional[float] = None,
                         name: str = "global_norm"):
        """``finish`` for `GradientWriter.write_statistics_later`: the matrix and its scalars,
        the global norm (of its ``l2_column``, missing gradients aside) under ``name`` and,
        given the clip's coefficient, ``global_norm_clipped``."""
        def finish():
            matrix = self.finish()
            # In Python: numpy's calls on a few dozen numbers cost more with cold caches; the
            # squares of float32 norms are exact in float64, and fsum is correctly rounded.
            scalars = {name: math.sqrt(math.fsum(
                norm * norm for norm in matrix[:, l2_column].tolist() if norm == norm))}
            if clip_coefficient is not None:
                scalars["global_norm_clipped"] = scalars[name] * clip_coefficient
            return matrix, scalars
        return finish


class Batched:
    """Host work of many logged steps, run together on the writer's thread: ``later(item)``
    returns the ``finish`` of one step, and the first ``finish`` called runs ``run`` once on
    every item waiting (``run(items)`` returns their results, in order). On that thread, right
    after the training's step, a numpy call on a few dozen numbers takes 5-10x its time in a hot
    loop; a batch of the steps queued in a second pays it once (benchmarks/NOTES.md, "The full
    steps' numpy in one batch")."""

    # The most items waiting: the steps whose write was refused (a stuck queue) are never
    # finished; past this, the oldest are let go (one finished after all runs alone).
    MOST_WAITING = 1024

    def __init__(self, run):
        self._run = run
        self._waiting = []  # `_Waiting`s not yet run, in the order logged
        self._waiting_lock = threading.Lock()  # the training thread only appends under it
        self._running_lock = threading.Lock()  # one thread runs a batch at a time

    def later(self, item) -> Callable:
        waiting = _Waiting(item)
        with self._waiting_lock:
            self._waiting.append(waiting)
            del self._waiting[:-self.MOST_WAITING]

        def finish():
            with self._running_lock:
                if not waiting.done:
                    with self._waiting_lock:
                        batch, self._waiting = self._waiting, []
                    if waiting not in batch:  # let go (MOST_WAITING)
                        batch.append(waiting)
                    for each, result in zip(batch, self._run([w.item for w in batch])):
                        each.result, each.done, each.item = result, True, None
                return waiting.result
        return finish


@dataclasses.dataclass(eq=False)
class _Waiting:
    item: object
    result: object = None
    done: bool = False


class FullSteps:
    """The matrices (`HostStats`) of a monitor's steps with every statistic, its
    ``gradient_stats``: the passes the stats need on the device, ONE copy of the small
    ``[parameters, passes]`` matrix to the host, the checks while the gradients are as logged.

    The common step, whose pass `statistics.surely_trusted_passes` trusts (Python floats), leaves
    its numpy to the writer's thread, which runs it for every such step queued meanwhile at
    once: the rows of all of them stacked, a few dozen numpy calls in all where each step took
    as many (0.33 ms a step with the writer's cold caches on the benchmark MLP, ~0.02 ms in a
    batch; benchmarks/NOTES.md, "The full steps' numpy in one batch")."""

    def __init__(self, gradient_stats):
        self._gradient_stats = gradient_stats
        self._trusted = Batched(self._finish)

    def matrix(self, ops, entries, dtype, weights=None) -> HostStats:
        """The stats matrix of ``entries`` (per parameter None or (values, dense size), on
        ``ops.device`` in ``dtype``), with ``weight_l2_norm`` when ``weights`` (the parameters)
        are given."""
        device = ops.device
        passes = statistics.pass_matrix(ops, entries, dtype, self._gradient_stats)
        if weights is not None:
            weights = [on_device(w, device, dtype) for w in weights]  # under no_grad
            passes = torch.cat([passes, ops.square_sums(weights)[:, None]], 1)
        host = passes.cpu().numpy()
        passes, weight_norms = ((host[:, :-1], np.sqrt(host[:, -1])) if weights is not None
                                else (host, None))
        given_sizes = [None if entry is None else entry[1] for entry in entries]
        if statistics.surely_trusted_passes(passes.tolist(), given_sizes, host.dtype,
                                            self._gradient_stats):
            return HostStats(host.dtype, self._trusted.later((passes, given_sizes,
                                                              weight_norms)))
        # The rare others are checked here, where the gradients are still there for the
        # masked pass.
        sizes = _sizes(given_sizes, host.dtype)
        rows, trusted = _fast_rows(passes, sizes, self._gradient_stats)
        if not trusted:
            rows = statistics.masked_reduction_matrix(ops, entries, dtype).cpu().numpy()
        return HostStats(host.dtype, lambda: self._statistics(rows, sizes, weight_norms))

    def _finish(self, steps):
        """The matrices of trusted steps (``(passes, given sizes, weight norms)`` each): one
        numpy run per kind of step (dtype, weights or not) on their rows stacked (every
        formula works row by row)."""
        kinds = {}
        for index, (passes, _, weight_norms) in enumerate(steps):
            kinds.setdefault((passes.dtype, weight_norms is None), []).append(index)
        matrices = [None] * len(steps)
        for (dtype, without_weights), indices in kinds.items():
            kind = [steps[i] for i in indices]
            sizes = _sizes([size for _, given, _ in kind for size in given], dtype)
            matrix = self._statistics(
                _fast_rows(np.concatenate([passes for passes, _, _ in kind]), sizes,
                           self._gradient_stats)[0],
                sizes, None if without_weights else np.concatenate([w for _, _, w in kind]))
            ends = np.cumsum([len(given) for _, given, _ in kind])
            for index, rows in zip(indices, np.split(matrix, ends[:-1])):
                matrices[index] = rows
        return matrices

    def _statistics(self, rows, sizes, weight_norms):
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return statistics.statistics_from_reductions(
                statistics.NumpyOps, rows, sizes, weight_norms, self._gradient_stats)


def _fast_rows(passes, sizes, gradient_stats):
    """``(rows, trusted)``: `statistics.checked_fast_rows` of the host ``passes`` (a
    `statistics.pass_matrix`) of gradients of the dense ``sizes``."""
    # Inf / Inf in rows the check rejects, NaN rows of missing gradients: expected here.
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return statistics.checked_fast_rows(statistics.NumpyOps, passes, sizes, passes.dtype,
                                            gradient_stats)


class NormsOnly:
    """The matrices of a monitor's norms-only steps, for parameters named ``names`` of the
    dense ``sizes`` with the ``gradient_stats``: from the clip's pass alone (`from_clip`: the
    gradients are not read again) or from one multi-tensor norm (`from_entries`).

    On the training thread, right after ``backward``, numpy's calls on a few dozen numbers run
    with cold caches (5-10x their time in a hot loop: ~0.2 ms a step on the benchmark MLP), so
    the copied norms are checked as Python floats and the matrix is built on the writer's
    thread (`HostStats`) from a template."""

    def __init__(self, names, sizes, gradient_stats, missing_warnings):
        self._names = names
        self._sizes = np.asarray(sizes, np.float64)
        self._gradient_stats = gradient_stats
        self._missing = missing_warnings  # a `layout.MissingGradientWarnings`
        self._least = {}  # numpy dtype -> per parameter, the least norm trusted (a list)
        self._templates = {}  # see `_template`
        self._every_place = list(range(len(names)))  # the places of norms of every parameter
        self._clip_doubted = False  # `from_clip`'s verdict on this step, for `from_entries`

    def from_clip(self, clip, weights, every_step) -> Optional[HostStats]:
        """The matrix from the norms of ``clip`` (a `torch_clip.PendingClip` or None), its
        `logged_norms` (places None without a gradient: warned of): ONE host copy of its
        vector is all the step adds to the clip. None where the gradients must be read
        (`from_entries`): no clip or none that shares its pass (never one under DeepSpeed's
        loss scale: its engine clips itself), norms in a dtype the monitor does not compute in
        (bfloat16, half), no gradient at all, or a norm `_matrix` doubts. ``weights`` and
        ``every_step`` as `norms_only_matrix`'s."""
        self._clip_doubted = False
        norms, places = (clip and clip.logged_norms) or (None, None)
        if (norms is None or norms.dtype not in _NUMPY_DTYPES
                or places.count(None) == len(places)):
            return None
        computed_weights = _weights_due(weights, every_step, norms.device, norms.dtype)
        weight_start = len(norms) if computed_weights else None
        if computed_weights:  # in the same host copy
            norms = torch.cat([norms, torch.stack(torch._foreach_norm(computed_weights, 2))])
        stats = self._matrix(norms, places, weights is not None, weight_start)
        if stats is not None and None in places:
            self._missing.warn([n for n, place in zip(self._names, places) if place is None])
        self._clip_doubted = stats is None
        return stats

    def from_entries(self, ops, entries, dtype, weights, every_step) -> HostStats:
        """The matrix of ``entries`` (as `FullSteps.matrix`'s) from one multi-tensor norm, or,
        where `_matrix` doubts a norm, `norms_only_matrix`'s: at once after `from_clip` doubted
        this step's (the same norms: a non-finite or tiny gradient, which no norm unmasks)."""
        if self._clip_doubted:
            return norms_only_matrix(ops, entries, dtype, self._gradient_stats, weights,
                                     every_step)
        present = [i for i, entry in enumerate(entries) if entry is not None]
        places = [None] * len(entries)
        for place, index in enumerate(present):
            places[index] = place
        computed_weights = _weights_due(weights, every_step, ops.device, dtype)
        norms = torch.stack(torch._foreach_norm(
            [entries[i][0] for i in present] + computed_weights, 2))
        return self._matrix(norms, places, weights is not None,
                            len(present) if computed_weights else None) or (
            norms_only_matrix(ops, entries, dtype, self._gradient_stats, weights, every_step))

    def _matrix(self, norms, places, with_weights, weight_start) -> Optional[HostStats]:
        """The `HostStats` of the gradient norms in ``norms`` (a vector; ``places``: per
        parameter its place in it, None without a gradient), the weights' norms from its
        ``weight_start`` on (None: not computed at this step; the tag has them when
        ``with_weights``), in ONE host copy; None when `statistics.trusted_norm_floats` doubts
        a norm (non-finite, or so small its squares may have underflowed: the masked pass's)."""
        copied = norms.tolist()  # one host copy, exact floats
        if places == self._every_place:  # every parameter, in order: the common case
            in_order = gradient_norms = copied[:len(places)]
        else:
            in_order = [None if place is None else copied[place] for place in places]
            gradient_norms = [np.nan if norm is None else norm for norm in in_order]
        dtype = _NUMPY_DTYPES[norms.dtype]
        if dtype not in self._least:
            self._least[dtype] = statistics.least_trusted_norms(self._sizes, dtype).tolist()
        if not all(statistics.trusted_norm_floats(in_order, self._least[dtype])):
            return None

        def finish():
            template, norm_column, weight_column = self._template(dtype, places, with_weights)
            matrix = template.copy()
            matrix[:, norm_column] = gradient_norms
            if weight_start is not None:  # NaN beside a missing gradient, as elsewhere
                matrix[:, weight_column] = np.where(
                    matrix[:, norm_column] == matrix[:, norm_column], copied[weight_start:],
                    np.nan)
            return matrix
        return HostStats(dtype, finish)

    def _template(self, dtype, places, with_weights):
        """``(matrix, norm column, weight norm column)``: `statistics.norms_only_matrix` of
        norms 0 (NaN without a gradient) and weight norms NaN, made once per set of missing
        gradients: a step's matrix is a copy with its norms in, where building it took the
        writer's thread ~20 numpy calls a step, each with cold caches."""
        missing = tuple(place is None for place in places)
        key = (dtype, missing, with_weights)
        if key not in self._templates:
            names = columns.stats_for(with_weights, False, self._gradient_stats)
            self._templates[key] = (
                statistics.norms_only_matrix(
                    np.where(missing, np.nan, 0).astype(dtype),
                    np.where(missing, np.nan, self._sizes).astype(dtype),
                    np.full(len(places), np.nan, dtype) if with_weights else None,
                    self._gradient_stats),
                columns.position(names, "l2_norm"),
                columns.position(names, "weight_l2_norm") if with_weights else None)
        return self._templates[key]


def norms_only_matrix(ops, entries, dtype, gradient_stats, weights, every_step) -> HostStats:
    """`FullSteps`' columns at a norms-only step: `statistics.norms_only_matrix`, the
    ``every_step`` stats (the tag's `columns.every_step_stats`) not NaN, from one multi-tensor
    norm of the gradients (and the weights). ``weights``: the parameters when the tag has the
    weight norm (their norms computed only when ``every_step`` names it), else None. A row
    whose norm `statistics.trusted_norms` doubts takes the masked pass (steps without one:
    `NormsOnly`, which checks the norms as Python floats)."""
    present = [i for i, entry in enumerate(entries) if entry is not None]
    computed_weights = _weights_due(weights, every_step, ops.device, dtype)
    host = torch.stack(torch._foreach_norm(
        [entries[i][0] for i in present] + computed_weights, 2)).cpu().numpy()
    gradient_norms = np.full(len(entries), np.nan, dtype=host.dtype)
    gradient_norms[present] = host[:len(present)]
    weight_norms = None
    if weights is not None:  # the column, NaN when not computed at this step
        weight_norms = (host[len(present):] if computed_weights
                        else np.full(len(entries), np.nan, dtype=host.dtype))
    sizes = _sizes([None if entry is None else entry[1] for entry in entries], host.dtype)
    doubtful = np.flatnonzero(~statistics.trusted_norms(gradient_norms, sizes))
    exact = None
    if doubtful.size:
        rows = statistics.masked_reduction_matrix(
            ops, [entries[i] for i in doubtful], dtype).cpu().numpy()
        exact = statistics.statistics_from_reductions(
            statistics.NumpyOps, rows, sizes[doubtful],
            None if weight_norms is None else weight_norms[doubtful], gradient_stats)

    def finish():
        matrix = statistics.norms_only_matrix(gradient_norms, sizes, weight_norms,
                                              gradient_stats)
        if exact is not None:
            names = columns.stats_for(weights is not None, False, gradient_stats)
            logged = [i for i, name in enumerate(names) if name in every_step]
            matrix[doubtful[:, None], logged] = exact[:, logged]
        return matrix
    return HostStats(host.dtype, finish)


def _weights_due(weights, every_step, device, dtype):
    """The ``weights`` whose norms a norms-only step computes (on ``device`` in ``dtype``):
    all of them when ``every_step`` has the weight norm (the tag has it: ``weights`` not None),
    else none."""
    if weights is None or "weight_l2_norm" not in every_step:
        return []
    return [on_device(w, device, dtype) for w in weights]


def _sizes(given, dtype):
    """The dense sizes ``given`` (None for a missing gradient: NaN) as a numpy vector."""
    return np.array([np.nan if size is None else size for size in given], dtype=dtype)
