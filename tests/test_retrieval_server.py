"""The Search-R1 retrieval server and its HTTP client over real sockets on 127.0.0.1: the API shapes and errors,
retries, and the server under attack (unbounded topk, many parallel clients, slow and vanishing clients,
oversized bodies), each of which the standard-library server it replaced failed."""

from __future__ import annotations

import http.client
import json
import logging
import math
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from retrieval_harness import DISTINCTIVE_QUERIES, bm25, get, passages, post, server  # noqa: F401  (fixtures)

from drmas.retrieval.client import HttpRetriever, RetrievalServerError
from drmas.retrieval.server import RetrievalServer

# ---------------------------------------------------------------------------------------- server + client


def test_server_answers_search_r1_shapes(server, bm25):
    query = DISTINCTIVE_QUERIES["5"]
    status, plain = post(server.url, json.dumps({"queries": [query, "Brasswick clockmakers"], "topk": 3}).encode())
    assert status == 200 and len(plain["result"]) == 2 and len(plain["result"][0]) == 3
    assert plain["result"][0][0] == {"id": "5", "contents": bm25.passages[5].contents}  # the corpus row unchanged
    status, scored = post(server.url, json.dumps({"queries": [query], "topk": 3, "return_scores": True}).encode())
    assert status == 200
    items = scored["result"][0]
    assert [set(item) for item in items] == [{"document", "score"}] * 3
    assert [item["document"] for item in items] == plain["result"][0]
    assert items[0]["score"] == pytest.approx(bm25.search([query], 3)[0][0].score)
    status, default = post(server.url, json.dumps({"queries": [query]}).encode())
    assert status == 200 and len(default["result"][0]) == 2  # the server's default topk
    assert get(server.url.replace("/retrieve", "/health")) == (200, {"status": "ok", "passages": 12, "topk": 2})


def test_client_round_trip_matches_in_process_search(server, bm25):
    client = HttpRetriever(server.url, timeout_s=10)
    queries = list(DISTINCTIVE_QUERIES.values())[:4]
    remote, local = client.search(queries, 3), bm25.search(queries, 3)
    assert [[h.passage for h in q] for q in remote] == [[h.passage for h in q] for q in local]
    assert [[h.score for h in q] for q in remote] == [[h.score for h in q] for q in local]  # JSON floats round-trip
    assert client.search([], 3) == []


@pytest.mark.parametrize("body, status, expected", [
    (b'{"queries": ["a"', 400, "not valid JSON"),
    (b'{"topk": 3}', 400, "queries"),
    (b'{"queries": "amber heron", "topk": 3}', 400, "$.queries"),
    (b'{"queries": [1, 2]}', 400, "$.queries[0]"),
    (b'{"queries": ["a"], "topk": 0}', 400, "'topk' must be >= 1"),
    (b'{"queries": ["a"], "topk": "3"}', 400, "$.topk"),
    (b'{"queries": ["a"], "return_scores": "yes"}', 400, "$.return_scores"),
    (b'{"queries": ["a", "b", "c", "d", "e"]}', 400, "5 queries, at most 4"),
    (b'[]', 400, "invalid request"),
])
def test_malformed_request_gets_400_with_message(server, body, status, expected):
    got_status, payload = post(server.url, body)
    assert got_status == status
    assert expected in payload["error"]


def test_unknown_path_and_wrong_method(server):
    base = server.url.rsplit("/", 1)[0]
    status, payload = post(base + "/search", b'{"queries": ["a"]}')
    assert status == 404 and "/search" in payload["error"]
    assert get(base + "/nope")[0] == 404
    assert get(server.url)[0] == 405


def test_client_reports_server_message_and_url(server):
    client = HttpRetriever(server.url, timeout_s=10)
    with pytest.raises(RetrievalServerError) as err:
        client.search(["a", "b", "c", "d", "e"], 2)  # over the server's max_queries=4
    assert server.url in str(err.value) and "HTTP 400" in str(err.value) and "at most 4" in str(err.value)


def test_client_reports_unreachable_server():
    with socket.socket() as probe:  # a port that was free a moment ago and that nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/retrieve"
    with pytest.raises(RetrievalServerError, match="cannot reach retrieval server.*after 2 attempts"):
        HttpRetriever(url, timeout_s=5, retries=1, backoff_s=0.01).search(["a"], 1)


def test_client_splits_a_large_batch_into_requests_the_server_accepts(server, bm25):
    queries = list(DISTINCTIVE_QUERIES.values()) * 3  # 12 queries; the server takes at most 4 per request
    client = HttpRetriever(server.url, timeout_s=10, max_queries_per_request=4)
    remote, local = client.search(queries, 2), bm25.search(queries, 2)
    assert [[h.passage for h in q] for q in remote] == [[h.passage for h in q] for q in local]


def test_client_waits_for_a_server_that_is_starting(bm25):
    """A retrieval server restarting during a run: the client retries until it is back."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started: list[RetrievalServer] = []
    timer = threading.Timer(0.5, lambda: started.append(RetrievalServer(bm25, port=port).start()))
    timer.start()
    try:
        client = HttpRetriever(f"http://127.0.0.1:{port}/retrieve", timeout_s=5, retries=8, backoff_s=0.1)  # 25 s
        hits = client.search([DISTINCTIVE_QUERIES["5"]], 1)
        assert hits[0][0].passage.id == "5"
    finally:
        timer.join()
        for srv in started:
            srv.close()


class _FlakyHandler(BaseHTTPRequestHandler):
    """Answers the first `server.failures` requests with `server.status`, then a valid one-hit result."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests += 1
        if self.server.requests <= self.server.failures:
            status, body = self.server.status, json.dumps({"error": "busy"}).encode()
        else:
            status, body = 200, json.dumps({"result": [[{"id": "x", "contents": "T\nbody"}]]}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("status, retried", [(503, True), (500, True), (400, False), (422, False)])
def test_client_retries_server_errors_but_not_refused_requests(status, retried):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _FlakyHandler)
    httpd.requests, httpd.failures, httpd.status = 0, 2, status
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        client = HttpRetriever(f"http://127.0.0.1:{httpd.server_address[1]}/retrieve", timeout_s=5, retries=3,
                               backoff_s=0.01)
        if retried:
            assert client.search(["q"], 1)[0][0].passage.id == "x"
            assert httpd.requests == 3
        else:
            with pytest.raises(RetrievalServerError, match=f"HTTP {status}: busy"):
                client.search(["q"], 1)
            assert httpd.requests == 1
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


class _UnscoredSearchR1Handler(BaseHTTPRequestHandler):
    """Another Search-R1 style server: ignores return_scores and answers title/text rows."""

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        rows = [[{"id": f"{q}-{i}", "title": f"T{i}", "text": q} for i in range(request["topk"])]
                for q in request["queries"]]
        body = json.dumps({"result": rows}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_client_accepts_unscored_answers_from_other_servers():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _UnscoredSearchR1Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/retrieve"
        hits = HttpRetriever(url, timeout_s=10).search(["alpha", "beta"], 2)
        assert [[h.passage.contents for h in q] for q in hits] == [["T0\nalpha", "T1\nalpha"], ["T0\nbeta", "T1\nbeta"]]
        assert all(math.isnan(h.score) for q in hits for h in q)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


# ------------------------------------------------------------------------------------ server under attack
# One test per attack the standard library's server fell to; each fails against that server.


QUICK_DEADLINE_S = 1.0


@pytest.fixture
def quick_server(bm25):
    """A server whose request deadline is short enough to watch it close a slow client."""
    srv = RetrievalServer(bm25, host="127.0.0.1", port=0, request_timeout_s=QUICK_DEADLINE_S,
                          keep_alive_s=QUICK_DEADLINE_S, shutdown_grace_s=1.0).start()
    try:
        yield srv
    finally:
        srv.close()


def _connect(srv: RetrievalServer) -> socket.socket:
    return socket.create_connection(srv.address, timeout=10)


def _retrieve_once(url: str) -> int:
    status, payload = post(url, json.dumps({"queries": [DISTINCTIVE_QUERIES["9"]], "topk": 1}).encode())
    assert status != 200 or payload["result"][0][0]["id"] == "9"
    return status


def test_topk_is_bounded_by_max_topk_and_capped_at_the_corpus(server):
    status, payload = post(server.url, b'{"queries": ["a"], "topk": 1000000000}')
    assert status == 400 and "'topk' must be at most max_topk=100, got 1000000000" in payload["error"]
    status, payload = post(server.url, b'{"queries": ["a"], "topk": 100}')  # within the bound: the whole corpus
    assert status == 200 and len(payload["result"][0]) == 12
    with pytest.raises(ValueError, match="default topk 5 is over max_topk 4"):
        RetrievalServer(object(), port=0, default_topk=5, max_topk=4)


def test_fifty_parallel_clients_are_all_answered(server):
    n_clients, n_requests = 50, 4
    barrier = threading.Barrier(n_clients)
    statuses: list[int] = []
    errors: list[BaseException] = []

    def client() -> None:
        try:
            barrier.wait(timeout=10)
            for _ in range(n_requests):  # a new connection each time, as urllib does
                statuses.append(_retrieve_once(server.url))
        except Exception as exc:  # a reset, a timeout: reported below
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and statuses == [200] * (n_clients * n_requests)


@pytest.mark.parametrize("half_request", [
    b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Le",  # half the headers
    b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n{\"queries\": [",  # half the body
], ids=["half-headers", "half-body"])
def test_slow_client_blocks_no_one_and_is_closed_at_the_deadline(quick_server, half_request):
    opened = time.monotonic()  # before the connection: its deadline cannot start earlier
    slow = _connect(quick_server)
    try:
        slow.sendall(half_request)
        assert _retrieve_once(quick_server.url) == 200
        slow.setblocking(False)  # answered while the slow client is still held open: not after it
        with pytest.raises(BlockingIOError):
            slow.recv(1024)
        slow.settimeout(60)
        try:
            assert slow.recv(1024) == b""  # closed by the server, no answer
        except ConnectionResetError:
            pass
        assert QUICK_DEADLINE_S <= time.monotonic() - opened < QUICK_DEADLINE_S + 10  # at the deadline
    finally:
        slow.close()


def test_dribbling_client_does_not_extend_its_deadline(quick_server):
    """Slowloris: a byte every 0.1 s keeps a connection busy forever unless the deadline covers the whole request."""
    request = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 200\r\n\r\n" + b" " * 200
    slow = _connect(quick_server)
    opened = time.monotonic()
    try:
        with pytest.raises(OSError):  # BrokenPipeError / ConnectionResetError once the server has closed
            for byte in request:
                slow.sendall(bytes([byte]))
                time.sleep(0.1)
        assert time.monotonic() - opened < QUICK_DEADLINE_S + 10  # the whole dribble would take 26 s
    finally:
        slow.close()


def test_client_disconnecting_mid_request_leaves_no_traceback(server, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    body = json.dumps({"queries": list(DISTINCTIVE_QUERIES.values())[:4], "topk": 12}).encode()
    head = f"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    gone = _connect(server)  # sends half its body, then goes away
    gone.sendall(head + body[:10])
    time.sleep(0.2)
    gone.close()
    reset = _connect(server)  # sends a whole request, then resets the connection instead of reading the answer
    reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reset.sendall(head + body)
    reset.close()
    time.sleep(0.3)
    assert _retrieve_once(server.url) == 200  # the server carries on
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err, err


def test_oversized_body_gets_413_that_the_client_receives(server):
    host, port = server.address
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("POST", "/retrieve", body=b"x" * (10 * 1024 * 1024), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 413
        assert json.loads(resp.read())["error"] == "request body of 10485760 bytes, at most 8388608"
        conn.request("POST", "/retrieve", body=b'{"queries": ["eleven arches"]}')  # the connection is still usable
        resp = conn.getresponse()
        assert resp.status == 200 and len(json.loads(resp.read())["result"][0]) == 2
        chunks = (b"x" * (1024 * 1024) for _ in range(10))  # no Content-Length: refused while streaming
        conn.request("POST", "/retrieve", body=chunks, encode_chunked=True,
                     headers={"Transfer-Encoding": "chunked"})
        resp = conn.getresponse()
        assert resp.status == 413 and "more than 8388608 bytes" in json.loads(resp.read())["error"]
    finally:
        conn.close()


def test_close_is_prompt_and_leaks_no_threads_or_sockets(bm25):
    before = {t.ident for t in threading.enumerate()}
    for _ in range(3):
        # what an unprompt close would wait for (an idle connection, one mid-request) takes 30 s or more
        srv = RetrievalServer(bm25, host="127.0.0.1", port=0, shutdown_grace_s=0.5, keep_alive_s=30.0).start()
        assert _retrieve_once(srv.url) == 200
        idle, mid_body = _connect(srv), _connect(srv)  # an idle connection and one stuck mid-request
        mid_body.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n{")
        time.sleep(0.1)
        started = time.monotonic()
        srv.close()
        assert time.monotonic() - started < 10
        for sock in (idle, mid_body):
            sock.settimeout(60)
            assert sock.recv(1024) == b""  # closed by the server
            sock.close()
        with pytest.raises(ConnectionRefusedError):
            _connect(srv)
        srv.close()  # again: harmless
    assert {t.ident for t in threading.enumerate()} <= before
