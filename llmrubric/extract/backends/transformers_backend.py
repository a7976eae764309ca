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
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence

import torch

from llmrubric.extract import models
from llmrubric.extract.backends.base import Backend
from llmrubric.extract.backends.batching import Row, label_rows, right_pad, select_rows, stack_caches
from llmrubric.extract.backends.prompt_tokens import Prepared, PromptTokens, shared_prefix
from llmrubric.extract.tasks import Result, Task
from llmrubric.io.errors import InputError


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
            the answer position (:meth:`PromptTokens._find_answer_prefix`).
        chat_template: wrap the prompt as a user message with the tokenizer's chat template.
        threads: CPU threads, set for the whole process (default: torch's own number, capped by the CPUs this
            process may use; a caller that lowered it, such as one of several workers sharing the cores, keeps it).
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
            torch.set_num_threads(int(threads or min(torch.get_num_threads(), len(os.sched_getaffinity(0)))))
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
        self.tokens = PromptTokens(
            tokenizer,
            seq2seq=self.seq2seq,
            max_length=self.max_length,
            overflow=overflow,
            label_prefix=label_prefix,
            chat_template=bool(chat_template),
            prefix_reuse=self.prefix_reuse,
        )
        self.answer_prefix = self.tokens.answer_prefix
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        forward = inspect.signature(self.model.forward).parameters
        self.head_only = not self.seq2seq and "logits_to_keep" in forward
        # the key/value cache's name in and out of forward: ``cache`` since transformers 5.x deprecated
        # ``past_key_values`` (removed in 5.40); older releases know only the latter
        self.cache_name = "cache" if "cache" in forward else "past_key_values"
        name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        self._model_id = (
            f"{name}|{dtype}|max{self.max_length}|{overflow}|lp={self.answer_prefix!r}|chat={bool(chat_template)}"
        )
        self.stats = {"prefill_tokens": 0, "prompt_tokens": 0, "forward_passes": 0, "prefix_passes": 0}

    def _pad(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return right_pad(seqs, self.pad_id, self.device)

    @property
    def model_id(self) -> str:
        return self._model_id

    def prefill_plan(self, tasks: Sequence[Task]) -> dict:
        """Token counts without running the model (:meth:`PromptTokens.prefill_plan`)."""
        return self.tokens.prefill_plan(tasks)

    # -- tokenisation -------------------------------------------------------------------

    # -- scoring ------------------------------------------------------------------------

    def score(self, tasks: Sequence[Task]) -> Iterator[Result]:
        """Groups with a shared prefix are batched in order of prefix length, so little of a
        prefix batch is padding; the rest in task order."""
        groups: dict[str, list[Task]] = defaultdict(list)
        for t in tasks:
            groups[t.group].append(t)
        pending: list[Prepared] = []
        shared: list[tuple[int, list[Prepared]]] = []
        for group in groups.values():
            prepared, failed = self.tokens.fit_group(group)
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

    def _score_pending(self, prepared: list[Prepared]) -> Iterator[Result]:
        return self._score_seq2seq(prepared) if self.seq2seq else self._score_causal(prepared, reuse=False)

    def _logprobs(self, batch: list[Row], **inputs) -> list[torch.Tensor]:
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
        return stack_caches(parts, width, self.model.config), mask

    @torch.inference_mode()
    def _score_causal(self, prepared: list[Prepared], reuse: bool) -> Iterator[Result]:
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
        rows = label_rows(prepared, prefix_len)
        for start in range(0, len(rows), self.batch_size):
            batch = rows[start : start + self.batch_size]
            ids, mask = self._pad([r.tokens for r in batch])
            kwargs = {}
            if cache is not None:
                first = torch.zeros(len(batch), dtype=torch.long, device=self.device)
                kwargs[self.cache_name] = select_rows(cache, first, self.model.config)
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
    def _score_shared(self, groups: list[list[Prepared]]) -> Iterator[Result]:
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
            ((gi, row) for gi, (g, n) in enumerate(zip(groups, lengths)) for row in label_rows(g, n)),
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
                **{self.cache_name: select_rows(cache, owner, self.model.config)},
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
    def _score_seq2seq(self, prepared: list[Prepared]) -> Iterator[Result]:
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
    text = backend.tokens.prompt_text(prompt)
    ids = torch.tensor([backend.tokens.encode(text)], device=backend.device)
    with torch.inference_mode():
        out = backend.model.generate(
            input_ids=ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=backend.pad_id
        )
    new = out[0] if backend.seq2seq else out[0, ids.shape[1] :]
    return backend.tokenizer.decode(new, skip_special_tokens=True)
