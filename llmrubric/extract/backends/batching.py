"""Batches of a local model's sequences: label rows after a shared prefix, right padding, and key/value
caches of prefixes (rows selected, parts stacked) for :mod:`llmrubric.extract.backends.transformers_backend`."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from llmrubric.extract.backends.prompt_tokens import Prepared


@dataclass
class Row:
    """One sequence to run: ``tokens`` after the shared prefix; scores read at ``start``..."""

    item: int  # index into the prepared list
    tokens: list[int]
    start: int  # position in ``tokens`` whose logits predict the first label token
    labels: tuple[int, ...] | None  # labels read here (all but their last token in it); None: every 1-token label


def label_rows(prepared: list[Prepared], prefix: int) -> list[Row]:
    """The rows that read every label of ``prepared`` after a shared prefix of ``prefix`` tokens, by length."""
    rows = []
    for i, p in enumerate(prepared):
        suffix = p.ids[prefix:]
        if all(len(label) == 1 for label in p.labels):
            rows.append(Row(i, suffix, len(suffix) - 1, None))
        else:  # labels that differ only in their last token (" 1", " 2": " " then a digit) share one row
            heads: dict[tuple[int, ...], list[int]] = defaultdict(list)
            for k, label in enumerate(p.labels):
                heads[tuple(label[:-1])].append(k)
            rows.extend(Row(i, suffix + list(head), len(suffix) - 1, tuple(ks)) for head, ks in heads.items())
    return sorted(rows, key=lambda r: len(r.tokens))


def right_pad(seqs: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad: (B, L) ids and (B, L) mask."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[b, : len(s)] = 1
    return ids.to(device), mask.to(device)


def select_rows(cache, rows: torch.Tensor, config):
    """A new cache with the given batch rows of ``cache`` (which is left as it is)."""
    from transformers import DynamicCache

    return DynamicCache([(layer.keys[rows], layer.values[rows]) for layer in cache.layers], config=config)


def stack_caches(parts: list, width: int, config):
    """One cache of the prefix caches ``parts`` (batch after batch), each right-padded to ``width`` positions."""
    from transformers import DynamicCache

    if len(parts) == 1 and parts[0].layers[0].keys.shape[2] == width:
        return parts[0]

    def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[2])) for t in tensors], dim=0)

    layers = zip(*(part.layers for part in parts))
    return DynamicCache(
        [(stacked([x.keys for x in layer]), stacked([x.values for x in layer])) for layer in layers], config=config
    )
