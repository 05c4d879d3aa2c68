"""``marconi vllm replay``: vLLM's own scheduler and block pool on a trace, with no model.

* :mod:`~marconi.integrations.vllm.replay.engine` (vLLM env): vLLM's ``EngineCore`` around a stub
  executor whose model sits on the meta device, so the KV cache configuration is vLLM's own;
* :mod:`~marconi.integrations.vllm.replay.worker` (vLLM env): the step loop, a stub runner, a
  virtual clock;
* :mod:`~marconi.integrations.vllm.replay.arrivals` (both envs): when requests are submitted
  (closed loop, Poisson, trace timestamps), shared with the in-process engine the replay is
  validated against;
* :mod:`~marconi.integrations.vllm.replay.steptime`: the per-step GPU roofline;
* :mod:`~marconi.integrations.vllm.replay.run` (project env): the command's side, records, table, plot.
"""
