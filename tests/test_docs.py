"""The user docs stay true: every command in them parses and every relative link resolves.

Pages: README.md, docs/*.md, benchmarks/README.md and the data READMEs. In their fenced shell blocks an
``llmrubric`` line is parsed by the CLI's own parser (its noun/verb ``--help`` exits 0 and the whole line
parses); a ``train.py``/``evaluate.py`` line's overrides compose with the app's config (an unknown group,
option or key fails); any other Python script, ``make`` target and ``conf/``/``benchmarks/`` path a command
names exists. An inline ``llmrubric ...`` in the prose names an existing noun/verb; a Python example parses and
imports only what llmrubric has. Markdown links point at existing files (and headings, for ``#anchor`` links).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import shlex
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import pytest
from support.paths import ROOT

from llmrubric import cli

GUIDES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "benchmarks" / "README.md",
    *sorted((ROOT / "data").glob("**/README.md")),
]
SHELL = {"bash", "sh", "shell", "console", "zsh"}
APPS = {"train.py", "evaluate.py"}
REPO_PATH = re.compile(r"^(conf|benchmarks)/[^*?${}<>\[\]]+$")
STOP = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1"}
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
INLINE_CLI = re.compile(r"`((?:\.venv/bin/)?llmrubric(?: [^`]*)?)`")
README_MAX_LINES = 130


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    argv: tuple[str, ...]  # the command without env assignments, nice, time

    def __str__(self) -> str:
        return f"{self.where} {shlex.join(self.argv)}"


def _lines(path: Path):
    """(line number, line, shell?) of a Markdown file; code-fence lines report their block's language."""
    fence, lang = None, ""
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = FENCE.match(line)
        if m and fence is None:
            fence, lang = m.group(1), m.group(2).lower()
            continue
        if m and line.strip().startswith(fence) and not line.strip()[len(fence) :].strip():
            fence = None
            continue
        yield n, line, fence, lang


def _argv(text: str) -> tuple[str, ...]:
    tokens = shlex.split(text, comments=True)
    for i, t in enumerate(tokens):
        if t in STOP:
            tokens = tokens[:i]
            break
    while tokens:
        if re.match(r"^[A-Za-z_]\w*=", tokens[0]) or tokens[0] in ("env", "time", "/usr/bin/time"):
            tokens = tokens[1:]
        elif tokens[0] == "nice":
            tokens = tokens[3:] if tokens[1:2] == ["-n"] else tokens[1:]
        else:
            break
    return tuple(tokens)


def shell_commands(path: Path) -> list[Command]:
    """Logical command lines (backslash continuations joined) of the fenced shell blocks."""
    out, pending, start = [], "", 0
    for n, line, fence, lang in _lines(path):
        if fence is None or lang not in SHELL:
            continue
        text = line.strip().removeprefix("$ ")
        if not pending:
            start = n
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        argv = _argv(pending + text)
        pending = ""
        if argv:
            out.append(Command(f"{path.relative_to(ROOT)}:{start}", argv))
    return out


def _program(cmd: Command) -> str:
    name = Path(cmd.argv[0]).name
    if name == "llmrubric":
        return "cli"
    if re.fullmatch(r"python(3(\.\d+)?)?", name):
        script = next((a for a in cmd.argv[1:] if not a.startswith("-")), "")
        return "app" if Path(script).name in APPS and "-m" not in cmd.argv[1:2] else "python"
    return "make" if name == "make" else "other"


COMMANDS = [c for path in GUIDES for c in shell_commands(path)]


def _by(kind: str) -> list:
    return [pytest.param(c, id=str(c)[:120]) for c in COMMANDS if _program(c) == kind]


def _app_commands() -> list:
    """``python train.py|evaluate.py ...`` lines, and ``llmrubric train|evaluate ...`` as the same apps."""
    out = [pytest.param(c, id=str(c)[:120]) for c in COMMANDS if _program(c) == "app"]
    for c in COMMANDS:
        if _program(c) == "cli" and c.argv[1:2] and f"{c.argv[1]}.py" in APPS:
            out.append(pytest.param(Command(c.where, ("python", f"{c.argv[1]}.py", *c.argv[2:])), id=str(c)[:120]))
    return out


def _words(args) -> list[str]:
    """The noun and verb of an ``llmrubric`` command: its leading non-option words (at most two)."""
    words = []
    for a in args:
        if len(words) == 2 or not re.fullmatch(r"[a-z][a-z0-9-]*", a):
            break
        words.append(a)
    return words


def _run_cli(argv: list[str]) -> tuple[int, str]:
    out = StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        try:
            cli.main(argv)
        except SystemExit as e:
            return (e.code if isinstance(e.code, int) else 1), out.getvalue()
    return 0, out.getvalue()


@functools.cache
def _help(words: tuple[str, ...]) -> tuple[int, str]:
    """``llmrubric <words> --help``: its exit code and output, run once per noun/verb in a test process (the
    guides name ``train`` and ``extract features`` dozens of times; Hydra's help composes the whole config)."""
    return _run_cli([*words, "--help"])


def _parse_cli(argv: list[str]) -> tuple[int, str]:
    out = StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        try:
            cli.build_parser().parse_args(argv)
        except SystemExit as e:
            return (e.code if isinstance(e.code, int) else 1), out.getvalue()
    return 0, ""


def _check_repo_paths(cmd: Command) -> None:
    for token in cmd.argv[1:]:
        value = token.split("=", 1)[1] if token.startswith("-") and "=" in token else token
        if REPO_PATH.match(value):
            assert (ROOT / value).exists(), f"{cmd}: {value} does not exist"


@pytest.mark.parametrize("cmd", _by("cli"))
def test_cli_command_parses(cmd: Command):
    args = list(cmd.argv[1:])
    words = _words(args)
    assert words, f"{cmd}: not `llmrubric <noun> <verb> ...`"
    code, text = _help(tuple(words))
    assert code == 0, f"{cmd}: `llmrubric {' '.join(words)} --help` exited {code}\n{text[-800:]}"
    code, text = _parse_cli(args)
    assert code == 0, f"{cmd}: the line does not parse\n{text[-800:]}"
    _check_repo_paths(cmd)


def _inline_cli() -> list:
    found = []
    for path in GUIDES:
        for n, line, fence, _ in _lines(path):
            if fence is None:
                for m in INLINE_CLI.finditer(line):
                    found.append(pytest.param(m.group(1), id=f"{path.relative_to(ROOT)}:{n} {m.group(1)}"[:120]))
    return found


@pytest.mark.parametrize("span", _inline_cli())
def test_inline_cli_names_exist(span: str):
    words = _words(shlex.split(span)[1:])
    code, text = _help(tuple(words))
    assert code == 0, f"`{span}`: `llmrubric {' '.join(words)} --help` exited {code}\n{text[-800:]}"


def _app_config(script: Path) -> tuple[str | None, str]:
    """config_path and config_name of the ``@hydra.main`` of the script, or of the app module it runs."""
    from llmrubric import config

    sources = [script.read_text(encoding="utf-8")]
    for node in ast.walk(ast.parse(sources[0])):
        module = node.module if isinstance(node, ast.ImportFrom) else None
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "launch" and node.args:  # launch("train")
            module = f"llmrubric.apps.{ast.literal_eval(node.args[0])}"
        if (module or "").startswith("llmrubric."):
            spec = importlib.util.find_spec(module)
            sources.append(Path(spec.origin).read_text(encoding="utf-8"))
    names = {"CONF_PATH": config.CONF_PATH}
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("hydra.main", "main"):
                kw = {
                    k.arg: names[k.value.id] if isinstance(k.value, ast.Name) else ast.literal_eval(k.value)
                    for k in node.keywords
                    if k.arg in ("config_path", "config_name")
                }
                if "config_name" in kw:
                    return kw.get("config_path"), kw["config_name"]
    raise AssertionError(f"{script.name}: no @hydra.main(config_name=...) found")


@pytest.fixture(scope="module")
def compose_app():
    """Compose a Hydra app's config as it would (its ``@hydra.main`` source; its imports register any
    structured configs), without running it. One Hydra initialisation serves every app with the same source,
    and a repeated override list (train.py and evaluate.py share their config) is composed once."""
    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from llmrubric.config import register_configs

    register_configs()  # as the apps' start does (llmrubric.config.hydra_app.run_app)
    imported, active, composed = set(), {"source": None, "context": None}, {}

    def close():
        if active["context"] is not None:
            active["context"].__exit__(None, None, None)
        GlobalHydra.instance().clear()

    def run(script: str, overrides: list[str]):
        path = ROOT / script
        if path not in imported:
            spec = importlib.util.spec_from_file_location(f"_docs_app_{path.stem}", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            imported.add(path)
        config_path, config_name = _app_config(path)
        source = (path.parent, config_path)
        key = (source, config_name, tuple(overrides))
        if key in composed:
            return composed[key]
        if active["source"] != source:
            close()
            if config_path and config_path.startswith("pkg://"):
                context = initialize_config_module(config_path.removeprefix("pkg://"), version_base="1.3")
            else:
                context = initialize_config_dir(str((path.parent / (config_path or ".")).resolve()), version_base="1.3")
            context.__enter__()
            active.update(source=source, context=context)
        composed[key] = compose(config_name, overrides=overrides, return_hydra_config=True)
        return composed[key]

    yield run
    close()


def _single_run(overrides: list[str]) -> list[str]:
    """A multirun's overrides with each sweep replaced by its first value (compose takes no sweeps)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for text, o in zip(overrides, OverridesParser.create().parse_overrides(overrides)):
        out.append(f"{o.get_key_element()}={next(o.sweep_string_iterator())}" if o.is_sweep_override() else text)
    return out


@pytest.mark.parametrize("cmd", _app_commands())
def test_app_overrides_compose(cmd: Command, compose_app):
    args = list(cmd.argv[1:])
    script = args.pop(0)
    assert (ROOT / script).is_file(), f"{cmd}: no {script}"
    multirun = any(a in ("-m", "--multirun") for a in args)
    flags = [a for a in args if a.startswith("-")]
    assert set(flags) <= {"-m", "--multirun"}, f"{cmd}: flags {flags} are not checked here"
    overrides = [a for a in args if not a.startswith("-")]
    try:
        compose_app(script, _single_run(overrides) if multirun else overrides)
    except Exception as e:  # Hydra's composition errors name the override
        pytest.fail(f"{cmd}: {type(e).__name__}: {e}")
    _check_repo_paths(cmd)


def _python_blocks() -> list:
    found = []
    for path in GUIDES:
        block, start = None, 0
        for n, line, fence, lang in _lines(path):
            if fence is not None and lang in ("python", "py"):
                if block is None:
                    block, start = [], n
                block.append(line)
            elif block is not None:
                found.append(pytest.param("\n".join(block), id=f"{path.relative_to(ROOT)}:{start}"))
                block = None
    return found


@pytest.mark.parametrize("code", _python_blocks())
def test_python_example_names_exist(code: str):
    """A Python example is valid syntax and everything it imports from llmrubric exists."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "llmrubric":
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "llmrubric":
                    importlib.import_module(alias.name)


@pytest.mark.parametrize("cmd", _by("python"))
def test_python_script_exists(cmd: Command):
    args = list(cmd.argv[1:])
    if args[:1] == ["-m"]:
        assert importlib.util.find_spec(args[1]) is not None, f"{cmd}: no module {args[1]}"
        return
    script = next(a for a in args if not a.startswith("-"))
    assert (ROOT / script).is_file(), f"{cmd}: no {script}"
    _check_repo_paths(cmd)


@pytest.mark.parametrize("cmd", _by("make"))
def test_make_target_exists(cmd: Command):
    targets = set(re.findall(r"^([\w.-]+)\s*:(?!=)", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M))
    for target in (a for a in cmd.argv[1:] if not a.startswith("-") and "=" not in a):
        assert target in targets, f"{cmd}: no target {target} in the Makefile"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for _, line, fence, _ in _lines(path) if fence is None and line.startswith("#")}


def _links() -> list:
    found = []
    for path in GUIDES:
        for n, line, fence, _ in _lines(path):
            if fence is not None:
                continue
            prose = re.sub(r"`[^`]*`", "", line)
            for target in [*LINK.findall(prose), *REF_LINK.findall(prose)]:
                if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    found.append(pytest.param(path, target, id=f"{path.relative_to(ROOT)}:{n} {target}"[:120]))
    return found


@pytest.mark.parametrize(("page", "target"), _links())
def test_relative_link_exists(page: Path, target: str):
    file, _, anchor = target.partition("#")
    dest = (page.parent / file).resolve() if file else page
    assert dest.exists(), f"{page.relative_to(ROOT)}: link {target}: {file} does not exist"
    if anchor and dest.suffix == ".md":
        assert anchor in _anchors(dest), f"{page.relative_to(ROOT)}: link {target}: no heading #{anchor}"


def test_guides_have_commands_and_links():
    """The collectors find what they look for (a broken fence or link parser would check nothing)."""
    kinds = {_program(c) for c in COMMANDS}
    assert {"cli", "app", "make"} <= kinds, kinds
    assert _links(), "no relative links found"


def test_readme_stays_a_guide():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines: results and tuning go to benchmarks/README.md, guides to docs/"
    )
