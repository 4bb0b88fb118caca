"""An OTLP/HTTP receiver on loopback, built on the OpenTelemetry protobuf messages
(`opentelemetry-proto`): accepts `POST /v1/traces` and `POST /v1/metrics` in
`application/x-protobuf`, as a Collector would, and appends what it decoded to a file
as JSON lines, one per span (`{"kind": "span", ...}`) or metric point series
(`{"kind": "metric", ...}`).

    target/python-venv/bin/python tests/python/otlp_receiver.py OUT.jsonl

Prints `listening PORT` once bound (port 0: the system chooses), then serves until
its stdin closes.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}


def value_of(any_value) -> object:
    which = any_value.WhichOneof("value")
    return getattr(any_value, which) if which else None


def attributes(pairs) -> dict[str, object]:
    return {pair.key: value_of(pair.value) for pair in pairs}


def spans_of(request: ExportTraceServiceRequest) -> list[dict]:
    out = []
    for resource_spans in request.resource_spans:
        service = attributes(resource_spans.resource.attributes).get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    {
                        "kind": "span",
                        "service": service,
                        "name": span.name,
                        "span_kind": SPAN_KINDS.get(span.kind, str(span.kind)),
                        "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(),
                        "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano,
                        "status": STATUS_CODES.get(span.status.code, str(span.status.code)),
                        "attributes": attributes(span.attributes),
                    }
                )
    return out


def metrics_of(request: ExportMetricsServiceRequest) -> list[dict]:
    out = []
    for resource_metrics in request.resource_metrics:
        service = attributes(resource_metrics.resource.attributes).get("service.name")
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.WhichOneof("data") != "histogram":
                    continue
                for point in metric.histogram.data_points:
                    out.append(
                        {
                            "kind": "metric",
                            "service": service,
                            "name": metric.name,
                            "unit": metric.unit,
                            "count": point.count,
                            "attributes": attributes(point.attributes),
                        }
                    )
    return out


class Receiver(BaseHTTPRequestHandler):
    out_path = ""
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 (the http.server API)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/x-protobuf":
            self.send_error(415, "only application/x-protobuf")
            return
        if self.path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            lines = spans_of(request)
            answer = ExportTraceServiceResponse().SerializeToString()
        elif self.path == "/v1/metrics":
            request = ExportMetricsServiceRequest.FromString(body)
            lines = metrics_of(request)
            answer = ExportMetricsServiceResponse().SerializeToString()
        else:
            self.send_error(404)
            return
        with self.lock, open(self.out_path, "a", encoding="utf-8") as out:
            for line in lines:
                out.write(json.dumps(line) + "\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def main() -> None:
    Receiver.out_path = sys.argv[1]
    open(Receiver.out_path, "a").close()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"listening {server.server_address[1]}", flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
