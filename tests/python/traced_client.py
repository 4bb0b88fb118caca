"""An MCP client on the official Python SDK 2.x with OpenTelemetry on: its spans go
over OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`, and the SDK writes each request's
trace context into its `_meta.traceparent` (SEP-414). Under one root span it calls
`tr__meta`, lists tools, calls `tr__fail`, then `lazy__meta` (an upstream idle long enough
to have stopped, started again by that call), and prints one JSON object: the root's trace id and what it saw.

    target/python-venv/bin/python tests/python/traced_client.py --url URL [--mode legacy]
        [--connect PLEXUS]

`--connect PLEXUS` reaches the daemon through `PLEXUS connect URL` (stdio) and calls
`tr__meta` only. `--rounds` instead calls `q__ask` (the upstream asks this client for a
sampling during the call; the client answers "sampled"), `f1__ask` (the fixture asks
the same, with no trace context of its own) and then `q__slow` twice at
once (`q` serves one call at a time: the second waits in plexus's queue).
"""

from __future__ import annotations

import argparse
import json
import warnings

import anyio
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from mcp import Client, StdioServerParameters
from mcp_types import CreateMessageResult, TextContent

warnings.simplefilter("ignore")

provider = TracerProvider(resource=Resource.create({"service.name": "traced-client"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("traced-client")


async def sample(context, params) -> CreateMessageResult:
    return CreateMessageResult(
        role="assistant", content=TextContent(type="text", text="sampled"), model="test"
    )


async def rounds(url: str, mode: str) -> dict:
    seen: dict = {}
    with anyio.fail_after(60):
        async with Client(url, mode=mode, cache=None, sampling_callback=sample) as client:
            with tracer.start_as_current_span("agent turn") as root:
                seen["trace_id"] = format(root.get_span_context().trace_id, "032x")
                asked = await client.call_tool("q__ask", {})
                seen["asked"] = asked.content[0].text
                # The fixture asks too, but writes no trace context into its request.
                asked = await client.call_tool("f1__ask", {"kind": "sampling"})
                seen["fixture_asked"] = asked.content[0].text
                answers = []

                async def slow() -> None:
                    answers.append((await client.call_tool("q__slow", {})).content[0].text)

                async with anyio.create_task_group() as group:
                    group.start_soon(slow)
                    group.start_soon(slow)
                seen["slow"] = answers
    return seen


async def run(url: str, mode: str, connect: str | None) -> dict:
    seen: dict = {}
    server = url if connect is None else StdioServerParameters(command=connect, args=["connect", url])
    with anyio.fail_after(60):
        async with Client(server, mode=mode, cache=None) as client:
            with tracer.start_as_current_span("agent turn") as root:
                seen["trace_id"] = format(root.get_span_context().trace_id, "032x")
                result = await client.call_tool("tr__meta", {})
                seen["meta"] = json.loads(result.content[0].text)
                if connect is not None:
                    return seen
                tools = await client.list_tools()
                seen["tools"] = sorted(tool.name for tool in tools.tools)
                failed = await client.call_tool("tr__fail", {})
                seen["fail_is_error"] = bool(failed.is_error)
                # `lazy` stops when idle for 1 s: this call waits for it to start again.
                await anyio.sleep(2.5)
                lazy = await client.call_tool("lazy__meta", {})
                seen["lazy_meta"] = json.loads(lazy.content[0].text)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--connect")
    parser.add_argument("--rounds", action="store_true")
    args = parser.parse_args()
    if args.rounds:
        seen = anyio.run(rounds, args.url, args.mode)
    else:
        seen = anyio.run(run, args.url, args.mode, args.connect)
    provider.shutdown()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
