"""Trace-replay simulation of prefix caches (no model): hit rates, FLOPs saved, modelled TTFT."""

from marconi.sim.latency import LatencyModel, RooflineLatency, TableLatency, ZeroLatency, make_latency
from marconi.sim.replay import SimResult, simulate, simulate_system, working_set_bytes

__all__ = ["simulate", "simulate_system", "SimResult", "working_set_bytes", "LatencyModel", "ZeroLatency", "RooflineLatency",
           "TableLatency", "make_latency"]
