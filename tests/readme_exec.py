"""Runs README python snippets in a subprocess: `python readme_exec.py PARTS.json`.

PARTS.json is a list of {"file", "line", "source"}: setup code, README blocks and
checks, executed in order in one module namespace (registered as `shop`, the module
name the README's CLI lines use). Each part is compiled under its own file name at
its own first line, so a traceback names the README line that failed.
"""

from __future__ import annotations

import json
import linecache
import sys
import types
from pathlib import Path


def main(parts_path: str) -> None:
    parts = json.loads(Path(parts_path).read_text(encoding="utf-8"))
    module = types.ModuleType("shop")
    module.__file__ = str(Path.cwd() / "shop.py")
    sys.modules["shop"] = module
    for part in parts:
        filename, line, source = part["file"], part["line"], part["source"]
        if not Path(filename).is_file():  # setup code: let tracebacks show it too
            lines = ["\n"] * (line - 1) + source.splitlines(keepends=True)
            linecache.cache[filename] = (len(source), None, lines, filename)
        code = compile("\n" * (line - 1) + source, filename, "exec", dont_inherit=True)
        exec(code, module.__dict__)


if __name__ == "__main__":
    main(sys.argv[1])
