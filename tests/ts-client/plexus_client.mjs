// The official TypeScript MCP SDK's client (what desktop clients and the Inspector
// are built on) doing what a desktop client does, against plexus or an upstream
// directly; tests/tests/e2e/ts_client.rs runs it and checks its one JSON line.
//
//   node plexus_client.mjs --url URL [options]
//   node plexus_client.mjs [options] -- COMMAND ARGS...   (stdio)
//
// Options: --prefix P (what names server-everything's tools and prompts, "" when
// direct), --uri-prefix P (what prefixes its resource URIs), --drift FILE (the
// fixture's drift file, empty at the start: writing `new-tool` there adds a tool,
// so tools/list_changed is awaited; without it that check is skipped).
//
// Every check records its outcome (or `{ error }`) and the script goes on, so one
// failure still reports the rest; the exit status is 0 once the line is printed.
import { writeFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import {
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  LoggingMessageNotificationSchema,
  ToolListChangedNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

const SAMPLED = "sampled by the typescript client";
const CALL_TIMEOUT_MS = 30_000;

const argv = process.argv.slice(2);
const options = { prefix: "", uriPrefix: "", url: null, drift: null, command: null };
for (let i = 0; i < argv.length; i++) {
  const arg = argv[i];
  if (arg === "--") {
    options.command = argv.slice(i + 1);
    break;
  }
  const value = argv[++i];
  if (arg === "--url") options.url = value;
  else if (arg === "--prefix") options.prefix = value;
  else if (arg === "--uri-prefix") options.uriPrefix = value;
  else if (arg === "--drift") options.drift = value;
  else throw new Error(`unknown option ${arg}`);
}
const tool = (name) => options.prefix + name;

const seen = { logs: [], listChanged: [], sampled: [], elicited: [] };
const client = new Client(
  { name: "plexus-ts-test", version: "1" },
  { capabilities: { sampling: {}, elicitation: { form: {} } } },
);
client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
  seen.sampled.push(request.params);
  return { model: "ts-test-model", role: "assistant", content: { type: "text", text: SAMPLED } };
});
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  seen.elicited.push(request.params);
  const properties = request.params.requestedSchema?.properties ?? {};
  const content = Object.fromEntries(Object.entries(properties).map(([k, p]) => [k, answerFor(p)]));
  return { action: "accept", content };
});
client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
  seen.logs.push(n.params);
});
client.setNotificationHandler(ToolListChangedNotificationSchema, () => {
  seen.listChanged.push(Date.now());
});

/** A value valid for one property of a flat form elicitation schema. */
function answerFor(p) {
  if ("default" in p) return p.default;
  if (p.enum?.length) return p.enum[0];
  if (p.oneOf?.length) return p.oneOf[0].const;
  if (p.type === "array") {
    const items = p.items ?? {};
    return (items.enum ?? (items.anyOf ?? []).map((c) => c.const)).slice(0, 1);
  }
  if (p.type === "boolean") return true;
  if (p.type === "integer" || p.type === "number") return p.minimum ?? 1;
  const byFormat = {
    email: "ts@example.com",
    uri: "https://example.com/ts",
    date: "2000-01-01",
    "date-time": "2000-01-01T00:00:00Z",
  };
  return byFormat[p.format] ?? "answered by typescript";
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const report = {};
async function check(name, body) {
  const started = Date.now();
  try {
    report[name] = await body();
  } catch (error) {
    report[name] = { error: `${error?.name ?? "Error"}: ${error?.message ?? error}` };
  }
  report[name].ms = Date.now() - started;
}

/** Every page of a list: the items and how many pages it took. */
async function allPages(list, key) {
  const items = [];
  let cursor;
  let pages = 0;
  do {
    const page = await list(cursor === undefined ? {} : { cursor });
    items.push(...page[key]);
    cursor = page.nextCursor;
    pages += 1;
    if (pages > 200) throw new Error(`${key}: more than 200 pages`);
  } while (cursor !== undefined);
  return { items, pages };
}
const textOf = (result) => (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
const call = (name, args, extra = {}) =>
  client.callTool({ name: tool(name), arguments: args }, undefined, { timeout: CALL_TIMEOUT_MS, ...extra });

const transport = options.url
  ? new StreamableHTTPClientTransport(new URL(options.url))
  : new StdioClientTransport({ command: options.command[0], args: options.command.slice(1), stderr: "inherit" });

const connectStarted = Date.now();
await client.connect(transport);
report.initialize = {
  ms: Date.now() - connectStarted,
  serverInfo: client.getServerVersion(),
  capabilities: client.getServerCapabilities(),
  protocolVersion: transport.protocolVersion ?? null,
};

// A daemon lists an upstream's conditional tools once the upstream re-lists; wait.
await check("listed", async () => {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const { items } = await allPages((p) => client.listTools(p), "tools");
    if (items.some((t) => t.name === tool("trigger-sampling-request"))) return { tools: items.length };
    if (Date.now() > deadline) throw new Error(`not listed: ${items.map((t) => t.name)}`);
    await sleep(300);
  }
});

await check("listTools", async () => {
  const { items, pages } = await allPages((p) => client.listTools(p), "tools");
  const schemas = {};
  for (const t of items) schemas[t.name] = { inputSchema: t.inputSchema, outputSchema: t.outputSchema ?? null };
  return { pages, names: items.map((t) => t.name), schemas };
});

await check("callTool", async () => {
  const echo = await call("echo", { message: "héllo from typescript ✓" });
  // The SDK validates structuredContent against the listed outputSchema.
  const structured = await call("get-structured-content", { location: "Chicago" });
  return { echo: textOf(echo), structuredContent: structured.structuredContent ?? null };
});

await check("progress", async () => {
  const seenProgress = [];
  const result = await call(
    "trigger-long-running-operation",
    { duration: 1, steps: 3 },
    { onprogress: (p) => seenProgress.push(p) },
  );
  return { notifications: seenProgress.length, last: seenProgress.at(-1) ?? null, text: textOf(result) };
});

await check("cancel", async () => {
  const controller = new AbortController();
  const started = Date.now();
  setTimeout(() => controller.abort("user cancelled"), 500);
  let outcome;
  try {
    await call("trigger-long-running-operation", { duration: 10, steps: 5 }, { signal: controller.signal });
    outcome = { aborted: false };
  } catch (error) {
    outcome = { aborted: controller.signal.aborted, error: `${error?.name}: ${error?.message}` };
  }
  outcome.afterMs = Date.now() - started;
  // The session goes on after the cancel.
  outcome.echoAfter = textOf(await call("echo", { message: "after cancel" }));
  // Errors are what the call rejected with, not a failure of the check.
  outcome.rejection = outcome.error;
  delete outcome.error;
  return outcome;
});

await check("resources", async () => {
  const resources = await allPages((p) => client.listResources(p), "resources");
  const templates = await allPages((p) => client.listResourceTemplates(p), "resourceTemplates");
  const mine = resources.items.filter((r) => r.uri.startsWith(options.uriPrefix + "demo://"));
  const first = mine[0];
  const read = first ? await client.readResource({ uri: first.uri }) : null;
  return {
    count: mine.length,
    pages: resources.pages,
    templates: templates.items
      .map((t) => t.uriTemplate)
      .filter((u) => u.startsWith(options.uriPrefix + "demo://"))
      .sort(),
    read: read && { uri: first.uri, contents: read.contents.map((c) => ({ uri: c.uri, mimeType: c.mimeType ?? null, size: (c.text ?? c.blob ?? "").length })) },
  };
});

await check("prompts", async () => {
  const { items, pages } = await allPages((p) => client.listPrompts(p), "prompts");
  const names = items.map((p) => p.name).filter((n) => n.startsWith(options.prefix));
  const simple = await client.getPrompt({ name: tool("simple-prompt") });
  const args = await client.getPrompt({ name: tool("args-prompt"), arguments: { city: "Paris", state: "Texas" } });
  return {
    names: names.sort(),
    pages,
    simple: simple.messages.map((m) => m.content.text ?? m.content.type),
    args: args.messages.map((m) => m.content.text ?? m.content.type),
  };
});

await check("complete", async () => {
  const result = await client.complete({
    ref: { type: "ref/prompt", name: tool("completable-prompt") },
    argument: { name: "department", value: "S" },
  });
  const narrowed = await client.complete({
    ref: { type: "ref/prompt", name: tool("completable-prompt") },
    argument: { name: "name", value: "" },
    context: { arguments: { department: "Engineering" } },
  });
  return { values: result.completion.values, narrowed: narrowed.completion.values };
});

await check("logging", async () => {
  await client.setLoggingLevel("debug");
  const before = seen.logs.length;
  // server-everything sends one message at once, then one every 5 s: stop it again.
  await call("toggle-simulated-logging", {});
  const deadline = Date.now() + 10_000;
  while (seen.logs.length === before && Date.now() < deadline) await sleep(50);
  await call("toggle-simulated-logging", {});
  const first = seen.logs[before] ?? null;
  return { received: seen.logs.length - before, first };
});

await check("sampling", async () => {
  const result = await call("trigger-sampling-request", { prompt: "hello", maxTokens: 20 });
  return { handled: seen.sampled.length, answered: textOf(result).includes(SAMPLED) };
});

await check("elicitation", async () => {
  const result = await call("trigger-elicitation-request", {});
  return {
    handled: seen.elicited.length,
    fields: Object.keys(seen.elicited.at(-1)?.requestedSchema?.properties ?? {}).length,
    accepted: textOf(result).includes("User provided the requested information"),
  };
});

if (options.drift) {
  await check("listChanged", async () => {
    const names = async () => (await allPages((p) => client.listTools(p), "tools")).items.map((t) => t.name);
    // The file starts empty (the test resets it): wait out a re-list still under way.
    const settled = Date.now() + 10_000;
    while ((await names()).includes("fx__exfiltrate") && Date.now() < settled) await sleep(100);
    const before = (await names()).includes("fx__exfiltrate");
    const since = Date.now();
    // The fixture lists one more tool and sends list_changed; plexus re-lists it
    // and tells its clients.
    writeFileSync(options.drift, "new-tool\n");
    const deadline = Date.now() + 20_000;
    while (!seen.listChanged.some((t) => t >= since) && Date.now() < deadline) await sleep(50);
    const received = seen.listChanged.some((t) => t >= since);
    return {
      received,
      afterMs: received ? seen.listChanged.find((t) => t >= since) - since : null,
      listedBefore: before,
      listedAfter: (await names()).includes("fx__exfiltrate"),
    };
  });
}

report.notifications = { listChanged: seen.listChanged.length, logs: seen.logs.length };
console.log(JSON.stringify(report));
await client.close();
process.exit(0);
