"""Model loading and packaged models: where a model is found, what its cache key covers, and
the one-line errors for a missing, truncated, unsupported or weightless model."""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from llmrubric.cli import main
from llmrubric.extract import models
from llmrubric.extract.backends.transformers_backend import TransformersBackend
from llmrubric.io.errors import InputError

SMOLLM2 = models.MODELS_DIR.parents[1] / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def gguf_file():
    if not SMOLLM2.is_file():
        pytest.fail(f"{SMOLLM2} is missing: run `make setup` (llmrubric models fetch smollm2 models)")
    return SMOLLM2


@pytest.mark.llm
def test_resolve_file_folder_and_named_gguf(gguf_file, tmp_path):
    assert models.resolve(gguf_file).gguf_file == gguf_file.name
    assert models.resolve(gguf_file.parent).gguf_file == gguf_file.name  # a folder with one .gguf and no config.json
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(b"x")
    with pytest.raises(InputError, match="2 .gguf files"):
        models.resolve(two)
    assert models.resolve(two, "b.gguf").weights == (two / "b.gguf",)


def test_cache_key_covers_the_weights(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "q4.gguf").write_bytes(b"one quantisation")
    (folder / "q8.gguf").write_bytes(b"another quantisation")
    keys = {models.weights_hash(models.resolve(folder, name)) for name in ("q4.gguf", "q8.gguf")}
    assert len(keys) == 2


def test_a_digits_first_gguf_tokenizer_splits_as_llama_cpp():
    """GPT-2's split writes "\\n\\n1" as two newline pieces; llama.cpp's ``smollm`` (digits first) as one."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import BPE

    def built(pre: str) -> tuple[bool, list[str]]:
        tokenizer = Tokenizer(BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        changed = models.split_digits_first(SimpleNamespace(backend_tokenizer=tokenizer), pre)
        return changed, [piece for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str("Options:\n\n12. a")]

    assert built("smollm") == (True, ["Options", ":", "\u010a\u010a", "1", "2", ".", "\u0120a"])
    assert built("gpt2") == (False, ["Options", ":", "\u010a", "\u010a", "12", ".", "\u0120a"])


@pytest.mark.parametrize("case", ["missing", "not_gguf", "truncated", "no_weights", "unsupported"])
@pytest.mark.llm
def test_bad_models_are_one_line_errors(case, gguf_file, tmp_path, capsys):
    path = tmp_path / "model.gguf"
    if case == "not_gguf":
        path = tmp_path / "model.bin"
        path.write_bytes(b"\0" * 16)
    elif case == "truncated":
        with open(gguf_file, "rb") as f:
            path.write_bytes(f.read(1 << 20))
    elif case == "no_weights":
        path = tmp_path / "folder"
        path.mkdir()
        (path / "config.json").write_text('{"model_type": "llama"}')
    elif case == "unsupported":
        import gguf

        writer = gguf.GGUFWriter(str(path), "no-such-arch")
        writer.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"text_id": "a", "text": "user: hi\\nassistant: hello"}\n')
    out = tmp_path / "f.csv"
    argv = [
        "extract",
        "features",
        str(texts),
        "--rubric",
        "conf/rubric/llm_rubric.yaml",
        "--model",
        str(path),
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and "Traceback" not in err
    assert not out.exists()


def write_gguf(path, **strings) -> None:
    """A small GGUF file with these string fields, an array of strings and a tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in strings.items():
        writer.add_string(key, value)
    writer.add_array("tokenizer.ggml.tokens", ["a", "bc", "\n\n"] * 50)
    writer.add_uint32("llama.block_count", 2)
    writer.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_strings_are_read_from_the_header(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, **{"tokenizer.ggml.pre": "smollm", "general.name": "tiny"})
    assert (
        models.gguf_string(path, "tokenizer.ggml.pre") == "smollm"
        and models.gguf_string(path, "general.name") == "tiny"
    )
    assert models.gguf_string(path, "general.architecture") == "llama" and models.gguf_string(path, "nope") is None
    assert models.gguf_pre_tokenizer(models.resolve(path)) == "smollm"
    (tmp_path / "x.gguf").write_bytes(b"GGML" + b"\0" * 20)
    with pytest.raises(InputError, match="not a GGUF file"):
        models.gguf_string(tmp_path / "x.gguf", "general.name")
    (tmp_path / "cut.gguf").write_bytes(path.read_bytes()[:60])
    with pytest.raises(InputError, match="header ends early"):
        models.gguf_string(tmp_path / "cut.gguf", "nope")


def test_a_gguf_files_converted_copy_is_loaded_in_its_place_and_a_partial_one_is_not(tok, llama, tmp_path):
    """The copy is found by the file's hash and the dtype; the GGUF file itself (here not loadable) is not read."""
    from llmrubric.extract import converted

    path = tmp_path / "m.gguf"
    write_gguf(path)
    files, cache = models.resolve(path), tmp_path / "cache"
    copy = converted.folder(cache, files.gguf_file, models.weights_hash(files), torch.float32)
    assert converted.save(llama, tok, copy, {"gguf_file": str(path)}) and not list(cache.glob("*.part-*"))
    model, tokenizer = models.load(files, torch.float32, cache)
    ids = tok("Answer: 1 2 3 4").input_ids
    assert tokenizer("Answer: 1 2 3 4").input_ids == ids
    with torch.no_grad():
        assert torch.equal(model(torch.tensor([ids])).logits, llama(torch.tensor([ids])).logits)
    for other in (torch.bfloat16, None):
        where = converted.folder(cache, files.gguf_file, models.weights_hash(files), other)
        assert where != copy and not where.exists()
    (copy / converted.MARK).unlink()  # a copy without its mark is not whole: the file itself is loaded (and fails)
    with pytest.raises(InputError, match="cannot load the model") as e:
        models.load(files, torch.float32, cache)
    assert str(path) in str(e.value)


def test_chat_template_without_an_answer_position_is_an_error(tok):
    from support.tiny_models import make_llama

    tok = tok.__class__(tokenizer_object=tok.backend_tokenizer, pad_token="<pad>")
    tok.chat_template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}{% if add_generation_prompt %}ANSWER NOW:{% endif %}"
    with pytest.raises(InputError, match="answer position cannot be found"):
        TransformersBackend(make_llama(tok), tok, chat_template=True)
    ok = TransformersBackend(make_llama(tok), tok, chat_template=True, label_prefix=" ")
    assert ok.answer_prefix == " "


def test_fetch_unknown_model_is_an_error(tmp_path):
    with pytest.raises(InputError, match="unknown model 'nope'"):
        models.fetch("nope", tmp_path)


def test_threads_follow_the_setting_and_by_default_keep_a_lower_count_within_the_machine(tok):
    from support.tiny_models import make_llama

    before, cpus = torch.get_num_threads(), len(os.sched_getaffinity(0))
    try:
        TransformersBackend(make_llama(tok), tok, device="cpu", threads=1)
        assert torch.get_num_threads() == 1
        TransformersBackend(make_llama(tok), tok, device="cpu")  # a caller's lower count (a pytest -n worker's) stays
        assert torch.get_num_threads() == 1
        torch.set_num_threads(cpus + 3)
        TransformersBackend(make_llama(tok), tok, device="cpu")  # never more threads than the CPUs it may use
        assert torch.get_num_threads() == cpus
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("case", ["unknown", "not_fetched", "missing_file", "not_gguf", "port_taken", "bad_port"])
def test_serve_refuses_in_one_line_before_loading_anything(case, tmp_path, capsys):
    import socket

    argv = {
        "unknown": ["nope"],
        "not_fetched": ["smollm2", "--dir", str(tmp_path)],
        "missing_file": [str(tmp_path / "absent.gguf")],
        "not_gguf": [str(tmp_path)],
        "bad_port": [str(tmp_path / "absent.gguf"), "--port", "70000"],
    }
    expected = {
        "unknown": "'nope' is neither a fetched model's name",
        "not_fetched": "model smollm2 is not fetched into",
        "missing_file": "absent.gguf: model not found",
        "not_gguf": "is neither a fetched model's name",
        "port_taken": "is taken",
        "bad_port": "setting port: 70000 is not a port (1 to 65535)",
    }
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        if case == "port_taken":
            pytest.importorskip("xllamacpp", reason="the optional group server is absent")
            gguf = tmp_path / "m.gguf"
            gguf.write_bytes(b"GGUF")  # never read: the port is checked before the model loads
            argv[case] = [str(gguf), "--port", str(taken.getsockname()[1])]
        assert main(["models", "serve", *argv[case]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and expected[case] in err, err
