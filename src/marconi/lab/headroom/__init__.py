"""``marconi experiment headroom``: the anatomy of the gap between the future-aware oracle and the default.

For each (trace, capacity) the trace is replayed through the default (``--default``, ``marconi``:
the worlds chooser) and the ``oracle`` side by side, and through the steps between them
(:mod:`.variants`: a future-filtered admission, then dead entries evicted first). The report says
where the oracle's extra hits come from, request by request (:mod:`.study`):

* by the kind of entry that served the hit: a last-decoded-token state, a branch state, and what
  the other cache held there (the KVs alone, or nothing);
* whether the other cache had admitted that state and evicted it, or never admitted it;
* by the session's position: turn and time since the session's previous request, from the
  trace's session ids and, without them, from token-prefix relations (:mod:`.sessions`);
* by the entry's depth and bytes, and where in the trace;
* and how much of the gap is *what to keep* (admission, dead entries) vs *when* (next-use order).

Outputs in ``--out``: ``records.jsonl`` (``point`` and ``breakdown`` records, the configuration
echoed), ``requests.jsonl`` (every request where the two differ: which entry each resumed from),
``plots/*.png`` and ``report.md`` (:mod:`.report`, from the records alone; ``--from-records``
redraws them)::

    marconi experiment headroom --out results/headroom --traces swe-sample --capacities 0.02x,0.05x
    marconi experiment headroom --out results/headroom --traces swe,sharegpt,mooncake --limit 1000

Modules: :mod:`.sessions` (sessions and entry kinds from the trace), :mod:`.variants` (the
replays), :mod:`.study` (replay, anatomy, records), :mod:`.report` (plots, findings, report.md),
:mod:`.command` (the CLI, the only module that prints).
"""

from marconi.lab.headroom.command import register
from marconi.lab.headroom.report import findings, report_markdown, write_outputs
from marconi.lab.headroom.sessions import PrefixHasher, SessionView, derive_sessions, trace_sessions
from marconi.lab.headroom.study import (DIMENSIONS, Anatomy, VariantRun, anatomy, breakdown_rows, replay,
                                                run_point)
from marconi.lab.headroom.variants import (DECOMPOSITION, VARIANTS, DeadFirstEviction,
                                                   FutureFilteredAdmission, build_variant)

__all__ = ["DECOMPOSITION", "DIMENSIONS", "VARIANTS", "Anatomy", "DeadFirstEviction", "FutureFilteredAdmission",
           "PrefixHasher", "SessionView", "VariantRun", "anatomy", "breakdown_rows", "build_variant",
           "derive_sessions", "findings", "register", "replay", "report_markdown", "run_point", "trace_sessions",
           "write_outputs"]
