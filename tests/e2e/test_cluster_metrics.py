"""Reading a real API server's request counts, as test_second_pass_writes_nothing and bench_operator_scale do there."""

from __future__ import annotations

from .cluster import job_reads_in, requests_in


def test_the_real_servers_job_reads_are_counted_from_its_metrics() -> None:
    # What test_second_pass_writes_nothing reads off a real API server's /metrics, on a sample of its format.
    metrics = "\n".join(
        [
            "# TYPE apiserver_request_total counter",
            'apiserver_request_total{code="200",component="apiserver",group="zerotrain.dev",resource="zerotrainingjobs",'
            'scope="resource",subresource="",verb="GET",version="v1alpha1"} 12',
            'apiserver_request_total{code="200",group="zerotrain.dev",resource="zerotrainingjobs",scope="namespace",'
            'subresource="",verb="LIST",version="v1alpha1"} 3',
            'apiserver_request_total{code="200",group="zerotrain.dev",resource="zerotrainingjobs",scope="namespace",'
            'subresource="",verb="WATCH",version="v1alpha1"} 2',
            'apiserver_request_total{code="200",group="zerotrain.dev",resource="zerotrainingjobs",scope="resource",'
            'subresource="status",verb="PATCH",version="v1alpha1"} 7',
            'apiserver_request_total{code="200",group="",resource="pods",verb="LIST",version="v1"} 40',
        ]
    )
    assert job_reads_in(metrics) == 15


def test_every_request_the_real_server_served_is_counted_by_verb_and_resource() -> None:
    # What bench_operator_scale reads off a real API server's /metrics for each phase.
    metrics = "\n".join(
        [
            "# HELP apiserver_request_total Counter of apiserver requests.",
            "# TYPE apiserver_request_total counter",
            'apiserver_request_total{code="201",group="",resource="pods",scope="resource",subresource="",'
            'verb="POST",version="v1"} 200',
            'apiserver_request_total{code="403",group="",resource="pods",scope="resource",subresource="",'
            'verb="POST",version="v1"} 3',
            'apiserver_request_total{code="200",group="zerotrain.dev",resource="zerotrainingjobs",scope="resource",'
            'subresource="status",verb="PATCH",version="v1alpha1"} 7',
            "# TYPE apiserver_request_duration_seconds histogram",
            'apiserver_request_duration_seconds_count{resource="pods",verb="POST"} 203',
        ]
    )
    assert requests_in(metrics) == {"post pods": 203, "patch zerotrainingjobs/status": 7}
