"""The client of the MCP conformance suite's client scenarios, written with the official
Python SDK. The suite runs it with the scenario server's URL as its last argument and the
scenario's name in MCP_CONFORMANCE_SCENARIO. It talks to that server either directly, or
through plexus (`--through PLEXUS`): a daemon whose one upstream is the scenario server
(remote, prefix ""), so what the suite sees is plexus acting as the client, and plexus
is held to what this client does alone.

    conformance_client.py [--through PLEXUS --scratch DIR] URL

The scenarios that need OAuth of the client (`auth/*`) are not for plexus, whose remote
upstreams take their credentials from the config, and are not run with this client.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.client import ClientRequestContext

warnings.simplefilter("ignore")

# What each scenario asks of its client, after connecting: a tool to call with
# its arguments, or None for listing the tools alone.
SCENARIOS: dict[str, tuple[str, dict[str, Any]] | None] = {
    "initialize": None,
    "tools_call": ("add_numbers", {"a": 2, "b": 3}),
    "sse-retry": ("test_reconnection", {}),
    "elicitation-sep1034-client-defaults": ("test_client_elicitation_defaults", {}),
    "request-metadata": None,
}
READY_WITHIN_S = 60.0
CALL_TIMEOUT_S = 30.0


async def elicitation(_context: ClientRequestContext, params: Any) -> types.ElicitResult:
    """Accepts a form with every field the schema gives a default left at it, as a
    user who only presses OK would (SEP-1034)."""
    schema = getattr(params, "requested_schema", None) or {}
    content = {
        key: prop["default"]
        for key, prop in (schema.get("properties") or {}).items()
        if isinstance(prop, dict) and "default" in prop
    }
    return types.ElicitResult(action="accept", content=content)


async def drive(url: str, scenario: str) -> None:
    step = SCENARIOS[scenario]
    async with Client(url, elicitation_callback=elicitation, read_timeout_seconds=CALL_TIMEOUT_S) as client:
        with anyio.fail_after(CALL_TIMEOUT_S):
            listed = await client.list_tools()
        if step is None:
            return
        name, arguments = step
        names = [tool.name for tool in listed.tools]
        if name not in names:
            raise SystemExit(f"the server lists no tool {name!r}: {names}")
        with anyio.fail_after(CALL_TIMEOUT_S):
            result = await client.call_tool(name, arguments)
        print(f"{name}: {result}", file=sys.stderr)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def wait_ready(admin: str, daemon: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"plexus exited with {daemon.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{admin}/readyz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"plexus was not ready within {READY_WITHIN_S:.0f} s")


def through_plexus(plexus: str, scratch: str, url: str, scenario: str) -> None:
    os.makedirs(scratch, exist_ok=True)
    port, admin_port = free_ports(2)
    config = os.path.join(scratch, f"{scenario.replace('/', '-')}.toml")
    with open(config, "w") as out:
        out.write(
            f'[daemon]\nlisten = "127.0.0.1:{port}"\nadmin_listen = "127.0.0.1:{admin_port}"\n'
            f'state_dir = "{config}.state"\n\n'
            f'[upstreams.scenario]\nurl = "{url}"\nprefix = ""\non_schema_change = "warn"\n'
        )
    log = open(f"{config}.log", "wb")
    daemon = subprocess.Popen(
        [plexus, "serve", "--config", config],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "PLEXUS_LOG": os.environ.get("PLEXUS_LOG", "info")},
    )
    try:
        wait_ready(f"http://127.0.0.1:{admin_port}", daemon)
        anyio.run(drive, f"http://127.0.0.1:{port}/mcp", scenario)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--through", metavar="PLEXUS", help="the plexus binary to put between")
    parser.add_argument("--scratch", metavar="DIR", help="where plexus's config, state and log go")
    parser.add_argument("url")
    options = parser.parse_args()
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    if scenario not in SCENARIOS:
        raise SystemExit(f"no client steps for scenario {scenario!r}")
    if options.through:
        if not options.scratch:
            raise SystemExit("--through needs --scratch")
        through_plexus(options.through, options.scratch, options.url, scenario)
    else:
        anyio.run(drive, options.url, scenario)


if __name__ == "__main__":
    main()
