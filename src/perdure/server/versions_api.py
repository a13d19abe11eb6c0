"""`GET /api/v1/versions` and the dashboard's versions page: `perdure versions` over HTTP."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..engine.versions import report_json, versions_report

if TYPE_CHECKING:
    from ..app import App


async def versions_data(app: App, check_code: bool) -> dict[str, Any]:
    """Unfinished runs by workflow and version, builds and their drain, and (`check_code`)
    what this server's code would do with runs of other versions."""
    check = check_code and bool(app.runtime.workflows)
    return report_json(await versions_report(app.runtime, check_code=check))
