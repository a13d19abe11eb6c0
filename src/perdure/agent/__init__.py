"""The persistent agent: an ordinary durable workflow whose model calls and tool calls are
steps (models, tools and boundaries, the TOML spec, the loop, budgets, memory)."""
