"""Local transformers models (causal or seq2seq), on GPU in bf16 or on CPU.

A label's probability is that of its whole token sequence as a continuation of the prompt:
``p(label) = prod_j p(t_j | prompt, t_<j)``, computed from the model's logits in float32.
Mass outside the labels is kept (the probabilities are not renormalised).

Causal models reuse the key/value cache of the prompt prefix shared by all tasks of one
group (a text asked several questions): the prefixes of ``batch_size`` groups run once (in
passes of ``prefix_batch_size`` right-padded prefixes; on CPU one prefix a pass, so attention
takes the causal kernel without a padding mask), and the question suffixes of all those groups
run in length-sorted batches on their group's cache rows. Seq2seq encoders are bidirectional, so the
whole prompt is encoded per task; the decoder scores the labels.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from llmrubric.extract import models
from llmrubric.extract.backends.base import Backend, check_labels
from llmrubric.extract.tasks import Result, Task
from llmrubric.io.errors import InputError

log = logging.getLogger(__name__)
MARKER = " [...] "


@dataclass
class _Prepared:
    task: Task
    ids: list[int]  # prompt token ids
    labels: list[list[int]]  # token ids of each label
    warning: str = ""


@dataclass
class _Row:
    """One sequence to run: ``tokens`` after the shared prefix; scores read at ``start``..."""

    item: int  # index into the prepared list
    tokens: list[int]
    start: int  # position in ``tokens`` whose logits predict the first label token
    labels: tuple[int, ...] | None  # labels read here (all but their last token in it); None: every 1-token label


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


class TransformersBackend(Backend):
    """Score tasks with a local ``transformers`` model.

    Args:
        model, tokenizer: loaded objects, or ``path`` (an HF folder or a ``.gguf`` file, see
            :mod:`llmrubric.extract.models`; ``gguf_file`` names one in a folder) to load both.
        device: ``cpu``/``cuda``; dtype: ``bfloat16``/``float32``/``auto`` (bf16 on GPU).
        batch_size: sequences per forward pass (rows are sorted by length into buckets).
        prefix_batch_size: shared prefixes per padded forward pass (default: 1 on CPU, where a
            padding mask costs the causal attention kernel about half its speed; else ``batch_size``).
        prefix_reuse: run a group's shared prompt prefix once and reuse its KV cache.
        max_length: context size (default: the model's ``max_position_embeddings``).
        overflow: ``truncate`` (cut the text from the middle, with a recorded warning) or
            ``refuse`` (the task fails with the reason).
        label_prefix: put before each label; default (None): derived from the model's format at
            the answer position (:meth:`_answer_prefix`).
        chat_template: wrap the prompt as a user message with the tokenizer's chat template.
        threads: CPU threads (default: the CPUs this process may use).
        gguf_cache: a folder where a ``.gguf`` model's converted copy is kept and loaded from next time
            (:mod:`llmrubric.extract.converted`); None: convert at every load.
    """

    def __init__(
        self,
        model=None,
        tokenizer=None,
        *,
        path: str | None = None,
        gguf_file: str | None = None,
        device: str | None = None,
        dtype: str = "auto",
        batch_size: int = 16,
        prefix_batch_size: int | None = None,
        prefix_reuse: bool = True,
        max_length: int | None = None,
        overflow: str = "truncate",
        label_prefix: str | None = None,
        chat_template: bool = False,
        threads: int | None = None,
        model_id: str | None = None,
        gguf_cache: str | None = None,
    ):
        for key, value in (("batch_size", batch_size), ("prefix_batch_size", prefix_batch_size)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InputError(f"{key} must be a whole number >= 1, not {value!r}")
        if overflow not in ("truncate", "refuse"):
            raise InputError(f"overflow must be 'truncate' or 'refuse', not {overflow!r}")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        if dtype not in ("float32", "bfloat16", "float16"):
            raise InputError(f"dtype must be auto, float32, bfloat16 or float16, not {dtype!r}")
        torch_dtype = getattr(torch, dtype)
        if device == "cpu":
            torch.set_num_threads(int(threads or len(os.sched_getaffinity(0))))
        name = model_id
        if model is None:
            if path is None:
                raise InputError("the transformers backend needs a model path (--model)")
            files = models.resolve(path, gguf_file)
            model, tokenizer = models.load(files, torch_dtype, gguf_cache)
            name = name or f"{files.name}@{models.weights_hash(files)}{models.tokenizer_tag(files)}"
        if tokenizer is None:
            raise InputError("the transformers backend needs a tokenizer")
        self.model = model.to(device=device, dtype=torch_dtype).eval()
        self.tokenizer = tokenizer
        self.device = device
        self.seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
        self.batch_size = int(batch_size)
        self.prefix_batch_size = int(prefix_batch_size or (1 if device == "cpu" else batch_size))
        self.prefix_reuse = bool(prefix_reuse) and not self.seq2seq
        self.max_length = int(
            max_length
            or getattr(model.config, "max_position_embeddings", 0)
            or getattr(model.config, "n_positions", 0)
            or 512
        )
        self.overflow = overflow
        self.chat_template = bool(chat_template)
        if self.chat_template and not getattr(tokenizer, "chat_template", None):
            raise InputError("chat_template is on but the tokenizer has no chat template")
        self.label_prefix = label_prefix
        self.answer_prefix = self._answer_prefix()
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        forward = inspect.signature(self.model.forward).parameters
        self.head_only = not self.seq2seq and "logits_to_keep" in forward
        # the key/value cache's name in and out of forward: ``cache`` since transformers 5.x deprecated
        # ``past_key_values`` (removed in 5.40); older releases know only the latter
        self.cache_name = "cache" if "cache" in forward else "past_key_values"
        name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        self._model_id = (
            f"{name}|{dtype}|max{self.max_length}|{overflow}|lp={self.answer_prefix!r}|chat={self.chat_template}"
        )
        self.stats = {"prefill_tokens": 0, "prompt_tokens": 0, "forward_passes": 0, "prefix_passes": 0}

    @property
    def model_id(self) -> str:
        return self._model_id

    # -- tokenisation -------------------------------------------------------------------

    def _prompt_text(self, prompt: str) -> str:
        if not self.chat_template:
            return prompt
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )

    def _answer_prefix(self) -> str:
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

    def _encode(self, text: str, special: bool = True) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def _label_ids(self, prompt_text: str, ids: list[int], label: str) -> list[int]:
        """The label's tokens as they continue the prompt at the answer position."""
        if self.seq2seq:
            return self._encode(self.answer_prefix + label, special=False)
        full = self._encode(prompt_text + self.answer_prefix + label)
        if full[: len(ids)] != ids:
            raise InputError(
                f"label {label!r} merges with the end of the prompt into other tokens, so its answer position cannot be "
                f"found; change label_prefix (now {self.answer_prefix!r}) or the template's last line"
            )
        return full[len(ids) :]

    def _prepare(self, task: Task) -> _Prepared:
        text = self._prompt_text(task.prompt)
        ids = self._encode(text)
        labels = [self._label_ids(text, ids, label) for label in task.labels]
        check_labels(task.question_id, task.labels, labels)
        return _Prepared(task, ids, labels)

    def _needed(self, p: _Prepared) -> int:
        longest = max(len(label) for label in p.labels)
        return len(p.ids) + (longest - 1 if not self.seq2seq else 0)

    def _fit_group(self, tasks: list[Task]) -> tuple[list[_Prepared], list[Result]]:
        """Tokenise a group's tasks; truncate their shared text from the middle if too long."""
        prepared = [self._prepare(t) for t in tasks]
        excess = max(self._needed(p) for p in prepared) - self.max_length
        if excess <= 0:
            return prepared, []
        text = tasks[0].text
        reason = f"prompt needs {excess + self.max_length} tokens, more than the context of {self.max_length}"
        if self.overflow == "refuse" or not text or any(t.text != text or text not in t.prompt for t in tasks):
            return [], [Result(t, None, "failed", reason) for t in tasks]
        text_ids = self._encode(text, special=False)
        cut = 0
        for _ in range(4):
            cut = min(len(text_ids), cut + excess + len(self._encode(MARKER, special=False)) + 2)
            keep = len(text_ids) - cut
            if keep < 2:
                return [], [Result(t, None, "failed", reason + " even with the text removed") for t in tasks]
            short = (
                self.tokenizer.decode(text_ids[: keep // 2])
                + MARKER
                + self.tokenizer.decode(text_ids[len(text_ids) - (keep - keep // 2) :])
            )
            prepared = [self._prepare(replace(t, prompt=t.prompt.replace(text, short, 1))) for t in tasks]
            excess = max(self._needed(p) for p in prepared) - self.max_length
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
            prepared, failed = self._fit_group(group)
            refused += len(failed)
            ids = [p.ids for p in prepared]
            prompts += len(ids)
            naive += sum(len(i) for i in ids)
            prefix = shared_prefix(ids) if self.prefix_reuse and len(ids) > 1 else 0
            shared += prefix + sum(len(i) - prefix for i in ids)
        return {"prompts": prompts, "refused": refused, "naive_prefill_tokens": naive, "shared_prefill_tokens": shared}

    # -- scoring ------------------------------------------------------------------------

    def score(self, tasks: Sequence[Task]) -> Iterator[Result]:
        """Groups with a shared prefix are batched in order of prefix length, so little of a
        prefix batch is padding; the rest in task order."""
        groups: dict[str, list[Task]] = defaultdict(list)
        for t in tasks:
            groups[t.group].append(t)
        pending: list[_Prepared] = []
        shared: list[tuple[int, list[_Prepared]]] = []
        for group in groups.values():
            prepared, failed = self._fit_group(group)
            yield from failed
            if self.prefix_reuse and len(prepared) > 1:
                shared.append((shared_prefix([p.ids for p in prepared]), prepared))
            elif prepared:
                pending.extend(prepared)
                if len(pending) >= self.batch_size:
                    yield from self._score_pending(pending)
                    pending = []
        if pending:
            yield from self._score_pending(pending)
        shared.sort(key=lambda s: s[0])
        for start in range(0, len(shared), self.batch_size):
            yield from self._score_shared([g for _, g in shared[start : start + self.batch_size]])

    def _score_pending(self, prepared: list[_Prepared]) -> Iterator[Result]:
        return self._score_seq2seq(prepared) if self.seq2seq else self._score_causal(prepared, reuse=False)

    @staticmethod
    def _rows(prepared: list[_Prepared], prefix: int) -> list[_Row]:
        rows = []
        for i, p in enumerate(prepared):
            suffix = p.ids[prefix:]
            if all(len(label) == 1 for label in p.labels):
                rows.append(_Row(i, suffix, len(suffix) - 1, None))
            else:  # labels that differ only in their last token (" 1", " 2": " " then a digit) share one row
                heads: dict[tuple[int, ...], list[int]] = defaultdict(list)
                for k, label in enumerate(p.labels):
                    heads[tuple(label[:-1])].append(k)
                rows.extend(_Row(i, suffix + list(head), len(suffix) - 1, tuple(ks)) for head, ks in heads.items())
        return sorted(rows, key=lambda r: len(r.tokens))

    def _pad(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-pad: (B, L) ids and (B, L) mask."""
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for b, s in enumerate(seqs):
            ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[b, : len(s)] = 1
        return ids.to(self.device), mask.to(self.device)

    def _logprobs(self, batch: list[_Row], **inputs) -> list[torch.Tensor]:
        """Run the model on one batch; per row, float32 log-probabilities at its read positions
        (``start`` onwards: one per label token). The LM head runs only there."""
        reads = [1 if r.labels is None else max(len(r.tokens) - r.start, 1) for r in batch]
        if self.head_only:
            width = max(reads)
            keep = torch.tensor(
                [[r.start + min(j, n - 1) for j in range(width)] for r, n in zip(batch, reads)], device=self.device
            )
            logits = self.model(**inputs, logits_to_keep=keep).logits  # (B, width, V)
            lp = torch.log_softmax(logits.float(), dim=-1)
            return [lp[b, :n] for b, n in enumerate(reads)]
        logits = self.model(**inputs).logits
        return [
            torch.log_softmax(logits[b, r.start : r.start + n].float(), dim=-1)
            for b, (r, n) in enumerate(zip(batch, reads))
        ]

    def _prefix_cache(self, ids: torch.Tensor, mask: torch.Tensor | None = None):
        kwargs = {"logits_to_keep": 1} if self.head_only else {}
        return getattr(self.model(input_ids=ids, attention_mask=mask, use_cache=True, **kwargs), self.cache_name)

    def _prefix_caches(self, prefixes: list[list[int]]):
        """One cache over all ``prefixes`` (right-padded to the longest) and its (B, L) mask, run
        in passes of ``prefix_batch_size`` prefixes."""
        from transformers import DynamicCache

        ids, mask = self._pad(prefixes)
        width, parts = ids.shape[1], []
        for start in range(0, len(prefixes), self.prefix_batch_size):
            part_mask = mask[start : start + self.prefix_batch_size]
            used = int(part_mask.sum(dim=1).max())
            single = part_mask.shape[0] == 1
            parts.append(
                self._prefix_cache(
                    ids[start : start + part_mask.shape[0], :used], None if single else part_mask[:, :used]
                )
            )
            self.stats["forward_passes"] += 1
            self.stats["prefix_passes"] += 1
        self.stats["prefill_tokens"] += int(mask.sum())
        if len(parts) == 1 and parts[0].layers[0].keys.shape[2] == width:
            return parts[0], mask

        def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
            return torch.cat([torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[2])) for t in tensors], dim=0)

        layers = zip(*(part.layers for part in parts))
        cache = DynamicCache(
            [(stacked([x.keys for x in layer]), stacked([x.values for x in layer])) for layer in layers],
            config=self.model.config,
        )
        return cache, mask

    def _select(self, cache, rows: torch.Tensor):
        """A new cache with the given batch rows of ``cache`` (which is left as it is)."""
        from transformers import DynamicCache

        return DynamicCache(
            [(layer.keys[rows], layer.values[rows]) for layer in cache.layers], config=self.model.config
        )

    @torch.inference_mode()
    def _score_causal(self, prepared: list[_Prepared], reuse: bool) -> Iterator[Result]:
        prefix_len, cache = 0, None
        if reuse:
            first = prepared[0].ids
            prefix_len = shared_prefix([p.ids for p in prepared])
            if prefix_len > 0:
                cache = self._prefix_cache(torch.tensor([first[:prefix_len]], device=self.device))
                self.stats["prefill_tokens"] += prefix_len
                self.stats["forward_passes"] += 1
                self.stats["prefix_passes"] += 1
        logprobs: dict[int, dict[int | None, torch.Tensor]] = defaultdict(dict)
        rows = self._rows(prepared, prefix_len)
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start : start + self.batch_size]
            ids, mask = self._pad([r.tokens for r in batch])
            kwargs = {}
            if cache is not None:
                kwargs[self.cache_name] = self._select(
                    cache, torch.zeros(len(batch), dtype=torch.long, device=self.device)
                )
                mask = torch.cat(
                    [torch.ones((len(batch), prefix_len), dtype=mask.dtype, device=mask.device), mask], dim=1
                )
            lps = self._logprobs(batch, input_ids=ids, attention_mask=mask, use_cache=cache is not None, **kwargs)
            self.stats["prefill_tokens"] += sum(len(r.tokens) for r in batch)
            self.stats["forward_passes"] += 1
            for r, lp in zip(batch, lps):
                logprobs[r.item].update(dict.fromkeys(r.labels or (None,), lp))
        yield from self._collect(prepared, logprobs, prefix_len)

    @torch.inference_mode()
    def _score_shared(self, groups: list[list[_Prepared]]) -> Iterator[Result]:
        """Several groups (texts) at once: their shared prefixes run as one right-padded batch, then
        the question suffixes of all groups run in length-sorted batches on their group's cache
        rows, with positions continuing after each group's own prefix."""
        lengths = [shared_prefix([p.ids for p in g]) for g in groups]
        if min(lengths) == 0:
            for g in groups:
                yield from self._score_causal(g, reuse=True)
            return
        cache, prefix_mask = self._prefix_caches([g[0].ids[:n] for g, n in zip(groups, lengths)])
        rows = sorted(
            ((gi, row) for gi, (g, n) in enumerate(zip(groups, lengths)) for row in self._rows(g, n)),
            key=lambda r: len(r[1].tokens),
        )
        logprobs: list[dict[int, dict[int | None, torch.Tensor]]] = [defaultdict(dict) for _ in groups]
        offsets = torch.tensor(lengths, device=self.device)
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start : start + self.batch_size]
            owner = torch.tensor([gi for gi, _ in batch], device=self.device)
            ids, mask = self._pad([r.tokens for _, r in batch])
            positions = offsets[owner][:, None] + torch.arange(ids.shape[1], device=self.device)[None, :]
            lps = self._logprobs(
                [r for _, r in batch],
                input_ids=ids,
                attention_mask=torch.cat([prefix_mask[owner], mask], dim=1),
                position_ids=positions,
                use_cache=True,
                **{self.cache_name: self._select(cache, owner)},
            )
            self.stats["prefill_tokens"] += sum(len(r.tokens) for _, r in batch)
            self.stats["forward_passes"] += 1
            for (gi, r), lp in zip(batch, lps):
                logprobs[gi][r.item].update(dict.fromkeys(r.labels or (None,), lp))
        for g, n, lp in zip(groups, lengths, logprobs):
            yield from self._collect(g, lp, n)

    def _collect(self, prepared, logprobs, prefix_len: int) -> Iterator[Result]:
        for i, p in enumerate(prepared):
            probs = {}
            for k, (option, label) in enumerate(zip(p.task.options, p.labels)):
                lp = logprobs[i].get(None) if None in logprobs[i] else logprobs[i][k]
                total = sum(float(lp[j, tok]) for j, tok in enumerate(label))
                probs[option] = float(torch.tensor(total).exp())
            computed = len(p.ids) - prefix_len + (prefix_len if i == 0 else 0)
            self.stats["prompt_tokens"] += len(p.ids)
            yield Result(p.task, probs, "ok", "", len(p.ids), computed, p.warning)

    @torch.inference_mode()
    def _score_seq2seq(self, prepared: list[_Prepared]) -> Iterator[Result]:
        start_id = self.model.config.decoder_start_token_id
        if start_id is None:
            start_id = self.pad_id
        logprobs: dict[int, dict[int | None, torch.Tensor]] = defaultdict(dict)
        order = sorted(range(len(prepared)), key=lambda i: len(prepared[i].ids))
        encoder = self.model.get_encoder()
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            ids, mask = self._pad([prepared[i].ids for i in chunk])
            hidden = encoder(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, L, H)
            self.stats["prefill_tokens"] += int(mask.sum())
            rows = [
                (b, i, None, [start_id]) if all(len(x) == 1 for x in prepared[i].labels) else None
                for b, i in enumerate(chunk)
            ]
            flat = []
            for b, i in enumerate(chunk):
                if rows[b] is not None:
                    flat.append(rows[b])
                else:
                    flat.extend((b, i, k, [start_id] + label[:-1]) for k, label in enumerate(prepared[i].labels))
            dec_ids, dec_mask = self._pad([f[3] for f in flat])
            pick = torch.tensor([f[0] for f in flat], device=self.device)
            logits = self.model(
                encoder_outputs=(hidden[pick],),
                attention_mask=mask[pick],
                decoder_input_ids=dec_ids,
                decoder_attention_mask=dec_mask,
            ).logits
            self.stats["forward_passes"] += 1
            lp = torch.log_softmax(logits.float(), dim=-1)
            for row, (_, i, k, _) in enumerate(flat):
                logprobs[i][k] = lp[row]
        yield from self._collect(prepared, logprobs, 0)


def generate(backend: TransformersBackend, prompt: str, max_new_tokens: int = 256) -> str:
    """Greedy generation with the backend's model (test-bank generation)."""
    text = backend._prompt_text(prompt)
    ids = torch.tensor([backend._encode(text)], device=backend.device)
    with torch.inference_mode():
        out = backend.model.generate(
            input_ids=ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=backend.pad_id
        )
    new = out[0] if backend.seq2seq else out[0, ids.shape[1] :]
    return backend.tokenizer.decode(new, skip_special_tokens=True)
