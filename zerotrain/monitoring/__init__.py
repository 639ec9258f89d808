"""Monitoring content generated from code: the PromQL of the dashboard and of the alert rules (`queries`), the
Grafana dashboard (`dashboard`, built with grafana-foundation-sdk) and the PrometheusRule groups (`alerts`).

`make monitoring` writes them into the chart; a test fails when the committed files drift from this code.
"""
