"""``retool-exec bench``: latency and throughput of every backend, side by side, in one run.

Modules, one job each:

- ``workloads``: the programs run and what a correct run of each returns;
- ``backends``: benchmark backend names -> Sandbox configs;
- ``runner``: the interleaved latency matrix; ``extras``: fresh-policy,
  client-CPU and memory figures; ``pools``: waiting on and reading warm pools;
- ``stats``: percentiles, throughput, ratios (pure);
- ``results``: the raw figures as JSON-round-trippable models;
- ``report`` and ``targets``: tables and the performance targets' verdicts;
- ``environment``: machine, Docker, image and package versions;
- ``plot``: the PNG (needs the ``[bench]`` extra); ``progress``: the stderr bar.
"""

from retool_exec.bench.results import BenchResult, BenchSettings
from retool_exec.bench.runner import run_bench

__all__ = ["BenchResult", "BenchSettings", "run_bench"]
