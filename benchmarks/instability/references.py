"""Two published detectors, run on the same logged global gradient norms as the rules: what the
early-warning rules must beat (issue 35).

Both see one norm per step, in order, with no look-ahead; each returns the steps it alarms at.
"""

import math

import numpy as np


def zclip_alarms(steps, norms, alpha=0.97, z_threshold=2.5, warmup=25):
    """ZClip (arXiv 2504.02507; bluorion-com/ZClip ``zclip/zclip.py``): an EMA of the norm's mean
    and variance (``alpha`` 0.97) after ``warmup`` steps that initialise them; a step whose
    z-score exceeds 2.5 is a spike, and the clipped norm ``mu + z_t^2 / z * sigma`` (ZClip's
    reciprocal mode) is what the EMAs are fed, as ZClip clips before updating."""
    alarms = []
    mean = variance = None
    seen = []
    for step, norm in zip(steps, norms):
        if not math.isfinite(norm):
            alarms.append(int(step))
            continue
        if len(seen) < warmup:
            seen.append(norm)
            if len(seen) == warmup:
                mean, variance = float(np.mean(seen)), float(np.var(seen))
            continue
        std = math.sqrt(max(variance, 0.0))
        z = (norm - mean) / std if std > 0 else 0.0
        fed = norm
        if z > z_threshold:
            alarms.append(int(step))
            fed = mean + z_threshold ** 2 / z * std
        mean = alpha * mean + (1 - alpha) * fed
        variance = alpha * variance + (1 - alpha) * (fed - mean) ** 2
    return alarms


def olmo_alarms(steps, norms, window=128, sigmas=6.0):
    """OLMo-core's stability monitor (``stability_monitor.py``): a norm above the mean + 6
    standard deviations of the last 128 steps (once 128 are there)."""
    alarms = []
    history = []
    for step, norm in zip(steps, norms):
        if not math.isfinite(norm):
            alarms.append(int(step))
            continue
        if len(history) == window:
            mean, std = float(np.mean(history)), float(np.std(history))
            if norm > mean + sigmas * std:
                alarms.append(int(step))
            history.pop(0)
        history.append(norm)
    return alarms
