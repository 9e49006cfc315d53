"""How many of a data plane's switches answer now: a candidate controller's probe (the registry's `reach`), which its
election compares with the other candidates' (controller/election.py). Each kind says what answering is."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence


def count_answering(targets: Sequence[str], answers: Callable[[str], bool]) -> tuple[int, int]:
    """(targets for which `answers` is true, targets), all asked at once: one that never answers costs its timeout
    once, not once per target."""
    if not targets:
        return 0, 0
    with ThreadPoolExecutor(len(targets)) as pool:
        return sum(pool.map(answers, targets)), len(targets)
