"""Experiment glue below the apps and the report: a run's data and splits (``experiment``), the method
variants the report compares (``variants``), the Optuna search (``search``) and MLflow tracking (``tracking``)."""
