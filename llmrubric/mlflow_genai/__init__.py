"""Calibrated judges inside MLflow's GenAI evaluation (MLflow 3: assessments on traces).

:mod:`.read`: an experiment's traces → annotations (``HUMAN`` feedback), features (``LLM_JUDGE``
feedback) and texts; :mod:`.write`: the inverse (tables → traces) and calibrated scores → ``CODE``
feedback on their traces; :mod:`.scorer`: a ``Scorer`` for ``mlflow.genai.evaluate`` from a trained
checkpoint; :mod:`.review`: a review queue with a label schema per rubric question (docs/mlflow.md).
"""
