#!/usr/bin/env python3
"""Lists the longest C++ functions under the given folders.

  python3 scripts/function-lengths.py [--max N] [--top K] DIR...

A function is a brace block opened at namespace or class level (not a
namespace, class, struct, enum, union or an initializer); its length is the
count of lines from its signature's first line to its closing brace, lambdas
and local classes included. Exits 1 when one is longer than --max (if given),
so docs/ARCHITECTURE.md's "under 120 lines in the runtime" can be checked:

  python3 scripts/function-lengths.py --max 120 core/runtime
"""
import argparse
import pathlib
import re
import sys

CONTAINER = re.compile(r'\b(namespace|class|struct|union|enum)\b[^;()]*$')


def strip(text):
    """Blanks out comments, strings and character literals, keeping newlines."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i))
            i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(''.join(ch if ch == '\n' else ' ' for ch in text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(')' + (m.group(1) if m else '') + '"', i)
            j = n if end < 0 else end + len(m.group(1) if m else '') + 2
            out.append(''.join(ch if ch == '\n' else ' ' for ch in text[i:j]))
            i = j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            out.append(' ' * (j + 1 - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def functions(path):
    text = strip(path.read_text(errors='replace'))
    stack = []          # 'container' | 'function' | 'other'
    start_of = []       # (kind, index of the statement start) per open brace
    stmt_start = 0      # where the current statement began (after ; { })
    found = []
    for i, c in enumerate(text):
        if c == '{':
            head = text[stmt_start:i]
            inside_function = 'function' in stack
            if inside_function:
                kind = 'other'
            elif CONTAINER.search(head.replace('\n', ' ')) or head.strip().startswith('extern "C"'):
                kind = 'container'
            elif ')' in head and not re.search(r'=\s*$', head):
                kind = 'function'
            else:
                kind = 'other'
            stack.append(kind)
            first = stmt_start + (len(head) - len(head.lstrip()))
            start_of.append(first)
            stmt_start = i + 1
        elif c == '}':
            if stack:
                kind = stack.pop()
                first = start_of.pop()
                if kind == 'function':
                    line0 = text.count('\n', 0, first) + 1
                    line1 = text.count('\n', 0, i) + 1
                    name = re.sub(r'\s+', ' ', text[first:text.find('(', first)].strip())[-60:]
                    found.append((line1 - line0 + 1, path, line0, name))
            stmt_start = i + 1
        elif c == ';' and 'function' not in stack:
            stmt_start = i + 1
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('dirs', nargs='+')
    ap.add_argument('--max', type=int)
    ap.add_argument('--top', type=int, default=10)
    args = ap.parse_args()
    found = []
    for d in args.dirs:
        for p in sorted(pathlib.Path(d).rglob('*')):
            if p.suffix in ('.cpp', '.h', '.cc', '.hpp'):
                found += functions(p)
    found.sort(key=lambda f: -f[0])
    for length, path, line, name in found[:args.top]:
        print(f'{length:5d}  {path}:{line}  {name}')
    if args.max is not None:
        over = [f for f in found if f[0] > args.max]
        print(f'{len(over)} function(s) longer than {args.max} lines in {len(found)}')
        return 1 if over else 0
    return 0


if __name__ == '__main__':
    sys.exit(main())
