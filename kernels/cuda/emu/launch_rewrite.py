#!/usr/bin/env python3
"""launch_rewrite.py IN.cu OUT.cpp: rewrites CUDA launches for the host emulator (emu.h).

`kernel<T><<<grid, block, shm, stream>>>(args);` becomes
`::emu::launch(dim3(grid), dim3(block), [&] { kernel<T>(args); });`.
"""
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^;<>]*>)?)\s*<<<(.*?)>>>\s*\((.*?)\);", re.S)


def split_top(s):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


def rewrite(m):
    cfg = split_top(m.group(2))
    return "::emu::launch(dim3(%s), dim3(%s), [&] { %s(%s); });" % (cfg[0], cfg[1], m.group(1), m.group(3))


src = open(sys.argv[1]).read()
out, n = LAUNCH.subn(rewrite, src)
if "<<<" in out:
    sys.exit("launch_rewrite.py: unconverted launch left in " + sys.argv[1])
open(sys.argv[2], "w").write('#line 1 "%s"\n' % sys.argv[1] + out)
