"""The CPU engine under ``sparse-dp`` admission generates the uncached run's greedy tokens (issue 24 item 4).

A small doc-QA trace (questions after 1/4..1 of shared documents, behind a shared instruction),
float64, on a tiny random-weight Bamba: every request's 4 greedy tokens with the cache equal
those without it, and the DP's checkpoints are what the requests resume from.
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("torch")

from marconi.engine.engine import Engine  # noqa: E402
from marconi.engine.models import load_model  # noqa: E402
from marconi.workloads.synthetic import doc_qa_trace  # noqa: E402

from engine_checks import logits_apart, tolerance  # noqa: E402


@functools.cache
def _model():
    return load_model("bamba-tiny", dtype="float64")


@pytest.mark.parametrize("admission", ["sparse-dp:m=2,marconi=false"])
def test_sparse_dp_engine_generates_the_uncached_greedy_tokens(admission):
    model = _model()
    trace = doc_qa_trace(num_docs=2, doc_len=96, questions_per_doc=4, question_len=6.0, answer_len=4.0,
                         instruction_len=16, vocab_size=1000, seed=3)
    spec = model.spec
    cached = Engine(model, 400 * spec.ssm_checkpoint_bytes + 20_000 * spec.kv_bytes_per_token, admission=admission)
    plain = Engine(model, 0, admission="none")
    resumed_inside = 0
    for req in trace:
        prompt = req.input_tokens.tolist()
        with_cache = cached.generate(prompt, 4)
        without = plain.generate(prompt, 4)
        assert with_cache.output_tokens == without.output_tokens, (req.session_id, req.turn_id)
        assert logits_apart(with_cache, without) <= tolerance(model), (req.session_id, req.turn_id)
        resumed_inside += 0 < with_cache.usable_hit_len < len(prompt)
        cached.cache.check_invariants()
    stats = cached.cache.stats
    assert resumed_inside >= 2 and stats.checkpoints_reused >= 2     # the cache was used, not bypassed
    assert cached.cache.admission.num_planned >= len(trace) - 1
