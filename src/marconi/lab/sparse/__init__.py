"""``marconi experiment sparse``: exact checkpoint placement (the DP) against placement heuristics.

For each workload it compares, at checkpoint budgets ``M``, on the same cache (token-level radix
tree, LRU, unbounded capacity unless ``--capacities`` adds a constrained one):

=====================  ===================================================================
strategy               admission policy (every one also keeps the last decoded token)
=====================  ===================================================================
``sparse-dp``          ``sparse-dp(m=M;marconi=false)``: M checkpoints placed by the exact DP
                       over the online overlap-depth estimate (FLOPs cost)
``sparse-dp+marconi``  ``sparse-dp(m=M)``: the same plus Marconi's branch point
``sparse-dp-lam``      ``sparse-dp(lam=X;marconi=false)``: no hard budget; a checkpoint must
                       save ``tau`` tokens' worth of FLOPs per future hit, ``X = tau*F(1)/bytes``
``uniform``            ``uniform(m=M)``: M checkpoints evenly spaced over the input
``every-block``        ``every-block(block=K;paged=false)``: block caching, token-level KV matching,
                       K a power of two from median sequence length / max(M) up to it
``last-token``         only the last decoded token
``marconi``            Marconi's branch point + last token
=====================  ===================================================================

Two views:

* **Simulation** (``kind="simulation"``): the trace replayed through the cache. Per point:
  checkpoints admitted per cached sequence (a checkpoint shared by many sequences counts once),
  peak SSM bytes per cached sequence, recomputed tokens (``unusable_tokens``: KV found but the
  deepest checkpoint on the path was shallower), recomputed FLOPs ``sum_r span_flops(usable_r,
  kv_hit_r)``, token hit rate.
* **Analytic** (``kind="analytic"``): the DP's own problem on the empirical ("oracle") overlap
  distribution. Each request's cached sequence ``S_i`` (input + output, ``T_i`` tokens) is overlapped
  by every later request ``j`` to depth ``d_ij = min(LCP(S_j, S_i), len(input_j))``; ``P_i`` is the
  histogram of those depths. Every strategy keeps the last token ``T_i`` for free; ``sparse-dp``
  places M more by :func:`~marconi.sparse.place_checkpoints` on ``P_i`` (its whole
  ``cost_by_budget`` curve), the heuristics' positions come from their admission policies'
  ``final_plan`` (Marconi's branch point is where ``S_i`` leaves the tree of earlier sequences), and
  are scored by :func:`~marconi.sparse.expected_cost`. Costs are summed over all (sequence, later
  request) pairs and reported per pair, in tokens and in FLOPs (the DP is solved for each). This
  is each sequence alone -- a checkpoint shared by many sequences counts for each -- so it shows
  what exact placement can do with P known, next to what the online estimator does in simulation.

Workloads (:data:`~.workloads.WORKLOADS`: workload catalog entries at the study's sizes):
``quality`` (QuALITY questions on real articles; synthetic doc-qa of the same shape where
``../shared/data/quality`` is absent, said so in the output), ``system-prompts`` (:func:`prompt_tree_trace`: a base prompt extended by variants to
different depths), ``swe`` (mini-swe-agent trajectories; the vendored sample as fallback),
``sharegpt`` (shared data only: skipped, said so, where absent) and ``doc-qa`` (synthetic
questions at 1/4..1 of a document).

Outputs in ``--out`` (each written atomically): ``records.jsonl`` (one record per point, the whole
configuration echoed), ``plots/<workload>_<capacity>_simulation.png`` and
``plots/<workload>_analytic.png`` (Pareto frontiers), ``summary.md`` (tables at M = 1, 2, 4, 8 and
findings computed from the records; ``--from-records`` redraws both from an earlier run). Only
:mod:`.command` prints::

    marconi experiment sparse --out results/sparse --quick          # M in {1,2,4,8}, about a minute on 2 cores
    marconi experiment sparse --out results/sparse                  # M = 1..16, full traces (~15 min on 2 cores)
    marconi experiment sparse --out results/sparse --capacities large,0.25x --workloads quality,swe

Modules: :mod:`.workloads` (the traces), :mod:`.strategies` (the admission policies compared),
:mod:`.study` (configuration, simulation points, the runner -> records), :mod:`.oracle` (the
analytic view), :mod:`.report` (findings, plots and ``summary.md`` from records alone),
:mod:`.command` (the CLI).
"""

from marconi.lab.sparse.command import register
from marconi.lab.sparse.oracle import analytic_records, sequence_overlaps
from marconi.lab.sparse.report import Verdict, findings, summary_markdown, verdict, write_outputs
from marconi.lab.sparse.strategies import Strategy, block_sizes
from marconi.lab.sparse.study import StudyConfig, plan_strategies, plan_tasks, run_study, simulation_record
from marconi.lab.sparse.workloads import SCALES, WORKLOADS, Workload, study_workload
from marconi.workloads.synthetic import prompt_tree_trace

__all__ = [
    "SCALES",
    "WORKLOADS",
    "Strategy",
    "StudyConfig",
    "Verdict",
    "Workload",
    "analytic_records",
    "block_sizes",
    "findings",
    "plan_strategies",
    "plan_tasks",
    "prompt_tree_trace",
    "register",
    "run_study",
    "sequence_overlaps",
    "simulation_record",
    "study_workload",
    "summary_markdown",
    "verdict",
    "write_outputs",
]
