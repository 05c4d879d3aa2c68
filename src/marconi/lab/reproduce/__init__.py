"""``marconi reproduce``: the Marconi paper's evaluation (§5, figs. 7–13 + two ablations) on real traces.

One module per concern (compute → records → report):

* :mod:`.context`  — :class:`ReproProfile` (how big a run is; ``PROFILES``) and :class:`ReproContext`
  (what a run knows: traces, working sets, calibration, sweep records, latency models);
* :mod:`.traces`   — the trace factory: workloads, timing variants, workload shifts, reuse anatomy;
* :mod:`.pipeline` — orchestration: build traces, plan and run the sweep, calibrate the regimes;
* :mod:`.figure`   — the seam every figure follows (:class:`~.figure.FigureRecords`, ``Finding``,
  the paper's numbers) and its helpers;
* :mod:`.fig7` … :mod:`.fig13`, :mod:`.headroom`, :mod:`.alpha`, :mod:`.admission`, :mod:`.anatomy` — one per
  figure: ``compute(ctx) -> records``; ``plot``, ``section``, ``verdict``, ``explain`` read records only;
* :mod:`.latency`  — the latency models figs. 9 and 10 apply;
* :mod:`.report`   — writes report.md, summary.md/json, figN.jsonl and the PNGs;
* :mod:`.command`  — the CLI (the only module that prints).
"""

from marconi.lab.reproduce.command import register
from marconi.lab.reproduce.context import PROFILES, ReproContext, ReproProfile, with_available_data
from marconi.lab.reproduce.pipeline import choose_regimes, plan_main_tasks, rerender, run_reproduction

__all__ = ["PROFILES", "ReproProfile", "ReproContext", "run_reproduction", "rerender", "plan_main_tasks",
           "choose_regimes", "register", "with_available_data"]
