"""A local model's prompts as token ids: the chat template, the answer position, each label's tokens as they
continue the prompt, and a text cut from the middle where a group's prompts overflow the context
(:class:`PromptTokens`, used by :class:`llmrubric.extract.backends.transformers_backend.TransformersBackend`)."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from llmrubric.extract.backends.base import check_labels
from llmrubric.extract.tasks import Result, Task
from llmrubric.io.errors import InputError

log = logging.getLogger(__name__)
MARKER = " [...] "


@dataclass
class Prepared:
    """A task's prompt and label token ids (after any truncation) and the truncation's warning."""

    task: Task
    ids: list[int]  # prompt token ids
    labels: list[list[int]]  # token ids of each label
    warning: str = ""


def shared_prefix(ids: Sequence[Sequence[int]]) -> int:
    """Length of the longest common token prefix, leaving every sequence at least one token."""
    first = ids[0]
    n = min(len(i) for i in ids) - 1
    for other in ids[1:]:
        k = 0
        while k < n and other[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


class PromptTokens:
    """Tasks as token ids for one tokenizer (the backend's arguments of the same names).

    Args:
        tokenizer: the model's tokenizer.
        seq2seq: an encoder-decoder model (labels start the decoder afresh).
        max_length: the context size; overflow: ``truncate`` or ``refuse`` a group that does not fit.
        label_prefix: put before each label (None: :meth:`_find_answer_prefix`).
        chat_template: wrap the prompt as a user message with the tokenizer's chat template.
        prefix_reuse: count a group's shared prefix once in :meth:`prefill_plan`.
    """

    def __init__(
        self,
        tokenizer,
        *,
        seq2seq: bool,
        max_length: int,
        overflow: str,
        label_prefix: str | None,
        chat_template: bool,
        prefix_reuse: bool,
    ):
        self.tokenizer, self.seq2seq, self.max_length, self.overflow = tokenizer, seq2seq, max_length, overflow
        self.chat_template, self.label_prefix, self.prefix_reuse = chat_template, label_prefix, prefix_reuse
        if self.chat_template and not getattr(tokenizer, "chat_template", None):
            raise InputError("chat_template is on but the tokenizer has no chat template")
        self.answer_prefix = self._find_answer_prefix()

    def prompt_text(self, prompt: str) -> str:
        if not self.chat_template:
            return prompt
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )

    def _find_answer_prefix(self) -> str:
        """What the model's own format puts between the prompt and the answer.

        With a chat template: the text between the generation prompt and an assistant message's
        content, found by rendering a conversation with a sentinel answer (usually ``""``).
        Without: ``" "``, as in a completion ``Answer: 1`` (templates end without whitespace);
        seq2seq decoders start fresh (``""``). A set ``label_prefix`` is used as given.
        """
        if self.label_prefix is not None:
            return self.label_prefix
        if self.seq2seq:
            return ""
        if not self.chat_template:
            return " "
        sentinel, user = "\u2063ANSWER\u2063", [{"role": "user", "content": "?"}]
        opened = self.tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        answered = self.tokenizer.apply_chat_template(
            user + [{"role": "assistant", "content": sentinel}], tokenize=False
        )
        at = answered.find(sentinel)
        if at < 0 or not answered[:at].startswith(opened):
            raise InputError(
                "the chat template's answer position cannot be found (an assistant message does not continue its "
                "generation prompt); set label_prefix"
            )
        return answered[len(opened) : at]

    def encode(self, text: str, special: bool = True) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def label_ids(self, prompt_text: str, ids: list[int], label: str) -> list[int]:
        """The label's tokens as they continue the prompt at the answer position."""
        if self.seq2seq:
            return self.encode(self.answer_prefix + label, special=False)
        full = self.encode(prompt_text + self.answer_prefix + label)
        if full[: len(ids)] != ids:
            raise InputError(
                f"label {label!r} merges with the end of the prompt into other tokens, so its answer position cannot be "
                f"found; change label_prefix (now {self.answer_prefix!r}) or the template's last line"
            )
        return full[len(ids) :]

    def prepare(self, task: Task) -> Prepared:
        text = self.prompt_text(task.prompt)
        ids = self.encode(text)
        labels = [self.label_ids(text, ids, label) for label in task.labels]
        check_labels(task.question_id, task.labels, labels)
        return Prepared(task, ids, labels)

    def needed(self, p: Prepared) -> int:
        longest = max(len(label) for label in p.labels)
        return len(p.ids) + (longest - 1 if not self.seq2seq else 0)

    def fit_group(self, tasks: list[Task]) -> tuple[list[Prepared], list[Result]]:
        """Tokenise a group's tasks; truncate their shared text from the middle if too long."""
        prepared = [self.prepare(t) for t in tasks]
        excess = max(self.needed(p) for p in prepared) - self.max_length
        if excess <= 0:
            return prepared, []
        text = tasks[0].text
        reason = f"prompt needs {excess + self.max_length} tokens, more than the context of {self.max_length}"
        if self.overflow == "refuse" or not text or any(t.text != text or text not in t.prompt for t in tasks):
            return [], [Result(t, None, "failed", reason) for t in tasks]
        text_ids = self.encode(text, special=False)
        cut = 0
        for _ in range(4):
            cut = min(len(text_ids), cut + excess + len(self.encode(MARKER, special=False)) + 2)
            keep = len(text_ids) - cut
            if keep < 2:
                return [], [Result(t, None, "failed", reason + " even with the text removed") for t in tasks]
            short = (
                self.tokenizer.decode(text_ids[: keep // 2])
                + MARKER
                + self.tokenizer.decode(text_ids[len(text_ids) - (keep - keep // 2) :])
            )
            prepared = [self.prepare(replace(t, prompt=t.prompt.replace(text, short, 1))) for t in tasks]
            excess = max(self.needed(p) for p in prepared) - self.max_length
            if excess <= 0:
                warning = f"truncated {cut} of {len(text_ids)} text tokens from the middle to fit the context of {self.max_length}"
                log.warning("text %s: %s", tasks[0].text_id, warning)
                for p, t in zip(prepared, tasks):
                    p.task, p.warning = t, warning
                return prepared, []
        return [], [Result(t, None, "failed", reason + " (truncation did not converge)") for t in tasks]

    def prefill_plan(self, tasks: Sequence[Task]) -> dict:
        """Token counts without running the model: ``naive`` (every prompt in full) and
        ``shared`` (each group's shared prefix once plus every suffix), after truncation."""
        groups: dict[str, list[Task]] = defaultdict(list)
        for t in tasks:
            groups[t.group].append(t)
        naive = shared = prompts = refused = 0
        for group in groups.values():
            prepared, failed = self.fit_group(group)
            refused += len(failed)
            ids = [p.ids for p in prepared]
            prompts += len(ids)
            naive += sum(len(i) for i in ids)
            prefix = shared_prefix(ids) if self.prefix_reuse and len(ids) > 1 else 0
            shared += prefix + sum(len(i) - prefix for i in ids)
        return {"prompts": prompts, "refused": refused, "naive_prefill_tokens": naive, "shared_prefill_tokens": shared}
