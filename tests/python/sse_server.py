"""An MCP server on the 2024-11-05 HTTP+SSE transport (GET /sse, POST /messages/),
written with the official Python SDK, for plexus's remote-upstream tests
(tests/tests/remote.rs): rmcp has no server for this transport.

Usage: sse_server.py --port PORT
"""

import argparse

from mcp.server.mcpserver import Context, MCPServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()

    server = MCPServer("sse-fixture")

    @server.tool()
    def echo(text: str) -> str:
        """Returns `text` unchanged."""
        return text

    @server.tool()
    def header(name: str, ctx: Context) -> str:
        """Returns the value of one header of the HTTP request that carried the call."""
        headers = ctx.headers or {}
        return headers.get(name.lower(), "(absent)")

    server.run("sse", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
