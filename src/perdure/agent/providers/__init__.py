"""Model providers: scripted (deterministic), openai (any compatible server), anthropic."""
