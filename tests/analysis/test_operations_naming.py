"""A span's operation: its service and masked name; a CLIENT span names what it calls."""

from __future__ import annotations

from tracekit.analysis.attribution.operations import client_target, span_operation


def test_a_client_span_takes_its_callees_server_span_names() -> None:
    # HotROD: frontend's "HTTP GET" to the customer and to the route service are two.
    customer = span_operation(
        "frontend", "HTTP GET", "CLIENT", callee=("customer", "GET /customer")
    )
    route = span_operation("frontend", "HTTP GET", "CLIENT", callee=("route", "GET /route"))
    assert customer == ("customer", "GET /customer") and route == ("route", "GET /route")


def test_without_a_callee_span_the_server_address_and_url_stand_in() -> None:
    target = client_target("GET", None, None, None, "http://0.0.0.0:8081/customer?customer=567")
    assert target == ("0.0.0.0:8081", "GET /customer")
    assert span_operation("frontend", "HTTP GET", "CLIENT", target=target) == target
    assert client_target("GET", "pricing", 8080, "/price/{sku}", None) == (
        "pricing:8080",
        "GET /price/{sku}",
    )
    # Ids in a raw path are masked; a span naming no server keeps its own names.
    assert client_target(None, "db", None, None, "http://db/users/12345/orders")[1] == (
        "/users/{id}/orders"
    )
    assert client_target("GET", None, None, None, None) is None
    assert span_operation("svc", "HTTP GET", "CLIENT") == ("svc", "HTTP GET")


def test_other_spans_are_their_service_and_masked_name() -> None:
    assert span_operation("redis-manual", "GetDriver", "CLIENT") == ("redis-manual", "GetDriver")
    assert span_operation("api", "GET /users/42", "SERVER") == ("api", "GET /users/{id}")
    assert span_operation(None, "  ", "INTERNAL") == ("(unknown)", "(unnamed)")
