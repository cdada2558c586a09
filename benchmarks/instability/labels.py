"""What counts as a loss spike in the instability set: the ground truth the alerts are scored on.

A step spikes when its loss is not finite or above ``FACTOR`` x the median of the previous
``WINDOW`` steps' losses (issue 35's definition; Megatron's ``--check-for-spiky-loss`` and
llm-foundry's ``KillLossSpike`` use the same shape: a multiple of a trailing statistic). Spiking
steps less than ``MERGE`` steps apart are one episode; its onset is its first step.
"""

import math

import numpy as np

FACTOR = 3.0
WINDOW = 50
MERGE = 20


def spiking_steps(steps, losses, factor=FACTOR, window=WINDOW):
    """The steps (of ``steps``, aligned with ``losses``) whose loss spikes."""
    losses = np.asarray(losses, dtype=np.float64)
    found = []
    for index in range(len(losses)):
        value = losses[index]
        if not math.isfinite(value):
            found.append(int(steps[index]))
            continue
        if index < window:
            continue
        history = losses[index - window:index]
        history = history[np.isfinite(history)]
        if len(history) and value > factor * np.median(history):
            found.append(int(steps[index]))
    return found


def episodes(steps, losses, factor=FACTOR, window=WINDOW, merge=MERGE):
    """``[(onset, last step)]`` of the loss-spike episodes."""
    found = []
    for step in spiking_steps(steps, losses, factor, window):
        if found and step - found[-1][1] < merge:
            found[-1] = (found[-1][0], step)
        else:
            found.append((step, step))
    return found
