"""The console in a real browser (Debian's chromium, driven by Selenium through
chromium-driver), against real daemons started by tests/tests/e2e/console.rs.

Each check prints `ok NAME ...` or raises; figures are printed as `figure NAME VALUE`.
Screenshots of each state go to --shots. Exit 0 only when every check passed.
"""

import argparse
import http.server
import json
import os
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

parser = argparse.ArgumentParser()
parser.add_argument("--admin", required=True, help="the loopback admin listener, http://host:port")
parser.add_argument("--mcp", required=True, help="the daemon's MCP URL")
parser.add_argument("--drift-file", required=True, help="the drifting fixture's drift file")
parser.add_argument("--secure-admin", required=True, help="an admin listener bound beyond loopback")
parser.add_argument("--token", required=True, help="the admin token of --secure-admin")
parser.add_argument("--secure-pid", required=True, type=int, help="the process of --secure-admin's daemon")
parser.add_argument("--shots", required=True, help="where screenshots go")
args = parser.parse_args()
os.makedirs(args.shots, exist_ok=True)
started = time.monotonic()


def ok(name, detail=""):
    print(f"ok {name} {detail}".rstrip(), flush=True)


def figure(name, value):
    print(f"figure {name} {value}", flush=True)


def until(what, condition, within=10.0, every=0.05):
    deadline = time.monotonic() + within
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as error:  # a node replaced mid-read: look again
            last_error = error
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_error})")


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def status_of(upstream):
    status = get_json(args.admin + "/status")
    return next(u for u in status["upstreams"] if u["name"] == upstream)


class Mcp:
    """A handshake-era MCP client over plain HTTP: enough to call one tool."""

    def __init__(self, url):
        self.url = url
        self.session = None
        self.next_id = 0
        self.request("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "console-test", "version": "1"},
        })
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, message):
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if self.session:
            headers["mcp-session-id"] = self.session
            headers["mcp-protocol-version"] = "2025-06-18"
        request = urllib.request.Request(self.url, json.dumps(message).encode(), headers, method="POST")
        with urllib.request.urlopen(request, timeout=20) as response:
            self.session = response.headers.get("mcp-session-id", self.session)
            body = response.read().decode()
        if not body.strip():
            return None
        if body.lstrip().startswith("{"):
            return json.loads(body)
        data = [line[5:].strip() for line in body.splitlines() if line.startswith("data:")]
        return json.loads(data[-1])

    def request(self, method, params):
        self.next_id += 1
        return self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})

    def call(self, tool, arguments):
        return self.request("tools/call", {"name": tool, "arguments": arguments})


options = webdriver.ChromeOptions()
options.binary_location = "/usr/bin/chromium"
for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--window-size=1280,800",
             f"--user-data-dir={tempfile.mkdtemp(prefix='plexus-console-chromium-')}"]:
    options.add_argument(flag)
options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
driver = webdriver.Chrome(options=options, service=Service(executable_path="/usr/bin/chromedriver"))


def viewport(width, height):
    # The window's own frame is not the page's: size it so the page gets width × height.
    driver.set_window_size(width, height)
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    driver.set_window_size(2 * width - inner[0], 2 * height - inner[1])


viewport(1280, 800)
figure("browser_start_s", round(time.monotonic() - started, 2))


def shot(name):
    driver.save_screenshot(os.path.join(args.shots, name + ".png"))


def console_errors():
    return [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]


def requested_urls():
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def card_state(upstream):
    return driver.execute_script(
        "const card = document.querySelector(`[data-upstream='${arguments[0]}']`);"
        "return card ? card.dataset.state : null;", upstream)


def click(selector):
    # The cards are rebuilt when their data change: find the button afresh each try.
    until(selector, lambda: driver.find_element(By.CSS_SELECTOR, selector).click() or True)


def text_of(selector):
    # Read in the page in one step: a node found first and read after could have been
    # replaced in between (the cards are rebuilt when their data change).
    return driver.execute_script(
        "const node = document.querySelector(arguments[0]);"
        "return node ? node.innerText : '';", selector)


try:
    # ---- the page loads, live, with no console error and nothing fetched from elsewhere
    requested_urls()  # the new tab page's own (chrome://) requests are not the console's
    console_errors()
    driver.get(args.admin + "/")
    until("the event stream", lambda: driver.find_element(By.ID, "link").get_attribute("data-live") == "true")
    until("both upstreams ready", lambda: card_state("alpha") == "ready" and card_state("beta") == "ready", 20)
    until("the catalog", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#catalog-entries li")) > 0)
    time.sleep(1.2)  # one more state event, rendered
    errors = console_errors()
    assert not errors, f"console errors: {errors}"
    urls = requested_urls()
    network = [url for url in urls if url.split(":", 1)[0] in ("http", "https", "ws", "wss")]
    foreign = [url for url in network if not url.startswith(args.admin + "/")]
    assert network and not foreign, f"requests beyond loopback: {foreign} (all: {urls})"
    ok("page_loads_cleanly", f"{len(urls)} requests, all to loopback")
    weight = sum(len(urllib.request.urlopen(args.admin + path, timeout=10).read())
                 for path in ["/", "/console/app.js", "/console/style.css"])
    figure("page_weight_bytes", weight)
    assert weight <= 150 * 1024, weight
    with urllib.request.urlopen(args.admin + "/", timeout=10) as response:
        headers = response.headers
    assert "script-src 'self'" in headers["content-security-policy"] and "unsafe-inline" not in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY" and headers["referrer-policy"] == "no-referrer", dict(headers)
    ok("security_headers")
    shot("01-loaded")

    # ---- the search filters the catalog
    total = len(driver.find_elements(By.CSS_SELECTOR, "#catalog-entries li"))
    driver.find_element(By.ID, "catalog-search").send_keys("echo")
    until("the filtered catalog", lambda: 0 < len(driver.find_elements(By.CSS_SELECTOR, "#catalog-entries li")) < total)
    names = [li.get_attribute("data-name") for li in driver.find_elements(By.CSS_SELECTOR, "#catalog-entries li")]
    assert all("echo" in name for name in names), names
    driver.execute_script("document.getElementById('catalog').scrollIntoView()")
    shot("02-search")
    driver.find_element(By.ID, "catalog-search").clear()
    driver.execute_script("document.getElementById('catalog-search').dispatchEvent(new Event('input'))")
    until("the whole catalog again", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#catalog-entries li")) == total)
    ok("search_filters", f"{total} entries, {len(names)} match 'echo': {names}")
    driver.execute_script("window.scrollTo(0, 0)")

    # ---- a crash shows within 2 s, without a reload
    driver.execute_script("window.plexusMarker = 'same page'")
    pid = status_of("beta")["pid"]
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    until("the crash on the page", lambda: card_state("beta") not in ("ready", None), within=5, every=0.02)
    shown_after = time.monotonic() - killed
    figure("crash_shown_after_ms", round(shown_after * 1000))
    assert shown_after < 2.0, f"the crash showed after {shown_after:.2f} s"
    assert driver.execute_script("return window.plexusMarker") == "same page", "the page was reloaded"
    reason = text_of("[data-reason='beta']")
    shot("03-crash")
    ok("crash_shows", f"after {shown_after * 1000:.0f} ms, state {card_state('beta')}, reason {reason!r}")

    # ---- the restart button restarts
    until("beta back", lambda: card_state("beta") == "ready" and status_of("beta")["pid"] not in (None, pid), 20)
    before = status_of("beta")["pid"]
    click("[data-action='restart:beta']")
    until("the restart's outcome", lambda: "restarted" in text_of("[data-outcome='restart:beta']"), 20)
    after = status_of("beta")["pid"]
    assert after and after != before, (before, after)
    shot("04-restarted")
    outcome = text_of("[data-outcome='restart:beta']")
    ok("restart_button", f"pid {before} -> {after}: {outcome!r}")

    # ---- a drifted tool's diff is shown, and Approve releases it
    client = Mcp(args.mcp)
    first = client.call("alpha__echo", {"text": "before"})
    assert "result" in first, first
    # Some traffic for the sparklines: calls, and calls the upstream refuses.
    for i in range(24):
        client.call("alpha__add", {"a": i, "b": 1} if i % 6 else {"b": "not a number"})
        client.call("beta__echo", {"text": "x" * i})
    with open(args.drift_file, "w") as drift:
        drift.write("description")
    until("the held tool's diff", lambda: driver.find_elements(By.CSS_SELECTOR, "[data-pins='alpha'] tr[data-entry='echo']"), 20)
    held = client.call("alpha__echo", {"text": "held"})
    assert held.get("error", {}).get("code") == -33006, held
    row = text_of("[data-pins='alpha'] tr[data-entry='echo']")
    assert "/description" in row and "security" in row and "id_rsa" in row, row
    until("the held tool in the catalog", lambda: driver.find_elements(By.CSS_SELECTOR, "#catalog-entries li[data-held='true']"))
    driver.execute_script("window.scrollTo(0, 0)")
    shot("05-held")
    click("[data-pins='alpha'] [data-action='approve:alpha/echo']")
    until("the approval", lambda: not driver.find_elements(By.CSS_SELECTOR, "[data-pins='alpha']"), 20)
    released = until("a released call", lambda: (lambda answer: answer if "result" in answer else None)(
        client.call("alpha__echo", {"text": "after"})), 10, 0.2)
    shot("06-approved")
    ok("approve_releases", f"held with -33006, then {json.dumps(released['result'])[:80]}")

    # ---- a view selector shows the catalog as that view sees it
    driver.execute_script("document.getElementById('catalog').scrollIntoView()")
    driver.find_element(By.CSS_SELECTOR, "#catalog-view option[value='small']").click()
    until("the view's tools", lambda: [li.get_attribute("data-name") for li in
                                       driver.find_elements(By.CSS_SELECTOR, "#catalog-entries li[data-kind='tools']")] == ["alpha__echo"])
    shot("06b-view")
    driver.find_element(By.CSS_SELECTOR, "#catalog-view option[value='']").click()
    until("the whole catalog", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#catalog-entries li[data-kind='tools']")) > 1)
    ok("view_selector", "view small shows the tool alpha__echo alone")

    # ---- Reload config goes through the control path and says how it went
    driver.execute_script("window.scrollTo(0, 0)")
    driver.find_element(By.ID, "reload").click()
    until("the reload's outcome", lambda: "reload applied" in driver.find_element(By.ID, "reload-outcome").text, 20)
    until("the last reload in the header", lambda: "applied at" in driver.find_element(By.ID, "daemon").text)
    ok("reload_button", repr(driver.find_element(By.ID, "reload-outcome").text))

    # ---- the activity shows the calls, never their arguments
    until("the activity rows", lambda: len(driver.find_elements(By.CSS_SELECTOR, "#activity-rows tr")) >= 3)
    activity = driver.find_element(By.ID, "activity-rows").text
    assert "alpha__echo" in activity or "echo" in activity, activity
    assert "before" not in activity and "after" not in activity, activity
    spark = text_of("[data-upstream='alpha'] .legend")
    assert "0 calls" not in spark.split("■")[1], spark
    ok("sparkline", repr(spark))
    driver.execute_script("document.getElementById('activity').scrollIntoView()")
    shot("07-activity")
    ok("activity", f"{len(driver.find_elements(By.CSS_SELECTOR, '#activity-rows tr'))} rows")

    # ---- a forged cross-origin form is refused
    forged = """<!doctype html><form id="forged" method="post" action="%s/upstreams/beta/restart">
<button id="go" type="submit">win a prize</button></form>""" % args.admin

    class Forger(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = forged.encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_):
            pass

    # Threads: the browser's idle connections must not hold the server's one loop.
    forger = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forger)
    forger.daemon_threads = True
    threading.Thread(target=forger.serve_forever, daemon=True).start()
    before = status_of("beta")["pid"]
    driver.get(f"http://127.0.0.1:{forger.server_port}/")
    driver.find_element(By.ID, "go").click()
    until("the refusal", lambda: "cross-origin" in driver.find_element(By.TAG_NAME, "body").text)
    refusal = driver.find_element(By.TAG_NAME, "body").text
    time.sleep(0.5)
    assert status_of("beta")["pid"] == before, "the forged form restarted beta"
    shot("08-forged-refused")
    forger.shutdown()
    console_errors()  # the refusal's 403 is the point here
    ok("forged_form_refused", repr(refusal.strip()))

    figure("checks_so_far_s", round(time.monotonic() - started, 1))
    # ---- usable at a phone's width
    viewport(390, 844)
    driver.get(args.admin + "/")
    until("the phone page", lambda: card_state("alpha") == "ready")
    width = driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1] + 1, f"the page scrolls sideways at a phone's width: {width}"
    shot("09-phone")
    ok("phone_width", f"scroll width {width[0]} within {width[1]}")
    viewport(1280, 800)

    # ---- beyond loopback, the admin token is asked for and kept in an HttpOnly cookie
    secure = args.secure_admin
    try:
        urllib.request.urlopen(secure + "/status", timeout=10)
        raise AssertionError("/status answered without a token")
    except urllib.error.HTTPError as error:
        assert error.code == 401, error.code
    driver.get(secure + "/")
    until("the login form", lambda: driver.find_elements(By.ID, "login"))
    assert not driver.find_elements(By.ID, "upstreams")
    shot("10-login")
    driver.find_element(By.ID, "token").send_keys("not-the-token")
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    until("the refusal", lambda: "not an admin token" in driver.find_element(By.TAG_NAME, "body").text)
    driver.find_element(By.ID, "token").send_keys(args.token)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    until("the console", lambda: driver.find_elements(By.ID, "upstreams"))
    until("its stream", lambda: driver.find_element(By.ID, "link").get_attribute("data-live") == "true")
    assert args.token not in driver.current_url, driver.current_url
    cookies = driver.get_cookies()
    cookie = next(c for c in cookies if c["name"] == "plexus_admin")
    assert cookie["httpOnly"] and cookie.get("sameSite") == "Strict", cookie
    assert args.token not in cookie["value"], "the cookie holds the token"
    assert not driver.execute_script("return document.cookie.includes('plexus_admin')")
    # Only the refused token's 401 may show.
    errors = [e for e in console_errors() if "/console/login" not in e["message"] or "401" not in e["message"]]
    assert not errors, f"console errors: {errors}"
    shot("11-signed-in")
    ok("login_required_beyond_loopback", f"cookie {cookie['name']} httpOnly sameSite={cookie['sameSite']}")

    # ---- Sign out ends the sign-in; the token signs in again
    driver.find_element(By.ID, "sign-out").click()
    until("the login form again", lambda: driver.find_elements(By.ID, "login"))
    assert not [c for c in driver.get_cookies() if c["name"] == "plexus_admin" and c["value"]]
    driver.find_element(By.ID, "token").send_keys(args.token)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    until("the console again", lambda: driver.find_elements(By.ID, "upstreams"))
    until("its stream again", lambda: driver.find_element(By.ID, "link").get_attribute("data-live") == "true")
    ok("sign_out")

    # ---- a lost connection shows as such; the open stream does not hold the daemon up
    stopping = time.monotonic()
    os.kill(args.secure_pid, signal.SIGTERM)

    def exited():
        try:
            with open(f"/proc/{args.secure_pid}/stat") as stat:
                return stat.read().split(")")[-1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    until("the daemon's exit", exited, 15)
    exit_s = time.monotonic() - stopping
    figure("daemon_exit_with_console_open_ms", round(exit_s * 1000))
    # A stream holding the admin listener's drain costs its 1 s deadline and the
    # connection's 1 s grace, and more (3 s measured); the daemon alone exits in ms.
    assert exit_s < 2.5, f"the daemon took {exit_s:.2f} s to exit with a console open"

    until("the lost connection on the page", lambda: driver.find_element(By.ID, "link").get_attribute("data-live") == "false", 5)
    shot("12-connection-lost")
    ok("lost_connection_shows", repr(driver.find_element(By.ID, "link").text))
except BaseException:
    shot("failure")
    raise
finally:
    driver.quit()

figure("browser_run_s", round(time.monotonic() - started, 1))
print("all checks passed", flush=True)
