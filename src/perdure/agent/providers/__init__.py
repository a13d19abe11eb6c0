"""Model providers, one class each (base.Provider): scripted, local, openai, anthropic (registry)."""
