"""How a config is measured, and measurements kept.

Owns the Evaluator interface (``evaluator``: Measurement, Baseline, trial states) and its
implementations — ``live`` (NVRTC compile pool + GPU child process running ``gpu``), ``replay``
(answers from a recording) and ``testing`` (CPU stand-ins) — plus what a compiled config uses
(``resources``), the recording file format (``recording``), making recordings (``record``) and
Kernel Tuner's formats (``kerneltuner``).

May import: ``kernels``, ``db`` (its records), and the shared ``tuner.problem``,
``tuner.report``, ``tuner.lifetime``. Never ``tuner.search`` or ``tuner.run``: the search
loop is a user of this package, not the other way round.
"""
