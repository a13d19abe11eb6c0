"""Finding the user's App for CLI commands: `--app module:attribute` or `PERDURE_APP`."""

from __future__ import annotations

import importlib
import os
import sys

from ..app import App
from ..errors import ConfigError


def load_app(spec: str | None, db: str | None) -> App:
    """Import `module:attr` (the App instance); without a spec, a bare App on the store.

    `--db` is exported as `PERDURE_DB` before the import so an `App()` built with
    the default store URL picks it up.
    """
    if db:
        os.environ["PERDURE_DB"] = db
    spec = spec or os.environ.get("PERDURE_APP")
    if not spec:
        return App(db)
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {spec!r}: cannot import {module_name!r} ({exc})") from None
    if attr:
        app = getattr(module, attr, None)
        if not isinstance(app, App):
            raise ConfigError(f"--app {spec!r}: {module_name}.{attr} is not a perdure.App")
        return app
    found = [v for v in vars(module).values() if isinstance(v, App)]
    if len(found) != 1:
        raise ConfigError(
            f"--app {spec!r}: found {len(found)} perdure.App objects; name one as module:attribute"
        )
    return found[0]
