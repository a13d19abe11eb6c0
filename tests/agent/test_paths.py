"""The agent's file tools resolve relative paths against its workspace (the spec's folder by
default), as their description tells the model, and refuse anything resolving outside."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import perdure
from perdure.agent.loop import Agent
from perdure.agent.messages import ToolCall
from perdure.agent.spec import load_spec
from perdure.agent.tools import Boundary, Refusal, Toolbox, builtin_tools

SPEC = """
name = "triage"
goal = "Draft a reply to each ticket"

[models.fast]
provider = "scripted"

[tools]
grant = ["read_file", "write_file", "list_dir", "finish"]
read_paths = ["tickets"]
write_paths = ["drafts"]
{workspace}
"""
WORKSPACES = {"no workspace": "", "workspace .": '[workspace]\npath = "."\ngit = false\n'}


def run_tool(toolbox: Toolbox, name: str, **arguments: Any) -> str:
    """Prepare and execute one call as the loop does; a refusal's text if it is refused."""
    tool_call = ToolCall(id=f"call-{name}", name=name, arguments=arguments)
    prepared = toolbox.prepare(tool_call)
    if isinstance(prepared, Refusal):
        return prepared.text
    return asyncio.run(toolbox.execute(prepared, toolbox.context(tool_call.id)))


@pytest.fixture(params=sorted(WORKSPACES))
def agent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Agent]:
    """The triage agent of a spec in tmp_path (with and without `[workspace] path = "."`)."""
    (tmp_path / "tickets").mkdir()
    (tmp_path / "tickets" / "t1.txt").write_text("The printer on floor 2 is jammed.")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret")
    spec = tmp_path / "agent.toml"
    spec.write_text(SPEC.format(workspace=WORKSPACES[request.param]))
    app = perdure.App(f"sqlite:///{tmp_path}/s.db")
    try:
        yield Agent(app.runtime, load_spec(spec))
    finally:
        app.close()


def test_relative_paths_start_at_the_spec_folder(agent: Agent) -> None:
    """`tickets/t1.txt` and `drafts/ok.txt` mean what they mean in the spec: they work."""
    folder = agent.spec.folder
    assert agent.boundary.workdir == folder
    toolbox = agent.toolbox
    assert run_tool(toolbox, "read_file", path="tickets/t1.txt").startswith("The printer")
    assert run_tool(toolbox, "write_file", path="drafts/ok.txt", content="On it.") == (
        "wrote 6 bytes to drafts/ok.txt"
    )
    assert (folder / "drafts" / "ok.txt").read_text() == "On it."
    assert run_tool(toolbox, "list_dir", path="tickets") == "t1.txt"
    assert run_tool(toolbox, "read_file", path=str(folder / "tickets" / "t1.txt")).startswith(
        "The printer"
    )


def test_refusals_name_the_resolved_path_and_the_allowed_roots(agent: Agent) -> None:
    """A refusal says where the path led and which roots were allowed, and never names as
    allowed the very place it refused; both relative to the workspace (the spec's folder),
    never as absolute server paths (issue 35 §11: refusals reach MCP callers)."""
    folder, toolbox = agent.spec.folder, agent.toolbox
    tickets = folder / "tickets"
    written = run_tool(toolbox, "write_file", path="tickets/new.txt", content="x")
    assert written == (
        "refused: write 'tickets/new.txt': tickets/new.txt is outside the allowed paths (drafts)"
    )
    read = run_tool(toolbox, "read_file", path="t1.txt")  # no longer from the first read root
    assert read == ("refused: read 't1.txt': t1.txt is outside the allowed paths (tickets, drafts)")
    missing = run_tool(toolbox, "read_file", path="tickets/t9.txt")
    assert missing == "error: 'tickets/t9.txt' does not exist (tickets/t9.txt)"
    outside = run_tool(toolbox, "read_file", path=str(folder.parent / "elsewhere.txt"))
    assert outside == (
        f"refused: read {str(folder.parent / 'elsewhere.txt')!r}: ../elsewhere.txt is outside "
        "the allowed paths (tickets, drafts)"
    )
    assert not (tickets / "new.txt").exists()


def test_escapes_stay_refused(agent: Agent) -> None:
    """`..`, absolute paths outside and symlinks leading out are refused, nothing written."""
    folder, toolbox = agent.spec.folder, agent.toolbox
    secret = folder / "outside" / "secret.txt"
    (folder / "tickets" / "door").symlink_to(folder / "outside", target_is_directory=True)
    (folder / "drafts").mkdir(exist_ok=True)
    (folder / "drafts" / "link.txt").symlink_to(secret)
    for name, args in [
        ("read_file", {"path": "outside/secret.txt"}),
        ("read_file", {"path": "tickets/../outside/secret.txt"}),
        ("read_file", {"path": str(secret)}),
        ("read_file", {"path": "tickets/door/secret.txt"}),
        ("list_dir", {"path": "."}),
        ("write_file", {"path": "../drafts/x.txt", "content": "x"}),
        ("write_file", {"path": "drafts/link.txt", "content": "pwned"}),
        ("write_file", {"path": "tickets/door/new.txt", "content": "pwned"}),
    ]:
        assert run_tool(toolbox, name, **args).startswith("refused: "), (name, args)
    assert secret.read_text() == "secret"
    assert sorted(os.listdir(folder / "outside")) == ["secret.txt"]


def test_a_workspace_elsewhere_is_where_relative_paths_start(tmp_path: Path) -> None:
    """With `[workspace] path = "work"`, the model's relative paths start there."""
    (tmp_path / "work" / "tickets").mkdir(parents=True)
    (tmp_path / "work" / "tickets" / "t1.txt").write_text("inside the workspace")
    spec = tmp_path / "agent.toml"
    spec.write_text(
        SPEC.replace('["tickets"]', '["work/tickets"]').format(
            workspace='[workspace]\npath = "work"\ngit = false\n'
        )
    )
    loaded = load_spec(spec)
    assert loaded.workdir() == tmp_path / "work"
    boundary = Boundary(
        read_paths=[loaded.path(p) for p in loaded.tools.read_paths], workdir=loaded.workdir()
    )
    assert boundary.resolve_read("tickets/t1.txt") == tmp_path / "work" / "tickets" / "t1.txt"


# -- a property: inside an allowed root always works, outside never does ---------------------

NAMES = st.text(alphabet="abc", min_size=1, max_size=3)
SEGMENTS = st.one_of(NAMES, st.sampled_from(["..", ".", "tickets", "drafts", "outside", "door"]))


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def test_any_path_inside_a_root_works_and_any_outside_is_refused() -> None:
    """For any relative path inside an allowed root, write then read succeed; any path whose
    lexical or real location is outside the roots is refused, naming where it led."""
    with tempfile.TemporaryDirectory() as made:
        folder = Path(made).resolve()
        tickets, drafts, outside = folder / "tickets", folder / "drafts", folder / "outside"
        for d in (tickets, drafts, outside):
            d.mkdir()
        (tickets / "door").symlink_to(outside, target_is_directory=True)
        boundary = Boundary(
            read_paths=[tickets], write_paths=[drafts], granted=["*"], workdir=folder
        )
        toolbox = Toolbox(builtin_tools(), boundary)

        @settings(
            max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(
            root=st.sampled_from(["tickets", "drafts"]),
            dirs=st.lists(NAMES, max_size=3),
            name=NAMES,
            content=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20),
        )
        def inside(root: str, dirs: list[str], name: str, content: str) -> None:
            path = "/".join([root, *dirs, f"{name}.txt"])
            if root == "drafts":
                assert run_tool(toolbox, "write_file", path=path, content=content).startswith(
                    "wrote"
                )
                assert run_tool(toolbox, "read_file", path=path) == content
            else:
                assert not run_tool(toolbox, "read_file", path=path).startswith("refused: ")
                listed = run_tool(toolbox, "list_dir", path="/".join([root, *dirs]))
                assert not listed.startswith("refused: ")

        @settings(
            max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(parts=st.lists(SEGMENTS, min_size=1, max_size=5), absolute=st.booleans())
        def anywhere(parts: list[str], absolute: bool) -> None:
            path = "/".join(parts)
            if absolute:
                path = str(folder / path)
            lexical = Path(os.path.normpath(folder / path))
            real = Path(os.path.realpath(folder / path))
            for tool_name, roots in (("read_file", (tickets, drafts)), ("write_file", (drafts,))):
                outside_roots = not any(_inside(lexical, r) for r in roots) or not any(
                    _inside(real, r) for r in roots
                )
                args: dict[str, Any] = {"path": path}
                if tool_name == "write_file":
                    args["content"] = "x"
                result = run_tool(toolbox, tool_name, **args)
                if outside_roots:
                    assert result.startswith("refused: "), (tool_name, path, result)
                    if not any(_inside(lexical, r) for r in roots):
                        allowed = ", ".join(os.path.relpath(r, folder) for r in roots)
                        shown = os.path.relpath(lexical, folder)  # never absolute
                        assert f"{shown} is outside the allowed paths ({allowed})" in result
            assert os.listdir(outside) == []  # nothing ever lands outside

        inside()
        anywhere()
