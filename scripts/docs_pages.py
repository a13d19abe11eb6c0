"""MkDocs hook: the reference pages generated from the code, offline.

A page holding `<!-- generated: cli -->` gets the CLI reference, made by mkdocs-click
from the click commands of `perdure.cli.main` (brackets in help text escaped so
Markdown does not read `[ARGS] [OPTIONS]` as a link; click's "unset" defaults shown
as nothing). A page holding `<!-- generated: openapi -->` gets the HTTP API, every
endpoint of docs/openapi.json with its scope, parameters, body and answers, and
every schema with its fields. Nothing here reaches the network.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

OPENAPI = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"
CLI_MARK = "<!-- generated: cli -->"
OPENAPI_MARK = "<!-- generated: openapi -->"
METHODS = ("get", "post", "put", "delete", "patch")


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace the generation marks of a page with what they stand for."""
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_reference())
    if OPENAPI_MARK in markdown:
        markdown = markdown.replace(OPENAPI_MARK, openapi_reference(OPENAPI))
    return markdown


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
