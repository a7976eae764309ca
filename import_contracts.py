"""An import-linter contract type: no module of the root packages imports a private part of another package.

``from optuna.storages._rdb import models`` (a private module) and ``from optuna.study import _helper``
(a private name) break it; names such as ``__future__`` or ``__version__`` are not private. Registered in
``pyproject.toml`` (``[tool.importlinter]`` ``contract_types``) and run by ``lint-imports`` in ``make test``.

A top-level module of the repository, not of the package: ``lint-imports`` puts the folder it runs in on
``sys.path``, so running it from the root finds this file with no ``PYTHONPATH``, and the wheel, whose
packages ``pyproject.toml`` lists, leaves out this tool of the test dependencies (import-linter).
"""

from __future__ import annotations

import ast

from importlinter import Contract, ContractCheck, fields, output


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_parts(line: str) -> list[str]:
    """The private modules and names an import statement ``line`` names (empty when it names none)."""
    try:
        statement = ast.parse(line.strip()).body[0]
    except (SyntaxError, IndexError):
        return []
    if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
        module = statement.module
        hits = [module] if any(_private(part) for part in module.split(".")) else []
        return hits + [f"{module}.{alias.name}" for alias in statement.names if _private(alias.name)]
    if isinstance(statement, ast.Import):
        return [a.name for a in statement.names if any(_private(part) for part in a.name.split("."))]
    return []


class PrivateImportsContract(Contract):
    """Options: ``importers`` (the packages whose imports are checked)."""

    type_name = "no_private_imports"
    importers = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        broken = []
        for package in self.importers:
            for importer in sorted(graph.find_descendants(package) | {package}):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if imported.split(".")[0] == package.split(".")[0]:
                        continue
                    for detail in graph.get_import_details(importer=importer, imported=imported):
                        for part in _private_parts(detail["line_contents"]):
                            broken.append(f"{importer}:{detail['line_number']} imports {part}")
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for line in check.metadata["broken"]:
            output.print_error(line, bold=False)
            output.new_line()
