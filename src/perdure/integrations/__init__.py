"""Adapters that run agents written with other frameworks as perdure workflows.

Each adapter imports its framework only when used, behind its extra (`require_extra`),
so `import perdure` never needs one.
"""
