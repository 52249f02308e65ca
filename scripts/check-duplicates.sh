#!/usr/bin/env bash
# Fails when `duplicates` finds a block of 6+ lines repeated under DIR (the
# same lines, or the same shape with other names); exits 77 (skipped) where
# the duplicates tool is not installed.
set -euo pipefail
dir=${1:?usage: check-duplicates.sh DIR}
if ! command -v duplicates >/dev/null 2>&1; then
  echo "SKIP: the duplicates tool is not installed"
  exit 77
fi
out=$(duplicates --repo "$dir" --most 40)
echo "$out"
grep -q '^no duplicates' <<<"$out"
