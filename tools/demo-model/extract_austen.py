"""Extract Jane Austen's six novels from Debian's r-cran-janeaustenr, without R.

The package keeps its data in an R lazy-load database: `data/Rdata.rdx` is a gzip-compressed R
serialisation of an index (variable name -> (offset, length) in `Rdata.rdb`), and each entry of
`Rdata.rdb` is a 4-byte big-endian length followed by a zlib stream holding one serialised R
object. The objects are character vectors (one element per line of the Project Gutenberg text).
This file implements just enough of R's XDR serialisation format (version 2 and 3) to read them.

Usage: python extract_austen.py <dir with Rdata.rdb/.rdx> <out dir>
writes <out dir>/<name>.txt for every character vector in the database.
"""

import gzip
import struct
import sys
import zlib
from pathlib import Path

NILVALUE_SXP, REFSXP, NILSXP = 254, 255, 0
SYMSXP, LISTSXP, CHARSXP, LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 1, 2, 9, 10, 13, 14, 16, 19
GLOBALENV_SXP, EMPTYENV_SXP, BASEENV_SXP, MISSINGARG_SXP, BASENAMESPACE_SXP = 253, 242, 241, 251, 247


class RReader:
    def __init__(self, data: bytes):
        self.d, self.p, self.refs = data, 0, []

    def int(self) -> int:
        (v,) = struct.unpack_from(">i", self.d, self.p)
        self.p += 4
        return v

    def header(self):
        assert self.d[:2] == b"X\n", "only XDR serialisations are supported"
        self.p = 2
        version = self.int()
        self.int(), self.int()  # writer version, min reader version
        if version == 3:
            n = self.int()
            self.p += n  # native encoding name
        return self.item()

    def length(self) -> int:
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        has_attr, has_tag = bool(flags & 0x200), bool(flags & 0x400)
        if t in (NILVALUE_SXP, NILSXP, GLOBALENV_SXP, EMPTYENV_SXP, BASEENV_SXP, MISSINGARG_SXP,
                 BASENAMESPACE_SXP):
            return None
        if t == REFSXP:
            return self.refs[(flags >> 8) - 1]
        if t == SYMSXP:
            name = self.item()
            self.refs.append(name)
            return name
        if t == CHARSXP:
            n = self.int()
            if n == -1:
                return None  # NA_character_
            s = self.d[self.p:self.p + n].decode("utf-8" if flags & (1 << 15) else "latin-1")
            self.p += n
            return s
        if t == LISTSXP:
            out = []
            while True:
                attr = self.item() if has_attr else None
                tag = self.item() if has_tag else None
                out.append((tag, self.item()))
                nxt = self.int()
                t2 = nxt & 0xFF
                if t2 in (NILVALUE_SXP, NILSXP):
                    return dict(out) if all(k is not None for k, _ in out) else out
                has_attr, has_tag = bool(nxt & 0x200), bool(nxt & 0x400)
                assert t2 == LISTSXP, f"unsupported pairlist continuation {t2}"
        if t in (STRSXP, VECSXP):
            n = self.length()
            v = [self.item() for _ in range(n)]
        elif t in (LGLSXP, INTSXP):
            n = self.length()
            v = list(struct.unpack_from(f">{n}i", self.d, self.p))
            self.p += 4 * n
        elif t == REALSXP:
            n = self.length()
            v = list(struct.unpack_from(f">{n}d", self.d, self.p))
            self.p += 8 * n
        else:
            raise ValueError(f"unsupported SEXP type {t}")
        if has_attr:
            attrs = self.item()  # a pairlist; only `names` matters here
            names = attrs.get("names") if isinstance(attrs, dict) else None
            if t == VECSXP and names is not None:
                return dict(zip(names, v))
        return v


def unserialize(blob: bytes):
    return RReader(blob).header()


def main() -> int:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    index = unserialize(gzip.decompress((src / "Rdata.rdx").read_bytes()))
    rdb = (src / "Rdata.rdb").read_bytes()
    variables = index["variables"]
    for name, (off, ln) in sorted(variables.items()):
        chunk = rdb[off:off + ln]
        obj = unserialize(zlib.decompress(chunk[4:]))
        if not (isinstance(obj, list) and obj and all(isinstance(x, str) or x is None for x in obj)):
            print(f"skip {name}: not a character vector", file=sys.stderr)
            continue
        text = "\n".join(x or "" for x in obj) + "\n"
        (out / f"{name}.txt").write_text(text, encoding="utf-8")
        print(f"{name}: {len(obj)} lines, {len(text)} chars")
    return 0


if __name__ == "__main__":
    sys.exit(main())
