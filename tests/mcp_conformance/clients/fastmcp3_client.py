"""FastMCP 3.x (2025-11-25) against `perdure mcp --http`: argv URL TOKEN. Task calls
(`call_tool(..., task=True)`), a failure, a question answered by elicitation, cancel and
list; prints what it saw as JSON on its last line."""

import asyncio
import json
import sys
from typing import Any

from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.exceptions import ToolError

URL, TOKEN = sys.argv[1:3]
asked: list[str] = []


async def answer(message: str, response_type: Any, params: Any, context: Any) -> Any:
    asked.append(message)
    return {"answer": "indigo"}


async def main() -> None:
    transport = StreamableHttpTransport(URL, headers={"Authorization": f"Bearer {TOKEN}"})
    out: dict[str, Any] = {}
    async with Client(transport, elicitation_handler=answer) as client:
        out["version"] = client.initialize_result.protocolVersion
        out["tools"] = sorted(t.name for t in await client.list_tools())
        napping = await client.call_tool("nap", {"x": 3, "pause": 0.2}, task=True)
        out["task_id"] = napping.task_id
        out["nap"] = (await napping.result()).structured_content
        failing = await client.call_tool("explode", {"n": 7}, task=True)
        try:
            await failing.result()
            out["explode"] = "no error"
        except ToolError as exc:
            out["explode"] = str(exc)
        asking = await client.call_tool("ask", {}, task=True)
        out["ask"] = (await asking.result()).structured_content
        out["asked"] = asked
        held = await client.call_tool("hold", {}, task=True)
        await held.cancel()
        out["cancelled"] = (await client.get_task_status(held.task_id)).status
        listed = await client.list_tasks()
        out["listed"] = len(listed["tasks"] if isinstance(listed, dict) else listed.tasks)
    print(json.dumps(out, default=str))


asyncio.run(main())
