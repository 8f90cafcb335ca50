"""Reading a model's request counts from Prometheus (deployments/control/prometheus_history.py):
each replica's counter differenced on its own, so replicas that start, stop or restart cost
nothing. The real server is exercised in tests/integration/test_prior_prometheus.py."""

from __future__ import annotations

from hbmserve.deployments.control.prometheus_history import counter_increases


def test_a_counter_that_falls_restarted_from_zero_and_one_first_seen_late_started_in_the_window():
    start = 100.0
    # Seen at the window's start: its value then is history, not traffic.
    assert counter_increases([(100.0, 50.0), (115.0, 53.0), (130.0, 2.0), (145.0, 6.0)], start) == [
        (100.0, 0.0), (115.0, 3.0), (130.0, 2.0), (145.0, 4.0)]
    # First seen later: a replica that started, every request it counted is new.
    assert counter_increases([(130.0, 5.0), (145.0, 5.0)], start) == [(130.0, 5.0), (145.0, 0.0)]
