"""The rendezvous: collectives between ranks (threads of this process), the setup errors, and
failure detection between real processes (a report, SIGKILL, an orderly goodbye)."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rustyflow_py.engine.rendezvous import EXITED_SILENTLY, Rendezvous, _recv_frame
from rustyflow_py.engine.world import World
from rustyflow_py.errors import DistributedError

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(
    worlds: list[World], body: Callable[[Rendezvous], Any], timeouts: list[float] | None = None
) -> tuple[list[Any], list[BaseException | None]]:
    """Each world's rank in a thread: connect, run `body`, close. Results and errors by index."""
    results: list[Any] = [None] * len(worlds)
    errors: list[BaseException | None] = [None] * len(worlds)

    def run(index: int) -> None:
        timeout = timeouts[index] if timeouts else 10.0
        try:
            with Rendezvous.connect(worlds[index], timeout=timeout) as rendezvous:
                results[index] = body(rendezvous)
        except BaseException as exc:  # handed to the test to assert on
            errors[index] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(worlds))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads), "a rank hung"
    return results, errors


def world_of(size: int, port: int | None = None) -> list[World]:
    port = port or free_port()
    return [World(rank=r, size=size, master_port=port) for r in range(size)]


def ok(results_errors: tuple[list[Any], list[BaseException | None]]) -> list[Any]:
    results, errors = results_errors
    for error in errors:
        if error is not None:
            raise error
    return results


# -- collectives ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_collectives(size: int) -> None:
    def body(rv: Rendezvous) -> tuple[Any, ...]:
        rank = rv.world.rank
        told = rv.broadcast(b"nccl-id" if rank == 0 else None)
        gathered = rv.gather(f"rank {rank}".encode())
        everyone = rv.all_gather(bytes([rank]) * (rank + 1))
        rv.barrier()
        told_again = rv.broadcast(b"" if rank == 0 else None)
        return told, gathered, everyone, told_again

    results = ok(run_ranks(world_of(size), body))
    expected_all = [bytes([r]) * (r + 1) for r in range(size)]
    for rank, (told, gathered, everyone, told_again) in enumerate(results):
        assert told == b"nccl-id" and told_again == b""
        assert gathered == ([f"rank {r}".encode() for r in range(size)] if rank == 0 else None)
        assert everyone == expected_all


def test_world_of_one_needs_no_socket() -> None:
    port = free_port()
    with socket.create_server(("", port)):  # would make a listening rank 0 fail
        with Rendezvous.connect(World(master_port=port), timeout=0.1) as rv:
            assert rv.broadcast(b"x") == b"x"
            assert rv.gather(b"y") == [b"y"] and rv.all_gather(b"z") == [b"z"]
            rv.barrier()
            rv.watch(lambda rank, message: None)
            rv.report_failure("nobody hears this")


def test_barrier_waits_for_the_last_rank() -> None:
    arrived: list[float] = [0.0] * 3
    left: list[float] = [0.0] * 3

    def body(rv: Rendezvous) -> None:
        if rv.world.rank == 1:
            time.sleep(0.3)
        arrived[rv.world.rank] = time.monotonic()
        rv.barrier()
        left[rv.world.rank] = time.monotonic()

    ok(run_ranks(world_of(3), body))
    assert min(left) >= max(arrived) == arrived[1]


def test_large_payloads_arrive_intact() -> None:
    big = os.urandom(50 << 20)
    other = os.urandom((50 << 20) + 3)

    def body(rv: Rendezvous) -> tuple[Any, Any]:
        told = rv.broadcast(big if rv.world.rank == 0 else None)
        gathered = rv.gather(other if rv.world.rank == 2 else b"small")
        return told, gathered

    results = ok(run_ranks(world_of(3), body))
    assert all(told == big for told, _ in results)
    assert results[0][1] == [b"small", b"small", other]


def test_a_collective_with_a_closed_rank_names_it() -> None:
    gone = threading.Event()

    def body(rv: Rendezvous) -> None:
        if rv.world.rank == 1:
            rv.close()
            gone.set()
        else:
            assert gone.wait(10)
            rv.gather(b"x")

    results, errors = run_ranks(world_of(2), body)
    assert errors[1] is None
    assert isinstance(errors[0], DistributedError)
    assert "rank 0 lost rank 1 during gather" in str(errors[0])


def test_close_is_idempotent_and_watch_sees_no_failure() -> None:
    failures: list[tuple[int, str]] = []

    def body(rv: Rendezvous) -> None:
        rv.watch(lambda rank, message: failures.append((rank, message)))
        rv.barrier()
        rv.close()
        rv.close()

    ok(run_ranks(world_of(3), body))
    time.sleep(0.2)
    assert failures == []


# -- setup errors --------------------------------------------------------------------------------


def test_mismatched_world_size() -> None:
    port = free_port()
    worlds = [World(rank=0, size=2, master_port=port), World(rank=3, size=4, master_port=port)]
    _, errors = run_ranks(worlds, lambda rv: None, timeouts=[5.0, 5.0])
    text = "rank 3 says world size 4 but rank 0 has 2: every process must see the same WORLD_SIZE"
    assert isinstance(errors[0], DistributedError) and str(errors[0]) == text
    assert isinstance(errors[1], DistributedError) and str(errors[1]) == text


def test_a_rank_twice() -> None:
    port = free_port()
    worlds = [World(rank=r, size=3, master_port=port) for r in (0, 1, 1)]
    start = time.monotonic()
    _, errors = run_ranks(worlds, lambda rv: None, timeouts=[5.0, 5.0, 5.0])
    assert time.monotonic() - start < 3  # the rank that had joined is told, not left waiting
    assert isinstance(errors[0], DistributedError)
    assert "rank 1 connected twice" in str(errors[0]) and "RANK" in str(errors[0])
    for error in errors[1:]:
        assert isinstance(error, DistributedError) and "rank 1 connected twice" in str(error)


def test_a_rank_without_rank_0_times_out() -> None:
    port = free_port()
    start = time.monotonic()
    with pytest.raises(DistributedError) as err:
        Rendezvous.connect(World(rank=2, size=4, master_port=port), timeout=0.5)
    assert time.monotonic() - start < 3
    assert str(err.value) == (
        f"rank 2 could not reach rank 0 at 127.0.0.1:{port} within 0.5 s: is rank 0 running, "
        "and MASTER_ADDR/MASTER_PORT the same everywhere?"
    )


def test_rank_0_times_out_naming_the_missing_ranks() -> None:
    port = free_port()
    worlds = world_of(4, port)[:2]
    start = time.monotonic()
    _, errors = run_ranks(worlds, lambda rv: None, timeouts=[0.5, 5.0])
    assert time.monotonic() - start < 3
    text = (
        f"rank 0 waited 0.5 s at 127.0.0.1:{port} for ranks 2, 3 (of 4): did every process "
        "start? (under sbatch, start the ranks with srun)"
    )
    assert isinstance(errors[0], DistributedError) and str(errors[0]) == text
    # rank 1 had joined: it is told why rank 0 gave up instead of waiting on
    assert isinstance(errors[1], DistributedError)
    assert str(errors[1]) == f"rank 0 stopped the rendezvous: {text}"


def test_address_in_use() -> None:
    port = free_port()
    with socket.create_server(("", port)), pytest.raises(DistributedError) as err:
        Rendezvous.connect(World(rank=0, size=2, master_port=port), timeout=1.0)
    assert f"port {port}" in str(err.value) and "in use" in str(err.value)
    assert "MASTER_PORT" in str(err.value)


def test_a_port_that_is_not_rank_0() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
                time.sleep(0.2)

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(DistributedError, match="is MASTER_PORT a RustyFlow rank 0"):
            Rendezvous.connect(World(rank=1, size=2, master_port=port), timeout=5)


def test_a_frame_in_pieces_is_read_whole() -> None:
    """A frame that trickles in (or a read cut short) is still read whole."""
    payload = os.urandom(300_000)
    reader, writer = socket.socketpair()
    with reader, writer:
        reader.settimeout(5)  # a timeout makes the socket non-blocking: reads come in pieces

        def trickle() -> None:
            frame = len(payload).to_bytes(8, "big") + payload
            for at in range(0, len(frame), 100_000):
                writer.sendall(frame[at : at + 100_000])
                time.sleep(0.02)

        threading.Thread(target=trickle, daemon=True).start()
        assert _recv_frame(reader) == payload


def test_a_stray_connection_is_ignored() -> None:
    """A port scan that reaches rank 0 before rank 1 does is dropped; the ranks still meet."""
    port = free_port()
    results: dict[int, list[bytes]] = {}

    def rank(number: int) -> None:
        with Rendezvous.connect(World(rank=number, size=2, master_port=port), 10) as rv:
            results[number] = rv.all_gather(bytes([number]))

    rank_0 = threading.Thread(target=rank, args=(0,), daemon=True)
    rank_0.start()
    for _ in range(500):
        try:
            stray = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            time.sleep(0.01)
    with stray:
        stray.sendall(b"GET / HTTP/1.0\r\n\r\n")
        rank(1)
        rank_0.join(10)
        try:  # rank 0 hung up on it without a word (a reset: it left bytes unread)
            assert stray.recv(100) == b""
        except ConnectionResetError:
            pass
    assert results == {0: [b"\x00", b"\x01"], 1: [b"\x00", b"\x01"]}


# -- failure detection between processes ---------------------------------------------------------

RANK_SCRIPT = """
import os, sys, time
from rustyflow_py.engine.rendezvous import Rendezvous
from rustyflow_py.engine.world import World

rank, size, port, action, seconds = sys.argv[1:]
rv = Rendezvous.connect(World(rank=int(rank), size=int(size), master_port=int(port)), 10.0)

def on_failure(peer, message):
    sys.stdout.write(f"FAILURE {peer} {message}\\n")
    sys.stdout.flush()
    os._exit(3)

print("READY", flush=True)  # first: a failure reported meanwhile waits in the socket
rv.watch(on_failure)
if action == "fail":
    rv.report_failure("boom")
    os._exit(1)
time.sleep(float(seconds))
if action == "close":
    rv.close()
    time.sleep(0.4)  # still here when the others close: no failure may be reported
    print("CLOSED", flush=True)
else:
    print("NOTHING HAPPENED", flush=True)
"""


class Ranks:
    """`size` processes running RANK_SCRIPT, each with its action and seconds."""

    def __init__(self, plans: list[tuple[str, float]]) -> None:
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT, str(rank), str(len(plans)), str(port)]
                + [action, str(seconds)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                env=env,
                cwd=REPO,
            )
            for rank, (action, seconds) in enumerate(plans)
        ]

    def wait_ready(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            assert proc.stdout is not None
            with selectors.DefaultSelector() as selector:
                selector.register(proc.stdout, selectors.EVENT_READ)
                assert selector.select(max(deadline - time.monotonic(), 0)), "a rank never joined"
            assert proc.stdout.readline() == b"READY\n"

    def finish(self, timeout: float = 15.0) -> list[tuple[int, str]]:
        """Exit codes and what each printed after READY."""
        outcomes = []
        for proc in self.procs:
            out, err = proc.communicate(timeout=timeout)
            outcomes.append((proc.returncode, out.decode() + err.decode()))
        return outcomes

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def ranks() -> Any:
    made: list[Ranks] = []

    def make(plans: list[tuple[str, float]]) -> Ranks:
        made.append(Ranks(plans))
        return made[-1]

    yield make
    for group in made:
        group.kill_all()


@pytest.mark.parametrize("failing", [2, 0])
def test_a_reported_failure_reaches_every_rank(ranks: Any, failing: int) -> None:
    group = ranks([("fail", 0) if rank == failing else ("wait", 10) for rank in range(3)])
    group.wait_ready()
    start = time.monotonic()
    outcomes = group.finish()
    assert time.monotonic() - start < 5
    for rank, outcome in enumerate(outcomes):
        assert outcome == ((1, "") if rank == failing else (3, f"FAILURE {failing} boom\n"))


@pytest.mark.parametrize("killed", [1, 0])
def test_a_killed_rank_is_noticed(ranks: Any, killed: int) -> None:
    group = ranks([("wait", 10), ("wait", 10), ("wait", 10)])
    group.wait_ready()
    start = time.monotonic()
    group.procs[killed].send_signal(signal.SIGKILL)
    outcomes = group.finish()
    assert time.monotonic() - start < 5
    for rank in {0, 1, 2} - {killed}:
        assert outcomes[rank] == (3, f"FAILURE {killed} {EXITED_SILENTLY}\n")
    assert outcomes[killed][0] == -signal.SIGKILL


@pytest.mark.parametrize("close_after", [(0.05, 0.25, 0.45), (0.45, 0.05, 0.25)])
def test_an_orderly_close_is_no_failure(ranks: Any, close_after: tuple[float, ...]) -> None:
    group = ranks([("close", seconds) for seconds in close_after])
    group.wait_ready()
    assert group.finish() == [(0, "CLOSED\n")] * 3
