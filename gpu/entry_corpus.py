"""Saves the code of every libcuda entry point the shim patches, whole (each function's bytes
as its dynamic symbol's size gives them, at most 4 KiB), with the driver version: the test data
of the shim's patcher (`cupti-shim/tests/data/`). The names are read from the shim's own tables
(hooks/launch.rs and hooks/calls.rs, packed beside this file), so a new hooked entry point is
in the next corpus without editing this.
    python3 entry_corpus.py OUT.json"""
import ctypes
import json
import os
import re
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def names():
    out = []
    for f in ("launch.rs", "calls.rs"):
        p = os.path.join(HERE, "shim-src", f)
        out += re.findall(r'c"(cu[A-Za-z0-9_]+)"', open(p).read())
    return sorted(set(out))


def libcuda_path():
    ctypes.CDLL("libcuda.so.1")
    for line in open("/proc/self/maps"):
        if "libcuda.so" in line:
            return line.split()[-1]
    raise SystemExit("libcuda.so.1 not mapped")


def dynsyms(path):
    """name -> (st_value, st_size) from .dynsym (ELF64 little-endian)."""
    data = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = {}
    for s in secs:
        if s[1] != 11:  # SHT_DYNSYM
            continue
        strtab = secs[s[6]]
        for off in range(s[4], s[4] + s[5], 24):
            name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", data, off)
            end = data.index(b"\0", strtab[4] + name)
            out[data[strtab[4] + name:end].decode()] = (value, size)
    return out, data


def main():
    path = libcuda_path()
    syms, data = dynsyms(path)
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuInit(0)
    v = ctypes.c_int()
    lib.cuDriverGetVersion(ctypes.byref(v))
    driver = open("/proc/driver/nvidia/version").read().split("\n")[0] if os.path.exists(
        "/proc/driver/nvidia/version") else ""
    entries = {}
    for n in names():
        if n not in syms:
            entries[n] = None
            continue
        value, size = syms[n]
        size = min(size or 64, 4096)
        # The file's bytes at the symbol (its load address equals the file offset for
        # libcuda's text segment is not assumed: read from the mapped library instead).
        addr = ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
        entries[n] = {"size": size, "symbol_value": value, "address": addr,
                      "code": ctypes.string_at(addr, size).hex()}
    out = {"libcuda": os.path.realpath(path), "cuda_driver_version": v.value,
           "nvidia_driver": driver, "entries": entries}
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    print(f"{sum(e is not None for e in entries.values())} of {len(entries)} entry points saved "
          f"from {out['libcuda']} ({driver[:80]})")


main()
