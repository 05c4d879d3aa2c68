"""The CPU tier's worker side in the replay: vLLM's own ``OffloadingConnectorWorker``, a timed host link.

Runs in the vLLM environment. :class:`TierWorker` is the ``OffloadingConnector``'s worker role with
the copy engine (the one part needing a GPU) replaced by :class:`TimedHostLink`, called in the model
runner's order around each step, so a request whose prefix is in the tier waits for its load's
modelled completion, as in a server (docs/vllm-tiers.md).
"""

from __future__ import annotations

import heapq
from typing import Any

from vllm.v1.kv_offload.base import GPULoadStoreSpec, LoadStoreSpec, OffloadingWorker, TransferResult

__all__ = ["TimedHostLink", "TierWorker", "group_bytes_per_block"]


def group_bytes_per_block(kv_cache_config: Any) -> list[int]:
    """Bytes one GPU block of each *offloaded* group moves (its page, padded as the pool lays it
    out, times the group's layers), in the order of vLLM's offloading groups: the order of a
    ``GPULoadStoreSpec``'s ``group_sizes``."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import get_offloading_group_ids

    groups = kv_cache_config.kv_cache_groups
    return [int(groups[g].kv_cache_spec.page_size_bytes) * len(groups[g].layer_names)
            for g in get_offloading_group_ids(kv_cache_config)]


class TimedHostLink(OffloadingWorker):
    """vLLM's ``OffloadingWorker`` interface with modelled transfers instead of copies. The replay
    sets ``now`` (virtual seconds); a job of ``b`` bytes completes at ``max(now, link free) + b /
    (bandwidth × num_gpus)`` on its direction's link. :meth:`get_finished` returns each job once,
    when complete by ``now``; :meth:`wait` says how far ``now`` must move (the caller moves it).
    """

    def __init__(self, bytes_per_block: list[int], bandwidth_bytes_s: float, num_gpus: int = 1) -> None:
        if not bandwidth_bytes_s > 0 or num_gpus < 1:
            raise ValueError("bandwidth must be > 0 and num_gpus >= 1")
        self.bytes_per_block = list(bytes_per_block)
        self.bandwidth = float(bandwidth_bytes_s) * num_gpus
        self.now = 0.0
        self.link_free = {"load": 0.0, "store": 0.0}
        self.done_at: dict[int, float] = {}          # job id -> completion time (submitted, unreported)
        self.nbytes: dict[int, int] = {}
        self.started_at: dict[int, float] = {}
        self.pending: list[tuple[float, int]] = []    # heap of (completion, job id)
        self.bytes_loaded = 0
        self.bytes_stored = 0
        self.num_loads = 0
        self.num_stores = 0
        self.load_wait_s: list[float] = []           # per load job: submission to completion

    def _bytes(self, spec: GPULoadStoreSpec) -> int:
        sizes = spec.group_sizes if spec.group_sizes is not None else [len(spec.block_ids)]
        return sum(int(n) * b for n, b in zip(sizes, self.bytes_per_block))

    def _submit(self, job_id: int, direction: str, nbytes: int) -> None:
        start = max(self.now, self.link_free[direction])
        done = start + nbytes / self.bandwidth
        self.link_free[direction] = done
        self.done_at[job_id], self.nbytes[job_id], self.started_at[job_id] = done, nbytes, self.now
        heapq.heappush(self.pending, (done, job_id))

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        nbytes = self._bytes(src_spec)
        self._submit(job_id, "store", nbytes)
        self.bytes_stored += nbytes
        self.num_stores += 1
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        nbytes = self._bytes(dst_spec)
        self._submit(job_id, "load", nbytes)
        self.bytes_loaded += nbytes
        self.num_loads += 1
        self.load_wait_s.append(self.done_at[job_id] - self.now)
        return True

    def get_finished(self) -> list[TransferResult]:
        out = []
        while self.pending and self.pending[0][0] <= self.now:
            done, job_id = heapq.heappop(self.pending)
            if self.done_at.pop(job_id, None) is None:
                continue
            out.append(TransferResult(job_id, True, self.nbytes.pop(job_id), done - self.started_at.pop(job_id)))
        return out

    def wait(self, job_ids: set[int]) -> None:
        """vLLM's worker blocks here until the jobs are copied; the replay moves its clock to
        :meth:`ready_at` of them instead, so there is nothing to do here."""

    def ready_at(self, job_ids: set[int]) -> float:
        """When the given jobs (those still unreported) are all complete."""
        return max((self.done_at[j] for j in job_ids if j in self.done_at), default=self.now)

    def next_completion(self) -> float | None:
        """The earliest unreported completion, or None with nothing in flight."""
        while self.pending and self.pending[0][1] not in self.done_at:
            heapq.heappop(self.pending)
        return self.pending[0][0] if self.pending else None


class _InOrder(set):
    """A set that iterates in the order it was built from (``TierWorker._signal_finished_in_order``)."""

    def __init__(self, items: list[str]) -> None:
        super().__init__(items)
        self._order = items

    def __iter__(self) -> Any:
        return iter([x for x in self._order if x in self])


class TierWorker:
    """The connector's worker role around a :class:`TimedHostLink`, driven by the replay's loop.
    Counts the tier's evictions by kind (``kv``, ``state``) by observing
    ``CPUOffloadingManager.prepare_store``, whose results it does not change.
    """

    def __init__(self, core: Any, bandwidth_bytes_s: float, num_gpus: int = 1) -> None:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import OffloadingConnector
        from vllm.v1.kv_cache_interface import MambaSpec
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import get_offloading_group_ids

        sched = core.scheduler
        if not isinstance(sched.connector, OffloadingConnector):
            raise ValueError(f"the scheduler's connector is {type(sched.connector).__name__}, not OffloadingConnector")
        kv_cfg = sched.kv_cache_config
        self.connector = OffloadingConnector(core.vllm_config, KVConnectorRole.WORKER, kv_cfg)
        self.link = TimedHostLink(group_bytes_per_block(kv_cfg), bandwidth_bytes_s, num_gpus)
        assert self.connector.connector_worker is not None
        self.connector.connector_worker.worker = self.link      # instead of register_kv_caches (CUDA)
        self.manager = sched.connector.scheduler.manager
        self.num_chunks = int(self.connector.connector_worker.spec.num_chunks)   # as vLLM sized the tier
        kinds = {g: ("state" if isinstance(kv_cfg.kv_cache_groups[g].kv_cache_spec, MambaSpec) else "kv")
                 for g in get_offloading_group_ids(kv_cfg)}
        self.evicted = {"kv": 0, "state": 0}
        self.stored_keys = {"kv": 0, "state": 0}
        self._observe_evictions(kinds)
        self._signal_finished_in_order(sched)

    def _observe_evictions(self, kinds: dict[int, str]) -> None:
        from vllm.v1.kv_offload.base import get_offload_group_idx

        prepare = self.manager.prepare_store
        evicted, stored = self.evicted, self.stored_keys

        def observed(keys: Any, req_context: Any) -> Any:
            out = prepare(keys, req_context)
            if out is not None:
                for key in out.evicted_keys:
                    evicted[kinds.get(get_offload_group_idx(key), "kv")] += 1
                for key in out.keys_to_store:
                    stored[kinds.get(get_offload_group_idx(key), "kv")] += 1
            return out

        self.manager.prepare_store = observed

    @staticmethod
    def _signal_finished_in_order(sched: Any) -> None:
        """The connector tells the tier's manager that requests ended by iterating the step's
        ``finished_req_ids``, a set of id strings, so in an order set by the process's string hash
        seed: the tier policy's recency (LRU ranks, ARC's lists) then differs from run to run. The
        replay hands the connector those ids in the order the scheduler finished the requests
        (``_free_request``), which is one of the orders vLLM can take, every run the same, and the
        order the emulation follows. Nothing else reads the reordered ids."""
        finished: list[str] = []
        free_request = sched._free_request                  # vLLM private: every request's end
        connector = sched.connector.connector_scheduler
        build = connector.build_connector_meta

        def _free_request(request: Any, *args: Any, **kwargs: Any) -> Any:
            finished.append(request.request_id)
            return free_request(request, *args, **kwargs)

        def build_connector_meta(scheduler_output: Any) -> Any:
            ids = scheduler_output.finished_req_ids
            if ids and len(ids) > 1:
                ordered = [r for r in dict.fromkeys(finished) if r in ids]
                ordered += sorted(set(ids).difference(ordered))
                scheduler_output.finished_req_ids = _InOrder(ordered)
            if ids:
                finished[:] = [r for r in finished if r not in ids]
            return build(scheduler_output)

        sched._free_request = _free_request
        connector.build_connector_meta = build_connector_meta

    def before_forward(self, scheduler_output: Any, clock: float) -> float:
        """The model runner's steps before the forward pass; returns the clock after any flush
        (vLLM's worker blocks until ``jobs_to_flush`` are stored before it reuses their blocks)."""
        meta = scheduler_output.kv_connector_metadata
        self.link.now = clock
        self.connector.bind_connector_metadata(meta)
        if meta.jobs_to_flush:
            flush = set(meta.jobs_to_flush)
            self.connector.handle_preemptions(meta)
            clock = max(clock, self.link.ready_at(flush))
            self.link.now = clock
        else:
            self.connector.handle_preemptions(meta)
        self.connector.start_load_kv(None)
        return clock

    def after_forward(self, scheduler_output: Any, clock: float) -> Any:
        """After the forward pass ending at ``clock``: stores deferred to the next step, the jobs
        complete by ``clock`` collected; the ``KVConnectorOutput`` for ``update_from_output``."""
        from vllm.v1.outputs import KVConnectorOutput

        self.link.now = clock
        self.connector.wait_for_save()
        _, recving = self.connector.get_finished(scheduler_output.finished_req_ids)
        meta = self.connector.build_connector_worker_meta()
        self.connector.clear_connector_metadata()
        return KVConnectorOutput(finished_sending=set(), finished_recving=recving or set(),
                                 kv_connector_worker_meta=meta)

    def next_completion(self) -> float | None:
        return self.link.next_completion()

    def summary(self) -> dict[str, Any]:
        """The tier's counters for the replay's result."""
        waits = self.link.load_wait_s
        return {"bytes_loaded": self.link.bytes_loaded, "bytes_stored": self.link.bytes_stored,
                "num_loads": self.link.num_loads, "num_stores": self.link.num_stores,
                "tier_evictions": dict(self.evicted), "tier_stored_chunks": dict(self.stored_keys),
                "tier_num_chunks": self.num_chunks,
                "load_wait_mean_s": sum(waits) / len(waits) if waits else None,
                "load_wait_max_s": max(waits) if waits else None,
                "host_bandwidth_bytes_s": self.link.bandwidth}

