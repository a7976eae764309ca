"""Calibrated judges inside MLflow's GenAI evaluation (MLflow 3: assessments on traces).

:mod:`.read`: an experiment's traces → annotations (``HUMAN`` feedback), features (``LLM_JUDGE``
feedback) and texts; :mod:`.write`: the inverse (tables → traces) and calibrated scores → ``CODE``
feedback on their traces; :mod:`.scorer`: a ``Scorer`` for ``mlflow.genai.evaluate`` from a trained
checkpoint; :mod:`.review`: a review queue with a label schema per rubric question; :mod:`.store`: the
tracking store checked before work, its failures as one line (docs/mlflow.md).

Importing the package sizes MLflow's HTTP connection pool to MLflow's own thread pools
(:func:`.store.size_http_pool`; ``MLFLOW_HTTP_POOL_MAXSIZE`` set by the user wins), before MLflow opens its
session: otherwise trace search and evaluate discard connections and flood the log with urllib3's
"Connection pool is full".
"""

from llmrubric.mlflow_genai.store import size_http_pool

size_http_pool()
