"""LLM feature extraction: answer distributions p_LLM(y | T, Q) → the features table.

Backends (``backends/``: transformers, OpenAI-compatible) score :class:`Task` prompts built
by question families (``families``) from Jinja templates (``prompts``, ``conf/prompts/``);
``runner.extract`` runs them through the SQLite result store (``cache``); ``summaries``
turns variable-size test banks (``testbank``) into fixed blocks; ``adapters`` reads texts.
"""

from llmrubric.extract.cache import ResultCache
from llmrubric.extract.families import item_tasks, likert_tasks
from llmrubric.extract.prompts import PromptTemplate
from llmrubric.extract.runner import Extraction, extract
from llmrubric.extract.tasks import Result, Task

__all__ = ["Extraction", "PromptTemplate", "Result", "ResultCache", "Task", "extract", "item_tasks", "likert_tasks"]
