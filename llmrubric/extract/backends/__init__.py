"""LLM backends behind one interface (:class:`~llmrubric.extract.backends.base.Backend`)."""

from llmrubric.extract.backends.base import Backend, check_labels

__all__ = ["Backend", "check_labels", "make_backend"]


def make_backend(name: str, **kwargs) -> Backend:
    """Build a backend by name: ``transformers`` or ``openai``."""
    if name == "transformers":
        from llmrubric.extract.backends.transformers_backend import TransformersBackend

        return TransformersBackend(**kwargs)
    if name == "openai":
        from llmrubric.extract.backends.openai_backend import OpenAIBackend

        return OpenAIBackend(**kwargs)
    from llmrubric.io.errors import InputError

    raise InputError(f"unknown backend {name!r} (use 'transformers' or 'openai')")
