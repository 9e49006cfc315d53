"""One setting of the model, many random trials: the imbalance factor with its confidence interval.

The imbalance factor is mean server load / max server load (thesis, chapter 3). It equals normalised throughput
when the busiest server saturates: 1.0 is perfect balance, 0.5 means half of the servers' capacity idles.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from experiments.simulation.placement import Placement, place
from controller.load import imbalance_factor
from experiments.simulation.remedies import REMEDY_MODES, Remedy, extra_servers_to_match, make_remedy
from experiments.simulation.zipf import MAX_KEYS, hot_share, zipf_weights

# The auto-H search keeps the homes of this many hottest keys per trial (int32 each): 10^4 keys x 2000 trials
# is 80 MB. Targets that need more hot keys than this are reported as not reached.
AUTO_HOT_LIMIT = 10_000
Z95 = 1.959963984540054


class ScenarioError(ValueError):
    """An impossible setting; the message names the parameter."""


MAX_DRAWS = 2 * 10**9  # key homes drawn per scenario (keys x trials): about 40 s here, longer refused
DRAWS_PER_S = 5e7  # measured on a 2-core VM: `simulate imbalance --keys 1000000 --trials 200` takes ~4 s


@dataclass(frozen=True)
class Estimate:
    """Monte Carlo mean with a normal-approximation 95% confidence interval."""

    mean: float
    low: float
    high: float
    std: float

    @classmethod
    def of(cls, samples: np.ndarray) -> "Estimate":
        samples = np.asarray(samples, dtype=float)
        mean = float(samples.mean())
        std = float(samples.std(ddof=1)) if samples.size > 1 else 0.0
        half = Z95 * std / math.sqrt(samples.size)
        return cls(mean=mean, low=mean - half, high=mean + half, std=std)

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci95": [self.low, self.high], "std": self.std}


@dataclass(frozen=True)
class Scenario:
    """Inputs of one simulation: n servers, N keys of Zipf(alpha) popularity, H hot keys, G groups."""

    servers: int = 10
    keys: int = 1000
    hot: int = 10
    groups: int = 1
    alpha: float = 1.0
    mode: str = "equal"
    trials: int = 2000
    seed: int = 1

    def check(self, hot_may_be_open: bool = False) -> None:
        """Raise ScenarioError naming the first impossible parameter."""
        for name in ("servers", "keys", "groups", "trials"):
            if getattr(self, name) < 1:
                raise ScenarioError(f"--{name} must be at least 1 (got {getattr(self, name)})")
        if self.keys > MAX_KEYS:
            raise ScenarioError(f"--keys must be at most {MAX_KEYS:,} (got {self.keys:,}): every key is held in "
                                f"memory")
        if self.keys * self.trials > MAX_DRAWS:
            raise ScenarioError(f"--keys x --trials must be at most {MAX_DRAWS:.0e} (got "
                                f"{self.keys * self.trials:.1e}, ~{self.keys * self.trials / DRAWS_PER_S / 60:.0f} "
                                f"min of random draws): lower --trials or --keys")
        if self.seed < 0:
            raise ScenarioError(f"--seed must be non-negative (got {self.seed})")
        if not (self.alpha > 0 and math.isfinite(self.alpha)):
            raise ScenarioError(f"--alpha must be a positive number (got {self.alpha})")
        if self.mode not in REMEDY_MODES:
            raise ScenarioError(f"--mode must be one of {', '.join(REMEDY_MODES)} (got {self.mode!r})")
        if self.servers % self.groups:
            raise ScenarioError(f"--groups ({self.groups}) must divide --servers ({self.servers}) "
                                f"into groups of equal size")
        if not hot_may_be_open and not 0 <= self.hot <= self.keys:
            raise ScenarioError(f"--hot must be between 0 and --keys ({self.keys}) (got {self.hot})")

    def weights(self) -> np.ndarray:
        return zipf_weights(self.keys, self.alpha)

    def placement(self, kept: int) -> Placement:
        return place(self.weights(), self.servers, self.trials, self.seed, kept)


@dataclass(frozen=True)
class Outcome:
    """Per-trial results of one scenario."""

    scenario: Scenario
    baseline: np.ndarray       # imbalance factor with no remedy, (trials,)
    remedied: np.ndarray       # imbalance factor with the remedy, (trials,)
    extra_copies: np.ndarray   # values stored beyond one per key, (trials,)
    extra_servers: np.ndarray  # copies of the busiest servers that reach the same maximum load, (trials,)

    def summary(self) -> dict[str, Any]:
        """The JSON-ready report: the remedy's mean imbalance factor first, then the comparisons, then inputs."""
        s = self.scenario
        remedied = Estimate.of(self.remedied)
        copies = float(self.extra_copies.mean())
        return {
            "imbalance_factor": remedied.mean,
            "ci95": [remedied.low, remedied.high],
            "std": remedied.std,
            "baseline": Estimate.of(self.baseline).as_dict(),
            "gain": Estimate.of(self.remedied / self.baseline).as_dict(),
            "hot_share": hot_share(s.hot, s.keys, s.alpha),
            "extra_copies": copies,
            "memory_overhead": copies / s.keys,
            "extra_servers_equivalent": Estimate.of(self.extra_servers).as_dict(),
            "inputs": asdict(s),
        }


def simulate(scenario: Scenario) -> Outcome:
    """Run `scenario`: place keys randomly in every trial, treat the `hot` hottest with the remedy."""
    scenario.check()
    return simulate_on(scenario, scenario.placement(kept=scenario.hot))


def simulate_on(scenario: Scenario, placement: Placement) -> Outcome:
    """Run `scenario`'s remedy on a given placement, so several remedies can share one set of trials."""
    remedy = make_remedy(placement, scenario.mode, scenario.groups)
    for rank in range(scenario.hot):
        remedy.add(placement.weights[rank], placement.homes[:, rank])
    return _outcome(scenario, placement, remedy)


def smallest_hot_for(scenario: Scenario, target: float) -> tuple[Outcome | None, dict[str, Any]]:
    """Smallest H whose mean imbalance factor reaches `target`, with the memory it costs.

    Keys are made hot one at a time on the same random assignments, so every H is judged on identical trials.
    Returns (outcome at that H, search facts); the outcome is None when no H up to the limit reaches the target.
    """
    scenario.check(hot_may_be_open=True)
    if not 0 < target <= 1:
        raise ScenarioError(f"--target must be in (0, 1] (got {target})")
    limit = min(scenario.keys, AUTO_HOT_LIMIT)
    placement = scenario.placement(kept=limit)
    remedy = make_remedy(placement, scenario.mode, scenario.groups)
    best = (float(imbalance_factor(placement.loads).mean()), 0)
    for hot in range(0, limit + 1):
        if hot:
            remedy.add(placement.weights[hot - 1], placement.homes[:, hot - 1])
        reached = float(imbalance_factor(remedy.loads()).mean())
        best = max(best, (reached, -hot))
        if reached >= target:
            found = replace(scenario, hot=hot)
            return _outcome(found, placement, remedy), {"target": target, "reached": True, "searched_up_to": hot}
    facts = {"target": target, "reached": False, "searched_up_to": limit,
             "best_imbalance_factor": best[0], "best_hot": -best[1]}
    return None, facts


def _outcome(scenario: Scenario, placement: Placement, remedy: Remedy) -> Outcome:
    loads = remedy.loads()
    return Outcome(
        scenario=scenario,
        baseline=imbalance_factor(placement.loads),
        remedied=imbalance_factor(loads),
        extra_copies=remedy.extra_copies.copy(),
        extra_servers=extra_servers_to_match(placement.loads, loads.max(axis=1)),
    )
