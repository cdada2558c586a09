"""How alarms are scored against loss-spike onsets (`labels.episodes`).

* An onset is **warned early** when an alarm was raised 1 to ``HORIZON`` steps before it (its
  lead is the largest such distance).
* Alarms raised within ``CLUSTER`` steps of the previous one are one alarm (a detector that fires
  at 30 steps in a row raised one alarm). An alarm is **followed by a spike** when an onset comes
  1 to ``HORIZON`` steps after its first step, **at a spike** when it starts inside an episode
  (neither early nor false: the loss already spiked), **false** otherwise. Precision = followed /
  (followed + false).
* On a healthy control every alarm is false.
"""

import dataclasses
from typing import List, Tuple

HORIZON = 20
CLUSTER = 10


@dataclasses.dataclass
class Score:
    onsets: int = 0
    warned: int = 0
    leads: List[int] = dataclasses.field(default_factory=list)
    followed: int = 0
    at_spike: int = 0
    false: int = 0

    def add(self, other: "Score") -> "Score":
        return Score(self.onsets + other.onsets, self.warned + other.warned,
                     self.leads + other.leads, self.followed + other.followed,
                     self.at_spike + other.at_spike, self.false + other.false)

    @property
    def recall(self):
        return self.warned / self.onsets if self.onsets else float("nan")

    @property
    def precision(self):
        judged = self.followed + self.false
        return self.followed / judged if judged else float("nan")


def clusters(alarm_steps, cluster=CLUSTER) -> List[int]:
    """The first step of each alarm (alarm steps within ``cluster`` steps of the previous one
    belong to it)."""
    firsts, last = [], None
    for step in sorted(set(alarm_steps)):
        if last is None or step - last > cluster:
            firsts.append(step)
        last = step
    return firsts


def score(episodes: List[Tuple[int, int]], alarm_steps, horizon=HORIZON) -> Score:
    alarm_steps = sorted(set(alarm_steps))
    result = Score(onsets=len(episodes))
    for onset, _ in episodes:
        leads = [onset - a for a in alarm_steps if 1 <= onset - a <= horizon]
        if leads:
            result.warned += 1
            result.leads.append(max(leads))
    for first in clusters(alarm_steps):
        if any(onset <= first <= end for onset, end in episodes):
            result.at_spike += 1
        elif any(1 <= onset - first <= horizon for onset, _ in episodes):
            result.followed += 1
        else:
            result.false += 1
    return result
