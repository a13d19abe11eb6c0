// The official TypeScript SDK against `perdure mcp --http` (2025-11-25): argv URL TOKEN.
// Drives task-augmented calls through callToolStream and prints what the SDK showed, as JSON.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema, CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [url, token] = process.argv.slice(2);
const client = new Client({ name: "ts-conformance", version: "1" }, { capabilities: { elicitation: {} } });
const asked = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.push(request.params.message);
  return { action: "accept", content: { answer: "amber" } };
});
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
await client.connect(transport);
const out = { tools: (await client.listTools()).tools.map((t) => [t.name, t.execution?.taskSupport]) };

async function stream(name, args) {
  const seen = [];
  for await (const message of client.experimental.tasks.callToolStream({ name, arguments: args }, CallToolResultSchema, { task: {} })) {
    if (message.type === "taskCreated") seen.push({ type: "taskCreated", taskId: message.task.taskId });
    if (message.type === "taskStatus") seen.push({ type: "taskStatus", status: message.task.status, statusMessage: message.task.statusMessage });
    if (message.type === "result") seen.push({ type: "result", result: message.result });
    if (message.type === "error") seen.push({ type: "error", message: message.error.message });
  }
  return seen;
}

out.nap = await stream("nap", { x: 4, pause: 0.2 });
out.explode = await stream("explode", { n: 7 });
const failedId = out.explode[0].taskId;
out.explodeResult = await client.experimental.tasks.getTaskResult(failedId, CallToolResultSchema);
out.ask = await stream("ask", {});
out.asked = asked;
const held = await client.experimental.tasks.callToolStream({ name: "hold", arguments: {} }, CallToolResultSchema, { task: {} });
const first = (await held.next()).value;
out.cancelled = await client.experimental.tasks.cancelTask(first.task.taskId);
out.listed = (await client.experimental.tasks.listTasks()).tasks.map((t) => [t.taskId, t.status]);
await client.close();
console.log(JSON.stringify(out));
