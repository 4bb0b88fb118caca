"""Drives a plexus search view (`expose = "search"`) with the official MCP Python SDK:
lists the two meta-tools, searches, then runs tools through `call_tool` with progress
and an elicitation relayed to this client.

    target/python-venv/bin/python tests/python/search_client.py --url http://127.0.0.1:PORT/mcp [--mode legacy]

The daemon must run `everything` (@modelcontextprotocol/server-everything), `time`
(mcp-server-time) and `fx` (the fixture). Prints `ok <name> <detail>` per check and
exits 1 with `FAIL <name>: <why>` at the first failure.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client import ClientRequestContext
from mcp.shared.exceptions import MCPError

warnings.simplefilter("ignore")

CALL_TIMEOUT_S = 60.0


class CheckFailed(Exception):
    pass


def ok(name: str, detail: str) -> None:
    print(f"ok {name} {detail}", flush=True)


def ensure(condition: bool, name: str, why: str) -> None:
    if not condition:
        raise CheckFailed(f"{name}: {why}")


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


async def search(client: Client, query: str, **more: Any) -> list[dict[str, Any]]:
    with anyio.fail_after(CALL_TIMEOUT_S):
        result = await client.call_tool("search_tools", {"query": query, **more})
    ensure(not result.is_error, "search", text_of(result))
    structured = result.structured_content
    ensure(isinstance(structured, dict), "search", f"no structured content: {result}")
    ensure(json.loads(text_of(result)) == structured, "search", "text block differs from structuredContent")
    return structured["tools"]


async def call_tool(client: Client, name: str, arguments: dict[str, Any], **kw: Any) -> str:
    with anyio.fail_after(CALL_TIMEOUT_S):
        result = await client.call_tool("call_tool", {"name": name, "arguments": arguments}, **kw)
    ensure(not result.is_error, f"call {name}", text_of(result))
    return text_of(result)


async def run(url: str, mode: str) -> None:
    elicited: list[Any] = []

    async def elicitation(_context: ClientRequestContext, params: Any) -> types.ElicitResult:
        elicited.append(params)
        schema = params.requested_schema or {}
        content: dict[str, Any] = {}
        for key, prop in (schema.get("properties") or {}).items():
            if "default" in prop:
                content[key] = prop["default"]
            elif prop.get("enum"):
                content[key] = prop["enum"][0]
            elif prop.get("oneOf"):
                content[key] = prop["oneOf"][0].get("const")
            elif prop.get("type") == "boolean":
                content[key] = True
            elif prop.get("type") in ("integer", "number"):
                content[key] = prop.get("minimum", 1)
            elif prop.get("type") == "array":
                items = prop.get("items") or {}
                content[key] = (items.get("enum") or [c.get("const") for c in items.get("anyOf") or []])[:1]
            else:
                content[key] = "python@example.com" if prop.get("format") == "email" else "python"
        return types.ElicitResult(action="accept", content=content)

    client = Client(url, mode=mode, elicitation_callback=elicitation, cache=None)
    async with client:
        listed = await client.list_tools()
        names = [tool.name for tool in listed.tools]
        ensure(names == ["search_tools", "call_tool"], "list", f"listed {names}")
        ensure(listed.tools[0].output_schema is not None, "list", "search_tools declares no outputSchema")
        ok("list", "two meta-tools")

        deadline = time.monotonic() + 240
        while True:
            found = await search(client, "current time in a time zone", limit=5)
            if found and found[0]["upstream"] == "time":
                break
            ensure(time.monotonic() < deadline, "search-time", f"found {[t['name'] for t in found]}")
            await anyio.sleep(0.5)
        ensure(found[0]["tool"] == "get_current_time", "search-time", f"found {found[0]}")
        ok("search-time", f"{found[0]['name']} first, score {found[0]['score']}")
        text = await call_tool(client, found[0]["name"], {"timezone": "UTC"})
        ensure("UTC" in text, "call-time", text)
        ok("call-time", "answered through call_tool")

        found = await search(client, "long running operation with progress", upstream="everything")
        names = [tool["name"] for tool in found]
        ensure(all(tool["upstream"] == "everything" for tool in found), "search-upstream", f"{names}")
        long_running = next((n for n in names if "long-running" in n), None)
        ensure(long_running is not None, "search-progress", f"found {names}")
        ok("search-progress", f"{long_running} among {len(names)}")
        progress: list[float] = []

        async def on_progress(value: float, _total: float | None, _message: str | None) -> None:
            progress.append(value)

        await call_tool(client, long_running, {"duration": 1, "steps": 3}, progress_callback=on_progress)
        with anyio.move_on_after(2.0):
            while len(progress) < 1:
                await anyio.sleep(0.05)
        ensure(len(progress) >= 1, "progress", "no progress through call_tool")
        ok("progress", f"{len(progress)} notifications through call_tool")

        found = await search(client, "ask the user for information elicitation", upstream="everything")
        names = [tool["name"] for tool in found]
        elicit = next((n for n in names if "elicitation-request" in n), None)
        ensure(elicit is not None, "search-elicitation", f"found {names}")
        text = await call_tool(client, elicit, {})
        ensure(len(elicited) >= 1, "elicitation", f"the callback never ran: {text}")
        ok("elicitation", "relayed through call_tool")

        try:
            with anyio.fail_after(CALL_TIMEOUT_S):
                await client.call_tool("search_tools", {"query": ""})
            raise CheckFailed("bad-input: an empty query was accepted")
        except MCPError as error:
            ensure(error.code == -32602, "bad-input", f"code {error.code}: {error}")
        ok("bad-input", "empty query refused with -32602")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", choices=["auto", "legacy"], default="legacy")
    args = parser.parse_args()
    try:
        anyio.run(run, args.url, args.mode)
    except BaseException as error:  # noqa: BLE001 - every failure is reported
        print(f"FAIL {error!r}", flush=True)
        return 1
    print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
