"""``marconi vllm replay``: vLLM's own scheduler and block pool on a trace, with no model.

:mod:`.engine` and :mod:`.worker` run in the vLLM environment (the engine core around a stub
executor; the step loop on a virtual clock), :mod:`.arrivals` in both, :mod:`.run` in the project's
(the command's side, records, table, plot); :mod:`.steptime` is the per-step GPU roofline.
"""
