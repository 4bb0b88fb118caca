"""A stateful MCP server built on the official Python SDK 2.x, which serves both protocol
eras on stdio (the first request decides): a counter that lives in the process, a tool
that adds a tool, a tool that changes `count`'s schema in a breaking way, and one that
asks the client with a request of its own (`ctx.elicit`). Each change
to the tool list is announced in the era the server is spoken to in.

    target/python-venv/bin/python tests/python/dual_era_server.py
"""

from __future__ import annotations

import os
import warnings

from pydantic import BaseModel

from mcp.server.mcpserver import Context, MCPServer

# `send_tool_list_changed` on the session is the handshake era's way, marked deprecated.
warnings.simplefilter("ignore")

server = MCPServer("dual-era-counter")
state = {"count": 0, "schema": 0}


async def announce(ctx: Context) -> None:
    """Tells the client the tool list changed, in the era it speaks."""
    if ctx.protocol_version == "2026-07-28":
        await ctx.notify_tools_changed()
    else:
        await ctx.session.send_tool_list_changed()


def count() -> str:
    """Adds one to the counter this process keeps and returns `value pid`."""
    state["count"] += 1
    return f"{state['count']} {os.getpid()}"


def count_by(step: int) -> str:
    """Adds `step` to the counter this process keeps and returns `value pid`."""
    state["count"] += step
    return f"{state['count']} {os.getpid()}"


def count_by_twice(step: int, times: int) -> str:
    """Adds `step` `times` times to the counter and returns `value pid`."""
    state["count"] += step * times
    return f"{state['count']} {os.getpid()}"


server.add_tool(count, name="count")


class Signature(BaseModel):
    name: str


@server.tool()
async def sign(ctx: Context) -> str:
    """Asks the client who signs, with a request of its own (the handshake era's way)."""
    answer = await ctx.elicit("Who signs?", Signature)
    return f"signed by {answer.data.name}" if answer.action == "accept" else answer.action


@server.tool()
async def add_tool(name: str, ctx: Context) -> str:
    """Adds a tool called `name` that answers with its own name."""

    def added() -> str:
        return name

    server.add_tool(added, name=name, description=f"Added at run time: {name}.")
    await announce(ctx)
    return f"added {name}"


@server.tool()
async def break_count(ctx: Context) -> str:
    """Gives `count` a new required parameter (each call another one): a breaking change."""
    state["schema"] += 1
    server.remove_tool("count")
    server.add_tool(count_by if state["schema"] == 1 else count_by_twice, name="count")
    await announce(ctx)
    return f"count changed ({state['schema']})"


if __name__ == "__main__":
    server.run("stdio")
