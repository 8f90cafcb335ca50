"""Reading a model's request counts from Prometheus (deployments/control/prometheus_history.py):
each replica's counter differenced on its own, so replicas that start, stop or restart cost
nothing. The real server is exercised in tests/integration/test_prior_prometheus.py."""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from hbmserve.deployments.control.prometheus_history import HistoryError, counter_increases, request_rates


def test_a_counter_that_falls_restarted_from_zero_and_one_first_seen_late_started_in_the_window():
    start = 100.0
    # Seen at the window's start: its value then is history, not traffic.
    assert counter_increases([(100.0, 50.0), (115.0, 53.0), (130.0, 2.0), (145.0, 6.0)], start) == [
        (100.0, 0.0), (115.0, 3.0), (130.0, 2.0), (145.0, 4.0)]
    # First seen later: a replica that started, every request it counted is new.
    assert counter_increases([(130.0, 5.0), (145.0, 5.0)], start) == [(130.0, 5.0), (145.0, 0.0)]


@pytest.mark.parametrize("status, body, words", [
    (404, b"<html>not found</html>", "Prometheus at"),
    (200, b"[1, 2]", "answered 200: [1, 2]"),
    (400, b'{"status": "error", "error": "bad query"}', "answered 400: bad query"),
])
def test_a_server_that_is_no_prometheus_is_a_history_error_not_a_crash(status, body, words):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(HistoryError, match=re.escape(words)):
            request_rates(f"http://127.0.0.1:{server.server_port}", "m", 3600, 15, 1e9, timeout_s=5)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
