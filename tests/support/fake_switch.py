"""A stand-in switch on the loopback for the client library's unit tests: it
answers every DATA datagram with crafted RESULTs (honest, forged, disagreeing)."""
from __future__ import annotations

import socket
import threading

import numpy as np

from switchml_xdp import wire

#: The fake job's result key (conftest's JobInfo): what honest RESULTs are signed with.
RESULT_KEY = bytes(range(16))


def result_of(h, values: np.ndarray, key: bytes | None = RESULT_KEY, auth: int = wire.AUTH_HEADER,
              **changes) -> bytes:
    """The RESULT an honest switch sends for DATA header h (world 1: the
    values themselves), signed with `key` (None: unsigned, as a forger without
    the key sends it); `changes` alter header fields."""
    f = {"job": int(h["job"]), "rank": int(h["rank"]), "slot": int(h["slot"]),
         "seq": int(h["seq"]), "flags": int(h["flags"]) & wire.FLAG_SLOT_VER, "exp": int(h["exp"]),
         "tag": int(h["tag"]), "op": int(h["op"]), "fmt": int(h["fmt"]), "kind": wire.TYPE_RESULT}
    f.update(changes)
    kind, job, rank, slot, seq = f.pop("kind"), f.pop("job"), f.pop("rank"), f.pop("slot"), f.pop("seq")
    payload = wire.datagram(kind, job, rank, slot, seq, values, **f)
    return payload if key is None else signed(payload, key, auth)


def signed(payload: bytes, key: bytes = RESULT_KEY, auth: int = wire.AUTH_HEADER) -> bytes:
    """A RESULT's UDP payload with its authenticator written in, as a switch
    holding the job's result key writes it."""
    buf = bytearray(payload)
    wire.sign_result(buf, key, auth, len(buf) - wire.HDR_LEN)
    return bytes(buf)


def hold_first_copy_of(p_held: int):
    """An answer that echoes every DATA at once (world 1), except the first
    copy of packet p_held: a lost packet for the backend to recover."""
    seen = set()

    def answer(h, values):
        p = int(h["seq"])
        if p == p_held and p not in seen:
            seen.add(p)
            return []
        return [(False, result_of(h, values))]
    return answer


def echo(h, values: np.ndarray, auth: int = wire.AUTH_HEADER) -> list:
    """World 1: the switch returns the payload as it came, in its format
    (`values`: the payload's bytes as FakeSwitch reads them), signed."""
    header = wire.pack_header(wire.TYPE_RESULT, int(h["job"]), int(h["rank"]), int(h["slot"]),
                              int(h["seq"]), int(h["count"]),
                              int(h["flags"]) & wire.FLAG_SLOT_VER, int(h["exp"]),
                              tag=int(h["tag"]), op=int(h["op"]), fmt=int(h["fmt"]))
    return [(False, signed(header + values.tobytes(), auth=auth))]


class FakeSwitch:
    """A UDP socket on the loopback that plays the switch: for every DATA
    datagram it calls answer(h, values) -> [(from_forger, payload), ...] and
    sends those to the worker, from its own port or from a forger's; `bind`:
    its address (a lab's switch host's, its data port)."""

    def __init__(self, answer, bind: tuple[str, int] = ("127.0.0.1", 0)):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(bind)
        self.sock.settimeout(0.05)
        self.forger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.forger.bind((bind[0], 0))
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.headers: list = []
        self.sources: list = []   # (ip, port) each DATA came from, as `headers`
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            h = wire.unpack_header(data)
            self.headers.append(h)
            self.sources.append(addr)
            for forged, payload in self.answer(h, np.frombuffer(data, "<i4", offset=wire.HDR_LEN)):
                (self.forger if forged else self.sock).sendto(payload, addr)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()
        self.forger.close()


def honest(h, values):
    return [(False, result_of(h, values))]


GROUP = "239.77.0.9"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake_udp_backend(answer, engine: bool, seq_base=0, k=8, slots=4, stall_timeout=5.0,
                     auth=wire.AUTH_HEADER, policy=None, switch=FakeSwitch, lanes=1, port=None):
    """(a `switch` answering with `answer`, a udp backend streaming to it): on
    the C engine or the Python loop, as rank 0 of a world-1 job "fake" with
    the Python loop's timeouts unless `policy` says; `lanes` of its own ports
    from `port` (default: a free one)."""
    from switchml_xdp.client.abort import AbortSignal
    from switchml_xdp.client.backend import LocalEnd
    from switchml_xdp.client.control import JobInfo
    from switchml_xdp.client.retransmit import PYTHON_POLICY
    from switchml_xdp.client.udp_backend import udp_backend

    sw = switch(answer)
    info = JobInfo(name="fake", job_id=3, world=1, rank=0, k=k, slots=slots,
                   switch_ip="127.0.0.1", switch_mac="00:00:00:00:00:00", switch_port=sw.port,
                   group_ip=GROUP, group_mac="01:00:5e:4d:00:09", port=port or free_port(),
                   heartbeat_s=1.0, key=0x0123456789ABCDEF, seq_base=seq_base,
                   result_key=RESULT_KEY, auth=auth, lanes=lanes)
    try:
        be = udp_backend(info, LocalEnd("127.0.0.1", "lo", "00:00:00:00:00:00"), AbortSignal(),
                         policy=policy or PYTHON_POLICY, stall_timeout=stall_timeout,
                         verbose=False, engine=engine)
    except BaseException:
        sw.close()
        raise
    return sw, be
