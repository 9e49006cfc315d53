"""The headline table: every remedy in the thesis's setting (10 servers, 1000 keys, Zipf 1, H = 10)."""
from __future__ import annotations

from dataclasses import replace

from experiments.simulation.scenario import Outcome, Scenario, simulate_on

# (label, remedy mode or None for no remedy, groups)
HEADLINE_ROWS = (
    ("no remedy", None, 1),
    ("move hot keys, no copies", "move", 1),
    ("MBalancer, equal, G=1 (thesis)", "equal", 1),
    ("MBalancer, equal, G=2", "equal", 2),
    ("MBalancer, weighted, G=1", "weighted", 1),
    ("MBalancer, weighted, G=2", "weighted", 2),
)


def headline(base: Scenario) -> list[tuple[str, Outcome]]:
    """Outcome of each headline row, all on the same random assignments."""
    placement = base.placement(kept=base.hot)
    rows = []
    for label, mode, groups in HEADLINE_ROWS:
        scenario = replace(base, mode=mode or "equal", groups=groups, hot=base.hot if mode else 0)
        rows.append((label, simulate_on(scenario, placement)))
    return rows


def format_headline(base: Scenario, rows: list[tuple[str, Outcome]]) -> str:
    head = (f"MBalancer simulation: {base.servers} servers, {base.keys} keys (Zipf {base.alpha}), H={base.hot} "
            f"hot keys, {base.trials} random assignments\n"
            f"{'remedy':<32} {'imbalance factor':>16} {'95% CI':>17} {'gain':>6} {'extra copies':>13} "
            f"{'= extra servers':>16}")
    lines = [head, "-" * len(head.splitlines()[-1])]
    for label, outcome in rows:
        r = outcome.summary()
        ci = f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"
        lines.append(f"{label:<32} {r['imbalance_factor']:>16.3f} {ci:>17} {r['gain']['mean']:>5.2f}x "
                     f"{r['extra_copies']:>13.1f} {r['extra_servers_equivalent']['mean']:>16.2f}")
    lines.append("imbalance factor = mean/max server load = normalised throughput when the busiest server saturates;"
                 "\n'= extra servers': copies of the busiest servers (Facebook's remedy) that reach the same max load")
    return "\n".join(lines)
