#!/bin/sh
# Builds the git-ignored seed corpus under fuzz/corpus/:
#
#   corpus/candy/   every real candy manifest of the shared corpus
#   corpus/root/    the real root charly.yml files
#   corpus/box/     every real box file (box/<name>/charly.yml)
#   corpus/vocab/   the real build.yml vocabulary files
#   corpus/hostile/ inputs too big to commit, generated here: a 20 MB scalar,
#                   100,000-deep flow and block nesting, a 10^10-node alias
#                   bomb. .ci/fuzz replays them once through every loader
#                   target (they are not fuzzed: libFuzzer would mutate
#                   megabytes per run).
#
# The small crashing inputs of issue 18 are committed under fuzz/seeds/<target>/.
# Re-running is harmless: existing files are overwritten, files libFuzzer
# added are kept.
#
# Usage: fuzz/seed.sh [CORPUS_ROOT]   (default: ../shared/corpus/overthink
#        next to the workspace, i.e. /work/shared/corpus/overthink)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-$here/../../shared/corpus/overthink}
[ -d "$src" ] || { echo "seed.sh: no corpus at $src" >&2; exit 1; }
all=$(cd "$src/.." && pwd)

copy() { # copy DEST FILES...: one seed per file, named after its directory
    dest=$here/corpus/$1
    shift
    mkdir -p "$dest"
    n=0
    for f in "$@"; do
        name=$(basename "$(dirname "$f")")
        install -m 644 "$f" "$dest/seed-$name-$n.yml"
        n=$((n + 1))
    done
    echo "seed.sh: $n files -> $dest"
}

# Every candy manifest: candy/<name>/charly.yml and image/<repo>/candy/<name>/charly.yml;
# the Go test fixtures under charly/testdata are left out.
mkdir -p "$here/corpus/candy"
n=0
for f in $(find "$src" -path '*/candy/*/charly.yml' ! -path '*/testdata/*' | sort); do
    name=$(basename "$(dirname "$f")")
    install -m 644 "$f" "$here/corpus/candy/seed-$name.yml"
    n=$((n + 1))
done
echo "seed.sh: $n candy files -> $here/corpus/candy"

# shellcheck disable=SC2046
copy root $(find "$all" -maxdepth 3 -name charly.yml ! -path '*/candy/*' ! -path '*/box/*' ! -path '*/testdata/*' | sort)
# shellcheck disable=SC2046
copy box $(find "$src" -path '*/box/*/charly.yml' ! -path '*/testdata/*' | sort)
# shellcheck disable=SC2046
copy vocab $(find "$all" -name build.yml ! -path '*/testdata/*' | sort)

h=$here/corpus/hostile
mkdir -p "$h"
# A 20 MB scalar (over the loader's 4 MiB file limit).
{ printf 'version: 2026.160.1301\nx: '; head -c 20000000 /dev/zero | tr '\0' a; printf '\n'; } > "$h/scalar-20mb.yml"
# 100,000-deep flow nesting, and block sequences nested as deep (`- - - … x`).
{ printf 'version: 2026.160.1301\nx: '; head -c 100000 /dev/zero | tr '\0' '['; printf '\n'; } > "$h/nest-flow-100k.yml"
{ printf 'version: 2026.160.1301\nx:\n'; head -c 100000 /dev/zero | tr '\0' - | sed 's/-/- /g'; printf 'x\n'; } > "$h/nest-block-100k.yml"
# Alias bomb: 10 levels of 10 aliases each, 10^10 nodes once expanded.
{
    printf 'version: 2026.160.1301\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n'
    i=1
    while [ $i -le 10 ]; do
        p=$((i - 1))
        printf 'a%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n' \
            $i $i $p $p $p $p $p $p $p $p $p $p
        i=$((i + 1))
    done
} > "$h/alias-bomb-1e10.yml"
# Lines past the 65,535 columns a report renderer can pad (issue 43): a
# long key at the top level, inside a candy, and a tab error after one.
k=$(head -c 65535 /dev/zero | tr '\0' k)
printf '%s: 1\n' "$k" > "$h/long-key-65535.yml"
printf 'candy:\n  version: 1.0.0\n  %s: 1\n' "$k" > "$h/long-field-65535.yml"
printf 'version: 2026.160.1301\nx: "%s"\n\ty: 1\n' "$k" > "$h/long-line-then-tab.yml"
echo "seed.sh: $(ls "$h" | wc -l) hostile inputs -> $h"
