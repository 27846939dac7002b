"""A star of TCP connections to rank 0: how the processes of a run meet, talk and notice death.

Before NCCL can connect the GPUs, the ranks must exchange its unique id, and a CPU run needs a
transport of its own; both need nothing more than rank 0 listening and everyone else dialing
in, as torch's TCPStore does. Each rank opens two connections: a *data* channel for the
collectives the main thread calls in lockstep, and a *control* channel that a watcher thread
reads, so that a rank that dies (an exception, SIGKILL, the OOM killer) is noticed at once by
every other rank instead of leaving them blocked forever in a collective that cannot finish.

Wire format: the dialing side sends a fixed header (magic, protocol version, rank, world size,
channel); after that every message is a frame, an 8-byte big-endian length and the bytes.
"""

from __future__ import annotations

import errno
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType

from rustyflow_py.engine.world import World
from rustyflow_py.errors import DistributedError

PROTOCOL_VERSION = 1
EXITED_SILENTLY = "exited without a word (killed, or out of host memory?)"

_MAGIC = b"RFRV"
_HEADER = struct.Struct("!4sHIIB")  # magic, protocol version, rank, world size, channel
_LENGTH = struct.Struct("!Q")
_CONTROL, _DATA = 0, 1
_CHANNEL_NAMES = {_CONTROL: "control", _DATA: "data"}
_SMALL = 1 << 16  # frames up to this size are sent with their length in one write
_WAITALL = getattr(socket, "MSG_WAITALL", 0)


class _HungUp(DistributedError):
    """Rank 0 closed a connection during the rendezvous (its other channel may say why)."""


class Rendezvous:
    """The connections between this rank and the others (to rank 0, or from every rank)."""

    def __init__(
        self, world: World, control: dict[int, socket.socket], data: dict[int, socket.socket]
    ) -> None:
        self.world = world
        self._control = control  # peer rank -> socket: every other rank on rank 0, else {0: ...}
        self._data = data
        self._send_locks = {peer: threading.Lock() for peer in control}
        self._said_bye: set[int] = set()  # peers that closed in order: their EOF is no failure
        self._state_lock = threading.Lock()
        self._failed = False  # a failure was seen or reported: on_failure is not called again
        self._closed = False
        self._watchers: list[threading.Thread] = []

    @classmethod
    def connect(cls, world: World, timeout: float = 300.0) -> Rendezvous:
        """Meet every other rank at rank 0's address; returns once all have joined."""
        if not world.distributed:
            return cls(world, {}, {})
        if world.main:
            return cls(world, *_serve(world, timeout))
        return cls(world, *_dial(world, timeout))

    # -- collectives on the data channel: every rank calls them, in the same order ------------

    def broadcast(self, payload: bytes | None) -> bytes:
        """Rank 0's `payload` on every rank (the others pass None)."""
        if self.world.main:
            if payload is None:
                raise ValueError("rank 0 must pass the bytes to broadcast")
            for peer in sorted(self._data):
                self._send_data(peer, payload, "broadcast")
            return payload
        return self._recv_data(0, "broadcast")

    def gather(self, payload: bytes) -> list[bytes] | None:
        """Every rank's payload, in rank order, on rank 0; None on the others."""
        if self.world.main:
            return [payload] + [self._recv_data(peer, "gather") for peer in sorted(self._data)]
        self._send_data(0, payload, "gather")
        return None

    def all_gather(self, payload: bytes) -> list[bytes]:
        """Every rank's payload, in rank order, on every rank."""
        gathered = self.gather(payload)
        if gathered is not None:
            for peer in sorted(self._data):  # each peer gets all parts but its own
                for rank, part in enumerate(gathered):
                    if rank != peer:
                        self._send_data(peer, part, "all_gather")
            return gathered
        return [
            payload if rank == self.world.rank else self._recv_data(0, "all_gather")
            for rank in range(self.world.size)
        ]

    def barrier(self) -> None:
        """Return once every rank has called barrier()."""
        self.gather(b"")
        self.broadcast(b"" if self.world.main else None)

    def _send_data(self, peer: int, payload: bytes, what: str) -> None:
        try:
            _send_frame(self._data[peer], payload)
        except OSError as exc:
            raise self._lost(peer, what, exc) from exc

    def _recv_data(self, peer: int, what: str) -> bytes:
        try:
            return _recv_frame(self._data[peer])
        except (OSError, EOFError) as exc:
            raise self._lost(peer, what, exc) from exc

    def _lost(self, peer: int, what: str, exc: BaseException) -> DistributedError:
        reason = "it closed the connection" if isinstance(exc, EOFError) else str(exc)
        return DistributedError(
            f"rank {self.world.rank} lost rank {peer} during {what} ({reason}): "
            f"rank {peer} failed or exited early; its own log says why"
        )

    # -- failure detection on the control channel ---------------------------------------------

    def watch(self, on_failure: Callable[[int, str], None]) -> None:
        """Call `on_failure(rank, message)` from a daemon thread when another rank fails.

        Called at most once, for the first failure seen; not after close() or report_failure().
        """
        if self._watchers:
            raise RuntimeError("Rendezvous.watch() was already called")
        for peer, sock in self._control.items():
            thread = threading.Thread(
                target=self._watch_peer,
                args=(peer, sock, on_failure),
                name=f"rustyflow-watch-rank{peer}",
                daemon=True,
            )
            self._watchers.append(thread)
            thread.start()

    def _watch_peer(
        self, peer: int, sock: socket.socket, on_failure: Callable[[int, str], None]
    ) -> None:
        while True:
            try:
                text = _recv_frame(sock).decode("utf-8", "replace")
            except (OSError, EOFError):
                text = None
            if self._closed:
                return
            if text == "BYE":
                with self._state_lock:
                    self._said_bye.add(peer)
                return
            if text is None:
                failed, message = peer, EXITED_SILENTLY
            elif text.startswith("FAIL "):
                failed, message = peer, text[len("FAIL ") :]
            elif text.startswith("PEER_FAILED "):
                number, _, message = text[len("PEER_FAILED ") :].partition(" ")
                failed = int(number)
            else:
                continue  # not a message of this protocol version: ignore it
            with self._state_lock:
                if self._failed or self._closed:
                    return
                self._failed = True
            if self.world.main:
                self._tell_peers(f"PEER_FAILED {failed} {message}", skip=failed)
            on_failure(failed, message)
            return

    def report_failure(self, message: str) -> None:
        """Tell the other ranks this one is failing with `message`; best effort, never raises."""
        try:
            with self._state_lock:
                if self._closed:
                    return
                self._failed = True
            if self.world.main:
                self._tell_peers(f"PEER_FAILED 0 {message}")
            else:
                self._tell_peers(f"FAIL {message}")
        except Exception:
            pass  # the process is dying anyway: a report that cannot be sent is no news

    def _tell_peers(self, text: str, skip: int | None = None) -> None:
        """Send `text` on the control channel of every peer still there (errors ignored)."""
        frame = text.encode("utf-8", "replace")
        for peer, sock in self._control.items():
            with self._state_lock:
                gone = peer == skip or peer in self._said_bye
            if gone:
                continue
            try:
                with self._send_locks[peer]:
                    _send_frame(sock, frame)
            except OSError:
                pass

    # -- orderly end --------------------------------------------------------------------------

    def close(self) -> None:
        """Say goodbye to the other ranks and close the connections; not a failure for anyone."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        self._tell_peers("BYE")
        for sock in [*self._control.values(), *self._data.values()]:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a watcher blocked in recv
            except OSError:
                pass
            sock.close()
        for thread in self._watchers:
            if thread is not threading.current_thread():
                thread.join(timeout=1.0)

    def __enter__(self) -> Rendezvous:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# -- setup: rank 0 listens and waits, the others dial in ---------------------------------------


def _serve(
    world: World, timeout: float
) -> tuple[dict[int, socket.socket], dict[int, socket.socket]]:
    """Rank 0: accept both channels of every other rank within `timeout` seconds."""
    listener = _listen(world.master_port, backlog=2 * world.size)
    channels: dict[int, dict[int, socket.socket]] = {_CONTROL: {}, _DATA: {}}
    deadline = time.monotonic() + timeout
    try:
        while len(channels[_CONTROL]) + len(channels[_DATA]) < 2 * (world.size - 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [
                    str(r)
                    for r in range(1, world.size)
                    if r not in channels[_CONTROL] or r not in channels[_DATA]
                ]
                raise DistributedError(
                    f"rank 0 waited {timeout:g} s at {world.master_addr}:{world.master_port} "
                    f"for rank{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                    f"(of {world.size}): did every process start? "
                    "(under sbatch, start the ranks with srun)"
                )
            _admit(listener, remaining, world, channels)
        for rank, sock in channels[_DATA].items():
            try:
                _send_frame(sock, b"READY")
            except OSError:
                raise DistributedError(
                    f"rank {rank} hung up during the rendezvous: its own log says why"
                ) from None
    except BaseException as exc:
        reason = str(exc) if isinstance(exc, DistributedError) else repr(exc)
        for sock in [*channels[_CONTROL].values(), *channels[_DATA].values()]:
            _reject(sock, f"rank 0 stopped the rendezvous: {reason}")
        raise
    finally:
        listener.close()
    for sock in [*channels[_CONTROL].values(), *channels[_DATA].values()]:
        sock.settimeout(None)
    return channels[_CONTROL], channels[_DATA]


def _admit(
    listener: socket.socket,
    remaining: float,
    world: World,
    channels: dict[int, dict[int, socket.socket]],
) -> None:
    """Accept one connection (waiting up to `remaining` s) and file it under its channel and
    rank; strays (a port scan, a client that gave up) are dropped, a wrong rank is fatal."""
    listener.settimeout(remaining)
    try:
        sock, _ = listener.accept()
    except TimeoutError:
        return
    try:
        _tune(sock)
        sock.settimeout(min(remaining, 10.0))
        magic, version, rank, size, channel = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
        if magic != _MAGIC:
            sock.close()
            return
        problem = _check_header(world, version, rank, size, channel, channels)
        if problem:
            _reject(sock, problem)
            raise DistributedError(problem)
        _send_frame(sock, b"OK")
    except (OSError, EOFError):
        sock.close()
        return
    channels[channel][rank] = sock


def _listen(port: int, backlog: int) -> socket.socket:
    """A listening socket on every interface at `port` (as torch's TCPStore does)."""
    dual = socket.has_dualstack_ipv6()
    try:
        if dual:
            try:
                return socket.create_server(
                    ("", port), family=socket.AF_INET6, backlog=backlog, dualstack_ipv6=True
                )
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise
        return socket.create_server(("", port), backlog=backlog)  # sets SO_REUSEADDR
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise DistributedError(
                f"rank 0 cannot listen on port {port}: it is in use (another run, or two "
                "processes with rank 0?): set MASTER_PORT to a free port, the same for every "
                "rank"
            ) from None
        raise DistributedError(
            f"rank 0 cannot listen on port {port} ({exc.strerror}): set MASTER_PORT to a "
            "free port above 1023, the same for every rank"
        ) from None


def _check_header(
    world: World,
    version: int,
    rank: int,
    size: int,
    channel: int,
    channels: dict[int, dict[int, socket.socket]],
) -> str | None:
    """Why rank 0 refuses this connection, or None if it is welcome."""
    if version != PROTOCOL_VERSION:
        return (
            f"rank {rank} speaks rendezvous protocol {version} but rank 0 speaks "
            f"{PROTOCOL_VERSION}: every process must run the same RustyFlow version"
        )
    if size != world.size:
        return (
            f"rank {rank} says world size {size} but rank 0 has {world.size}: every process "
            "must see the same WORLD_SIZE"
        )
    if not 0 < rank < world.size or channel not in channels:
        return (
            f"a process connected as rank {rank} (channel {channel}) of {world.size}: "
            f"expected ranks 1..{world.size - 1} (only rank 0 listens)"
        )
    if rank in channels[channel]:
        return (
            f"rank {rank} connected twice ({_CHANNEL_NAMES[channel]} channel): two processes "
            "have the same rank; check RANK (or the launcher's rank variable) on each"
        )
    return None


def _reject(sock: socket.socket, reason: str) -> None:
    """Tell a connected rank why the rendezvous failed, then hang up (errors ignored)."""
    try:
        _send_frame(sock, b"ERROR " + reason.encode("utf-8", "replace"))
    except OSError:
        pass
    sock.close()


def _dial(
    world: World, timeout: float
) -> tuple[dict[int, socket.socket], dict[int, socket.socket]]:
    """A non-zero rank: open both channels to rank 0 and wait until every rank has joined."""
    deadline = time.monotonic() + timeout
    control = _open_channel(world, _CONTROL, timeout, deadline)
    try:
        try:
            data = _open_channel(world, _DATA, timeout, deadline, control)
        except _HungUp:
            _raise_rank_0_reason(control, world, 1.0)  # rank 0 may have said why on control
            raise
    except BaseException:
        control.close()
        raise
    try:
        # Rank 0 answers within its own timeout, which started before we reached it.
        data.settimeout(timeout + 5.0)
        try:
            _expect(data, b"READY", world)
        except TimeoutError:
            raise DistributedError(
                f"rank {world.rank} reached rank 0 at {world.master_addr}:{world.master_port} "
                f"but rank 0 did not say within {timeout + 5.0:g} s that every rank joined"
            ) from None
        control.settimeout(None)
        data.settimeout(None)
    except BaseException:
        control.close()
        data.close()
        raise
    return {0: control}, {0: data}


def _open_channel(
    world: World,
    channel: int,
    timeout: float,
    deadline: float,
    control: socket.socket | None = None,
) -> socket.socket:
    """Connect to rank 0 (retrying until `deadline`), send the header, read rank 0's OK.
    While retrying the data channel, an answer on the open `control` channel is heeded."""
    where = f"{world.master_addr}:{world.master_port}"
    pause = 0.05
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DistributedError(
                f"rank {world.rank} could not reach rank 0 at {where} within {timeout:g} s: "
                "is rank 0 running, and MASTER_ADDR/MASTER_PORT the same everywhere?"
            )
        try:
            sock = socket.create_connection(
                (world.master_addr, world.master_port), timeout=min(remaining, 10.0)
            )
        except socket.gaierror as exc:
            raise DistributedError(
                f"rank {world.rank} cannot resolve rank 0's address {world.master_addr!r} "
                f"({exc.strerror}): set MASTER_ADDR to rank 0's host name or IP address"
            ) from None
        except OSError:
            wait = min(pause, max(deadline - time.monotonic(), 0.0))
            if control is None:
                time.sleep(wait)
            else:
                _raise_rank_0_reason(control, world, wait)
            pause = min(pause * 2, 1.0)
            continue
        try:
            _tune(sock)
            sock.settimeout(10.0)  # rank 0 answers at once, unless it is not rank 0
            sock.sendall(_HEADER.pack(_MAGIC, PROTOCOL_VERSION, world.rank, world.size, channel))
            _expect(sock, b"OK", world)
        except TimeoutError:
            sock.close()
            raise DistributedError(
                f"rank {world.rank} reached {where} but got no answer to its handshake: "
                "is MASTER_PORT a RustyFlow rank 0 and not some other server?"
            ) from None
        except OSError as exc:
            sock.close()
            raise _HungUp(
                f"rank 0 at {where} hung up on rank {world.rank} during the rendezvous "
                f"({exc.strerror or exc}): rank 0 failed; its log says why"
            ) from None
        except BaseException:
            sock.close()
            raise
        return sock


def _raise_rank_0_reason(control: socket.socket, world: World, wait: float) -> None:
    """Rank 0 that gives up tells every rank why, on each channel it has: if it did (within
    `wait` s) on this rank's control channel, raise its reason."""
    if select.select([control], [], [], wait)[0]:
        _expect(control, b"", world)  # an ERROR frame (or a hang-up): raises


def _expect(sock: socket.socket, word: bytes, world: World) -> None:
    """Read rank 0's answer: `word`, or an ERROR frame turned into a DistributedError."""
    try:
        (length,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
        answer = _recv_exact(sock, length) if length <= _SMALL else b"<%d bytes>" % length
    except EOFError:
        raise _HungUp(
            f"rank 0 hung up on rank {world.rank} during the rendezvous: "
            "rank 0 failed; its log says why"
        ) from None
    if answer.startswith(b"ERROR "):
        raise DistributedError(answer[len(b"ERROR ") :].decode("utf-8", "replace"))
    if answer != word:
        raise DistributedError(
            f"rank {world.rank} got {answer[:40]!r} from {world.master_addr}:"
            f"{world.master_port} instead of {word!r}: is MASTER_PORT a RustyFlow rank 0?"
        )


# -- frames -------------------------------------------------------------------------------------


def _tune(sock: socket.socket) -> None:
    """No Nagle delay (small frames go at once), and keepalive to notice a vanished host."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


def _send_frame(sock: socket.socket, payload: bytes) -> None:
    length = _LENGTH.pack(len(payload))
    if len(payload) <= _SMALL:
        sock.sendall(length + payload)
    else:
        sock.sendall(length)
        sock.sendall(payload)


def _recv_frame(sock: socket.socket) -> bytes:
    (length,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
    return _recv_exact(sock, length)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    """Exactly `size` bytes, or EOFError. MSG_WAITALL usually gets them in one call straight
    into the bytes object returned (no copy of a large payload); the rest, if a signal or a
    timeout cut it short, is read into a preallocated buffer."""
    if size == 0:
        return b""
    first = sock.recv(size, _WAITALL)
    if len(first) == size:
        return first
    if not first:
        raise EOFError(f"connection closed with {size} bytes still expected")
    buffer = bytearray(size)
    view = memoryview(buffer)
    view[: len(first)] = first
    done = len(first)
    while done < size:
        got = sock.recv_into(view[done:])
        if not got:
            raise EOFError(f"connection closed with {size - done} bytes still expected")
        done += got
    return bytes(buffer)
