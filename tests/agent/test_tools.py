"""Agent tools: schemas from type hints, validation, and the boundary (paths, commands, hosts,
grants, approval) refusing calls without executing them."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import pytest

from perdure.agent.messages import ToolCall
from perdure.agent.tools import (
    Boundary,
    PreparedCall,
    Refusal,
    Toolbox,
    ToolContext,
    ToolRefused,
    builtin_tools,
    gate_event,
    tool,
)
from perdure.agent.tools.builtins import (
    http_request,
    read_file,
    run_command,
    write_file,
)
from perdure.errors import ConfigError

ALL = [t.name for t in builtin_tools()]


def call(name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"call-{name}", name=name, arguments=arguments)


def run(toolbox: Toolbox, tool_call: ToolCall) -> str:
    """Prepare and execute one call as the loop would; a refusal's text if it is refused."""
    prepared = toolbox.prepare(tool_call)
    if isinstance(prepared, Refusal):
        return prepared.text
    return asyncio.run(toolbox.execute(prepared, toolbox.context(tool_call.id)))


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """A root the agent may use and, beside it, an outside directory with a secret."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "notes.txt").write_text("inside")
    (outside / "secret.txt").write_text("secret")
    return {"root": root, "outside": outside}


def files(tree: dict[str, Path], **extra: Any) -> Toolbox:
    boundary = Boundary(read_paths=[tree["root"]], write_paths=[tree["root"]], granted=ALL, **extra)
    return Toolbox(builtin_tools(), boundary)


# -- schemas and validation -----------------------------------------------------------------


@tool(effect="read", permissions=())
def sample(
    ctx: ToolContext,
    name: str,
    count: int = 3,
    tags: list[str] | None = None,
    mode: Literal["fast", "slow"] = "fast",
) -> str:
    """Do a sample thing.

    More detail the model does not need.

    Args:
        name: Who to greet.
        count: How many times,
            at most ten.
    """
    return f"{name} {count} {tags} {mode}"


def test_schema_comes_from_type_hints() -> None:
    """Required parameters are those without defaults; types, enums and docs are carried."""
    spec = sample.spec()
    params = spec.parameters
    assert spec.name == "sample"
    assert spec.description == "Do a sample thing."
    assert params["type"] == "object"
    assert params["required"] == ["name"]
    assert set(params["properties"]) == {"name", "count", "tags", "mode"}  # no ctx
    assert params["properties"]["name"]["type"] == "string"
    assert params["properties"]["count"] == {
        "default": 3,
        "description": "How many times, at most ten.",
        "type": "integer",
    }
    assert params["properties"]["mode"]["enum"] == ["fast", "slow"]
    assert {"type": "array", "items": {"type": "string"}} in params["properties"]["tags"]["anyOf"]
    assert params["additionalProperties"] is False
    assert "title" not in json.dumps(params)


def test_validation_converts_and_refuses_with_a_readable_reason() -> None:
    """Good arguments are converted; bad ones raise ToolRefused naming the argument."""
    assert sample.validate({"name": "ana", "count": "4"})["count"] == 4
    with pytest.raises(ToolRefused, match="count"):
        sample.validate({"name": "ana", "count": "many"})
    with pytest.raises(ToolRefused, match="name: Field required"):
        sample.validate({"count": 1})
    with pytest.raises(ToolRefused, match="colour: Extra inputs are not permitted"):
        sample.validate({"name": "ana", "colour": "red"})
    with pytest.raises(ToolRefused, match="mode"):
        sample.validate({"name": "ana", "mode": "medium"})


def test_bad_arguments_are_refused_by_the_toolbox_without_running() -> None:
    """A call with invalid arguments is prepared as a Refusal and the function never runs."""
    ran: list[int] = []

    @tool(effect="once")
    def bump(by: int) -> int:
        ran.append(by)
        return by

    toolbox = Toolbox([bump], Boundary(granted=["bump"]))
    assert run(toolbox, call("bump", by="lots")).startswith("refused: invalid arguments for bump")
    assert ran == []
    assert run(toolbox, call("bump", by=2)) == "2"
    assert ran == [2]


def test_tool_declarations_are_checked() -> None:
    """An unknown effect, a bad name or *args are configuration errors, found at import."""

    def noop() -> None: ...

    def variadic(*items: str) -> None: ...

    with pytest.raises(ConfigError, match="effect 'sometimes'"):
        tool(effect="sometimes")(noop)  # type: ignore[call-overload]
    with pytest.raises(ConfigError, match="names"):
        tool(name="has space")(noop)

    with pytest.raises(ConfigError, match="items"):
        tool(variadic)


def test_effects_are_declared_per_tool_and_per_call() -> None:
    """Built-ins declare effects like steps; an HTTP GET reads, a POST is `once`."""
    assert read_file.effect == "read"
    assert write_file.effect == "idempotent"
    assert run_command.effect == "once"
    assert http_request.effect_for({"url": "http://x", "method": "GET"}) == "read"
    assert http_request.effect_for({"url": "http://x", "method": "POST"}) == "once"
    assert read_file.permissions == ("fs.read",)


# -- paths ----------------------------------------------------------------------------------


def test_allowed_paths_read_write_and_list(tree: dict[str, Path]) -> None:
    """Inside the root, files can be written (parents created), read back and listed."""
    toolbox = files(tree)
    assert run(toolbox, call("write_file", path="sub/a.txt", content="hello")).startswith("wrote")
    assert (tree["root"] / "sub" / "a.txt").read_text() == "hello"
    assert run(toolbox, call("read_file", path="sub/a.txt")) == "hello"
    assert run(toolbox, call("read_file", path=str(tree["root"] / "notes.txt"))) == "inside"
    assert run(toolbox, call("list_dir", path=".")).splitlines() == ["notes.txt", "sub/"]
    assert run(toolbox, call("read_file", path="missing.txt")).startswith("error: ")


def test_read_file_truncates(tree: dict[str, Path]) -> None:
    """Reading stops at max_bytes and says so."""
    (tree["root"] / "big.txt").write_text("x" * 50)
    text = run(files(tree), call("read_file", path="big.txt", max_bytes=10))
    assert text.startswith("x" * 10 + "\n[truncated")


def test_path_traversal_is_refused(tree: dict[str, Path]) -> None:
    """`..` climbing out of the root is refused for reading, writing and listing."""
    toolbox = files(tree)
    for name, args in [
        ("read_file", {"path": "../outside/secret.txt"}),
        ("list_dir", {"path": ".."}),
        ("write_file", {"path": "../outside/new.txt", "content": "x"}),
        ("read_file", {"path": "sub/../../outside/secret.txt"}),
    ]:
        assert run(toolbox, call(name, **args)).startswith("refused: "), (name, args)
    assert not (tree["outside"] / "new.txt").exists()
    with pytest.raises(ToolRefused) as refused:
        toolbox.boundary.resolve_read("../outside/secret.txt")
    # the refusal names the path as resolved and the one root it was checked against
    assert str(refused.value) == (  # relative to the workspace, never absolute
        "read '../outside/secret.txt': ../outside/secret.txt is outside the allowed paths (.)"
    )


def test_absolute_path_outside_is_refused(tree: dict[str, Path]) -> None:
    """An absolute path outside every root is refused; nothing is written there."""
    toolbox = files(tree)
    secret = tree["outside"] / "secret.txt"
    assert run(toolbox, call("read_file", path=str(secret))).startswith("refused: ")
    assert run(toolbox, call("read_file", path="/etc/passwd")).startswith("refused: ")
    result = run(toolbox, call("write_file", path=str(secret), content="pwned"))
    assert result.startswith("refused: ")
    assert secret.read_text() == "secret"


def test_symlink_escape_is_refused_for_read_and_write(tree: dict[str, Path]) -> None:
    """A symlink inside the root pointing outside can be neither read nor written through."""
    secret = tree["outside"] / "secret.txt"
    (tree["root"] / "link.txt").symlink_to(secret)
    toolbox = files(tree)
    assert run(toolbox, call("read_file", path="link.txt")) == "refused: " + (
        "read 'link.txt': the symlink link.txt leads to ../outside/secret.txt, "
        "outside the allowed paths (.)"
    )
    assert run(toolbox, call("write_file", path="link.txt", content="pwned")).startswith(
        "refused: "
    )
    assert secret.read_text() == "secret"


def test_dangling_symlink_to_outside_is_refused(tree: dict[str, Path]) -> None:
    """A symlink to a file outside that does not exist yet cannot be used to create it."""
    target = tree["outside"] / "planted.txt"
    (tree["root"] / "dangling").symlink_to(target)
    result = run(files(tree), call("write_file", path="dangling", content="x"))
    assert result.startswith("refused: ")
    assert not target.exists()


def test_symlinked_parent_directory_is_refused(tree: dict[str, Path]) -> None:
    """A directory symlink inside the root leading outside refuses what lies beneath it."""
    (tree["root"] / "door").symlink_to(tree["outside"], target_is_directory=True)
    toolbox = files(tree)
    assert run(toolbox, call("read_file", path="door/secret.txt")).startswith("refused: ")
    assert run(toolbox, call("list_dir", path="door")).startswith("refused: ")
    result = run(toolbox, call("write_file", path="door/new.txt", content="x"))
    assert result.startswith("refused: ")
    assert not (tree["outside"] / "new.txt").exists()
    # `door/..` is the root itself on paper, but outside once the symlink is followed.
    with pytest.raises(ToolRefused):
        toolbox.boundary.resolve_read("door/../notes.txt")


def test_symlink_staying_inside_is_allowed(tree: dict[str, Path]) -> None:
    """A symlink whose target is inside the root is followed."""
    (tree["root"] / "alias.txt").symlink_to(tree["root"] / "notes.txt")
    assert run(files(tree), call("read_file", path="alias.txt")) == "inside"


def test_root_reached_through_a_symlink_works(tree: dict[str, Path], tmp_path: Path) -> None:
    """A root given by a symlinked path is compared on its real path, both spellings work."""
    (tmp_path / "via").symlink_to(tree["root"], target_is_directory=True)
    boundary = Boundary(read_paths=[tmp_path / "via"])
    assert boundary.resolve_read("notes.txt") == (tree["root"] / "notes.txt").resolve()
    assert boundary.resolve_read(str(tree["root"] / "notes.txt")).name == "notes.txt"


def test_write_needs_a_write_root(tree: dict[str, Path]) -> None:
    """A read-only root can be read but not written; a missing root grants nothing."""
    read_only = Toolbox(builtin_tools(), Boundary(read_paths=[tree["root"]], granted=ALL))
    assert run(read_only, call("read_file", path="notes.txt")) == "inside"
    assert "write_file" not in [s.name for s in read_only.offered()]
    assert run(read_only, call("write_file", path="n.txt", content="x")).startswith("refused: ")
    with pytest.raises(ToolRefused, match="does not exist"):
        Boundary(read_paths=[tree["root"] / "missing"]).resolve_read("a.txt")


# -- commands -------------------------------------------------------------------------------


def test_disallowed_command_is_refused_and_not_executed(tree: dict[str, Path]) -> None:
    """A command outside the allowlist is refused; the file it would create never appears."""
    marker = tree["root"] / "marker"
    toolbox = files(tree, commands=["echo"])
    result = run(toolbox, call("run_command", argv=["touch", str(marker)]))
    assert result.startswith("refused: command 'touch' is not allowed")
    assert not marker.exists()


def test_allowed_command_runs_without_a_shell(tree: dict[str, Path]) -> None:
    """An allowed command runs in the working directory; shell syntax is just an argument."""
    toolbox = files(tree, commands=["echo", "ls"])
    out = json.loads(run(toolbox, call("run_command", argv=["echo", "hi", ";", "touch", "m"])))
    assert out["exit_code"] == 0
    assert out["stdout"] == "hi ; touch m\n"
    assert not (tree["root"] / "m").exists()
    listing = json.loads(run(toolbox, call("run_command", argv=["ls"])))
    assert listing["stdout"].split() == ["notes.txt"]


def test_command_allowlist_rules() -> None:
    """Prefixes are exact, `./echo` is not `echo`, and strings with shell syntax are refused."""
    boundary = Boundary(commands=["echo", ("git", "status")])
    assert boundary.check_command(["git", "status", "-s"]) == ["git", "status", "-s"]
    assert boundary.check_command("echo hello") == ["echo", "hello"]
    for refused in (["git", "push"], ["./echo"], ["/bin/echo"], [], "echo hi; rm -rf x"):
        with pytest.raises(ToolRefused):
            boundary.check_command(refused)
    with pytest.raises(ToolRefused):
        Boundary().check_command(["echo"])  # nothing allowed by default


def test_command_timeout_kills_it(tree: dict[str, Path]) -> None:
    """A command past its timeout is killed and reported as timed out."""
    toolbox = files(tree, commands=["sleep"])
    out = json.loads(run(toolbox, call("run_command", argv=["sleep", "5"], timeout=0.2)))
    assert out["timed_out"] is True
    assert out["exit_code"] != 0


# -- hosts ----------------------------------------------------------------------------------


@pytest.fixture
def web() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server on 127.0.0.1: its base URL and the paths it was asked for."""
    hits: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = f"hello {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            hits.append(f"POST {self.path} {self.rfile.read(length).decode()}")
            self.send_response(201)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()


def web_box(*hosts: str) -> Toolbox:
    return Toolbox(builtin_tools(), Boundary(hosts=hosts, granted=["http_request"]))


def test_allowed_host_is_requested(web: tuple[str, list[str]]) -> None:
    """With 127.0.0.1 allowlisted, GET and POST reach the local server and report back."""
    base, hits = web
    toolbox = web_box("127.0.0.1")
    out = json.loads(run(toolbox, call("http_request", url=f"{base}/ok")))
    assert out["status"] == 200
    assert out["body"] == "hello /ok"
    posted = json.loads(
        run(toolbox, call("http_request", url=f"{base}/p", method="POST", body="x"))
    )
    assert posted["status"] == 201
    assert hits == ["/ok", "POST /p x"]


def test_disallowed_host_is_refused_and_not_requested(web: tuple[str, list[str]]) -> None:
    """Unlisted hosts, userinfo tricks, other schemes and ports are refused before any request."""
    base, hits = web
    port = base.rsplit(":", 1)[1]
    listed = web_box("127.0.0.1")
    for url in (
        f"http://localhost:{port}/",  # same server, unlisted name
        f"http://127.0.0.1@localhost:{port}/",  # userinfo: the host is localhost
        f"http://localhost:{port}@127.0.0.1:{port}/",  # userinfo, even towards a listed host
        f"ftp://127.0.0.1:{port}/",
        f"http://127.0.0.1:{port}\\@localhost/",
    ):
        assert run(listed, call("http_request", url=url)).startswith("refused: "), url
    with pytest.raises(ToolRefused, match="credentials"):
        listed.boundary.check_host(f"http://localhost:{port}@127.0.0.1:{port}/")
    only_port = web_box("127.0.0.1:1")
    assert run(only_port, call("http_request", url=f"{base}/")).startswith("refused: ")
    assert hits == []


def test_ip_literals_are_refused_unless_listed(web: tuple[str, list[str]]) -> None:
    """An IP address is refused when only names are allowlisted (no wildcard matches it)."""
    base, hits = web
    boundary = Boundary(hosts=["*.example.com", "example.com"])
    with pytest.raises(ToolRefused, match="IP addresses"):
        boundary.check_host(f"{base}/")
    with pytest.raises(ToolRefused, match="IP addresses"):
        boundary.check_host("http://[::1]/")
    assert boundary.check_host("https://api.example.com/x") == "https://api.example.com/x"
    with pytest.raises(ToolRefused, match="not allowed"):
        boundary.check_host("https://evilexample.com/")
    assert run(web_box("example.com"), call("http_request", url=f"{base}/")).startswith("refused: ")
    assert hits == []


# -- grants, approval, gates ----------------------------------------------------------------


def test_ungranted_tool_is_not_offered_and_not_executed(tree: dict[str, Path]) -> None:
    """Deny by default: only granted tools are offered; a call to another is refused unrun."""
    ran: list[str] = []

    @tool(effect="once")
    def launch(target: str) -> str:
        """Launch something."""
        ran.append(target)
        return "launched"

    toolbox = Toolbox(
        [*builtin_tools(), launch],
        Boundary(read_paths=[tree["root"]], write_paths=[tree["root"]], granted=["read_file"]),
    )
    assert [s.name for s in toolbox.offered()] == ["read_file"]
    refusal = toolbox.prepare(call("launch", target="moon"))
    assert isinstance(refusal, Refusal)
    assert refusal.text == "refused: tool 'launch' is not granted"
    assert run(toolbox, call("write_file", path="w.txt", content="x")).startswith("refused: ")
    assert run(toolbox, call("no_such_tool")) == "refused: tool 'no_such_tool' is not granted"
    # Even a PreparedCall forged around the check is not executed.
    forged = PreparedCall(call("launch", target="moon"), launch, {"target": "moon"}, "once")
    assert asyncio.run(toolbox.execute(forged, toolbox.context("x"))).startswith("refused: ")
    assert ran == []
    assert not (tree["root"] / "w.txt").exists()


def test_tool_without_its_permission_is_not_offered() -> None:
    """A granted tool whose permission the boundary cannot give (no commands) is not offered."""
    toolbox = Toolbox(builtin_tools(), Boundary(granted=["run_command", "finish"]))
    assert [s.name for s in toolbox.offered()] == ["finish"]
    refusal = toolbox.prepare(call("run_command", argv=["echo"]))
    assert isinstance(refusal, Refusal)
    assert "process.run" in refusal.reason


def test_destructive_tools_need_approval_per_spec(tree: dict[str, Path]) -> None:
    """`*` gates every destructive call (not a GET); a name gates that tool only."""
    every = files(tree, approval_required=["*"], hosts=["example.com"], commands=["echo"])
    assert every.needs_approval(call("write_file", path="a", content="b"))
    assert every.needs_approval(call("run_command", argv=["echo"]))
    assert every.needs_approval(call("http_request", url="http://example.com", method="POST"))
    assert not every.needs_approval(call("http_request", url="http://example.com"))
    assert not every.needs_approval(call("read_file", path="a"))
    named = files(tree, approval_required=["run_command"], commands=["echo"])
    prepared = named.prepare(call("run_command", argv=["echo"]))
    assert isinstance(prepared, PreparedCall)
    assert named.needs_approval(prepared)
    assert not named.needs_approval(call("write_file", path="a", content="b"))
    assert not files(tree).needs_approval(call("write_file", path="a", content="b"))


def test_ask_human_is_a_gate_and_finish_marks_completion() -> None:
    """ask_human is flagged as a gate and names the event to wait for; finish is flagged."""
    toolbox = Toolbox(builtin_tools(), Boundary(granted=["ask_human", "finish"]))
    prepared = toolbox.prepare(call("ask_human", question="Ship it?"))
    assert isinstance(prepared, PreparedCall)
    assert prepared.tool.gate and not prepared.tool.finish
    marker = json.loads(asyncio.run(toolbox.execute(prepared, toolbox.context("c7"))))
    assert marker == {"wait_event": "human:c7", "question": "Ship it?"}
    assert gate_event("c7") == "human:c7"
    done = toolbox.prepare(call("finish", summary="all done"))
    assert isinstance(done, PreparedCall)
    assert done.tool.finish
    assert asyncio.run(toolbox.execute(done, toolbox.context("c8"))) == "all done"


class FakeMemory:
    """An in-memory Memory for the remember/recall tools."""

    def __init__(self) -> None:
        self.facts: list[tuple[str, list[str]]] = []

    async def remember(self, text: str, tags: list[str]) -> str:
        self.facts.append((text, tags))
        return f"m{len(self.facts)}"

    async def recall(self, query: str, limit: int) -> list[dict[str, Any]]:
        found = [{"text": t, "tags": g} for t, g in self.facts if query in t]
        return found[:limit]


def test_memory_tools_use_the_context_memory() -> None:
    """remember and recall go through ctx.memory; without one they report an error."""
    memory = FakeMemory()
    toolbox = Toolbox(builtin_tools(), Boundary(granted=["remember", "recall"]))

    def go(tool_call: ToolCall, mem: FakeMemory | None) -> str:
        prepared = toolbox.prepare(tool_call)
        assert isinstance(prepared, PreparedCall)
        return asyncio.run(toolbox.execute(prepared, toolbox.context(tool_call.id, mem)))

    assert go(call("remember", text="the build uses uv", tags=["build"]), memory) == "m1"
    assert memory.facts == [("the build uses uv", ["build"])]
    assert json.loads(go(call("recall", query="uv"), memory)) == [
        {"text": "the build uses uv", "tags": ["build"]}
    ]
    assert go(call("recall", query="uv"), None).startswith("error: ")


def test_tool_refusal_inside_execution_is_reported(tree: dict[str, Path]) -> None:
    """If the boundary changed since prepare, execution re-checks and refuses."""
    toolbox = files(tree)
    prepared = toolbox.prepare(call("read_file", path="notes.txt"))
    assert isinstance(prepared, PreparedCall)
    os.remove(tree["root"] / "notes.txt")
    (tree["root"] / "notes.txt").symlink_to(tree["outside"] / "secret.txt")
    assert asyncio.run(toolbox.execute(prepared, toolbox.context("c"))).startswith("refused: ")
