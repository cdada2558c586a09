"""The loss-spike rule: the loss spiking (warning; critical when it is no longer finite), and the
steps just before, when the loss climbs with the gradient (the precursor warning), each episode a
finding of its own that names the variable whose gradient moved first.

Why the loss, and why both. A gradient norm jump the loss never feels changes nothing a user
cares about, and healthy runs have many (a mini-batch with rare tokens, the first steps after a
learning-rate change); a loss spike is what costs the run. What comes before one, measured on the
instability set (`benchmarks/early_warning.py`: Adam's preconditioner collapsing, learning rates
raised 30x or ramped past stability, RNNs without clipping, with healthy controls of the same
shapes): the loss leaves its band a step or a few before it spikes, and the gradient with it. On
the six healthy controls the loss never reached 1.7x the median of its previous 50 logged steps
(mini-batch noise of cross-entropy and regression losses); before a spike it passes 2x one to
four steps ahead, with the global gradient norm above its own median (Adam's collapse: both grow
geometrically for 5-20 steps, arXiv 2506.04805; an unstable rate: the first steps past the edge
of stability, Cohen et al. 2021, arXiv 2103.00065). Neither alone separates the two: the norm
alone rose 3-8x on healthy mini-batch runs while their loss fell, the loss alone (above 1.5x)
fires on noisy runs that never spike.

The optimizer says what the loss cannot yet: a learning rate raised 30x makes the update of its
own step 30x larger, one step before any loss feels it (the loss of a step is computed before
its update). Where the monitor logs the optimizer's update (``update_l2_norm`` with
``weight_l2_norm``: `tensorboard_gradients.torch.GradientMonitor(optimizer=)`, the Keras
monitor), the model's update/weight ratio jumping far above its own recent median is the
``update`` precursor warning, with or without a logged loss (see ``precursor_update_ratio``).

A mini-batch loss is noisy, and near convergence heavy-tailed: the precursor needs a climb of
several steps and a spike must last and stand far outside the loss's own noise (see
``precursor_rising_steps``, ``loss_spike_steps``, ``loss_spike_zscore``), so a hard batch is no
finding. A non-finite loss is critical at once.

Everything here is causal: a step is judged on itself and the ``loss_window`` logged steps before
it, so a precursor is raised at its first step (`Alert.raised_step`) and a spike once it has
lasted, as a monitor watching the run would raise them. The rule judges the whole run's record
(the loss, whether one was logged, the global norm, and the variable that moved most and how
far: 5 numbers a step) at once, in a stream too (`Rule.whole_run`).
"""

import numpy as np

from tensorboard_gradients.analysis import window
from tensorboard_gradients.analysis.alerts import Wording
from tensorboard_gradients.analysis.rule import Parameter, Rule

LOSS_WINDOW = Parameter("loss_window", 50, int, "loss history (logged steps)", doc="""
A step's loss and global gradient norm are compared with their medians over the previous
this-many logged steps (finite values only), as the loss-spike definitions of Megatron-LM
(``--check-for-spiky-loss``), llm-foundry's ``KillLossSpike`` and issue 35's labels do; the
first this-many logged steps are not judged (they have no history: a run's first steps fall
fast). Needs a logged loss (`GradientSeries.loss`).
""")

LOSS_SPIKE_RATIO = Parameter(
    "loss_spike_ratio", 3.0, float, "loss spike at (x its median)", in_form=True, doc="""
A loss above this multiple of its median over the previous ``loss_window`` logged steps, or
not finite, is a loss spike (warning; critical when not finite). 3x: the definition of a loss
spike in issue 35 and the instability set's labels; Megatron-LM flags a loss 10x its running
average as spiky, llm-foundry's ``KillLossSpike`` 2x-5x depending on the run.
""")

LOSS_SPIKE_STEPS = Parameter(
    "loss_spike_steps", 2, int, "loss spike lasting (logged steps)", doc="""
A loss spike is a warning when the loss stays at or above ``loss_spike_ratio`` x its median for
this many logged steps in a row, far outside its own noise (``loss_spike_zscore``), or is not
finite (at once: critical); anything less is the loss's own weather, no finding (the loss curve
shows it). A mini-batch loss near
convergence is heavy-tailed: on the demo's healthy Keras runs (per-batch cross-entropy near 0.01)
single batches reach 3-5x the median of their previous 50 (a batch with one misclassified
image), and twice two in a row; every loss spike of the instability set lasts two steps or more
(Adam's collapse: about 20, a rate raised or ramped: about 20).
""")

LOSS_SPIKE_ZSCORE = Parameter(
    "loss_spike_zscore", 6.0, float, "loss spike at robust z-score", doc="""
... and its log10 is this many robust standard deviations (1.4826 MAD of log10 of the previous
``loss_window`` logged losses, at least 0.01 decades so a flat loss does not make every rise
infinite) above their median. A noisy mini-batch loss's 3x is its own weather: the demo's
healthy runs' two-step 3-5x excursions sit at robust z-scores of 1.5-4.4 (sigma 0.25-0.9 in
natural log); the instability set's spikes, from smooth or settled losses, at 10 and far more.
""")

PRECURSOR_LOSS_RATIO = Parameter(
    "precursor_loss_ratio", 2.0, float, "warn at loss (x its median)", in_form=True, doc="""
Below a spike, a loss at least this multiple of its median, with the global gradient norm
at ``precursor_norm_ratio`` x its own, is the precursor warning: the loss climbing with the
gradient. Tuned on the tune half of the instability set (1.5, 1.7, 2.0 and 2.3 tried): the
healthy controls' loss never passed 1.65x (a converged model's noisy loss near its floor);
at 1.5 the noisy sick runs (an RNN at SGD 20, a loss jittering near 1e-15) gave false
warnings, at 2.3 recall fell to 0.63. Validation on the held-out half and both references:
benchmarks/NOTES.md, "Early warning".
""")

PRECURSOR_NORM_RATIO = Parameter(
    "precursor_norm_ratio", 1.5, float, "warn at global norm (x its median)", doc="""
The global gradient norm's part of the precursor warning: at least this multiple of its median
over the previous ``loss_window`` logged steps. A loss above its band with the gradient at its
usual size is a hard batch; with the gradient 1.5x up it is the optimizer climbing (1.0, 1.2,
1.3 and 1.5 tried on the tune half: 1.5 halved the false warnings for 2 of 38 spikes warned).
""")

PRECURSOR_RISING_STEPS = Parameter(
    "precursor_rising_steps", 5, int, "warn after the loss rose (logged steps)", doc="""
The precursor warning also needs the loss to have risen at each of this many logged steps in a
row (each loss above the one before): a climb, not noisy batches. A diverging optimizer climbs
for several steps (Adam's collapse on the instability set: 5-20 before the spike). Tried on the
tune half: 1 left 19 false warnings on the noisy sick runs (an RNN at SGD 20, an LSTM whose loss
swings between 5 and 26 once blown up), 3 none, with every Adam spike still warned; the demo's
healthy Keras runs (per-batch cross-entropy near convergence) then still had 4 warnings at 3 and
1 at 4, none at 5, which costs the held-out half 4 of its 29 warned spikes (climbs of 3-4 steps
of the noise-free interpolating regression).
""")

PRECURSOR_UPDATE_RATIO = Parameter(
    "precursor_update_ratio", 10.0, float, "warn at update/weight (x its median)", doc="""
The update precursor: the model's update/weight ratio, ``sqrt(sum ||update||^2) /
sqrt(sum ||w||^2)`` over the variables whose update was logged, at least this multiple of its
median over the previous ``loss_window`` logged steps. The optimizer's steps grew at once:
a raised or mis-scheduled learning rate, or Adam's second moment collapsing under a vanishing
gradient (arXiv 2506.04805: its update/weight grew 60x-5,000x in the steps before the first
spikes of the instability set's regression runs). Schedules change the rate gradually: a
linear warm-up doubles it at most against the median of the steps before. On the instability
set the healthy controls' ratio never passed 2.7x its median (warm-up included; 1.9x on the
tune half), the learning rates raised 30x passed 27x at the step that took the new rate. With
``precursor_update_beyond_gradient`` the results on the tune half were the same from 3 to 20
(benchmarks/NOTES.md, "Early warning"). A transformer at a high rate without warm-up then
showed the other side: between its spikes, as Adam's second moment decays after one, the
update/weight ratio moves 5x-8x its median with no spike after it; 10x (tried 5x to 30x on the
tune half with that case) removed those warnings and warned the same spikes ("Early warning:
ramps, the sustained and jump precursors").
""")

PRECURSOR_UPDATE_BEYOND_GRADIENT = Parameter(
    "precursor_update_beyond_gradient", 2.0, float, "update jump beyond the gradient's (x)",
    doc="""
... and that jump at least this multiple of the global gradient norm's own jump (its ratio to
its median over the same steps): the optimizer's step grew beyond what the gradient explains.
Under plain SGD the update is the gradient times the rate, so a gradient spike (which the
``spike`` rule judges, with the loss) moves both alike; a raised rate moves the update alone.
Without it, on the tune half, an LSTM at SGD 12 that had already blown up gave 9 update
warnings no spike followed (precision 0.71); with it 1 (0.87), at 3 of 29 spikes warned.
Chosen after looking at the update warnings of both halves (learning rates raised 30x: the
gradient moved 0.7-1.1x, the update 27-45x; blown-up SGD runs: both alike), so the held-out
half does not validate this parameter; the held-out controls' absence of warnings does.
""")

PRECURSOR_SUSTAINED_STEPS = Parameter(
    "precursor_sustained_steps", 4, int, "warn after a raised gradient lasting (logged steps)",
    doc="""
The sustained precursor: for this many logged steps in a row, the global gradient norm at
``precursor_sustained_norm_ratio`` x its median over the previous ``loss_window`` logged steps
and the loss at ``precursor_sustained_loss_ratio`` x its own. A rate past the edge of stability
reached by a schedule that rises a little each step (a warm-up aimed too high): the loss does not
jump, it drifts up 1.1-2x, noisily, while the gradient stays 2-5x up for 5-15 steps before the
spike (Cohen et al. 2021, arXiv 2103.00065: past 2/lr the loss oscillates and rises). Such a
climb is never the 5 clean rises the climbing precursor needs, and the rate never jumps as the
update precursor needs. A hard batch raises the gradient for a step. Tuned on the tune half's
learning-rate ramps (an MLP under Adam and under SGD with momentum, a GPT under AdamW, three
seeds each; their control ramps to a stable rate): 2 to 5 steps and norms of 1.5x to 3x tried
with losses of 1.2x to 1.5x; 3 steps at 1.8x added 2 warned spikes and 9 false warnings (a
ramped MLP's loss bumps 1.6x and recovers), 4 at 2x the same 2 warned spikes and no false one
(benchmarks/NOTES.md, "Early warning: ramps").
""")

PRECURSOR_SUSTAINED_NORM_RATIO = Parameter(
    "precursor_sustained_norm_ratio", 2.0, float, "sustained warning at global norm (x median)",
    doc="""
The global gradient norm's part of the sustained precursor (see ``precursor_sustained_steps``).
""")

PRECURSOR_SUSTAINED_LOSS_RATIO = Parameter(
    "precursor_sustained_loss_ratio", 1.2, float, "sustained warning at loss (x its median)",
    doc="""
The loss's part of the sustained precursor (see ``precursor_sustained_steps``): the loss above
its band while the gradient stays up, so a healthy run whose gradient grows while its loss falls
(a rate warming up, a model learning a new feature) is not warned.
""")

PRECURSOR_JUMP_RATIO = Parameter(
    "precursor_jump_ratio", 16.0, float, "warn at a global norm jump (x its median)", doc="""
The jump precursor: the global gradient norm at least this multiple of its median over the
previous ``loss_window`` logged steps while the loss is already ``precursor_jump_loss_ratio``
x its own: a gradient spike the loss felt. A transformer pushed past its stable rate shows it
one or two steps before its loss spikes (the tune half's ramped GPT: 9x-28x with the loss at
1.0-2.1x; ZClip, arXiv 2504.02507, and SPAM, arXiv 2501.06842, clip such jumps because they
precede loss spikes). A gradient spike the loss never felt stays the ``spike`` rule's (info
unless the loss follows). Tried on the tune half at 6x to 20x: 4 more spikes warned from 6x to
16x (the ramped GPT's, and a blown-up LSTM's), fewer false warnings from 12x on (the ramped
GPT's 10x-25x jumps it recovered from), 3 fewer spikes warned at 20x. 16x, the end of that
plateau farthest from the healthy runs: a converged GPT (the held-out control) had one batch
at 10.8x with its loss 2.4x up.
""")

PRECURSOR_JUMP_LOSS_RATIO = Parameter(
    "precursor_jump_loss_ratio", 1.1, float, "jump warning at loss (x its median)", doc="""
The loss's part of the jump precursor (see ``precursor_jump_ratio``). 1.0 (the loss at its
median) added 5 false warnings on the tune half; 1.1 to 1.3 gave the same results.
""")

LOSS_EPISODE_STEPS = Parameter(
    "loss_episode_steps", 20, int, "loss episode gap (logged steps)", doc="""
Warnings and spikes less than this many logged steps apart are one episode: one finding
each, with the episode's first step as its identity. 20, as the instability set's labels
merge spiking steps (a spike's recovery oscillates for a few steps).
""")

# The least robust sigma of log10(loss) (decades): a flat loss makes no rise infinitely unusual.
_LOSS_SIGMA_FLOOR = 0.01
# The least rise (x its running median) that names a variable as the one that moved first.
_MOVED = np.log10(2.0)

_CLIMB = ("loss at {value:.3g}x its median of the previous {window} logged steps and the global "
          "gradient norm at {detail:.3g}x its own (warned from {limit:g}x): the loss is climbing "
          "with the gradient, a loss spike may follow")
_SPIKED = ("loss spiked to {value:.3g}x its median of the previous {window} logged steps (from "
           "{limit:g}x), the global gradient norm at {detail:.3g}x its own")
_SUSTAINED = ("global gradient norm at {detail:.3g}x its median of the previous {window} logged "
              "steps, and the loss at {value:.3g}x its own, for {sustain} logged steps in a row "
              "(warned from {limit:g}x the norm): the optimizer is past its stable rate (a "
              "schedule ramping too high?), a loss spike may follow")
_JUMPED = ("global gradient norm jumped to {detail:.3g}x its median of the previous {window} "
           "logged steps (warned from {limit:g}x) with the loss at {value:.3g}x its own: the loss "
           "felt the gradient's jump, a loss spike may follow")
# The global norm is often NaN at such a step: not told.
_NOT_FINITE = "loss was not finite (NaN or Inf)"
_UPDATE_JUMPED = ("the update/weight ratio jumped to {value:.3g}x its median of the previous "
                  "{window} logged steps (warned from {limit:g}x): the optimizer's steps grew at "
                  "once (a raised learning rate?), a loss spike may follow")
_MOVED_FIRST = "; {mover}'s gradient moved first: x{rise:.3g} its running median from step {since}"
_WORDINGS = {
    (kind, moved): Wording.define(f"loss_spike.{kind}{'_moved' if moved else ''}",
                                  template + (_MOVED_FIRST if moved else ""))
    for kind, template in (("precursor", _CLIMB), ("spike", _SPIKED), ("not_finite", _NOT_FINITE),
                           ("update", _UPDATE_JUMPED), ("sustained", _SUSTAINED),
                           ("jump", _JUMPED))
    for moved in (False, True)
}

# The record's columns.
_LOSS, _LOGGED, _NORM, _MOVER, _MOVER_RISE, _UPDATE = range(6)


class LossSpike(Rule):
    name = "loss_spike"
    kind = "loss_spike"
    parameters = (LOSS_WINDOW, LOSS_SPIKE_RATIO, LOSS_SPIKE_STEPS, LOSS_SPIKE_ZSCORE,
                  PRECURSOR_LOSS_RATIO, PRECURSOR_NORM_RATIO, PRECURSOR_RISING_STEPS,
                  PRECURSOR_UPDATE_RATIO, PRECURSOR_UPDATE_BEYOND_GRADIENT,
                  PRECURSOR_SUSTAINED_STEPS, PRECURSOR_SUSTAINED_NORM_RATIO,
                  PRECURSOR_SUSTAINED_LOSS_RATIO, PRECURSOR_JUMP_RATIO, PRECURSOR_JUMP_LOSS_RATIO,
                  LOSS_EPISODE_STEPS)
    whole_run = True

    def check(self, thresholds):
        if thresholds.precursor_loss_ratio >= thresholds.loss_spike_ratio:
            raise ValueError("threshold precursor_loss_ratio must be below loss_spike_ratio")

    def record(self, evidence):
        """``("loss", columns, [steps, 6])``: per step the loss, whether one was logged, the
        global norm (NaN at a step with NaN/Inf gradients), the variable whose norm stood
        highest above its running median (`Spike.variable_scores`; -1: none), that height in
        decades, and the model's update/weight ratio (`_update_ratio`; NaN where no update was
        logged). float64: a loss near 1e-15 keeps its digits. Recorded whether or not a loss
        was logged (a stream's rounds must all record); the loss judged only where one was."""
        spike_rule = next(rule for rule in evidence.rules if rule.name == "spike")
        _, excess = evidence.once(spike_rule.variable_scores)
        matters = evidence.once(spike_rule.matters)
        excess = np.where(matters & np.isfinite(excess), excess, -np.inf)
        rows = len(evidence.series.steps)
        mover = np.argmax(excess, axis=1) if excess.shape[1] else np.zeros(rows, np.int64)
        rise = excess[np.arange(rows), mover] if excess.shape[1] else np.full(rows, -np.inf)
        record = np.column_stack([
            evidence.loss, evidence.loss_logged,
            np.where(evidence.global_present, evidence.global_norm, np.nan),
            np.where(np.isfinite(rise), mover, -1), np.where(np.isfinite(rise), rise, np.nan),
            _update_ratio(evidence),
        ]).astype(np.float64)
        return "loss", np.arange(record.shape[1], dtype=np.int64), record

    def alerts(self, evidence, builder):
        self.alerts_on(self.record(evidence), evidence.thresholds, builder)

    def alerts_on(self, record, limits, builder):
        """This rule's findings from a `record` of the whole run (None: no step fed)."""
        if record is None:
            return
        values = record[2]
        loss, logged = values[:, _LOSS], values[:, _LOGGED] > 0
        norm, update = values[:, _NORM], values[:, _UPDATE]
        history = np.where(logged, loss, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            # A loss at r times its median is at least r times the least of its window: only
            # those steps need their medians (the least r a precursor judges); the same for
            # updates.
            candidates = logged & (loss >= min(
                limits.precursor_loss_ratio, limits.precursor_sustained_loss_ratio,
                limits.precursor_jump_loss_ratio) * window.trailing_minima(history,
                                                                          limits.loss_window))
            jumps = update >= limits.precursor_update_ratio * window.trailing_minima(
                update, limits.loss_window)
            loss_ratio = loss / window.trailing_medians(history, limits.loss_window, candidates)
            norm_ratio = norm / window.trailing_medians(norm, limits.loss_window,
                                                        candidates | ~np.isfinite(loss) | jumps)
            update_ratio = update / window.trailing_medians(update, limits.loss_window, jumps)
            spike = logged & (~np.isfinite(loss) | (loss_ratio >= limits.loss_spike_ratio))
            precursor = (logged & ~spike & (loss_ratio >= limits.precursor_loss_ratio)
                         & (norm_ratio >= limits.precursor_norm_ratio)
                         & _rising(np.where(logged, loss, np.nan), limits.precursor_rising_steps))
            update_jump = (~spike & (update_ratio >= limits.precursor_update_ratio)
                           & (update_ratio >= limits.precursor_update_beyond_gradient
                              * norm_ratio))
            gradient_up = (logged & ~spike
                           & (loss_ratio >= limits.precursor_sustained_loss_ratio)
                           & (norm_ratio >= limits.precursor_sustained_norm_ratio))
            gradient_jump = (logged & ~spike & (loss_ratio >= limits.precursor_jump_loss_ratio)
                             & (norm_ratio >= limits.precursor_jump_ratio))
        sustained = window.sustained(gradient_up, limits.precursor_sustained_steps)
        # A non-finite loss is infinitely far above its median (its own wording says so).
        shown = np.where(np.isfinite(loss), loss_ratio, np.inf)
        finite = np.isfinite(loss)
        with np.errstate(invalid="ignore", divide="ignore"):
            logs = np.log10(np.where(finite & (loss > 0), history, np.nan))
            noise = window.trailing_robust_sigmas(logs, limits.loss_window, spike & finite)
            outside = (logs - window.trailing_medians(logs, limits.loss_window, spike & finite)
                       >= limits.loss_spike_zscore * np.maximum(noise, _LOSS_SIGMA_FLOOR))
        far_spike = spike & finite & outside
        lasting = window.sustained(far_spike, limits.loss_spike_steps) | (spike & ~finite)
        # Where each finding that must last is told: a spike once it lasted (at once when the
        # loss is not finite), a sustained rise once it lasted its steps.
        told = {"spike": _held(far_spike, limits.loss_spike_steps) | (spike & ~finite),
                "sustained": _held(gradient_up, limits.precursor_sustained_steps)}
        steps = builder.steps
        for episode in _episodes(steps, spike | precursor | update_jump | sustained
                                 | gradient_jump, limits.loss_episode_steps):
            spiking = spike & episode
            # Before the episode's first spiking step: what follows it is the spike's recovery.
            before = np.arange(len(steps)) < (np.argmax(spiking) if spiking.any() else len(steps))
            identity = int(steps[np.argmax(episode)])
            for rule, mask in (("precursor", precursor & episode & before),
                               ("update", update_jump & episode & before),
                               ("sustained", sustained & episode & before),
                               ("jump", gradient_jump & episode & before),
                               ("spike", spiking & lasting)):
                if not mask.any():
                    continue
                first = int(np.argmax(mask))
                all_finite = bool(finite[mask].all()) or rule != "spike"
                wording = rule if rule != "spike" or all_finite else "not_finite"
                limit = {"precursor": limits.precursor_loss_ratio, "spike": limits.loss_spike_ratio,
                         "update": limits.precursor_update_ratio,
                         "sustained": limits.precursor_sustained_norm_ratio,
                         "jump": limits.precursor_jump_ratio}[rule]
                # An episode may begin inside a stretch that began before it (episodes of a
                # logged step or two): told at the stretch's telling row, or at once.
                raised = first + int(np.argmax(told[rule][first:])) if rule in told else first
                severity = "warning" if all_finite else "critical"
                mover = _first_mover(values, first, limits.loss_episode_steps)
                params = dict(limit=limit, window=limits.loss_window)
                if rule == "sustained":
                    params.update(sustain=limits.precursor_sustained_steps)
                if mover is not None:
                    params.update(mover=builder.series.variables[mover[0]], rise=mover[1],
                                  since=int(steps[mover[2]]),
                                  mover_layer=builder.series.layers[mover[0]])
                builder.add(self.kind, rule, severity, mask,
                            update_ratio if rule == "update" else shown, np.max, limit,
                            _WORDINGS[wording, mover is not None].bound(**params),
                            detail=(norm_ratio, np.max), episode=identity,
                            raised_step=int(steps[raised]))


def _update_ratio(evidence) -> np.ndarray:
    """``[steps]``: the model's update/weight ratio, the root of the summed squared update norms
    over that of the weight norms of the variables whose update was logged (NaN at steps with
    none, with NaN/Inf gradients, or without the columns)."""
    series = evidence.series
    rows = len(series.steps)
    if not {"update_l2_norm", "weight_l2_norm"} <= set(series.stat_names):
        return np.full(rows, np.nan)
    update = series.stat("update_l2_norm").astype(np.float64)
    weight = series.stat("weight_l2_norm").astype(np.float64)
    known = np.isfinite(update) & np.isfinite(weight)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        ratio = (np.sqrt((np.where(known, update, 0.0) ** 2).sum(axis=1))
                 / np.sqrt((np.where(known, weight, 0.0) ** 2).sum(axis=1)))
    return np.where(known.any(axis=1) & ~evidence.nonfinite.any(axis=1) & (ratio > 0), ratio,
                    np.nan)


def _rising(loss, steps: int) -> np.ndarray:
    """``bool[rows]``: the loss rose at each of the ``steps`` rows up to this one (each above
    the row before; NaN never rises)."""
    with np.errstate(invalid="ignore"):
        return _held(np.concatenate([[False], loss[1:] > loss[:-1]]), steps)


def _held(flags: np.ndarray, steps: int) -> np.ndarray:
    """``bool[rows]``: ``flags`` held at each of the ``steps`` rows up to this one: where a
    finding that needs them to last is told, knowing nothing after it."""
    if len(flags) < steps:
        return np.zeros(len(flags), bool)
    return np.concatenate([np.zeros(steps - 1, bool), window.all_in_window(flags, steps)])[
        :len(flags)]


def _episodes(steps, alarms, gap: int):
    """A ``bool[steps]`` mask per episode: alarmed rows less than ``gap`` logged steps apart
    belong together, and adjacent ones always (a stretch that must last is one finding)."""
    rows = np.flatnonzero(alarms)
    if not rows.size:
        return []
    starts = np.concatenate([[0], np.flatnonzero(np.diff(rows) >= max(gap, 2)) + 1])
    ends = np.concatenate([starts[1:], [rows.size]])
    masks = []
    for start, end in zip(starts, ends):
        mask = np.zeros(len(steps), bool)
        mask[rows[start]:rows[end - 1] + 1] = alarms[rows[start]:rows[end - 1] + 1]
        masks.append(mask)
    return masks


def _first_mover(values, row: int, lookback: int):
    """``(variable, rise, since row)``: the variable that stood highest above its running
    median at ``row``, its rise (x), and the first row of its climb (it led at every row from
    there, within ``lookback`` rows, at least 2x up); None when no variable was 2x up."""
    mover, rise = values[row, _MOVER], values[row, _MOVER_RISE]
    if not mover >= 0 or not rise >= _MOVED:
        return None
    since = row
    while (since > 0 and row - since < lookback and values[since - 1, _MOVER] == mover
           and values[since - 1, _MOVER_RISE] >= _MOVED):
        since -= 1
    return int(mover), float(10.0 ** rise), since
