"""What was left out of a run's data as damaged, and the sentences that say so.

Nothing left out is silent (see `local` and `provider`): the steps a checksum check found damaged
(`RunDamage`, filled by `event_scan`) and the tensors the decode guard refused
(`refusal_message`, counted by `decode_guard`) are told to the user in these sentences.
"""

import collections
import dataclasses
from typing import Dict, FrozenSet, Tuple


def counted(count: int, singular: str, plural: str) -> str:
    return f"{count} {singular if count == 1 else plural}"


def refusal_message(count: int, refusals: collections.Counter, what: str = "this tag") -> str:
    """The sentence for ``count`` logged steps of ``what`` refused before decoding."""
    reasons = [reason for reason, _ in refusals.most_common(2)] or [
        "not a float matrix of the shape its metadata gives"
    ]
    return (
        f"{counted(count, f'logged step of {what} was', f'logged steps of {what} were')} "
        f"refused as damaged: {'; '.join(reasons)}"
    )


@dataclasses.dataclass(frozen=True)
class RunDamage:
    """The damaged records of one run's event files."""

    # tag -> {step of a damaged record that still parses: event file name}
    steps: Dict[str, Dict[int, str]] = dataclasses.field(default_factory=dict)
    file_messages: Tuple[str, ...] = ()  # damage that cannot be pinned to a tag
    # tag -> {step of an intact record whose tensor was refused before decoding: why}
    refused: Dict[str, Dict[int, str]] = dataclasses.field(default_factory=dict)

    def steps_of(self, tag: str) -> FrozenSet[int]:
        """The steps of ``tag`` left out: their record fails its checksum or their tensor was
        refused."""
        return frozenset(self.steps.get(tag, ())) | frozenset(self.refused.get(tag, ()))

    def signature(self, *tags: str) -> tuple:
        return tuple(self.steps_of(tag) for tag in tags) + (self.file_messages,)

    def messages_for(self, tag: str, *companions: Tuple[str, str]) -> Tuple[str, ...]:
        """Sentences on the damaged records of ``tag``, then of each ``(tag, what)`` of
        ``companions`` (its histograms and epochs tags, named ``what``), then on the files."""
        named = ((tag, "this tag"),) + companions
        # Tensors refused before decoding first, then records failing their checksum.
        sentences = [refusal_message(len(self.refused[name]),
                                     collections.Counter(self.refused[name].values()), what)
                     for name, what in named if self.refused.get(name)]
        for name, what in named:
            by_file = collections.Counter(self.steps.get(name, {}).values())
            sentences.extend(
                f"{counted(count, f'logged step of {what} was', f'logged steps of {what} were')}"
                f" left out: {'its record' if count == 1 else 'their records'} in {file} "
                f"{'fails its checksum' if count == 1 else 'fail their checksums'} (damaged on "
                "disk; TensorBoard's Python loader stops reading that file there, so its later "
                "steps may be missing too)"
                for file, count in sorted(by_file.items())
            )
        return tuple(sentences) + self.file_messages


NO_DAMAGE = RunDamage()
