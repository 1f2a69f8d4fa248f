"""Expected per-agent E[A^2] under each normalisation mode, for two agents whose rewards differ by construction.

Written for issue 34 part 2 *before* any training run: the figures in docs/stability.md ("Where the mechanism
must show") come from this script, which feeds synthetic 0/1 rewards to drmas's own `compute_advantages`
(groups of 8 episodes, one call per agent per episode; independent agents):

- (a) the solver succeeds with p = 0.5, the verifier with p = 0.05 (different variance);
- (b) both succeed with p = 0.5, the verifier's reward is scaled by 0.1 (different scale).

Per agent and mode: E[A^2]; corr(A, r) (how much of an agent's advantage is its own reward); E[A^2] over the
groups where the agent's own rewards vary and where they are constant (an agent-wise advantage is exactly 0 in
the latter: there is nothing to learn from them); and the share of constant groups.

    python bench/expected_advantages.py
"""
import numpy as np

from drmas.algorithms.advantage import compute_advantages

G, GROUPS = 8, 20000
AGENTS = ("solver", "verifier")
SETTINGS = {"(a) success 0.5 vs 0.05": ((0.5, 0.05), (1.0, 1.0)), "(b) scale 1 vs 0.1": ((0.5, 0.5), (1.0, 0.1))}


def expected(p: tuple[float, float], scale: tuple[float, float], rng: np.random.Generator) -> dict:
    """mode -> agent -> (E[A^2], corr(A, r), E[A^2 | own rewards vary], E[A^2 | constant], share constant)."""
    gids = np.repeat(np.arange(GROUPS), 2 * G)
    traj = np.tile(np.repeat(np.arange(G), 2), GROUPS)
    agents = np.tile(np.array(AGENTS * G), GROUPS)
    r = np.empty(gids.size)
    for k, agent in enumerate(AGENTS):
        hit = agents == agent
        r[hit] = scale[k] * (rng.random(hit.sum()) < p[k])
    out = {}
    for mode in ("agent", "step_global", "global"):
        adv = compute_advantages(r, gids, agents, traj, mode=mode)
        out[mode] = {}
        for agent in AGENTS:
            hit = agents == agent
            own = r[hit].reshape(GROUPS, G)
            constant = np.repeat(own.min(1) == own.max(1), G)
            a = adv[hit]
            out[mode][agent] = (float(np.mean(a**2)), float(np.corrcoef(a, r[hit])[0, 1]),
                                float(np.mean(a[~constant] ** 2)), float(np.mean(a[constant] ** 2)) if constant.any()
                                else float("nan"), float(constant.mean()))
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    print("| setting | mode | agent | E[A^2] | corr(A, r) | E[A^2], own rewards vary | E[A^2], own rewards constant "
          "| groups constant |\n|---|---|---|---|---|---|---|---|")
    for name, (p, scale) in SETTINGS.items():
        for mode, per_agent in expected(p, scale, rng).items():
            for agent, (e, c, ev, ec, f) in per_agent.items():
                print(f"| {name} | {mode} | {agent} | {e:.3f} | {c:.2f} | {ev:.3f} | {ec:.3f} | {f:.2f} |")


if __name__ == "__main__":
    main()
