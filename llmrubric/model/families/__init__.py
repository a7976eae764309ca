"""The model families, one module (or subpackage) each. Importing this package imports every module in
its folder, in sorted order, and each registers its names in :mod:`llmrubric.model.core.registry`: a new
family is one module dropped here, with no list to edit (docs/architecture.md, "How to add a model family")."""

import importlib
import pkgutil

BUILT_IN = tuple(
    importlib.import_module(f"{__name__}.{name}") for name in sorted(m.name for m in pkgutil.iter_modules(__path__))
)
