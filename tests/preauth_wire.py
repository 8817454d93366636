"""A raw peer of a moolib listener: tensorpipe's wire format (libnop encoding, each object or buffer
behind its 8-byte length) and moolib's message layout (rid, fid, then the fields), as far as the
pre-handshake attack tests (tests/test_security_preauth.py), the key holders' calls of moolib's own
functions (tests/test_security_keyholder.py) and scripts/preauth_attack_bench.py need."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import struct
import threading
import time

REQ_GREETING, REQ_ERROR, REQ_SUCCESS, REQ_AUTH_CHALLENGE = 0, 1, 2, 10  # moolib's Rpc::ReqType
SIGNATURE = 0xFF984B883019D446  # moolib's greeting signature
TIMEOUT = 300  # s: only ever a failure deadline

# ------------------------------------------------------------------ libnop encoding


def nop_uint(v: int) -> bytes:
    if v < 0x80:
        return bytes([v])
    for prefix, fmt, bound in ((0x80, "<B", 1 << 8), (0x81, "<H", 1 << 16), (0x82, "<I", 1 << 32)):
        if v < bound:
            return bytes([prefix]) + struct.pack(fmt, v)
    return b"\x83" + struct.pack("<Q", v)


def nop_int(v: int) -> bytes:
    if -64 <= v <= 127:
        return struct.pack("<b", v)
    for prefix, fmt, lo in ((0x84, "<b", -(1 << 7)), (0x85, "<h", -(1 << 15)), (0x86, "<i", -(1 << 31))):
        if lo <= v < -lo:
            return bytes([prefix]) + struct.pack(fmt, v)
    return b"\x87" + struct.pack("<q", v)


def nop_str(b: bytes) -> bytes:
    return b"\xbd" + nop_uint(len(b)) + b


def nop_struct(*members: bytes) -> bytes:
    return b"\xb9" + nop_uint(len(members)) + b"".join(members)


def nop_map(pairs: list[tuple[bytes, bytes]]) -> bytes:
    return b"\xbb" + nop_uint(len(pairs)) + b"".join(k + v for k, v in pairs)


def nop_array(items: list[bytes]) -> bytes:
    return b"\xba" + nop_uint(len(items)) + b"".join(items)


def nop_variant(index: int, value: bytes) -> bytes:
    return b"\xb8" + nop_int(index) + value


def frame(payload: bytes) -> bytes:
    """What tensorpipe's TCP transport puts on the wire for one object or buffer."""
    return struct.pack("<Q", len(payload)) + payload


class NopReader:
    """Decodes the libnop objects a tensorpipe peer answers with (enough for a brochure answer)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1]

    def fixed(self, fmt: str) -> int:
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def value(self):
        b = self.byte()
        if b < 0x80:
            return b
        if b >= 0xC0:
            return b - 0x100
        ints = {0x80: "<B", 0x81: "<H", 0x82: "<I", 0x83: "<Q", 0x84: "<b", 0x85: "<h", 0x86: "<i", 0x87: "<q"}
        if b in ints:
            return self.fixed(ints[b])
        if b in (0xBD, 0xBC):  # string, binary
            n = self.value()
            self.pos += n
            return self.data[self.pos - n : self.pos]
        if b in (0xB9, 0xBA):  # structure, array
            return [self.value() for _ in range(self.value())]
        if b == 0xBB:
            return {self.value(): self.value() for _ in range(self.value())}
        if b == 0xB8:
            return (self.value(), self.value())
        raise ValueError(f"nop prefix {b:#x}")


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def recv_frame(sock: socket.socket) -> bytes:
    (n,) = struct.unpack("<Q", recv_exact(sock, 8))
    return recv_exact(sock, n)


class RawPeer:
    """A tensorpipe pipe to the learner (its connection and its basic channel's), without moolib."""

    def __init__(
        self,
        port: int,
        key: str | None = None,
        name: bytes = b"raw-peer",
        signed_name: bytes | None = None,
        signed_id: bytes | None = None,
    ):
        self.main = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.main.sendall(frame(nop_variant(0, nop_struct(nop_str(b"")))))  # spontaneous connection
        brochure = nop_struct(
            nop_map([(nop_str(b"uv"), nop_struct(nop_str(b"uv:*")))]),
            nop_map([(nop_str(b"basic"), nop_struct(nop_str(b"any")))]),
            nop_map([]),
        )
        self.main.sendall(frame(nop_variant(2, brochure)))
        index, answer = NopReader(recv_frame(self.main)).value()
        assert index == 3, answer  # a brochure answer
        (registration,) = struct.unpack("<Q", answer[4][b"basic"][0])
        self.channel = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.channel.sendall(frame(nop_variant(1, nop_struct(nop_uint(registration)))))  # requested connection
        self.their_greeting = b""
        if key is not None:
            self._handshake(key.encode(), name, signed_name, signed_id)
        # Drain what the listener sends (its challenge, its answers) so that it never waits on a full
        # socket; the buffers that come on the channel are kept for reply().
        self.received: list[bytes] = []
        threading.Thread(target=self._drain, args=(self.main,), daemon=True).start()
        threading.Thread(target=self._keep, daemon=True).start()

    def _handshake(self, key: bytes, name: bytes, signed_name: bytes | None, signed_id: bytes | None) -> None:
        """moolib's challenge-response as a key holder (src/auth.h): the listener's challenge is
        answered with a greeting that claims ``name`` and a random PeerId and proves the key, its
        proof made for ``signed_name`` and ``signed_id`` where given (else for what it claims).
        The listener's own greeting is kept in ``their_greeting``."""
        recv_frame(self.main)  # the descriptor of the listener's challenge
        buffer = recv_frame(self.channel)
        _, fid, signature, n = struct.unpack_from("<IIQQ", buffer)
        assert (fid, signature, n) == (REQ_AUTH_CHALLENGE, SIGNATURE, 32), buffer
        self.their_nonce, self.my_nonce = buffer[24:56], os.urandom(32)
        self.peer_id = os.urandom(16)
        proof = auth_proof(
            key,
            b"C",
            self.their_nonce,
            self.my_nonce,
            name if signed_name is None else signed_name,
            self.peer_id if signed_id is None else signed_id,
        )
        self.send(challenge(self.my_nonce))
        self.send(greeting(name, self.peer_id) + moolib_str(proof))
        try:
            recv_frame(self.main)  # the descriptor of the listener's greeting (sent on our challenge)
            self.their_greeting = recv_frame(self.channel)
        except OSError:
            pass  # refused and closed before it came

    @staticmethod
    def _drain(sock: socket.socket) -> None:
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass

    def _keep(self) -> None:
        try:
            while True:
                self.received.append(recv_frame(self.channel))
        except (OSError, ConnectionError):
            pass

    def reply(self, rid: int, timeout: float = TIMEOUT) -> tuple[int, bytes]:
        """The listener's answer to call ``rid`` (not its acknowledgement of it): its kind (REQ_SUCCESS or
        REQ_ERROR) and the fields after it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for buffer in list(self.received):
                if len(buffer) >= 8 and struct.unpack_from("<II", buffer)[0] == rid & ~1:
                    kind = struct.unpack_from("<I", buffer, 4)[0]
                    if kind in (REQ_SUCCESS, REQ_ERROR):
                        return kind, buffer[8:]
            time.sleep(0.05)
        raise TimeoutError(f"no answer to call {rid} within {timeout} s")

    def send(
        self,
        body: bytes,
        declared: int | None = None,
        tensors: list[int] = (),
        offsets: list[int] = (),
        data: list[bytes] = (),
    ) -> None:
        """One moolib message: ``body`` (rid, fid, fields) as its buffer, announced as ``declared``
        bytes (default: its size), with descriptors of ``tensors`` (their byte counts), the
        ``offsets`` of their dtype, sizes and strides in ``body``, and then their ``data``."""
        size = len(body) if declared is None else declared
        padded = body + b"\0" * (-len(body) % 8) + b"".join(struct.pack("<Q", o) for o in offsets)
        descs = [nop_struct(nop_int(len(padded)), nop_str(b""), nop_int(0), nop_str(b"basic"), nop_str(b""))]
        descs += [nop_struct(nop_int(n), nop_str(b""), nop_int(0), nop_str(b"basic"), nop_str(b"")) for n in tensors]
        descriptor = nop_struct(nop_str(struct.pack("<I", size)), nop_array([]), nop_array(descs))
        try:
            self.main.sendall(frame(nop_variant(4, descriptor)))
            self.channel.sendall(frame(padded) + b"".join(frame(d) for d in data))
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused (and closed) before it was all sent: what closed_by_peer() then sees

    def closed_by_peer(self, timeout: float = TIMEOUT) -> bool:
        """Whether the learner closes the connection within ``timeout`` s."""
        self.main.settimeout(timeout)
        try:
            while self.main.recv(65536):
                pass
            return True
        except TimeoutError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        for s in (self.main, self.channel):
            s.close()


def auth_proof(
    key: bytes, role: bytes, receiver_nonce: bytes, sender_nonce: bytes, sender_name: bytes, sender_id: bytes
) -> bytes:
    """A greeting's proof of the key (src/auth.h, auth::proof): HMAC-SHA256 over the tag, the
    sender's role (b"C" connected, b"A" accepted), its claimed name (length-prefixed) and PeerId
    (16 bytes, as on the wire), the receiver's nonce and the sender's."""
    message = b"moolib-rfwp-auth-v1" + role + moolib_str(sender_name) + sender_id + receiver_nonce + sender_nonce
    return hmac.new(key, message, hashlib.sha256).digest()


def moolib_str(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def challenge(nonce: bytes = b"n" * 32) -> bytes:
    return struct.pack("<IIQ", 0, REQ_AUTH_CHALLENGE, SIGNATURE) + moolib_str(nonce)


def greeting(name: bytes, peer_id: bytes = b"\0" * 16) -> bytes:
    """A greeting up to its proof: signature, name, peer id, an empty list of addresses."""
    return struct.pack("<IIQ", 0, REQ_GREETING, SIGNATURE) + moolib_str(name) + peer_id + struct.pack("<Q", 0)


def tensor_meta(dtype: int, sizes: list[int], strides: list[int]) -> bytes:
    """How moolib describes a tensor inside a message: its dtype (torch's ScalarType), sizes, strides."""
    return struct.pack("<i", dtype) + b"".join(
        struct.pack("<Q", len(v)) + struct.pack(f"<{len(v)}q", *v) for v in (sizes, strides)
    )


class Call:
    """A call of a function moolib defines in C++, its fields written as moolib serializes them; tensors are
    described in place (their dtype as torch's ScalarType number, sizes, strides) and their data sent after.
    The methods append a field and return the call."""

    def __init__(self, function: str):
        # Random and odd, as moolib's own: it answers with rid - 1, and takes rids from all peers in one
        # table (a rid another peer's call holds is ignored).
        self.rid = secrets.randbits(32) | 1
        self.body = struct.pack("<II", self.rid, function_id(function))
        self.offsets: list[int] = []
        self.data: list[bytes] = []

    def u32(self, v: int) -> Call:
        self.body += struct.pack("<I", v)
        return self

    def i64(self, v: int) -> Call:
        self.body += struct.pack("<q", v)
        return self

    def boolean(self, v: bool) -> Call:
        self.body += bytes([int(v)])
        return self

    def text(self, v: bytes) -> Call:
        self.body += moolib_str(v)
        return self

    def tensors(self, tensors: list[tuple[int, list[int], bytes]]) -> Call:
        """A std::vector<Tensor> of contiguous ``(dtype, sizes, data)``."""
        self.body += struct.pack("<Q", len(tensors))
        for dtype, sizes, data in tensors:
            strides = [1] * len(sizes)
            for i in range(len(sizes) - 2, -1, -1):
                strides[i] = strides[i + 1] * sizes[i + 1]
            self.offsets.append(len(self.body))
            self.body += tensor_meta(dtype, sizes, strides)
            self.data.append(data)
        return self

    def none(self) -> Call:
        """A Python None (a py::object field)."""
        self.body += b"\x07"
        return self

    def send(self, peer: RawPeer) -> None:
        peer.send(self.body, tensors=[len(d) for d in self.data], offsets=self.offsets, data=self.data)


def function_id(name: str) -> int:
    """The id moolib gives a function it defines: 1000 + std::hash<std::string_view>(name) % 2**24,
    with libstdc++'s hash (its _Hash_bytes, seed 0xc70f6907) on a 64-bit machine."""
    mask, mul = (1 << 64) - 1, (0xC6A4A793 << 32) + 0x5BD1E995

    def shift_mix(v: int) -> int:
        return v ^ (v >> 47)

    data = name.encode()
    aligned = len(data) & ~7
    h = (0xC70F6907 ^ (len(data) * mul)) & mask
    for p in range(0, aligned, 8):
        h = ((h ^ (shift_mix(int.from_bytes(data[p : p + 8], "little") * mul & mask) * mul & mask)) * mul) & mask
    if len(data) & 7:
        h = ((h ^ int.from_bytes(data[aligned:], "little")) * mul) & mask
    return 1000 + shift_mix(shift_mix(h) * mul & mask) % (1 << 24)
