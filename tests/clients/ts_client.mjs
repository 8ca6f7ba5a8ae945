// A real TypeScript MCP SDK client (the 2025-11-25 initialize era that Claude Code and the Inspector
// speak). Usage: node ts_client.mjs URL HEADERS_JSON STEPS_JSON; prints one JSON line per step.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, headersJson, stepsJson] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: JSON.parse(headersJson) },
});
const client = new Client({ name: "relay-ts-test", version: "0.0.1" });
try {
  await client.connect(transport);
  const tools = await client.listTools();
  console.log(JSON.stringify({ step: "tools", names: tools.tools.map((t) => t.name).sort() }));
  for (const [name, args] of JSON.parse(stepsJson)) {
    const result = await client.callTool({ name, arguments: args });
    console.log(JSON.stringify({ step: name, isError: !!result.isError, structured: result.structuredContent ?? null,
      text: result.content?.[0]?.text ?? null }));
  }
} catch (err) {
  console.log(JSON.stringify({ step: "error", message: String(err && err.message ? err.message : err) }));
} finally {
  await client.close();
}
