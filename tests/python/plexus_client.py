"""Drives plexus with the official MCP Python SDK, a client written independently of plexus
and of the rmcp clients in the Rust tests, over streamable HTTP or stdio.

    target/python-venv/bin/python tests/python/plexus_client.py --url http://127.0.0.1:PORT/mcp [--mode legacy]
    target/python-venv/bin/python tests/python/plexus_client.py --stdio -- plexus serve --stdio --config X

`--mode auto` (the SDK's default) probes `server/discover` and so speaks 2026-07-28 to plexus:
sampling, elicitation and roots then arrive as input-required rounds, log messages ride on
requests that opt in through `_meta`, and resource updates on a `subscriptions/listen` stream.
`--mode legacy` speaks the handshake era (2025-11-25) with its server-to-client requests.

The daemon must run the upstreams `everything` (@modelcontextprotocol/server-everything,
prefix `everything__`) and `fx` (the workspace's plexus-fixture). Prints one line per
check (`ok <name> <detail>`) and exits 1 with `FAIL <name>: <why>` at the first failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, TypeVar

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client import ClientRequestContext
from mcp.client.subscriptions import ResourceUpdated
from mcp.shared.exceptions import MCPError

# The handshake-era calls this script exercises on purpose (logging/setLevel,
# resources/subscribe, roots) are marked deprecated in favour of the 2026-07-28 forms.
warnings.simplefilter("ignore")

SAMPLED_TEXT = "sampled by python"
ROOT_URI = "file:///roots/python"
# A connect that waits out a probe or a retry takes seconds more than one that does
# not; the budget catches that, with room for a loaded 2-core machine running the
# other end-to-end tests (1.2 s was seen there). The time itself is printed.
CONNECT_BUDGET_S = 3.0
# How long the everything upstream may take to appear in a fresh daemon's catalog
# (a cold `npx` start; the stdio daemon has no listing on disk yet).
LISTED_WITHIN_S = 240.0
# Upper bound for any one request, so a lost answer fails the check instead of hanging.
CALL_TIMEOUT_S = 60.0
NOTIFIED_WITHIN_S = 15.0
# The whole run, a last bound should every finer one miss a hang.
TOTAL_S = 540.0

T = TypeVar("T")


class CheckFailed(Exception):
    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name}: {why}")
        self.name = name
        self.why = why


def ok(name: str, detail: str) -> None:
    print(f"ok {name} {detail}", flush=True)


def ensure(condition: bool, name: str, why: str) -> None:
    if not condition:
        raise CheckFailed(name, why)


@dataclass
class Recorder:
    """What the server sent this client, as its callbacks saw it."""

    sampled: list[types.CreateMessageRequestParams] = field(default_factory=list)
    elicited: list[Any] = field(default_factory=list)
    roots_asked: int = 0
    logs: list[types.LoggingMessageNotificationParams] = field(default_factory=list)
    progress: list[types.ProgressNotificationParams] = field(default_factory=list)
    updates: list[str] = field(default_factory=list)
    transport_errors: list[Exception] = field(default_factory=list)

    async def sampling(
        self, _context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult:
        self.sampled.append(params)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=SAMPLED_TEXT),
            model="python-sdk-test",
        )

    async def elicitation(self, _context: ClientRequestContext, params: Any) -> types.ElicitResult:
        self.elicited.append(params)
        if isinstance(params, types.ElicitRequestURLParams):
            # URL mode: the user "opened the link"; accepting carries no content.
            return types.ElicitResult(action="accept")
        schema = params.requested_schema or {}
        content = {key: answer_for(prop) for key, prop in (schema.get("properties") or {}).items()}
        return types.ElicitResult(action="accept", content=content)

    async def list_roots(self, _context: ClientRequestContext) -> types.ListRootsResult:
        self.roots_asked += 1
        return types.ListRootsResult(roots=[types.Root(uri=ROOT_URI, name="python")])

    async def logging(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(params)

    async def message(self, message: Any) -> None:
        if isinstance(message, types.ProgressNotification):
            self.progress.append(message.params)
        elif isinstance(message, types.ResourceUpdatedNotification):
            self.updates.append(str(message.params.uri))
        elif isinstance(message, Exception):
            self.transport_errors.append(message)


def answer_for(prop: dict[str, Any]) -> Any:
    """A value valid for one property of a form elicitation's (flat) schema."""
    if "default" in prop:
        return prop["default"]
    if prop.get("enum"):
        return prop["enum"][0]
    if prop.get("oneOf"):
        return prop["oneOf"][0].get("const")
    kind = prop.get("type")
    if kind == "array":
        items = prop.get("items") or {}
        choices = items.get("enum") or [c.get("const") for c in items.get("anyOf") or []]
        return choices[:1]
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        return prop.get("minimum", 1)
    return {
        "email": "python@example.com",
        "uri": "https://example.com/python",
        "date": "2000-01-01",
        "date-time": "2000-01-01T00:00:00Z",
    }.get(prop.get("format", ""), "answered by python")


# Checks named by --skip: a deployment that cannot meet one (nodes behind a
# balancer each run their own upstream process, whose toggles differ) runs the rest.
SKIPPED: set[str] = set()


async def bounded(name: str, awaitable: Awaitable[T], within: float = CALL_TIMEOUT_S) -> T:
    """Awaits one request; a timeout or an error answer fails the check `name`."""
    try:
        with anyio.fail_after(within):
            return await awaitable
    except TimeoutError:
        raise CheckFailed(name, f"no answer within {within:.0f} s") from None
    except MCPError as error:
        raise CheckFailed(name, f"error {error.code}: {error.error.message} {error.error.data!r}") from None


async def eventually(condition: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        await anyio.sleep(0.05)
    return True


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


async def call(client: Client, name: str, check: str, arguments: dict[str, Any] | None = None, **kw: Any) -> str:
    result = await bounded(check, client.call_tool(name, arguments or {}, **kw))
    text = text_of(result)
    ensure(not result.is_error, check, f"{name} answered isError: {text}")
    return text


async def all_pages(list_page: Callable[[str | None], Awaitable[Any]], key: str) -> list[Any]:
    """Every entry of a paginated list, following plexus's cursors."""
    entries: list[Any] = []
    cursor: str | None = None
    for _ in range(1000):
        page = await list_page(cursor)
        entries.extend(getattr(page, key))
        cursor = page.next_cursor
        if cursor is None:
            return entries
    raise CheckFailed(f"list-{key}", "more than 1000 pages: the cursor never ends")


async def tool_names(client: Client) -> set[str]:
    tools = await bounded("list-tools", all_pages(lambda c: client.list_tools(cursor=c), "tools"))
    return {tool.name for tool in tools}


async def exercise_everything(client: Client, seen: Recorder, modern: bool) -> None:
    # A fresh daemon lists an upstream's tools once it is ready; wait for them.
    deadline = time.monotonic() + LISTED_WITHIN_S
    while "everything__trigger-sampling-request" not in (names := await tool_names(client)):
        ensure(
            time.monotonic() < deadline,
            "everything-listed",
            f"not listed within {LISTED_WITHIN_S:.0f} s: {sorted(names)}",
        )
        await anyio.sleep(0.5)
    ok("everything-listed", f"{sum(n.startswith('everything__') for n in names)} tools")

    # A daemon that kept the last-known catalog lists the tools while the upstream still
    # starts; calls meanwhile get -33001 with a retry hint, which a client honours.
    while True:
        try:
            with anyio.fail_after(CALL_TIMEOUT_S):
                await client.call_tool("everything__echo", {"message": "ready?"})
            break
        except MCPError as error:
            data = error.error.data if isinstance(error.error.data, dict) else {}
            ensure(
                error.code == -33001 and time.monotonic() < deadline,
                "everything-ready",
                f"error {error.code}: {error.error.message}",
            )
            await anyio.sleep(max(data.get("retry_after_ms") or 200, 50) / 1000)

    text = await call(client, "everything__trigger-sampling-request", "sampling", {"prompt": "hello", "maxTokens": 20})
    ensure(SAMPLED_TEXT in text, "sampling", f"result lacks {SAMPLED_TEXT!r}: {text}")
    ensure(len(seen.sampled) == 1, "sampling", f"callback ran {len(seen.sampled)} times")
    ok("sampling", "upstream got the callback's answer")

    text = await call(client, "everything__trigger-elicitation-request", "elicitation")
    ensure("User provided the requested information" in text, "elicitation", f"not accepted: {text}")
    ok("elicitation", f"form with {len(seen.elicited[-1].requested_schema.get('properties', {}))} fields accepted")

    if "everything__trigger-url-elicitation" in names:
        before = len(seen.elicited)
        text = await call(
            client, "everything__trigger-url-elicitation", "url-elicitation", {"url": "https://example.com/consent"}
        )
        ensure("User completed the URL elicitation flow" in text, "url-elicitation", f"not accepted: {text}")
        ensure(
            isinstance(seen.elicited[before], types.ElicitRequestURLParams),
            "url-elicitation",
            f"callback got {seen.elicited[before]!r}",
        )
        ok("url-elicitation", "accepted")
    else:
        ok("url-elicitation", "skipped: not listed")

    # Roots reach the client that made the call that asks for them: the fixture's `ask`
    # asks during its call. (server-everything asks when no call is in flight; plexus
    # answers that itself rather than guess whose roots a shared upstream may see.)
    text = await call(client, "fx__ask", "roots", {"kind": "roots"})
    ensure(text == ROOT_URI, "roots", f"fx__ask answered {text!r}, not {ROOT_URI}")
    ok("roots", ROOT_URI)

    completion = await bounded(
        "completion",
        client.complete(
            types.PromptReference(type="ref/prompt", name="everything__completable-prompt"),
            {"name": "department", "value": "Eng"},
        ),
    )
    values = completion.completion.values
    ensure("Engineering" in values, "completion", f"values {values}")
    ok("completion", f"{values}")

    # Progress: the SDK puts a progress token on the call; plexus swaps it for its own
    # upstream and must restore it on the way back, or the callback never runs.
    via_callback: list[float] = []

    async def on_progress(progress: float, _total: float | None, _message: str | None) -> None:
        via_callback.append(progress)

    text = await call(
        client,
        "everything__trigger-long-running-operation",
        "progress",
        {"duration": 1, "steps": 3},
        progress_callback=on_progress,
    )
    # Callbacks run in their own tasks and may trail the result slightly.
    await eventually(lambda: len(via_callback) >= 3, 2.0)
    ensure(len(via_callback) >= 1, "progress", f"no progress notification reached the callback ({text})")
    ok("progress", f"{len(via_callback)} notifications to the callback, {len(seen.progress)} to the handler")

    # Cancellation: abandoning the call makes the SDK send notifications/cancelled;
    # control must come back at once and the session must go on working.
    cancel_after = 0.5
    started = time.monotonic()
    try:
        with anyio.move_on_after(cancel_after) as scope:
            await client.call_tool(
                "everything__trigger-long-running-operation",
                {"duration": 10, "steps": 10},
                progress_callback=on_progress,
            )
    except MCPError as error:
        raise CheckFailed("cancellation", f"the call failed before the cancel: {error.code} {error}") from None
    latency = time.monotonic() - started - cancel_after
    ensure(scope.cancelled_caught, "cancellation", "the 10 s operation finished within 0.5 s")
    ensure(latency < 1.0, "cancellation", f"control came back only {latency:.2f} s after the cancel")
    echoed = await call(client, "everything__echo", "cancellation", {"message": "after cancel"})
    ensure("after cancel" in echoed, "cancellation", f"echo after the cancel answered {echoed}")
    ok("cancellation", f"control back {latency * 1000:.0f} ms after the cancel; echo afterwards works")

    if "logging" in SKIPPED:
        print("skipped logging (--skip)", flush=True)
    else:
        def from_upstream() -> list[types.LoggingMessageNotificationParams]:
            return [m for m in seen.logs if (m.logger or "").startswith("everything")]

        if modern:
            # Log messages belong to requests that opted in (the client stamps `logLevel`
            # on every request): they arrive while a call is in flight.
            await call(client, "everything__toggle-simulated-logging", "logging")
            await call(client, "everything__trigger-long-running-operation", "logging", {"duration": 6, "steps": 3})
            arrived = await eventually(lambda: bool(from_upstream()), 2.0)
        else:
            await bounded("logging", client.set_logging_level("debug"))
            await call(client, "everything__toggle-simulated-logging", "logging")
            arrived = await eventually(lambda: bool(from_upstream()), NOTIFIED_WITHIN_S)
        await call(client, "everything__toggle-simulated-logging", "logging")
        ensure(
            arrived,
            "logging",
            f"no log message with logger everything* within {NOTIFIED_WITHIN_S:.0f} s; "
            f"got {[(m.logger, m.level) for m in seen.logs]}",
        )
        first = from_upstream()[0]
        ok("logging", f"{len(from_upstream())} messages, first logger={first.logger} level={first.level}")

    if "subscription" in SKIPPED:
        print("skipped subscription (--skip)", flush=True)
        return
    resources = await bounded("subscription", all_pages(lambda c: client.list_resources(cursor=c), "resources"))
    uri = next((str(r.uri) for r in resources if str(r.uri).startswith("everything+")), None)
    ensure(uri is not None, "subscription", f"no everything+ resource among {len(resources)}")
    assert uri is not None
    if modern:
        # subscriptions/listen replaces resources/subscribe: updates arrive on its stream.
        async with client.listen(resource_subscriptions=[uri]) as subscription:
            honored = list(subscription.honored.resource_subscriptions or [])
            ensure(honored == [uri], "subscription", f"plexus honoured {honored} of [{uri}]")
            await call(client, "everything__toggle-subscriber-updates", "subscription")
            with anyio.move_on_after(NOTIFIED_WITHIN_S):
                async for event in subscription:
                    if isinstance(event, ResourceUpdated):
                        seen.updates.append(str(event.uri))
                        break
        arrived = bool(seen.updates)
        await call(client, "everything__toggle-subscriber-updates", "subscription")
    else:
        await bounded("subscription", client.subscribe_resource(uri))
        await call(client, "everything__toggle-subscriber-updates", "subscription")
        arrived = await eventually(lambda: bool(seen.updates), NOTIFIED_WITHIN_S)
        await call(client, "everything__toggle-subscriber-updates", "subscription")
        await bounded("subscription", client.unsubscribe_resource(uri))
    ensure(arrived, "subscription", f"no notifications/resources/updated within {NOTIFIED_WITHIN_S:.0f} s")
    ensure(all(u == uri for u in seen.updates), "subscription", f"updates {seen.updates} for {uri}")
    ok("subscription", f"{len(seen.updates)} updates for {uri}")


async def exercise_fixture(client: Client) -> None:
    tools = await bounded("fx-lists", all_pages(lambda c: client.list_tools(cursor=c), "tools"))
    prompts = await bounded("fx-lists", all_pages(lambda c: client.list_prompts(cursor=c), "prompts"))
    resources = await bounded("fx-lists", all_pages(lambda c: client.list_resources(cursor=c), "resources"))
    templates = await bounded(
        "fx-lists", all_pages(lambda c: client.list_resource_templates(cursor=c), "resource_templates")
    )
    fx_tools = sorted(t.name for t in tools if t.name.startswith("fx__"))
    fx_prompts = sorted(p.name for p in prompts if p.name.startswith("fx__"))
    fx_resources = sorted(str(r.uri) for r in resources if str(r.uri).startswith("fx+"))
    fx_templates = sorted(t.uri_template for t in templates if t.uri_template.startswith("fx+"))
    ensure("fx__echo" in fx_tools, "fx-lists", f"fx__echo not among {fx_tools}")
    ensure(bool(fx_prompts), "fx-lists", f"no fx__ prompt among {[p.name for p in prompts]}")
    ensure(bool(fx_resources), "fx-lists", f"no fx+ resource among {[str(r.uri) for r in resources]}")
    ensure("fx+fixture://items/{id}" in fx_templates, "fx-lists", f"templates {fx_templates}")
    ok(
        "fx-lists",
        f"{len(fx_tools)} tools, {len(fx_prompts)} prompts, "
        f"{len(fx_resources)} resources, {len(fx_templates)} templates",
    )

    sent = "héllo from python ✓"
    text = await call(client, "fx__echo", "fx-echo", {"text": sent})
    ensure(text == sent, "fx-echo", f"sent {sent!r}, got {text!r}")
    ok("fx-echo", repr(text))

    read = await bounded("fx-read", client.read_resource("fx+fixture://items/7"))
    contents = [(str(c.uri), getattr(c, "text", None)) for c in read.contents]
    ensure(
        contents == [("fx+fixture://items/7", "item 7 from fixture")],
        "fx-read",
        f"expected [('fx+fixture://items/7', 'item 7 from fixture')], got {contents}",
    )
    ok("fx-read", contents[0][1] or "")


async def run(server: str | StdioServerParameters, mode: str) -> None:
    seen = Recorder()
    modern = mode == "auto"
    client = Client(
        server,
        mode=mode,
        log_level="debug",
        sampling_callback=seen.sampling,
        elicitation_callback=seen.elicitation,
        list_roots_callback=seen.list_roots,
        logging_callback=seen.logging,
        message_handler=seen.message,
        client_info=types.Implementation(name="plexus-python-test", version="1"),
        # Lists change while upstreams come up: always ask plexus, never a local cache.
        cache=None,
    )
    started = time.monotonic()
    try:
        with anyio.fail_after(TOTAL_S):
            async with client:
                connect_s = time.monotonic() - started
                if modern:
                    ensure(
                        client.session.discover_result is not None and client.protocol_version == "2026-07-28",
                        "connect",
                        f"auto mode did not settle on 2026-07-28 (protocol {client.protocol_version})",
                    )
                else:
                    ensure(client.session.initialize_result is not None, "connect", "no initialize result")
                ensure(
                    connect_s < CONNECT_BUDGET_S,
                    "connect",
                    f"connected after {connect_s:.3f} s (budget {CONNECT_BUDGET_S} s)",
                )
                ok("connect", f"{mode} mode connected in {connect_s * 1000:.0f} ms, protocol {client.protocol_version}")
                await exercise_everything(client, seen, modern)
                await exercise_fixture(client)
    except TimeoutError:
        raise CheckFailed("run", f"not done within {TOTAL_S:.0f} s") from None


def first_check_failure(error: BaseException) -> CheckFailed | None:
    """The CheckFailed inside `error`, which anyio's task groups may have wrapped."""
    if isinstance(error, CheckFailed):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            if (found := first_check_failure(inner)) is not None:
                return found
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="plexus's streamable HTTP endpoint")
    target.add_argument("--stdio", action="store_true", help="launch the command after `--` and talk over its stdio")
    parser.add_argument("--mode", choices=["auto", "legacy"], default="auto", help="the SDK's connect mode")
    parser.add_argument("--skip", action="append", default=[], help="a check not to run (logging, subscription)")
    parser.add_argument("--connect-budget", type=float, default=CONNECT_BUDGET_S, help="seconds the connect may take")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="with --stdio: -- PROGRAM ARGS...")
    args = parser.parse_args()
    SKIPPED.update(args.skip)
    globals()["CONNECT_BUDGET_S"] = args.connect_budget
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.stdio:
        if not command:
            parser.error("--stdio needs a command after --")
        env = dict(os.environ)
        env.setdefault("PLEXUS_LOG", "warn")
        server: str | StdioServerParameters = StdioServerParameters(command=command[0], args=command[1:], env=env)
    else:
        if command:
            parser.error("a command is only taken with --stdio")
        server = args.url
    try:
        anyio.run(run, server, args.mode)
    except BaseException as error:  # noqa: BLE001 - every error is a failure, named
        failure = first_check_failure(error)
        if failure is not None:
            print(f"FAIL {failure.name}: {failure.why}", flush=True)
        else:
            print(f"FAIL unexpected: {type(error).__name__}: {error!r}", flush=True)
            traceback.print_exc()
        return 1
    print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
