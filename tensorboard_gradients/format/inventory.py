"""What a logdir holds when it holds no gradient data: the words that tell a wrong path from a
run whose monitor was never attached.

A CI gate or a tab that only says "no gradient alerts" on an empty or mistyped logdir passes a
misconfigured job silently. `Inventory.describe` names what was found instead (event files,
runs, other plugins' tags), so the reader can see which of the two it is. The CLI fills one from
its own scan of the files (`reader.scan_logdir_report`), the plugin from TensorBoard's data
provider; both say it in these words.
"""

import dataclasses
from typing import Dict, Optional, Tuple

# How each framework attaches a writer: the entry point the absence of gradients points to.
ENTRY_POINTS = (
    ("Keras model.fit", "tensorboard_gradients.keras.GradientMonitor"),
    ("PyTorch", "tensorboard_gradients.torch.GradientMonitor"),
    ("Lightning", "tensorboard_gradients.lightning.GradientMonitor"),
    ("Hugging Face Trainer", "tensorboard_gradients.transformers.GradientMonitorCallback"),
    ("JAX / optax", "tensorboard_gradients.jax.gradient_monitor"),
    ("TensorFlow custom loop", "tensorboard_gradients.summary.gradients"),
)

# Tags named per plugin, at most: a logdir of 2,000 tags must not make a wall of text.
_TAGS_SHOWN = 8


def _listed(names, shown: int = _TAGS_SHOWN) -> str:
    names = list(names)
    listed = ", ".join(names[:shown])
    return listed + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _singular(plugin: str) -> str:
    """A plugin's name as an adjective: "scalars" tags are scalar tags."""
    return plugin[:-1] if plugin.endswith("s") else plugin


def _count(number: int, noun: str) -> str:
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


@dataclasses.dataclass(frozen=True)
class Inventory:
    """What was found at ``location``.

    Attributes:
      location: the logdir as the user gave it.
      exists: whether it is a directory (False: a wrong path).
      event_files: how many event files lie under it; None where unknown (TensorBoard's data
        provider lists runs and tags, not files).
      runs: the runs found (event-file directories), sorted.
      tags: ``{plugin name: sorted tag names}`` of what other plugins logged ("scalars" for
        ``loss``, ``accuracy``...).
      unreadable: why ``location`` (a bucket) could not be listed, or None.
    """

    location: str
    exists: bool
    event_files: Optional[int] = None
    runs: Tuple[str, ...] = ()
    tags: Dict[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)
    unreadable: Optional[str] = None

    def found(self) -> str:
        """What is there, e.g. "12 event files in 3 runs; scalar tags: accuracy, loss"."""
        if self.unreadable:
            return (f"it could not be read ({self.unreadable}): check the store's credentials "
                    "and endpoint, then restart TensorBoard")
        if not self.exists:
            return "no such directory"
        if self.event_files == 0 or (self.event_files is None and not self.runs):
            return "no event files (nothing has been logged there)"
        parts = []
        if self.event_files is not None:
            parts.append(_count(self.event_files, "event file"))
        if self.runs:
            parts.append(("in " if parts else "") + _count(len(self.runs), "run"))
        words = " ".join(parts)
        logged = [f"{_singular(plugin)} tags: {_listed(names)}"
                  for plugin, names in sorted(self.tags.items()) if names]
        return "; ".join([words] + (logged or ["no tags of any plugin"]))

    def describe(self) -> str:
        """Why nothing was judged and what was found, in one sentence (`hint` says what to do)."""
        if not self.exists:
            return f"No gradient data: {self.location} is not a directory (check the path)."
        return f"No gradient data in {self.location}: {self.found()}; no gradients tag."


def hint() -> str:
    """What to do about no gradient data: each framework's entry point, a line each."""
    width = max(len(framework) for framework, _ in ENTRY_POINTS)
    return "Attach a gradient writer to the training job:\n" + "\n".join(
        f"  {framework.ljust(width)}  {entry}" for framework, entry in ENTRY_POINTS)
