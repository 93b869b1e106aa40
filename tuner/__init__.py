"""Search and measure: Optuna studies over the kernel families, measured on a GPU.

Three parts, each a subpackage that says in its docstring what it owns and what it may import:

* ``tuner.measure``: how one config is measured (the Evaluator interface and its
  implementations: live GPU child + compile pool, replay of a recording, CPU stand-in), and
  recordings of measurements;
* ``tuner.search``: how configs are chosen (search space, samplers, static prior, warm start)
  and the study loop that asks, measures through an Evaluator and records;
* ``tuner.run``: how a command is driven (the command line, its option objects, the stores,
  the run over shapes and families, ``--worker``, ``--dry-run``).

Imports go run → search → measure, never back; all three may use the shared modules at this
level: ``tuner.problem`` (GEMM problems, a config's identity), ``tuner.report`` (terminal text)
and ``tuner.lifetime`` (stopping between trials; children that die with their parent).

Entry points: ``python -m tuner`` (``tuner.run.cli``), ``python -m tuner.record`` and
``python -m tuner.kerneltuner`` (``tuner.measure.record`` and ``tuner.measure.kerneltuner``).
"""
