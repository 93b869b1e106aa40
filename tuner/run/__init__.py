"""How a command is driven: from the command line to the studies and back to a table.

Owns the command line of ``python -m tuner`` (``cli``: parsing, at the edge, into the frozen
option objects of ``options``; dispatch), opening the stores and running a tuning command
(``tune``), the run over shapes and families (``session``), the Optuna storage (``storage``),
the job loop (``worker``) and ``--dry-run`` (``dryrun``).

May import everything below it: ``tuner.search``, ``tuner.measure``, the shared modules,
``kernels`` and ``db``. Nothing imports ``tuner.run`` but the entry points.
"""
