"""An MCP upstream on stdio (or streamable HTTP with `--http PORT`), built on the official Python SDK 2.x, that exports its
own OpenTelemetry spans (the SDK's server middleware makes one per request, parented
by the request's `_meta.traceparent`) over OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`,
and answers with the `_meta` it received.

    target/python-venv/bin/python tests/python/traced_server.py [--http PORT]

Tools: `meta` (the request's `_meta` as JSON text), `header` (the request's HTTP
`traceparent` header; empty on stdio), `fail` (an `isError` result),
`ask` (asks the client for a sampling while it runs; answers with the sampled text),
`slow` (answers after 1 s).
"""

from __future__ import annotations

import json
import sys
import warnings

import anyio

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, SamplingMessage, TextContent

warnings.simplefilter("ignore")

# Each span is posted as it ends: the test reads them while this process still runs.
provider = TracerProvider(resource=Resource.create({"service.name": "traced-upstream"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)

server = MCPServer("traced-upstream")


@server.tool()
def meta(ctx: Context) -> str:
    """Returns the `_meta` of this request as JSON."""
    received = ctx.request_context.meta
    if hasattr(received, "model_dump"):
        received = received.model_dump(by_alias=True, exclude_none=True)
    return json.dumps(dict(received or {}), sort_keys=True)


@server.tool()
def header(ctx: Context) -> str:
    """Returns the `traceparent` header of the HTTP request that carried this call."""
    return (ctx.headers or {}).get("traceparent", "")


@server.tool()
def fail() -> CallToolResult:
    """Fails as a tool does: an `isError` result."""
    return CallToolResult(content=[TextContent(type="text", text="it failed")], is_error=True)


@server.tool()
async def ask(ctx: Context) -> str:
    """Asks the client for a sampling during the call; returns what it sampled."""
    sampled = await ctx.session.create_message(
        [SamplingMessage(role="user", content=TextContent(type="text", text="say something"))],
        max_tokens=16,
        related_request_id=ctx.request_id,
    )
    return sampled.content.text


@server.tool()
async def slow() -> str:
    """Answers after 1 s (two at once, under `max_in_flight = 1`, queue in plexus)."""
    await anyio.sleep(1.0)
    return "slow"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run("stdio")
