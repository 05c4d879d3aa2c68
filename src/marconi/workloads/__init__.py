"""Real and synthetic workloads: the trace schema and I/O (:mod:`.trace`), the tokenizer, builders
from real data (paper recipes) and synthetic generators, the named catalog (:mod:`.catalog`),
``load_trace`` (:mod:`.source`) and the ``marconi trace`` CLI group (:mod:`.commands`)."""

from .catalog import DataUnavailable, Provenance, build_workload, catalog_entries, is_workload, workload_names
from .mooncake import build_mooncake_trace, read_mooncake_rows
from .paths import bundled_data_dir, shared_data_dir
from .quality import build_quality_trace, load_quality_articles
from .sharegpt import build_chat_trace, build_lmsys_trace, build_sharegpt_trace, read_chat_records
from .swe import SHARED_PREFIXES, build_swe_trace, load_shared_prefix, load_trajectories
from .synthetic import (SYNTHETIC_KINDS, agent_trace, chat_trace, doc_qa_trace, prompt_tree_trace,
                        shared_prompts_trace, synthetic_trace)
from .source import load_trace
from .tokenizer import TextTokenizer, TokenizerError, load_tokenizer
from .trace import (Request, Trace, TraceFormatError, TraceProblem, TraceStats, iter_requests,
                    read_trace, read_trace_meta, trace_stats, validate_trace, write_trace)

__all__ = [
    "Request", "Trace", "TraceStats", "TraceFormatError", "TraceProblem",
    "iter_requests", "read_trace", "read_trace_meta", "write_trace", "validate_trace", "trace_stats",
    "TextTokenizer", "TokenizerError", "load_tokenizer",
    "build_chat_trace", "build_sharegpt_trace", "build_lmsys_trace", "read_chat_records",
    "build_swe_trace", "load_trajectories", "load_shared_prefix", "SHARED_PREFIXES",
    "build_mooncake_trace", "read_mooncake_rows", "build_quality_trace", "load_quality_articles",
    "chat_trace", "agent_trace", "shared_prompts_trace", "doc_qa_trace", "prompt_tree_trace", "synthetic_trace",
    "SYNTHETIC_KINDS",
    "build_workload", "workload_names", "is_workload", "catalog_entries", "Provenance", "DataUnavailable",
    "bundled_data_dir", "shared_data_dir", "load_trace",
]
