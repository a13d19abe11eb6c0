"""The TOML spec: a good one loads; a bad one is refused naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

import perdure
from perdure.agent.spec import check_grants, duration, load_spec
from perdure.agent.tools import builtin_tools

GOOD = """
name = "summariser"
goal = "Summarise each new file"
instructions = "Be brief."

[models.fast]
provider = "scripted"
context_tokens = 2048
price = { input_per_mtok = 0.5, output_per_mtok = 1.5 }

[tools]
grant = ["read_file", "write_file"]
read_paths = ["inbox"]
write_paths = ["outbox"]

[limits]
max_iterations = 5
deadline = "30m"

[budget]
tokens_per_day = 100000

[trigger]
inbox = "inbox"
pattern = "*.txt"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_a_good_spec_loads_with_paths_relative_to_its_folder(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, GOOD))
    assert spec.name == "summariser" and spec.tier("fast").context_tokens == 2048
    assert spec.tier("fast").price.cost(1_000_000, 2_000_000) == 3.5
    assert spec.path("inbox") == (tmp_path / "inbox").resolve()
    assert spec.trigger is not None and spec.trigger.inbox == "inbox"
    assert duration(spec.limits.deadline or "") == 1800.0


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("max_iterations = 5", "max_iterations = 0"),
            ":17: limits.max_iterations: Input should be greater than 0",
        ),
        (
            ("max_iterations = 5", "max_iterations = 5\nmax_iteration = 3"),
            ":18: limits.max_iteration: Extra inputs are not permitted",
        ),
        (
            ('deadline = "30m"', 'deadline = "soon"'),
            ":18: limits.deadline: Value error, 'soon' is not a duration",
        ),
        (
            ('provider = "scripted"', 'provider = "magic"'),
            ":7: models.fast.provider: Input should be",
        ),
        (('name = "summariser"', 'name = "has space"'), ":2: name: String should match pattern"),
        (
            ("[budget]", '[routing]\ndefault = "slow"\n[budget]'),
            ":21: routing.default: no model tier 'slow'",
        ),
        (
            ('pattern = "*.txt"', 'pattern = "*.txt"\nevent = "x"'),
            ":26: trigger.event: one trigger kind per agent",
        ),
    ],
)
def test_a_bad_spec_names_file_line_and_field(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    path = write(tmp_path, GOOD.replace(*change))
    with pytest.raises(perdure.ConfigError) as info:
        load_spec(path)
    message = str(info.value)
    assert message.startswith(str(path)) and expected in message and "\n" not in message


def test_unreadable_or_broken_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(perdure.ConfigError, match="cannot read the spec"):
        load_spec(tmp_path / "missing.toml")
    with pytest.raises(perdure.ConfigError, match="not valid TOML"):
        load_spec(write(tmp_path, "name = "))


BUILTIN_NAMES = [t.name for t in builtin_tools()]
MCP = '\n[[tools.mcp]]\nname = "gh"\ncommand = "github-mcp-server"\ngrant = ["list_issues"]\n'


@pytest.mark.parametrize(
    "grant",
    [
        ["read_file", "finish"],
        ["*"],
        ["re*"],  # a pattern matching built-in tools
        ["gh__list_issues", "gh__*"],  # a declared MCP server's tools, as SERVER__TOOL
        ["ledger_once"],  # a tool the agent is given in Python
    ],
)
def test_grants_naming_a_tool_are_accepted(tmp_path: Path, grant: list[str]) -> None:
    """Built-in tools, patterns matching one, a declared MCP server's tools, Python tools."""
    spec = load_spec(
        write(tmp_path, GOOD.replace('["read_file", "write_file"]', repr(grant)) + MCP)
    )
    check_grants(spec, [*BUILTIN_NAMES, "ledger_once"])


@pytest.mark.parametrize("grant", ["rm_rf", "rm_*", "github__list_issues", "gh_list_issues"])
def test_a_grant_naming_no_tool_is_refused_in_one_line(tmp_path: Path, grant: str) -> None:
    """An unknown tool (or an undeclared server's) is refused naming the line, the entry,
    the known tools and the declared MCP servers."""
    path = write(tmp_path, GOOD.replace('"write_file"]', f'"write_file", "{grant}"]') + MCP)
    with pytest.raises(perdure.ConfigError) as info:
        check_grants(load_spec(path), BUILTIN_NAMES)
    message = str(info.value)
    assert message.startswith(f"{path}:12: tools.grant: no tool {grant!r} (known tools: ")
    assert "read_file" in message and "run_command" in message and "\n" not in message
    assert "MCP servers: gh (grant their tools as SERVER__TOOL)" in message
