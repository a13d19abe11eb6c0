"""MkDocs hook: the reference pages generated from the code, offline.

A page holding `<!-- generated: cli -->` gets the CLI reference, made by mkdocs-click
from the click commands of `perdure.cli.main` (brackets in help text escaped so
Markdown does not read `[ARGS] [OPTIONS]` as a link; click's "unset" defaults shown
as nothing). A page holding `<!-- generated: openapi -->` gets the HTTP API, every
endpoint of docs/openapi.json with its scope, parameters, body and answers, and
every schema with its fields. `<!-- generated: spec -->` becomes every key of an agent
spec, from the pydantic models of `perdure.agent.spec`: type, default, the model's
docstring and the comment on the field's line. Nothing here reaches the network.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from pathlib import Path
from typing import Any

OPENAPI = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"
CLI_MARK = "<!-- generated: cli -->"
OPENAPI_MARK = "<!-- generated: openapi -->"
SPEC_MARK = "<!-- generated: spec -->"
METHODS = ("get", "post", "put", "delete", "patch")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the generation marks of a page with what they stand for."""
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if OPENAPI_MARK in markdown:
        markdown = markdown.replace(OPENAPI_MARK, openapi_reference(OPENAPI))
    if SPEC_MARK in markdown:
        markdown = markdown.replace(SPEC_MARK, spec_reference())
    return markdown


def field_comments(model: type) -> dict[str, str]:
    """The comment written on each field's line of a model's source."""
    source = inspect.getsource(model)
    found = re.findall(r"^    (\w+): [^\n]*?  # ([^\n]*)$", source, re.MULTILINE)
    return dict(found)


def submodel(annotation: Any) -> tuple[type | None, str]:
    """The spec model a field holds (alone, in a list or in a dict), and how its table is
    named: `[section]`, `[[section]]` or `[section.KEY]`."""
    from pydantic import BaseModel

    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, "[{}]"
    if origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0], "[[{}]]"
    if origin is dict and isinstance(args[-1], type) and issubclass(args[-1], BaseModel):
        return args[-1], "[{}.KEY]"
    if origin in (types.UnionType, typing.Union) and len(args) == 1:
        return submodel(args[0])
    return None, ""


def type_name(annotation: Any) -> str:
    """A field's type as a reader of TOML sees it."""
    text = str(annotation).replace("typing.", "").replace("NoneType", "None")
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text)
    return re.sub(r"\b(?:perdure|pathlib)\.[\w.]+\.(\w+)", r"\1", text)


def spec_reference() -> str:
    """Markdown: every key of an agent spec, section by section."""
    from perdure.agent.spec import AgentSpec

    out: list[str] = []
    pending: list[tuple[str, type]] = [("", AgentSpec)]
    while pending:
        section, model = pending.pop(0)
        title = section or "top level"
        out += [f"## `{title}`" if section else f"## {title}", ""]
        own = model.__dict__.get("__doc__")  # not pydantic's BaseModel docstring
        out += [cell(inspect.cleandoc(own) if own else ""), ""]
        comments = field_comments(model)
        out += ["| key | type | default | note |", "|---|---|---|---|"]
        for name, info in model.model_fields.items():  # type: ignore[attr-defined]
            if info.exclude:
                continue
            inner, form = submodel(info.annotation)
            key = f"{section}.{name}" if section else name
            if inner is not None:
                pending.append((form.format(key), inner))
            default = "required" if info.is_required() else f"`{info.get_default()!r}`"
            if inner is not None and not info.is_required():
                default = "see its table" if info.get_default() is not None else "`None`"
            note = cell(comments.get(name, ""))
            out.append(f"| `{name}` | `{cell(type_name(info.annotation))}` | {default} | {note} |")
        out.append("")
    return "\n".join(out)


def cli_reference() -> str:
    """Markdown for every `perdure` command, its usage and its options."""
    from mkdocs_click._docs import make_command_docs

    from perdure.cli.main import cli

    lines = make_command_docs(
        prog_name="perdure", command=cli, depth=1, style="table", list_subcommands=True
    )
    out: list[str] = []
    in_code = False
    for line in lines:
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            line = line.replace("`Sentinel.UNSET`", "").replace("[", "\\[")
        out.append(line)
    return "\n".join(out)


def cell(text: object) -> str:
    """A value as one Markdown table cell."""
    return re.sub(r"\s+", " ", str(text)).replace("|", "\\|").strip()


def schema_name(schema: dict[str, Any]) -> str:
    """How a schema reads in a table: its component name, or its type."""
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f"[{name}](#schema-{name.lower()})"
    if schema.get("type") == "array":
        return f"list of {schema_name(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(schema_name(part) for part in schema[key])
    kind = schema.get("type", "any")
    return " or ".join(kind) if isinstance(kind, list) else str(kind)


def body_schema(part: dict[str, Any]) -> str:
    """The schema of a request body or an answer (JSON or event stream)."""
    for content in part.get("content", {}).values():
        return schema_name(content.get("schema", {}))
    return ""


def openapi_reference(path: Path) -> str:
    """Markdown for every endpoint and schema of an OpenAPI 3.1 document."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    responses = doc["components"].get("responses", {})
    out = [f"Generated from `docs/openapi.json` (OpenAPI {doc['openapi']}).", ""]
    for route, item in doc["paths"].items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            out += [f"### `{method.upper()} {route}`", "", cell(op.get("summary", "")), ""]
            scope = op.get("x-perdure-scope")
            out += [f"Scope: `{scope}`." if scope else "No token needed.", ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | required | type | description |", "|" + "---|" * 5]
                for p in params:
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'} "
                        f"| {schema_name(p.get('schema', {}))} | {cell(p.get('description', ''))} |"
                    )
                out.append("")
            if "requestBody" in op:
                out += [f"Body: {body_schema(op['requestBody'])}", ""]
            out += ["| status | meaning | body |", "|---|---|---|"]
            for status, answer in op["responses"].items():
                if "$ref" in answer:
                    answer = responses[str(answer["$ref"]).rsplit("/", 1)[-1]]
                out.append(
                    f"| {status} | {cell(answer.get('description', ''))} | {body_schema(answer)} |"
                )
            out.append("")
    out += ["## Schemas", ""]
    for name, schema in doc["components"]["schemas"].items():
        out += [f"### {name} {{#schema-{name.lower()}}}", "", cell(schema.get("description", ""))]
        props = schema.get("properties", {})
        if props:
            required = set(schema.get("required", []))
            out += ["", "| field | type | required | description |", "|---|---|---|---|"]
            for field, spec in props.items():
                out.append(
                    f"| `{field}` | {schema_name(spec)} | {'yes' if field in required else 'no'} "
                    f"| {cell(spec.get('description', ''))} |"
                )
        out.append("")
    return "\n".join(out)
