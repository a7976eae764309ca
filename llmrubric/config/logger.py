"""MLflow tracking settings (``logger.*``, ``conf/logger/``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class LoggerConfig:
    """MLflow tracking (``logger.*``, :mod:`llmrubric.experiments.tracking`); ``logger=none`` turns it off.

    Attributes:
        experiment: the MLflow experiment, one per experiment config.
        tracking_uri: None: ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlruns.db`` (artifacts in mlartifacts/ beside it).
    """

    enabled: bool = True
    experiment: str = "${name}"
    tracking_uri: str | None = None
