"""Adapters that make agents written with other frameworks durable perdure workflows."""
