#!/bin/sh
# Copies the real candy files of the shared corpus into fuzz/corpus/candy/
# (git-ignored) as the seed corpus. Re-running is harmless: existing files
# are overwritten, files libFuzzer added are kept.
#
# Usage: fuzz/seed.sh [CORPUS_ROOT]   (default: ../shared/corpus/overthink
#        next to the workspace, i.e. /work/shared/corpus/overthink)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-$here/../../shared/corpus/overthink}
dest=$here/corpus/candy
[ -d "$src" ] || { echo "seed.sh: no corpus at $src" >&2; exit 1; }
mkdir -p "$dest"
n=0
# Every candy manifest: candy/<name>/charly.yml and image/<repo>/candy/<name>/charly.yml;
# the Go test fixtures under charly/testdata are left out.
for f in $(find "$src" -path '*/candy/*/charly.yml' ! -path '*/testdata/*' | sort); do
    name=$(basename "$(dirname "$f")")
    cp "$f" "$dest/seed-$name.yml"
    n=$((n + 1))
done
echo "seed.sh: $n candy files -> $dest"
