"""FastMCP 4.x (2026-07-28, the tasks extension) against `perdure mcp --http`: argv URL TOKEN.
Prints what it saw as JSON on its last line."""

import asyncio
import json
import sys
from typing import Any

from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.exceptions import ToolError
from fastmcp_tasks.client import call_tool_task

URL, TOKEN = sys.argv[1:3]
asked: list[str] = []


async def answer(message: str, response_type: Any, params: Any, context: Any) -> Any:
    asked.append(message)
    return {"answer": "violet"}


async def main() -> None:
    transport = StreamableHttpTransport(URL, headers={"Authorization": f"Bearer {TOKEN}"})
    out: dict[str, Any] = {}
    async with Client(transport, elicitation_handler=answer) as client:
        out["version"] = client.session.protocol_version
        out["tools"] = sorted(t.name for t in await client.list_tools())
        napping = await call_tool_task(client, "nap", {"x": 6, "pause": 0.2})
        out["task_id"] = napping.task_id
        out["nap"] = (await napping.result()).structured_content
        out["plain"] = (await client.call_tool("nap", {"x": 1, "pause": 0})).structured_content
        try:
            await client.call_tool("explode", {"n": 7})
            out["explode"] = "no error"
        except ToolError as exc:
            out["explode"] = str(exc)
        asking = await call_tool_task(client, "ask", {})
        out["ask"] = (await asking.result()).structured_content
        out["asked"] = asked
        held = await call_tool_task(client, "hold", {})
        await held.cancel()
        out["cancelled"] = (await held.wait(timeout=30)).status
    print(json.dumps(out, default=str))


asyncio.run(main())
