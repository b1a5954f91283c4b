"""Decode every good schema vector with Debian's python3-msgpack and compare
it with the JSON beside it: proves the headers are plain msgpack and that
docs/protocol.md's field names and types are what goes on the wire.  The
compact v2 payloads of schema/vectors/codec/ are decoded by the decoder
below, written from docs/protocol.md ("4: compact v2") alone, and must give
the positions, codes and values their JSON names."""
import json
import os
import struct
import sys

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
VEC = os.path.join(HERE, "..", "schema", "vectors")
TYPES = {"HELLO", "WELCOME", "MANIFEST", "CHUNK", "COMMIT", "ACK", "CREDIT",
         "ERROR", "HEARTBEAT", "BYE", "BULK"}


BLOCK, LANES, QESC, GAP_BITS, LMAX = 4096, 32, 20, 26, 12


def prefix_codes(lengths):
    """Canonical codes: (length, code read MSB first) -> symbol."""
    codes, code = {}, 0
    for length in range(1, LMAX + 1):
        for sym, ln in enumerate(lengths):
            if ln == length:
                codes[(length, code)] = sym
                code += 1
        code <<= 1
    return codes


class Compact2:
    """The header, then block by block the lanes' refills and codes."""

    def __init__(self, pl, es, count, changed):
        self.w, self.count, self.changed = 8 * es, count, changed
        self.k, self.mode = pl[0], pl[1]
        nsym = 8 + self.w - 3
        used = 2
        if self.mode == 1:
            lengths = [(pl[2 + i // 2] >> (4 * (i & 1))) & 15 for i in range(nsym)]
            self.codes = prefix_codes(lengths)
            used += (nsym + 1) // 2
        head = (used + 7) & ~7
        self.nblocks = (changed + BLOCK - 1) // BLOCK
        entries = max(self.nblocks - 1, 0)
        self.index = pl[head:head + 8 * entries]
        stream = pl[head + 8 * entries:]
        assert len(stream) % 2 == 0, "stream not whole words"
        self.words = [stream[i] | stream[i + 1] << 8 for i in range(0, len(stream), 2)]

    def pos_len(self, buf):
        t = 0
        while buf >> t & 1:
            t += 1
        return QESC + GAP_BITS if t >= QESC else t + 1 + self.k

    def match(self, buf):
        """(code length, symbol) of the prefix code at buf's bottom, or None."""
        code = 0
        for length in range(1, LMAX + 1):
            code = code << 1 | (buf >> (length - 1) & 1)
            if (length, code) in self.codes:
                return length, self.codes[(length, code)]
        return None

    def val_len(self, buf):
        if self.mode == 0:
            return self.w
        m = self.match(buf)
        return LMAX + 1 if m is None else m[0] + (m[1] - 8 + 3 if m[1] >= 8 else 0)

    def refill(self, lanes, length_of):
        while True:
            short = [l for l in lanes if self.n[l] < length_of(self.buf[l])]
            if not short:
                return
            for l in short:
                self.buf[l] |= self.words[self.at] << self.n[l]
                self.n[l] += 16
                self.at += 1

    def take(self, l, length):
        assert length <= self.n[l]
        self.buf[l] >>= length
        self.n[l] -= length

    def gap(self, l):
        buf, t = self.buf[l], 0
        while buf >> t & 1 and t < QESC:
            t += 1
        if t >= QESC:
            self.take(l, QESC + GAP_BITS)
            return buf >> QESC & ((1 << GAP_BITS) - 1)
        self.take(l, t + 1 + self.k)
        return t << self.k | (buf >> (t + 1) & ((1 << self.k) - 1))

    def value(self, l):
        buf = self.buf[l]
        if self.mode == 0:
            self.take(l, self.w)
            return buf & ((1 << self.w) - 1)
        length, sym = self.match(buf)
        if sym < 8:
            self.take(l, length)
            return sym + 1
        extra = sym - 8 + 3
        self.take(l, length + extra)
        return 1 << extra | (buf >> length & ((1 << extra) - 1))

    def block(self, n, pos, codes):
        self.buf, self.n = [0] * LANES, [0] * LANES
        for r in range((n + LANES - 1) // LANES):
            lanes = [l for l in range(LANES) if LANES * r + l < n]
            self.refill(lanes, self.pos_len)
            for l in lanes:
                self.next += self.gap(l)
                assert self.next < self.count, "position past count"
                pos.append(self.next)
                self.next += 1
            self.refill(lanes, self.val_len)
            codes.extend(self.value(l) for l in lanes)
        assert not any(self.buf), "leftover bits not zero"

    def decode(self):
        pos, codes = [], []
        self.at = self.next = 0
        for j in range(self.nblocks):
            if j:
                off, prev = struct.unpack_from("<II", self.index, 8 * (j - 1))
                assert (off, prev + 1) == (self.at, self.next), "index entry disagrees"
            self.block(min(BLOCK, self.changed - BLOCK * j), pos, codes)
        assert self.at == len(self.words), "words after the last block"
        return pos, codes


def ulp_apply(old, z, w):
    mask, top = (1 << w) - 1, 1 << (w - 1)
    d = z >> 1 if z & 1 == 0 else -((z + 1) >> 1)
    s = old ^ (mask if old & top else top)
    s = (s + d) & mask
    return s ^ (top if s & top else mask)


def check_codec():
    """Each compact v2 vector decoded and applied by the decoder above."""
    vec = os.path.join(VEC, "codec")
    failures = checked = 0
    for name in sorted(os.listdir(vec)):
        if not name.endswith(".bin"):
            continue
        with open(os.path.join(vec, name), "rb") as f:
            pl = f.read()
        with open(os.path.join(vec, name[:-4] + ".json")) as f:
            want = json.load(f)
        es, w = want["elem_size"], 8 * want["elem_size"]
        d = Compact2(pl, es, want["count"], want["changed"])
        pos, codes = d.decode()
        after = list(want["base"])
        for p, c in zip(pos, codes):
            after[p] = c if d.mode == 0 else ulp_apply(after[p], c, w)
        ok = (want["encoding"] == 4 and len(pl) == want["payload_bytes"] and d.mode == want["value_mode"]
              and pos == want["positions"] and codes == want["codes"] and after == want["after"])
        if not ok:
            print(f"codec/{name}: the decoder from the doc disagrees with its JSON")
            failures += 1
        checked += 1
    if checked < 3:
        print(f"codec/: {checked} compact v2 vectors, want 3")
        failures += 1
    print(f"{checked} compact v2 payloads decoded from the doc's text")
    return failures


def main():
    good = bad = 0
    seen = set()
    failures = 0
    for name in sorted(os.listdir(VEC)):
        if not name.endswith(".msgpack"):
            continue
        stem = name[:-8]
        with open(os.path.join(VEC, name), "rb") as f:
            raw = f.read()
        with open(os.path.join(VEC, stem + ".json")) as f:
            want = json.load(f)
        if stem.startswith("bad_"):
            bad += 1
            if not want.get("error", "").startswith("DCAST_E") or not want.get("detail"):
                print(f"{stem}: bad vector JSON lacks error/detail: {want}")
                failures += 1
            continue
        good += 1
        got = msgpack.unpackb(raw, raw=False, strict_map_key=True)
        if got != want:
            print(f"{stem}: msgpack decodes to\n  {got}\nbut JSON says\n  {want}")
            failures += 1
        if got.get("proto") != 2 or got.get("type") not in TYPES:
            print(f"{stem}: proto/type wrong: {got.get('proto')} {got.get('type')}")
            failures += 1
        seen.add(got.get("type"))
    if seen != TYPES:
        print(f"missing good vectors for {sorted(TYPES - seen)}")
        failures += 1
    print(f"{good} good vectors match their JSON, {bad} bad vectors described")
    failures += check_codec()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
