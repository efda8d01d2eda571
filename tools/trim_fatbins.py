#!/usr/bin/env python3
"""Keep only one GPU architecture's device code in CUDA shared libraries, in place.

usage: trim_fatbins.py --arch 90 LIBRARY...

A CUDA library carries its kernels in the ELF section `.nv_fatbin`: a run of fat binaries, one
per compiled unit, each holding the same kernels as machine code (SASS) for several
architectures (TensorFlow 2.21: sm_60, 70, 80, 89, 90) and as PTX. A GPU runs the SASS of its
own architecture, or the driver compiles the PTX; the rest is never read there. In TensorFlow's
GPU bundle these images are most of its size (about 790 MiB of 2.2 GiB, already compressed),
and a lent GPU machine's session pays for every MiB carried (tools/gpu_session.sh).

For each fat binary this keeps the SASS images of --arch and, where it has none, its PTX for
--arch or below (where it has neither, nothing of it could run there: it keeps the entry of the
highest architecture, so that it still registers as before); it rewrites the fat binary in
place with those entries only (a smaller size in its header, the bytes freed set to zero, so
they cost nothing compressed), as nvcc would have written it for that architecture alone. A fat
binary whose entries do not parse exactly is left as it is; a header that does not hold
together leaves the rest of the section as it is. The section, the file size and every address
stay the same, so the host code's pointers to each fat binary still hold.

Written by hand because NVIDIA's own tool for this, nvprune, takes object files and static
libraries only, not shared libraries, and no kept library reads the fat binary format. The
format (undocumented; as NVIDIA's cuobjdump reads it): a 16-byte header (magic 0xBA55ED50,
version, header size, size of the entries), then entries, each a header (kind: 1 PTX, 2 ELF;
header size; payload size; at byte 28 the architecture as 10 * major + minor) and its payload.
"""

import argparse
import struct
import sys

MAGIC = 0xBA55ED50
PTX, ELF = 1, 2


def _sections(data):
  """{name: (offset, size)} of an ELF64 little-endian file's sections ({} for another file)."""
  if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
    return {}  # a linker script or another machine's library: no device code of ours
  shoff, = struct.unpack_from("<Q", data, 0x28)
  shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
  if shnum == 0:
    return {}  # no section headers (or over 65,535 of them, which no CUDA library has)
  headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
  names_offset = headers[shstrndx][4]
  sections = {}
  for name, kind, _, _, offset, size in headers:
    end = data.index(b"\0", names_offset + name)
    if kind != 8:  # SHT_NOBITS (.bss) has no bytes in the file
      sections[data[names_offset + name:end].decode()] = (offset, size)
  return sections


def _entries(data, start, end):
  """The entries (offset, kind, arch, length) of the fat binary whose entries span start:end,
  or None when they do not tile that span exactly."""
  entries = []
  at = start
  while at < end:
    if at + 32 > end:
      return None
    kind, _, header_size, size = struct.unpack_from("<HHIQ", data, at)
    arch, = struct.unpack_from("<I", data, at + 28)
    if kind not in (PTX, ELF) or header_size < 32:
      return None
    entries.append((at, kind, arch, header_size + size))
    at += header_size + size
  return entries if at == end else None


def _kept(entries, arch):
  sass = [e for e in entries if e[1] == ELF and e[2] == arch]
  if sass:
    return sass
  ptx = [e for e in entries if e[1] == PTX and e[2] <= arch]
  if ptx:
    return ptx
  # Nothing here runs on this architecture, before or after: one entry stays, so that the fat
  # binary still registers as it did and fails only where one of its kernels is launched.
  return [max(entries, key=lambda e: (e[2], e[1]))]


def trim(data, arch):
  """Trims the bytearray `data` (a whole ELF file) in place; returns (fat binaries, trimmed,
  left as they were, bytes freed)."""
  sections = _sections(data)
  if ".nv_fatbin" not in sections:
    return 0, 0, 0, 0
  offset, size = sections[".nv_fatbin"]
  at, end = offset, offset + size
  count = trimmed = left = freed = 0
  while at + 16 <= end:
    magic, _, header_size, entries_size = struct.unpack_from("<IHHQ", data, at)
    if magic != MAGIC:
      # Fat binaries start 8-byte aligned in the section, zeros between them.
      at = offset + ((at - offset) // 8 + 1) * 8
      continue
    count += 1
    first, stop = at + header_size, at + header_size + entries_size
    if header_size < 16 or stop > end:
      # A header that does not hold together: this one and whatever follows in the section
      # stay as they are (its extent is unknown, so a later "magic" could lie inside it).
      left += 1
      break
    entries = _entries(data, first, stop)
    kept = _kept(entries, arch) if entries else None
    if kept is None:
      left += 1
    elif len(kept) < len(entries):
      body = b"".join(bytes(data[e[0]:e[0] + e[3]]) for e in kept)
      data[first:first + len(body)] = body
      data[first + len(body):stop] = bytes(stop - first - len(body))
      struct.pack_into("<Q", data, at + 8, len(body))
      trimmed += 1
      freed += entries_size - len(body)
    at = stop
  return count, trimmed, left, freed


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--arch", type=int, required=True,
                      help="the GPU architecture kept, as 10 * major + minor (Hopper: 90)")
  parser.add_argument("libraries", nargs="+")
  args = parser.parse_args(argv)
  total = 0
  errors = []
  for path in args.libraries:  # one bad library is named and the others still trimmed
    try:
      with open(path, "rb") as f:
        data = bytearray(f.read())
      try:
        count, trimmed, left, freed = trim(data, args.arch)
      except (ValueError, struct.error, IndexError):
        errors.append(f"error: {path}: a damaged ELF file (its headers point past its end); "
                      "left as it was")
        continue
      if trimmed:
        with open(path, "r+b") as f:  # same size: rewrite in place, mode and links kept
          f.write(data)
    except OSError as e:
      errors.append(f"error: {path}: {e.strerror}")
      continue
    total += freed
    print(f"{path}: {count} fat binaries, {trimmed} trimmed to sm_{args.arch}, {left} left "
          f"as they were, {freed / 1048576:.1f} MiB freed")
  print(f"{total / 1048576:.1f} MiB of device code for other architectures freed")
  if errors:
    print(*errors, sep="\n", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  main()
