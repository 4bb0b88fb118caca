"""Starts real MCP servers over stdio (pinned npm and PyPI packages, and the
fixture), lists their tools and writes them as one catalog for the MCP tool-search
benchmark: `{"servers": [{"upstream", "package", "instructions", "tools": [...]}]}`.
A server that fails to start is reported and left out; the queries that need it
then count as misses, never silently dropped (plexus-search-bench warns).

    python tests/python/list_server_tools.py OUT.json FIXTURE_BINARY
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile


# upstream name, package (pinned), command, arguments, extra environment. The
# tokens are placeholders: these servers list their tools without calling out.
SCRATCH = tempfile.mkdtemp(prefix="plexus-search-bench-")
SERVERS = [
    ("everything", "@modelcontextprotocol/server-everything@2026.8.31", "npx", [], {}),
    ("time", "mcp-server-time==2026.10.19", "uvx", [], {}),
    ("filesystem", "@modelcontextprotocol/server-filesystem@2026.8.31", "npx", [SCRATCH], {}),
    ("memory", "@modelcontextprotocol/server-memory@2026.8.31", "npx", [], {"MEMORY_FILE_PATH": os.path.join(SCRATCH, "memory.json")}),
    ("thinking", "@modelcontextprotocol/server-sequential-thinking@2026.8.31", "npx", [], {}),
    ("github", "@modelcontextprotocol/server-github@2025.4.8", "npx", [], {"GITHUB_PERSONAL_ACCESS_TOKEN": "placeholder"}),
    ("gitlab", "@modelcontextprotocol/server-gitlab@2025.4.25", "npx", [], {"GITLAB_PERSONAL_ACCESS_TOKEN": "placeholder"}),
    ("slack", "@modelcontextprotocol/server-slack@2025.4.25", "npx", [], {"SLACK_BOT_TOKEN": "placeholder", "SLACK_TEAM_ID": "T0"}),
    ("maps", "@modelcontextprotocol/server-google-maps@0.6.2", "npx", [], {"GOOGLE_MAPS_API_KEY": "placeholder"}),
    ("puppeteer", "@modelcontextprotocol/server-puppeteer@2025.5.12", "npx", [], {"PUPPETEER_SKIP_DOWNLOAD": "1"}),
    ("playwright", "@playwright/mcp@0.0.83", "npx", [], {}),
    ("notion", "@notionhq/notion-mcp-server@2.5.2", "npx", [], {}),
    ("fetch", "mcp-server-fetch==2026.10.24", "uvx", [], {}),
    ("git", "mcp-server-git==2026.10.19", "uvx", [], {}),
    ("sqlite", "mcp-server-sqlite==2025.4.25", "uvx", ["--db-path", os.path.join(SCRATCH, "bench.db")], {}),
]


def command_of(runner: str, package: str, args: list[str]) -> tuple[str, list[str]]:
    if runner == "npx":
        return "npx", ["-y", package, *args]
    if runner == "uvx":
        name = package.split("==")[0]
        # mcp-server-sqlite's last release predates the SDK's 2.0 API.
        pinned = ["--with", "mcp==1.9.4", "--with", "pydantic==2.11.7"] if name == "mcp-server-sqlite" else []
        return "uvx", [*pinned, "--from", package, name, *args]
    return runner, args


async def list_one(upstream: str, command: str, args: list[str], env: dict) -> dict:
    """A bare JSON-RPC client over the server's stdio: the tools as the server sent
    them, with no SDK model in between to reject a schema it finds odd."""
    child = await asyncio.create_subprocess_exec(
        command, *args, env={**os.environ, **env}, limit=1 << 24,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    ids = iter(range(1, 1 << 30))

    async def request(method: str, params: dict) -> dict:
        number = next(ids)
        child.stdin.write((json.dumps({"jsonrpc": "2.0", "id": number, "method": method, "params": params}) + "\n").encode())
        await child.stdin.drain()
        while True:
            line = await child.stdout.readline()
            if not line:
                raise RuntimeError(f"{upstream} closed its output")
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if message.get("id") == number and "method" not in message:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    try:
        init = await request("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "plexus-search-bench", "version": "0"},
        })
        child.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        tools, cursor = [], None
        while True:
            page = await request("tools/list", {"cursor": cursor} if cursor else {})
            tools += page.get("tools", [])
            cursor = page.get("nextCursor")
            if not cursor:
                break
        return {"upstream": upstream, "instructions": init.get("instructions"), "tools": tools}
    finally:
        # npx and uvx start the server as their child, which holds the pipes: the
        # whole group goes.
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await child.wait()


async def main() -> int:
    out, fixture = sys.argv[1], sys.argv[2]
    servers = [(u, p, *command_of(r, p, a), e) for (u, p, r, a, e) in SERVERS]
    servers.append(("fx", "plexus-fixture", fixture, [], {}))
    limit = asyncio.Semaphore(2)

    async def guarded(upstream, package, command, args, env):
        async with limit:
            try:
                found = await asyncio.wait_for(list_one(upstream, command, args, env), 300)
                found["package"] = package
                print(f"{upstream}: {len(found['tools'])} tools", file=sys.stderr)
                return found
            except BaseException as error:  # noqa: BLE001 - reported, left out
                print(f"{upstream}: not listed: {error!r}", file=sys.stderr)
                return None

    listed = await asyncio.gather(*(guarded(*server) for server in servers))
    listed = [server for server in listed if server]
    with open(out, "w") as file:
        json.dump({"servers": listed}, file, indent=1, sort_keys=True)
    print(f"wrote {out}: {sum(len(s['tools']) for s in listed)} tools of {len(listed)} servers", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
