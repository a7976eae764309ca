"""A prompt-injection detector: configurable patterns searched in each judged text.

A match does not change the answer: the block stays in the features and is listed as
``possible_injection`` in the failures table (with the matched words) and counted in the summary.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from llmrubric.config import conf_path
from llmrubric.io.errors import InputError, yaml_error

DEFAULT_PATTERNS = conf_path("injection", "default.yaml")


class InjectionDetector:
    """Case-insensitive regular expressions from a YAML file (``patterns: [...]``)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else DEFAULT_PATTERNS
        if not self.path.is_file():
            raise InputError("injection patterns file not found", file=str(self.path), setting="injection_patterns")
        try:
            data = yaml.safe_load(self.path.read_text())
        except yaml.YAMLError as e:
            raise yaml_error(e, str(self.path)) from None
        patterns = data.get("patterns") if isinstance(data, dict) else None
        if not isinstance(patterns, list) or not patterns:
            raise InputError("needs 'patterns:', a non-empty list of regular expressions", file=str(self.path))
        self.patterns = []
        for n, p in enumerate(patterns, 1):
            if not isinstance(p, str) or not p.strip():
                raise InputError(f"pattern {n} is not a non-empty string: {p!r}", file=str(self.path))
            try:
                self.patterns.append(re.compile(p, re.IGNORECASE))
            except re.error as e:
                raise InputError(f"pattern {n} {p!r} is not a regular expression: {e}", file=str(self.path)) from None

    def find(self, text: str) -> str | None:
        """The first matched words (at most 80 characters), or None."""
        for p in self.patterns:
            m = p.search(text)
            if m:
                return " ".join(m.group(0).split())[:80]
        return None


def make_detector(enabled, patterns: str | Path | None = None) -> InjectionDetector | None:
    """The detector when ``enabled`` (a bool, the ``detect_injection`` setting), else None."""
    if not isinstance(enabled, bool):
        raise InputError(f"must be true or false, not {enabled!r}", setting="detect_injection")
    return InjectionDetector(patterns) if enabled else None
