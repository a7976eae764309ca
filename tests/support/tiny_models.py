"""Tiny offline models for the extractor tests: a byte-level BPE tokenizer trained on a few
sentences, a 2-layer Llama-style causal LM and a 2-layer T5, all built from configs."""

from __future__ import annotations

import json
from pathlib import Path

import torch

SENTENCES = [
    "You are given a conversation between a user and an intelligent assistant.",
    "Question: to what degree are the claims followed by a citation? Answer: 1 2 3 4",
    "Only print '1', '2', '3', or '4'. Likely. Unlikely. Somewhat likely.",
    "user: how do I reset my password? assistant: open the settings page [1].",
    "Sources: [1] the settings page explains how to reset a password.",
    "support partial_support not_support Label: Rating: 0 1 2 3 4 5 Score:",
    "Context: Passage: Nugget: Key fact: Search Query: Gold answer: rubric",
]


def make_tokenizer(vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(SENTENCES * 3, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def make_llama(tokenizer, max_positions: int = 512, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper, less uniform outputs than the default init
        model.lm_head.weight.mul_(4)
    return model


def make_t5(tokenizer, seed: int = 0):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_layers=2,
        num_heads=4,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    return T5ForConditionalGeneration(config).eval()


def save_model(model, tokenizer, path: Path) -> Path:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_texts(path: Path, n: int = 4, with_refs: bool = True) -> Path:
    rows = []
    for i in range(n):
        refs = with_refs and i % 2 == 0
        text = f"user: how do I reset password {i}? assistant: open the settings page" + (" [1]." if refs else ".")
        if refs:
            text += "\nSources: [1] the settings page explains how to reset a password."
        rows.append({"text_id": f"t{i}", "text": text * (1 + i % 3), "has_references": refs})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
