"""One nesting limit for every value perdure takes in: a JSON body, an event payload, a
webhook body, MCP arguments, schedule and run arguments.

A value nested deeper than `MAX_DEPTH` lists and objects is refused where it enters (the
codec refuses to encode one, so none reaches the store); code that walks stored values
(the redactor, the pages) stops at the same depth, so a deeper value kept before the limit
cannot make a view fail. Plain Python, without recursion.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 200  # lists and objects inside each other


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """`value` has lists/tuples/dicts nested more than `limit` deep (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple | set | frozenset):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def nested_message(where: str) -> str:
    return f"{where} is nested too deeply (over {MAX_DEPTH} lists or objects inside each other)"
