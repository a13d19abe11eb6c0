"""Model providers, one class each (base.Provider), listed by name in registry.PROVIDERS."""
