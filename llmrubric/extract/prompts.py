"""Prompt templates: Jinja files under ``conf/prompts/``, rendered with StrictUndefined.

A template's hash covers its own source and the sources of the files it imports, so a
changed prompt never reuses cached answers of the old one.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from pathlib import Path

import jinja2
import jinja2.meta

from llmrubric.config import conf_path
from llmrubric.io.errors import InputError

PROMPTS_DIR = conf_path("prompts")


class PromptTemplate:
    """One Jinja template file; ``render(**variables)`` fails loudly on a missing variable."""

    def __init__(self, name: str, directory: str | Path | None = None):
        self.directory = Path(directory) if directory else PROMPTS_DIR
        file = name if name.endswith(".j2") else f"{name}.j2"
        self.path = self.directory / file
        if not self.path.is_file():
            raise InputError("prompt template not found", file=str(self.path))
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(self.directory)),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=False,
            autoescape=False,
        )
        self.name = Path(file).stem
        try:
            self.template = self.env.get_template(file)
        except jinja2.TemplateSyntaxError as e:
            raise InputError(f"template syntax error: {e.message}", file=str(self.path), row=e.lineno) from e

    @cached_property
    def hash(self) -> str:
        """sha256 (16 hex digits) of the template and every template it references."""
        digest = hashlib.sha256()
        seen, todo = set(), [self.path.name]
        while todo:
            file = todo.pop()
            if file in seen:
                continue
            seen.add(file)
            source = (self.directory / file).read_text()
            digest.update(file.encode() + b"\0" + source.encode() + b"\0")
            todo.extend(sorted(f for f in jinja2.meta.find_referenced_templates(self.env.parse(source)) if f))
        return digest.hexdigest()[:16]

    def render(self, **variables) -> str:
        try:
            return self.template.render(**variables).strip()
        except jinja2.UndefinedError as e:
            raise InputError(
                f"template variable error: {e.message} (given {sorted(variables)})", file=str(self.path)
            ) from e


def text_hash(*parts: str) -> str:
    """sha256 (16 hex digits) of the given strings, separated unambiguously."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]
