"""Lead time and false alarms of `instability_precursor`, and what acting on it prevents.

    python -m benchmarks.precursors --seeds 0,1,2,3,4,5 --policies observe,protect
    python -m benchmarks.precursors --families tiny_attn    # one family

For every scenario of the precursor families (faulty ones and their healthy twins) and every
seed: the ground-truth spike is the first step whose loss is above 2x the median of the 20
losses before it, read from the run under `observe` (which trains exactly as an unguarded run);
the lead is that step minus the first `instability_precursor` warning's. Under `protect` a spike
is prevented when no loss goes above 2x its recent level, and a healthy run is compared with its
`observe` run's final held-out loss. Seeds are split into those the thresholds were tuned on and
those reported (`--tuned`), so the reported figures are out of sample.
"""

from __future__ import annotations

import argparse
import json
import statistics
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch

from trainguard import DetectorConfig, GuardConfig

from .scenarios import all_scenarios, run_scenario

FAMILIES = ("tiny_lm", "tiny_attn", "logit_growth")
SPIKE_RATIO = 2.0
SPIKE_WINDOW = 20
KIND = "instability_precursor"


def spike_step(losses: list[float]) -> int | None:
    """The first step whose loss is above SPIKE_RATIO x the median of the SPIKE_WINDOW before."""
    for step in range(SPIKE_WINDOW, len(losses)):
        level = statistics.median(losses[step - SPIKE_WINDOW:step])
        if not losses[step] <= SPIKE_RATIO * level:  # NaN counts as a spike
            return step
    return None


def one(name: str, seed: int, policy: str) -> dict[str, Any]:
    torch.set_num_threads(1)
    scenario = next(s for s in all_scenarios() if s.name == name)
    result = run_scenario(scenario, "trainguard", seed=seed,
                          config=GuardConfig(policy=policy, sinks={"console": False},
                                             detectors=DetectorConfig(
                                                 instability_precursor={"probe": True})))
    warnings = [e["step"] for e in result.events if e["kind"] == KIND]
    signals = [(e.get("details") or {}).get("signal") for e in result.events
               if e["kind"] == KIND]
    return {"scenario": name, "seed": seed, "policy": policy, "healthy": scenario.healthy,
            "spike": spike_step(result.train_losses), "precursors": warnings,
            "signals": signals,
            "eval": result.final_eval_loss, "outcome": result.outcome,
            "actions": result.actions}


def summarise(rows: list[dict[str, Any]], seeds: set[int]) -> dict[str, Any]:
    mine = [r for r in rows if r["seed"] in seeds]
    observed = [r for r in mine if r["policy"] == "observe"]
    spikes = [r for r in observed if not r["healthy"] and r["spike"] is not None]
    leads = [r["spike"] - min((p for p in r["precursors"] if p <= r["spike"]), default=r["spike"])
             for r in spikes]
    protected = {(r["scenario"], r["seed"]): r for r in mine if r["policy"] == "protect"}
    reference = {(r["scenario"], r["seed"]): r for r in observed}
    prevented = [protected[(r["scenario"], r["seed"])]["spike"] is None for r in spikes
                 if (r["scenario"], r["seed"]) in protected]
    worse = [(k, protected[k]["eval"] / reference[k]["eval"] - 1) for k in protected
             if protected[k]["healthy"] and k in reference]
    return {
        "seeds": sorted(seeds), "spikes": len(spikes),
        "leads": leads, "median_lead": statistics.median(leads) if leads else None,
        "lead_at_least_5": sum(1 for v in leads if v >= 5) / len(leads) if leads else None,
        "healthy_runs": sum(1 for r in observed if r["healthy"]),
        "healthy_with_precursor": [f"{r['scenario']}@{r['seed']}" for r in observed
                                   if r["healthy"] and r["precursors"]],
        "prevented": f"{sum(prevented)}/{len(prevented)}" if prevented else None,
        "healthy_worst_change_under_protect": max((v for _, v in worse), default=None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4,5")
    parser.add_argument("--tuned", default="0,1,2", help="seeds the thresholds were tuned on")
    parser.add_argument("--policies", default="observe,protect")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", help="write the rows and summaries here")
    parser.add_argument("--families", default=",".join(FAMILIES),
                        help="the scenario families to run (default: every precursor family)")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    families = set(args.families.split(","))
    names = [s.name for s in all_scenarios() if s.family in families]
    jobs = [(n, s, p) for p in args.policies.split(",") for n in names for s in seeds]
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(one, *zip(*jobs, strict=True)))
    for r in rows:
        print(f"{r['scenario']:<30}{r['seed']:>3} {r['policy']:<8} spike {r['spike']!s:>5}  "
              f"precursors {list(zip(r['precursors'], r['signals'], strict=True))[:4]}  "
              f"eval {r['eval']:.4g}")
    tuned = {int(s) for s in args.tuned.split(",")}
    report = {"tuned": summarise(rows, tuned & set(seeds)),
              "reported": summarise(rows, set(seeds) - tuned)}
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, **report}, f, indent=1)


if __name__ == "__main__":
    main()
