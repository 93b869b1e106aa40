"""How configs are chosen: one Optuna study per (GPU model, family + source hash, problem).

Owns the search space encoding (``space``), the samplers (``samplers``), the static start-up
prior (``prior``), warm start from stored results (``warmstart``), the study loop (``study``:
Budget, Session, run_study) and several workers sharing a study (``fleet``).

May import: ``kernels``, ``db``, ``optuna``, ``tuner.measure`` (the Evaluator interface it
measures through) and the shared ``tuner.problem``, ``tuner.report``, ``tuner.lifetime``.
Never ``tuner.run``: a study is handed everything it needs (a Session, a Budget).
"""
