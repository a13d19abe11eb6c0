"""Triggers: what starts runs without a person (schedules, events, inbox folders, webhooks,
plans). Each builds on the engine's idempotent start: an occasion maps to one run id."""
