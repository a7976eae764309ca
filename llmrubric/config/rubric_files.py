"""``rubric=/some/path.yaml``: a rubric file anywhere, not only the names of ``conf/rubric/``.

Hydra looks up a config group's options by name in its search path, so :func:`rubric_files` checks the file
(:meth:`~llmrubric.io.rubric.Rubric.load`: one line for a YAML error or an unknown key), stores its mapping in
Hydra's ConfigStore as the option ``file_<stem>`` of the group ``rubric`` and rewrites the override to it.
"""

from __future__ import annotations

import re
from pathlib import Path

RUBRIC_SUFFIXES = (".yaml", ".yml")
FILE_PREFIX = "file_"


def is_rubric_path(value: str) -> bool:
    """Whether a ``rubric=`` value names a file rather than an option of ``conf/rubric/``."""
    return value.lower().endswith(RUBRIC_SUFFIXES)


def rubric_files(overrides) -> list[str]:
    """``overrides`` with every ``rubric=<file.yaml>`` replaced by ``rubric=file_<stem>``, that file's rubric stored
    in the ConfigStore under that name (a missing or bad file is an :class:`~llmrubric.io.errors.InputError`)."""
    out = []
    for override in overrides:
        key, sep, value = str(override).partition("=")
        value = value.strip("'\"")
        if sep and key == "rubric" and is_rubric_path(value):
            override = f"rubric={store_rubric(Path(value))}"
        out.append(override)
    return out


def store_rubric(path: Path) -> str:
    """Store the rubric file ``path`` in the ConfigStore (group ``rubric``); its option name."""
    from hydra.core.config_store import ConfigStore

    from llmrubric.io.rubric import Rubric, read_rubric

    data = read_rubric(path)
    Rubric.from_dict(data, str(path), warn_main=False)  # every check of a rubric, before Hydra sees it
    data.setdefault("name", path.stem)
    name = FILE_PREFIX + re.sub(r"\W", "_", path.stem)
    ConfigStore.instance().store(group="rubric", name=name, node=data)
    return name
