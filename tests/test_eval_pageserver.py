"""The evaluation page server: each kind of page behaves as scenarios rely on, over real HTTP."""

from __future__ import annotations

import time

import httpx
import pytest

from keel.evals.pageserver import PageServer, large_document, progress_text


@pytest.fixture
def server() -> PageServer:
    with PageServer() as s:
        yield s


def get(server: PageServer, path: str, timeout: float = 5.0) -> httpx.Response:
    return httpx.get(server.url(path), timeout=timeout, follow_redirects=False, trust_env=False)


def test_changing_page_differs_on_every_request(server: PageServer) -> None:
    server.add_changing("/t", "<p>tick {n} {not a field}</p>")
    bodies = [get(server, "/t").text for _ in range(3)]
    assert bodies == [f"<p>tick {n} {{not a field}}</p>" for n in (1, 2, 3)]
    assert server.hits("/t") == 3


def test_progress_page_advances_then_stays_done(server: PageServer) -> None:
    server.add_progress("/job", steps=4, done="succeeded")
    bodies = [get(server, "/job").text for _ in range(6)]
    assert "25%" in bodies[0] and "50%" in bodies[1] and "75%" in bodies[2]
    assert bodies[3] == bodies[4] == bodies[5] == progress_text(4, 4, "succeeded")
    assert "100%" in bodies[3] and "succeeded" in bodies[3]
    assert len(set(bodies)) == 4


def test_settling_page_stops_changing_after_n_polls(server: PageServer) -> None:
    server.add_settling("/s", settle_after=2, template="check {n}")
    bodies = [get(server, "/s").text for _ in range(4)]
    assert bodies == ["check 1", "check 2", "check 2", "check 2"]


def test_large_document_is_the_size_asked_for_and_deterministic(server: PageServer) -> None:
    server.add_large("/big", 300 * 1024, "Each step is durable.", "Spec")
    body = get(server, "/big").text
    assert 300 * 1024 <= len(body) < 301 * 1024
    assert body == large_document(300 * 1024, "Each step is durable.", "Spec")
    assert "Section 1<" in body and "<title>Spec</title>" in body


def test_failing_page_answers_its_status(server: PageServer) -> None:
    server.add_error("/boom")
    response = get(server, "/boom")
    assert response.status_code == 500 and response.text == "internal server error"


def test_slow_page_answers_late(server: PageServer) -> None:
    server.add_slow("/slow", 0.3, "late")
    started = time.perf_counter()
    assert get(server, "/slow").text == "late"
    assert time.perf_counter() - started >= 0.3


def test_script_page_holds_its_text_only_in_javascript(server: PageServer) -> None:
    server.add_script_page("/live", interval_ms=50, text="ticks:")
    first, second = get(server, "/live").text, get(server, "/live").text
    assert first == second, "over HTTP the page never changes"
    assert 'id="status"></p>' in first and "setInterval" in first


def test_unknown_paths_are_404_and_not_counted(server: PageServer) -> None:
    assert get(server, "/missing").status_code == 404
    assert server.hits("/missing") == 0


def test_paths_must_start_with_a_slash(server: PageServer) -> None:
    with pytest.raises(ValueError):
        server.add_page("doc", "x")
