"""``fwrl bench ...``: benchmarks, not tests; a module per command.

- :mod:`.envs`: ``fwrl bench envs``, env steps/s through the worker layer with random actions (and
  per core of the worker processes), for each env path of the spec;
- :mod:`.throughput`: ``fwrl bench throughput``, agent steps/s of real training beside the env
  ceiling of the same workers, and where each thread's time goes;
- :mod:`.kernels`: ``fwrl bench kernels``, the fast-weight kernels' timings (it parses its own
  options);
- :mod:`.rounds`: what the env and throughput benches share, the checks of a measured window and
  of the rounds, and a mean over rounds as their tables show it.

Each command's body (``bench_envs``, ``bench_throughput``, ``kernels.main``) is called by
``fwrl.launch.cli`` and returns the exit status.
"""
