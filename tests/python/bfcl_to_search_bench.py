"""Turns the function documents and questions that the `bfcl-eval` package ships
(Berkeley Function-Calling Leaderboard) into a tool-search benchmark for
plexus-search-bench: every function of the chosen categories becomes one MCP tool
(deduplicated by name), every question a query whose expected tools are the
functions its ground truth calls.

    python tests/python/bfcl_to_search_bench.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import bfcl_eval

CATEGORIES = ["simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple"]
UPSTREAM = "bfcl"


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fix_types(schema):
    """BFCL writes Python type names ("dict", "float"); MCP wants JSON Schema's."""
    if isinstance(schema, dict):
        fixed = {key: fix_types(value) for key, value in schema.items()}
        names = {"dict": "object", "float": "number", "list": "array", "tuple": "array", "any": "string"}
        if isinstance(fixed.get("type"), str):
            fixed["type"] = names.get(fixed["type"], fixed["type"])
        return fixed
    if isinstance(schema, list):
        return [fix_types(value) for value in schema]
    return schema


def main() -> int:
    data = Path(bfcl_eval.__file__).parent / "data"
    tools: dict[str, dict] = {}
    queries = []
    for category in CATEGORIES:
        questions = lines(data / f"BFCL_v4_{category}.json")
        answers = {entry["id"]: entry for entry in lines(data / "possible_answer" / f"BFCL_v4_{category}.json")}
        for entry in questions:
            for function in entry["function"]:
                tools.setdefault(
                    function["name"],
                    {
                        "name": function["name"],
                        "description": function.get("description", ""),
                        "inputSchema": fix_types(function.get("parameters") or {"type": "object"}),
                    },
                )
            answer = answers.get(entry["id"])
            if not answer:
                continue
            expected = sorted({name for call in answer["ground_truth"] for name in call})
            turn = entry["question"][0]
            text = " ".join(message["content"] for message in turn if message["role"] == "user")
            if text.strip() and expected:
                queries.append({"query": text[:4000], "expected": [f"{UPSTREAM}/{name}" for name in expected]})
    out = {
        "source": f"bfcl-eval {getattr(bfcl_eval, '__version__', '')}: {', '.join(CATEGORIES)}",
        "tools": [{"upstream": UPSTREAM, "tool": tool} for tool in tools.values()],
        "queries": queries,
    }
    Path(sys.argv[1]).write_text(json.dumps(out))
    print(f"{len(out['tools'])} tools, {len(queries)} queries", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
