"""Triggers: what starts runs without a person (schedules, events, inbox folders, webhooks,
table changes, message sources, plans). Each builds on the engine's idempotent start: an
occasion maps to one run id. Each kind is one class the runtime keeps in its one registry
(`perdure.engine.triggers`); a plan is a run, not a standing trigger."""
