"""The model families behind one interface (docs/architecture.md, "The model package"): ``core/``
holds what every family shares (the registry, checkpoints, encoding), ``families/`` one module per family, each
registering itself, and ``adaptive``, ``auto``, ``judges`` work on top of them. Importing this package
registers every family (``families`` imports its modules) and ``model=auto``."""

from llmrubric.model import auto, families  # noqa: F401  (registers every family, then those on top)
