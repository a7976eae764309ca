"""LLM backends behind one interface (:class:`~llmrubric.extract.backends.base.Backend`)."""

from llmrubric.extract.backends.base import Backend, check_labels
from llmrubric.io.errors import InputError

__all__ = ["BACKEND_KEYS", "Backend", "check_labels", "make_backend", "make_backend_from"]

BACKEND_KEYS = {
    "transformers": (
        "gguf_file",
        "device",
        "dtype",
        "threads",
        "batch_size",
        "prefix_batch_size",
        "prefix_reuse",
        "max_length",
        "overflow",
        "label_prefix",
        "chat_template",
        "gguf_cache",
    ),
    "openai": (
        "base_url",
        "endpoint",
        "api_key_env",
        "azure_api_version",
        "top_logprobs",
        "concurrency",
        "max_retries",
        "timeout",
        "backoff",
        "max_backoff",
        "pause_after",
        "pause",
        "max_pause",
        "down_after",
        "whitespace_continuation",
        "whitespace_min_prob",
        "samples",
        "samples_per_request",
        "tolerance",
        "tolerance_weights",
        "temperature",
        "max_tokens",
        "sum_tolerance",
        "structured_output",
        "seed",
    ),
}


def make_backend(name: str, **kwargs) -> Backend:
    """Build a backend by name: ``transformers`` or ``openai``."""
    if name == "transformers":
        from llmrubric.extract.backends.transformers_backend import TransformersBackend

        return TransformersBackend(**kwargs)
    if name == "openai":
        from llmrubric.extract.backends.openai_backend import OpenAIBackend

        return OpenAIBackend(**kwargs)
    raise InputError(f"unknown backend {name!r} (use 'transformers' or 'openai')")


def make_backend_from(settings: dict) -> Backend:
    """The backend that extraction ``settings`` (``backend``, ``model`` and that backend's keys) name."""
    name = settings["backend"]
    kwargs = {k: settings[k] for k in BACKEND_KEYS[name] if settings.get(k) is not None}
    mode = settings.get("mode") or "logprob"
    if name == "transformers" and mode != "logprob":
        raise InputError(
            f"mode {mode!r} reads generated answers from a server: use backend openai (conf/extract/openai.yaml, "
            "vllm.yaml, llama_cpp.yaml); the transformers backend reads logprobs only",
            setting="mode",
        )
    if name == "openai":
        kwargs["mode"] = mode
    if name == "transformers":
        try:
            return make_backend(name, path=settings["model"], **kwargs)
        except OSError as e:
            raise InputError(
                f"cannot load the model (not a model folder or a reachable Hugging Face id): {' '.join(str(e).split())[:300]}",
                file=str(settings["model"]),
                setting="--model",
            ) from e
    return make_backend(name, model=settings["model"], **kwargs)
