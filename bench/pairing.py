"""Paired, alternating runs of a raw baseline and the thing measured against it.

A shared 2-core virtual machine swings by 20-30% from one second to the next. Timing the
baseline and the subject back to back, in alternating order, many times, and taking the
median of the pairs' ratios gives a figure that holds where a best-of-N of each does not.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Paired:
    """Seconds of each paired run: `base` the raw baseline, `subject` the thing measured."""

    base: list[float]
    subject: list[float]

    def ratios(self) -> list[float]:
        """Subject speed as a fraction of baseline speed, one per pair, ascending."""
        return sorted(b / s for b, s in zip(self.base, self.subject, strict=True))

    def ratio(self) -> float:
        """The median of the pairs' ratios."""
        return statistics.median(self.ratios())

    def span(self) -> str:
        """The range of the pairs' ratios, as `lo%-hi%`."""
        ratios = self.ratios()
        return f"{ratios[0]:.0%}-{ratios[-1]:.0%}"

    def base_s(self) -> float:
        """The median seconds of the baseline."""
        return statistics.median(self.base)

    def subject_s(self) -> float:
        """The median seconds of the subject."""
        return statistics.median(self.subject)


def paired(base: Callable[[], float], subject: Callable[[], float], rounds: int) -> Paired:
    """Run both `rounds` times, each returning its seconds; even rounds run `base` first."""
    result = Paired([], [])
    for number in range(rounds):
        if number % 2:
            result.subject.append(subject())
            result.base.append(base())
        else:
            result.base.append(base())
            result.subject.append(subject())
    return result
