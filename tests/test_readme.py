"""Every fenced code block of README.md and of every docs page (docs/**/*.md) is executed or
checked here, so none can rot.

Each block is one test case, named by its page (none for the README), the heading it sits
under and its line (`a-first-workflow:L39`, `docs/concepts/effects:effects:L12`). What is
done with it depends on its language:

- ```python: run for real in a subprocess (the venv's python), in a fresh temp
  directory with a fresh SQLite store (PERDURE_DB), compiled under its document's
  own line numbers so a traceback names the document and line.
- ```bash: run with `bash -euo pipefail` in such a sandbox with the venv first on
  PATH; the exit code must be 0 (or `exit=`). A `perdure worker|serve|agent|mcp`
  line serves until SIGTERM: it is started in the background before the rest of
  the block, waited for (its port answers or it writes its first line), and at
  the end stopped with SIGTERM and must exit 0. A line ending in `&` is the block's own
  background job instead (it may `kill -9 $!` it): the script runs it as written.
- ```toml: parsed; a complete agent spec (with `name` and `goal`) must pass
  `perdure validate`.
- ```json: parsed. A plain ``` block must be declared (`synopsis` or `no-run`).

Markers: an HTML comment on the lines right before the fence, merged if several:
`<!-- readme: key key=value key="quoted value" -->`. The vocabulary:

- `setup=NAME[,NAME]`: python: run the named code first (tests/readme_setups.py
  `PY_SETUPS`: `app` = the imports and `app = perdure.App()`; `stubs` = fake
  `payments` and `mailer`; ...). Shell: prepare the sandbox (`SHELL_SETUPS`:
  `serve` starts `perdure --app shop:app serve` on a free port, which replaces
  the block's `127.0.0.1:8000`).
- `name=NAME`: names a python block, for `continues=NAME`.
- `continues[=NAME]`: python: run after the python block above (or the one
  named NAME, and what that one continues) of the same document, in one process.
- `wrap=NAME`: python: the block is a fragment, run inside the named template
  (`PY_WRAPS`).
- `check=NAME`: after the block, run the named check of what it did
  (`PY_CHECKS` / `SHELL_CHECKS`): a run it starts is driven and must complete.
- `stores=sqlite,postgres`: run once per store; PostgreSQL in a fresh schema
  `readme_<random>` of the local server, dropped afterwards.
- `env="K=V ..."`, `exit=N`, `expect="TEXT"`: shell: extra environment, the
  documented exit code, text that must appear in the output.
- `background`: shell: every command line serves until SIGTERM.
- `synopsis`: a CLI usage block: each command and option it shows must exist in
  the CLI, and `--opt a|b` values must be among its choices.
- `no-run reason="WHY"`: not run, only parsed (python compiles, shell `bash -n`,
  toml loads). It must say why, and at most MAX_NO_RUN blocks of a document may be exempt.

Shell blocks get `shop.py` in their sandbox, made of the nearest python block
above in their document (with its setups), so `perdure --app shop:app ...` lines find that block's
app. They start real servers and workers, so they are marked slow.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from extras_needed import require
from readme_doc import KEYS, Block, ReadmeError, document_blocks, parse
from readme_setups import PY_CHECKS, PY_SETUPS, PY_WRAPS, SHELL_CHECKS, SHELL_SETUPS
from readme_support import (
    PG_URL,
    SHELL_LANGS,
    Sandbox,
    check_block,
    check_json,
    check_synopsis,
    commands,
    extras_needed,
    is_long_running,
    run_python,
    run_shell,
)

DOCUMENTS = document_blocks()
BLOCKS = [block for blocks in DOCUMENTS.values() for block in blocks]
MAX_NO_RUN = 2  # per document
LANGS = {"python", "toml", "json", "", *SHELL_LANGS}


def cases() -> list[object]:
    found: list[object] = []
    for block in BLOCKS:
        stores = block.names("stores") or ["sqlite"]
        for store in stores:
            marks = [pytest.mark.postgres] if store == "postgres" else []
            if block.lang in SHELL_LANGS and not block.has("no-run"):
                marks.append(pytest.mark.slow)  # it starts servers and workers
            suffix = "" if len(stores) == 1 else f"[{store}]"
            found.append(pytest.param(block, store, id=block.id + suffix, marks=marks))
    return found


@pytest.fixture
def sandbox(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A fresh directory and an empty store of the kind the case asks for."""
    store: str = request.node.callspec.params["store"]
    if store == "sqlite":
        yield Sandbox(tmp_path, f"sqlite:///{tmp_path}/readme.db")
        return
    schema = f"readme_{uuid.uuid4().hex[:12]}"
    try:
        yield Sandbox(tmp_path, f"{PG_URL}?schema={schema}")
    finally:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.parametrize(("block", "store"), cases())
def test_block(block: Block, store: str, sandbox: Sandbox) -> None:
    """The block does what it shows (run, served, validated or parsed, as declared)."""
    blocks = DOCUMENTS[block.doc]
    if not block.has("no-run"):
        for extra, module in extras_needed(block, blocks):
            require(extra, module)
    check_block(block, blocks, sandbox)


def test_markers_name_what_exists() -> None:
    """Every marker is used where it means something and names a setup, wrap or check
    that exists."""
    for block in BLOCKS:
        at = block.at
        assert block.lang in LANGS, f"{at}: no way to check a ```{block.lang} block"
        python, shell = block.lang == "python", block.lang in SHELL_LANGS
        assert block.lang or block.has("synopsis") or block.has("no-run"), (
            f"{at}: a plain ``` block must be declared `synopsis` or `no-run reason=...`"
        )
        assert block.has("reason") == block.has("no-run"), f"{at}: no-run and reason go together"
        for name in block.names("setup"):
            assert name in (PY_SETUPS if python else SHELL_SETUPS if shell else {}), (
                f"{at}: unknown setup {name!r}"
            )
        if block.has("check"):
            known = PY_CHECKS if python else SHELL_CHECKS if shell else {}
            check = block.markers["check"]
            assert check in known, f"{at}: unknown check {check!r}"
        if block.has("wrap"):
            assert python and block.markers["wrap"] in PY_WRAPS, f"{at}: unknown wrap"
        if block.has("continues"):
            name = block.markers["continues"]
            assert python and any(
                b.lang == "python" and (not name or b.markers.get("name") == name)
                for b in DOCUMENTS[block.doc][: block.index]
            ), f"{at}: `continues` needs a python block above (named {name!r})"
        for key in ("env", "exit", "expect", "background"):
            assert shell or not block.has(key), f"{at}: {key} is for shell blocks"
        if block.has("exit"):
            assert block.markers["exit"].isdigit(), f"{at}: exit=N takes a number"
        assert set(block.names("stores")) <= {"sqlite", "postgres"}, f"{at}: unknown store"


@pytest.mark.parametrize("doc", sorted(DOCUMENTS))
def test_no_run_blocks_are_few_and_say_why(doc: str) -> None:
    """At most MAX_NO_RUN blocks of a document are exempt from running, each with its reason."""
    exempt = [b for b in DOCUMENTS[doc] if b.has("no-run")]
    assert len(exempt) <= MAX_NO_RUN, [f"{b.at}: {b.markers.get('reason')}" for b in exempt]
    for block in exempt:
        assert len(block.markers.get("reason", "")) >= 10, f"{block.at}: say why"


def test_the_documents_have_their_blocks() -> None:
    """The extractor finds the README's python and shell blocks, and python, shell and toml
    blocks across the docs pages (not zero of each); every case has its own id."""
    readme = [b.lang for b in DOCUMENTS["README.md"]]
    assert readme.count("python") >= 1 and readme.count("bash") >= 1
    langs = [b.lang for b in BLOCKS]
    assert langs.count("python") >= 10 and langs.count("bash") >= 2 and "toml" in langs
    assert len(DOCUMENTS) > 10, sorted(DOCUMENTS)
    assert len({b.id for b in BLOCKS}) == len(BLOCKS)


# -- the harness itself bites ------------------------------------------------------------

SAMPLE = """# Title

## Part one

<!-- readme: setup=app -->
```python
x = 1
raise RuntimeError("rotten")
```

<!-- readme: exit=3 -->
```bash
true
perdure --db sqlite:///x.db worker --concurrency 2
exit 3
```
"""


def test_parse_reads_headings_lines_and_markers() -> None:
    """Blocks carry their heading, fence line, source and merged markers."""
    python, shell = parse(SAMPLE)
    assert (python.lang, python.line, python.heading, python.id) == (
        "python",
        6,
        "Part one",
        "part-one:L6",
    )
    assert python.source == 'x = 1\nraise RuntimeError("rotten")\n'
    assert python.markers == {"setup": "app"} and shell.markers == {"exit": "3"}
    assert [line for line, _ in commands(shell)] == [13, 14, 15]
    assert [is_long_running(c) for _, c in commands(shell)] == [False, True, False]
    assert not is_long_running("perdure --app shop:app worker > w.log 2>&1 &  # its own job")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- readme: setpu=app -->\n```python\n```\n", "unknown marker key 'setpu'"),
        ("<!-- readme: no-run -->\n\ntext\n```python\n```\n", "not right before a code block"),
        ("<!-- readme: check -->\n```python\n```\n", "written `check=VALUE`"),
        ("```python\nx = 1\n", "never closes"),
        ("<!-- readme no-run -->\n```python\n```\n", "a marker reads"),
    ],
    ids=["unknown-key", "misplaced", "missing-value", "unclosed", "no-colon"],
)
def test_parse_refuses_what_would_hide_a_block(text: str, message: str) -> None:
    """A misspelt, misplaced or malformed marker, or an unclosed fence, is an error."""
    with pytest.raises(ReadmeError, match=message):
        parse(text)
    assert set(KEYS) >= {"no-run", "setup", "check"}


def test_a_rotten_python_block_fails_naming_its_line(tmp_path: Path) -> None:
    """A snippet that raises fails its case, and the traceback names its README line."""
    python, _ = parse(SAMPLE)
    sandbox = Sandbox(tmp_path, f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(pytest.fail.Exception) as failed:
        run_python(python, [python], sandbox)
    assert "RuntimeError: rotten" in str(failed.value)
    assert 'README.md", line 8' in str(failed.value)


def test_a_failing_shell_line_fails_naming_its_line(tmp_path: Path) -> None:
    """A shell block whose command fails (or exits other than declared) fails its case."""
    shell = parse("```bash\ntrue\nfalse\necho unreachable\n```\n")[0]
    sandbox = Sandbox(tmp_path, f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(AssertionError, match=r"exited 1, not 0") as failed:
        run_shell(shell, [shell], sandbox)
    assert "README.md:3: exit 1" in str(failed.value)
    assert "unreachable" not in str(failed.value)


def test_a_synopsis_naming_a_missing_option_fails() -> None:
    """A CLI synopsis that shows an option, argument or command the CLI lacks fails."""
    (good,) = parse("```\nperdure worker [--concurrency N]\n  ls [--status S]\n```\n")
    assert check_synopsis(good) == 2
    (extra,) = parse("```\nperdure show RUN STEP\n```\n")
    with pytest.raises(AssertionError, match="shows 2 argument"):
        check_synopsis(extra)
    (bad,) = parse("```\nperdure worker [--concurency N]\n```\n")
    with pytest.raises(AssertionError, match="no option --concurency"):
        check_synopsis(bad)
    (gone,) = parse("```\nperdure frobnicate RUN\n```\n")
    with pytest.raises(AssertionError, match="no command `perdure frobnicate`"):
        check_synopsis(gone)


APP = """
import perdure

app = perdure.App()

@app.workflow()
def hello(name: str) -> str:
    return f"hello {name}"
"""


@pytest.mark.slow
def test_a_long_running_line_is_served_then_stopped_cleanly(tmp_path: Path) -> None:
    """A `perdure worker` line runs in the background while the rest of the block runs,
    and is stopped with SIGTERM; the run the block started completes meanwhile."""
    (app_block, shell) = parse(
        f"```python\n{APP}```\n\n```bash\nperdure --app shop:app worker \\\n  --concurrency 2\n"
        "perdure --app shop:app start hello '[\"ana\"]' --id r1 --wait\n```\n"
    )
    sandbox = Sandbox(tmp_path, f"sqlite:///{tmp_path}/s.db")
    run_shell(shell, [app_block, shell], sandbox)
    assert (tmp_path / "shop.py").read_text().strip() == APP.strip()
    assert (tmp_path / "background-0.log").stat().st_size > 0
    assert sandbox.backgrounds == []


@pytest.mark.slow
def test_a_server_that_dies_fails_its_block(tmp_path: Path) -> None:
    """A long-running line that exits before it is ready fails the block with its output."""
    (shell,) = parse("```bash\nperdure --app missing_module:app worker\necho after\n```\n")
    sandbox = Sandbox(tmp_path, f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(pytest.fail.Exception, match="before it was ready"):
        run_shell(shell, [shell], sandbox)


def test_json_and_undeclared_blocks_are_checked(tmp_path: Path) -> None:
    """A JSON block must parse, and a block of a language nothing checks fails."""
    good, bad = parse('```json\n{"a": [1, 2]}\n```\n\n```json\n{"a": [1, 2}\n```\n')
    check_json(good)
    with pytest.raises(pytest.fail.Exception, match=r"README\.md:6: not JSON"):
        check_json(bad)
    (paged,) = parse('\n```json\n{"a": }\n```\n', "docs/how-to/x.md")
    with pytest.raises(pytest.fail.Exception, match=r"docs/how-to/x\.md:3: not JSON"):
        check_json(paged)
    assert paged.id == "docs/how-to/x:top:L2" and paged.path.name == "x.md"
    (ruby,) = parse("```ruby\nputs 1\n```\n")
    sandbox = Sandbox(tmp_path, f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(pytest.fail.Exception, match="must be declared"):
        check_block(ruby, [ruby], sandbox)
