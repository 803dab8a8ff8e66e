#!/usr/bin/env python3
"""Compare the machine code of two kernel caches kernel by kernel: a refactor of kernel source that
must not change what runs (issue 23) compiles both trees' kernels (`flashkv precompile` with
FLASHKV_CACHE_DIR=A and =B) and checks here that every kernel's SASS (.text.* sections) and its
resource records (.nv.info.*: registers, shared memory, barriers) are byte-identical.

    scripts/compare_kernels.py CACHE_A CACHE_B [--only-common]

--only-common: compare the kernels both caches hold and only count the others (for a quick check
on a subset precompiled into one side, e.g. `flashkv precompile --head-dims 128 --group-sizes 4`).

Entries are matched by their first name expression (kernel ids and cache keys may differ between
the trees, e.g. when headers moved), and sections by their kernel's rank within the entry (a Config
that gains a defaulted template parameter mangles to another symbol name with the same code). Exit status 1 if any kernel differs or is missing on one side.
No CUDA tools needed: the cubin is an ELF file and only its section bytes are compared."""
import os
import struct
import sys


def read_entry(path):
    b = open(path, "rb").read()
    assert b[:8] == b"FKVCUBIN", path
    pos = 8 + 4 + 8  # magic, format version, key
    (n,) = struct.unpack_from("<I", b, pos)
    pos += 4
    names = []
    for _ in range(n):
        for k in range(2):
            (ln,) = struct.unpack_from("<I", b, pos)
            pos += 4
            s = b[pos:pos + ln].decode()
            pos += ln
            if k == 0:
                names.append(s)
    (size,) = struct.unpack_from("<Q", b, pos)
    pos += 8
    return names, b[pos:pos + size]


def elf_sections(elf):
    """{name: bytes} of an ELF64 little-endian file's sections."""
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    names_blob = elf[strtab[4]:strtab[4] + strtab[5]]
    out = {}
    for h in headers:
        name = names_blob[h[0]:names_blob.index(b"\0", h[0])].decode()
        out[name] = elf[h[4]:h[4] + h[5]] if h[1] != 8 else b""  # SHT_NOBITS has no bytes
    return out


def load(cache):
    kernels = {}
    for f in sorted(os.listdir(cache)):
        if f.endswith(".fkvbin"):
            names, cubin = read_entry(os.path.join(cache, f))
            secs = elf_sections(cubin)
            prefixes = (".text.", ".nv.info.", ".nv.shared.", ".nv.constant0.")
            # Sections are named after the kernel's mangled symbol, which a new defaulted template
            # parameter changes without changing the code: name them by the symbol's rank instead.
            symbols = sorted({k[len(p):] for k in secs for p in prefixes if k.startswith(p)})
            rank = {sym: i for i, sym in enumerate(symbols)}
            code = {}
            for k, v in secs.items():
                for p in prefixes:
                    if k.startswith(p):
                        code[f"{p}#{rank[k[len(p):]]}"] = v
            kernels[names[0]] = code
    return kernels


def main():
    only_common = "--only-common" in sys.argv[3:]
    a, b = load(sys.argv[1]), load(sys.argv[2])
    bad = 0
    for name in sorted(set(a) | set(b)):
        if (name not in a or name not in b) and only_common:
            continue
        if name not in a or name not in b:
            print(f"MISSING in {'A' if name not in a else 'B'}: {name}")
            bad += 1
        elif a[name] != b[name]:
            diff = [s for s in sorted(set(a[name]) | set(b[name])) if a[name].get(s) != b[name].get(s)]
            print(f"DIFFERS: {name}: {', '.join(diff)}")
            bad += 1
    same = len(set(a) & set(b)) - sum(1 for n in set(a) & set(b) if a[n] != b[n])
    print(f"{same} kernels identical, {bad} differ or are missing ({len(a)} in A, {len(b)} in B)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
