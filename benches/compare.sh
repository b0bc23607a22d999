#!/usr/bin/env bash
# Side-by-side comparison of charly with ninja and b3sum, in one go.
#
#   benches/compare.sh [WORKDIR]          (default: /tmp/charly-compare)
#
# Environment:
#   CHARLY_COMPARE_SIZES  sizes for (d), default "100x10 1000x100 10000x1000"
#   CHARLY_COMPARE_PARTS  which parts run, default "a b c d e"
#   CHARLY_COMPARE_RUNS   hyperfine runs for the small sizes (default 30)
#   CHARLY_COMPARE_HASH_MIB  size of each hashing data set (default 1024)
#   CARGO_TARGET_DIR      where cargo builds (default: <workspace>/target)
#
# What it measures (release builds, warm stores, warm page cache):
#   (a) no-op at 1,000x100: `charly box generate --all` vs `ninja -n` on the
#       equivalent build.ninja (after one real `ninja`), plus
#       `charly box build --all --dry-run` (the build graph keyed and looked
#       up; the fake runner that used to build it first is test-only),
#       the same no-op with `--out DIR`, and `charly validate`;
#   (b) incremental at 1,000x100: one candy file edited (new content every
#       run) -> charly's decide + rebuild vs ninja's; the same candy's
#       manifest edited (an env value of its charly.yml); and a touch only
#       (same content, new mtime);
#   (c) hashing: charly_engine::hash::hash_file (through the noop bench's
#       hidden CHARLY_BENCH_HASH_DIR mode) vs b3sum, on one 1 GiB file and
#       on the same 1 GiB split into 4,096 files of 256 KiB;
#   (d) the no-op at every size (linear growth?) with peak RSS, answered by
#       the no-op journal (the default) and in full (--no-journal: load,
#       resolve, every key, every record looked up);
#   (e) podman, when the example was built (the README's main command):
#       `charly box build --all` no-op (journal replay, and --no-journal) vs
#       `podman build`'s warm no-op of the build directory `box generate`
#       writes for the example's `node-builder` (since layers are nodes no
#       single Containerfile is built, and node-builder's is the one plain
#       podman can build: no local package in its context).
# Targets: no-op 1,000x100 < 50 ms and within 2x of `ninja -n`, also with
# --out DIR; one candy file or manifest edited at 1,000x100 within 2x of ninja; `validate`
# at 1,000 candies <= 60 ms; --no-journal at 10,000x1,000 <= 1.5 s and
# <= 250 MB peak; growth linear in the size; hashing >= 80 % of b3sum; the
# example's no-op >= 100x faster than podman's.
#
# Needs: hyperfine ninja-build b3sum time (Debian: apt-get install hyperfine
# ninja-build b3sum time). Without hyperfine it times with a date loop;
# without b3sum it skips (c)'s reference.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WORK=${1:-/tmp/charly-compare}
SIZES=${CHARLY_COMPARE_SIZES:-"100x10 1000x100 10000x1000"}
PARTS=${CHARLY_COMPARE_PARTS:-"a b c d e"}
RUNS=${CHARLY_COMPARE_RUNS:-30}
HASH_MIB=${CHARLY_COMPARE_HASH_MIB:-1024}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$WORK/results
mkdir -p "$WORK" "$OUT"

say() { printf '\n== %s\n' "$*" >&2; }
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
have() { command -v "$1" >/dev/null 2>&1; }

for t in ninja; do
    have "$t" || { echo "compare.sh: $t is required (apt-get install ninja-build)" >&2; exit 2; }
done
have hyperfine || echo "compare.sh: hyperfine not found; timing with a date loop (apt-get install hyperfine)" >&2
have b3sum || echo "compare.sh: b3sum not found; (c) has no reference (apt-get install b3sum)" >&2
TIMEV=/usr/bin/time
[ -x "$TIMEV" ] || { TIMEV=; echo "compare.sh: /usr/bin/time not found; no peak RSS (apt-get install time)" >&2; }

say "building (release): charly, scalegen, the noop bench"
(cd "$ROOT" && cargo build --release -q -p charly-cli --bin charly \
    && cargo build --release -q -p charly-suite --bin scalegen \
    && cargo bench -q -p charly-suite --bench noop --no-run 2>/dev/null)
CHARLY=$CARGO_TARGET_DIR/release/charly
SCALEGEN=$CARGO_TARGET_DIR/release/scalegen

# --- timing helpers ---------------------------------------------------------
# time_cmds NAME RUNS [hyperfine args...] -- CMD...   -> $OUT/NAME.csv
# CSV columns (hyperfine): command,mean,stddev,median,user,system,min,max (s)
time_cmds() {
    local name=$1 runs=$2; shift 2
    local hargs=()
    while [ "$1" != "--" ]; do hargs+=("$1"); shift; done
    shift
    if have hyperfine; then
        hyperfine -N --style basic --warmup 2 --runs "$runs" "${hargs[@]}" \
            --export-csv "$OUT/$name.csv" "$@" >"$OUT/$name.txt" 2>&1 \
            || { cat "$OUT/$name.txt" >&2; return 1; }
    else
        # Fallback: no --prepare support beyond a plain shell command.
        local prep=""
        if [ "${hargs[0]:-}" = "--prepare" ]; then prep=${hargs[1]}; fi
        echo "command,mean,stddev,median,user,system,min,max" >"$OUT/$name.csv"
        for c in "$@"; do
            local ts=()
            for _ in $(seq "$runs"); do
                [ -n "$prep" ] && sh -c "$prep"
                local s e; s=$(date +%s%N); sh -c "$c" >/dev/null 2>&1; e=$(date +%s%N)
                ts+=($(( e - s )))
            done
            printf '%s\n' "${ts[@]}" | sort -n | awk -v c="$c" '
                {a[NR]=$1/1e9; s+=$1/1e9}
                END {printf "%s,%f,0,%f,0,0,%f,%f\n", c, s/NR, a[int((NR+1)/2)], a[1], a[NR]}' \
                >>"$OUT/$name.csv"
        done
    fi
}
# field NAME ROW COLUMN   (row 1 = first command; column: mean|median|min|max)
field() {
    awk -F, -v row="$2" -v col="$3" '
        NR==1 {for (i=1;i<=NF;i++) h[$i]=i; next}
        NR==row+1 {print $(h[col])}' "$OUT/$1.csv"
}
ms() { awk -v s="$1" 'BEGIN {printf "%.1f", s*1000}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }
cpu_ms() { # NAME ROW -> mean user+sys in ms
    awk -v u="$(field "$1" "$2" user)" -v s="$(field "$1" "$2" system)" 'BEGIN {printf "%.1f", (u+s)*1000}'
}
sec() { awk -v s="$1" 'BEGIN {printf "%.3f", s}'; }
peak_rss_mb() { # CMD... -> peak RSS in MB of one run
    if [ -z "$TIMEV" ]; then echo "n/a"; return; fi
    "$TIMEV" -v "$@" 2>&1 >/dev/null | awk -F': ' '/Maximum resident set size/ {printf "%.1f", $2/1024}'
}

# --- projects ---------------------------------------------------------------
# prepare SIZE: generate with build.ninja, validate, cold charly generate,
# one fake build, one real ninja run.
prepare() {
    local size=$1 n=${1%x*} m=${1#*x}
    local dir=$WORK/p$size store=$WORK/store-$size
    say "project $size: generate, validate, cold runs"
    rm -rf "$store"
    local nodes
    nodes=$("$SCALEGEN" --candies "$n" --boxes "$m" --out "$dir" --ninja 2>"$OUT/scalegen-$size.txt")
    cat "$OUT/scalegen-$size.txt" >&2
    "$CHARLY" -C "$dir" validate >"$OUT/validate-$size.txt" 2>&1 \
        || { cat "$OUT/validate-$size.txt" >&2; echo "compare.sh: $size does not validate" >&2; exit 1; }
    tail -1 "$OUT/validate-$size.txt" >&2
    local s e
    s=$(date +%s%N)
    CHARLY_CACHE_DIR=$store "$CHARLY" -C "$dir" box generate --all >/dev/null 2>"$OUT/cold-$size.txt"
    e=$(date +%s%N)
    echo "cold charly generate: $(( (e - s) / 1000000 )) ms; $(tail -1 "$OUT/cold-$size.txt")" >&2
    echo "$(( (e - s) / 1000000 ))" >"$OUT/cold-ms-$size"
    grep -q "generate: ${nodes#nodes=} nodes" "$OUT/cold-$size.txt" \
        || { echo "compare.sh: charly's graph is not the generator's (${nodes})" >&2; exit 1; }
    local edges
    edges=$(grep -c '^build .build/ninja/' "$dir/build.ninja")
    [ "$edges" = "${nodes#nodes=}" ] \
        || { echo "compare.sh: build.ninja has $edges edges, charly $nodes" >&2; exit 1; }
    # The no-op journal trusts no file changed in the last 2 s: let the
    # fresh project age, then one full no-op run records it.
    sleep 2.1
    CHARLY_CACHE_DIR=$store "$CHARLY" -C "$dir" box generate --all -q >/dev/null
    if [ "$size" = 1000x100 ]; then # for (a)'s --out no-op
        CHARLY_CACHE_DIR=$store "$CHARLY" -C "$dir" box generate --all -q --out "$WORK/out-$size" >/dev/null
        sleep 2.1
        CHARLY_CACHE_DIR=$store "$CHARLY" -C "$dir" box generate --all -q --out "$WORK/out-$size" >/dev/null
    fi
    s=$(date +%s%N)
    ninja -C "$dir" >/dev/null
    e=$(date +%s%N)
    echo "cold ninja: $(( (e - s) / 1000000 )) ms; ninja -n: $(ninja -C "$dir" -n | tail -1)" >&2
    echo "$(( (e - s) / 1000000 ))" >"$OUT/ninja-cold-ms-$size"
}

{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "cpu: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), $(nproc) cores"
    echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
    echo "kernel: $(uname -sr)"
    echo "rustc: $(rustc --version)"
    echo "ninja: $(ninja --version); hyperfine: $(hyperfine --version 2>/dev/null || echo none); b3sum: $(b3sum --version 2>/dev/null || echo none)"
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT/machine.txt" >&2

if part a || part b || part d; then
    for size in $SIZES; do prepare "$size"; done
fi

# --- (a) no-op at 1,000x100 -------------------------------------------------
A=1000x100
if part a && [ -d "$WORK/p$A" ]; then
    say "(a) no-op $A: charly box generate --all vs ninja -n"
    export CHARLY_CACHE_DIR=$WORK/store-$A
    time_cmds a-noop "$RUNS" -- \
        "$CHARLY -C $WORK/p$A box generate --all -q" \
        "ninja -C $WORK/p$A -n" \
        "$CHARLY -C $WORK/p$A box build --all --dry-run -q" \
        "$CHARLY -C $WORK/p$A box generate --all -q --no-journal" \
        "$CHARLY -C $WORK/p$A box generate --all -q --out $WORK/out-$A" \
        "$CHARLY -C $WORK/p$A validate" \
        "$CHARLY -C $WORK/p$A validate --no-journal"
    unset CHARLY_CACHE_DIR
fi

# --- (b) incremental at 1,000x100 -------------------------------------------
if part b && [ -d "$WORK/p$A" ]; then
    # A config file of a candy that 2-6 boxes install (not a hub): the
    # first such candy by name.
    read -r c cand users < <(awk '/^build \.build\/ninja\/frag\// {
            split($2, a, "/"); c = a[5]; sub(":$", "", c); n[c]++
            for (i = 5; i <= NF; i++) if ($i ~ ("^candy/" c "/files/")) f[c] = $i
        }
        END { for (c in n) if ((c in f) && n[c] >= 2 && n[c] <= 6) print c, f[c], n[c] }' \
        "$WORK/p$A/build.ninja" | sort | head -1)
    file=$WORK/p$A/$cand
    say "(b) incremental $A: edit $cand (candy $c, in $users boxes)"
    export CHARLY_CACHE_DIR=$WORK/store-$A
    time_cmds b-edit-charly "$RUNS" --prepare "sh -c 'date +%s%N >> $file'" -- \
        "$CHARLY -C $WORK/p$A box generate --all -q"
    time_cmds b-edit-ninja "$RUNS" --prepare "sh -c 'date +%s%N >> $file'" -- \
        "ninja -C $WORK/p$A"
    # The candy's own manifest: one env value changed (new every run), the
    # edit users make most; ninja's edges list the manifest too.
    manifest=$WORK/p$A/candy/$c/charly.yml
    var=$(echo "$c" | tr '[:lower:]' '[:upper:]')_HOME
    grep -q "^ *$var: " "$manifest" \
        || { echo "compare.sh: no $var in $manifest" >&2; exit 1; }
    edit_manifest="sed -i \"s|^\\( *$var: \\).*|\\1/opt/$c-\$(date +%s%N)|\" $manifest"
    time_cmds b-manifest-charly "$RUNS" --prepare "sh -c '$edit_manifest'" -- \
        "$CHARLY -C $WORK/p$A box generate --all -q"
    time_cmds b-manifest-ninja "$RUNS" --prepare "sh -c '$edit_manifest'" -- \
        "ninja -C $WORK/p$A"
    time_cmds b-touch-charly "$RUNS" --prepare "touch $file" -- \
        "$CHARLY -C $WORK/p$A box generate --all -q"
    time_cmds b-touch-ninja "$RUNS" --prepare "touch $file" -- \
        "ninja -C $WORK/p$A"
    # What one edit reran (the last run's summary).
    date +%s%N >>"$file"
    "$CHARLY" -C "$WORK/p$A" box generate --all 2>&1 >/dev/null | tail -1 | tee "$OUT/b-edit-charly-summary.txt" >&2
    date +%s%N >>"$file"
    ninja -C "$WORK/p$A" | tail -1 | tee "$OUT/b-edit-ninja-summary.txt" >&2
    unset CHARLY_CACHE_DIR
fi

# --- (c) hashing ------------------------------------------------------------
if part c; then
say "(c) hashing ${HASH_MIB} MiB: charly hash_file vs b3sum"
H=$WORK/hash
if [ ! -f "$H/one/big.bin" ] || [ "$(stat -c %s "$H/one/big.bin")" != $(( HASH_MIB << 20 )) ]; then
    rm -rf "$H"; mkdir -p "$H/one" "$H/many"
    head -c $(( HASH_MIB << 20 )) /dev/urandom >"$H/one/big.bin"
    split -b 256K -a 4 -d "$H/one/big.bin" "$H/many/part-"
fi
for set in one many; do
    (cd "$ROOT" && CHARLY_BENCH_HASH_DIR=$H/$set cargo bench -q -p charly-suite --bench noop 2>/dev/null) \
        | tee "$OUT/c-charly-$set.txt" | head -1 >&2
done
if have b3sum; then
    time_cmds c-b3sum-one 10 -- "b3sum --no-names $H/one/big.bin"
    # Many files: one b3sum process over all of them (it hashes files one
    # after another, each multi-threaded when large).
    time_cmds c-b3sum-many 10 -- "sh -c 'b3sum --no-names $H/many/* >/dev/null'"
    time_cmds c-b3sum-one-1t 10 -- "b3sum --no-names --num-threads 1 $H/one/big.bin"
fi
fi

# --- (d) sizes --------------------------------------------------------------
part d && for size in $SIZES; do
    say "(d) no-op $size"
    runs=$RUNS
    case $size in 10000x*) runs=5 ;; esac
    export CHARLY_CACHE_DIR=$WORK/store-$size
    time_cmds "d-noop-$size" "$runs" -- \
        "$CHARLY -C $WORK/p$size box generate --all -q" \
        "ninja -C $WORK/p$size -n" \
        "$CHARLY -C $WORK/p$size box generate --all -q --no-journal"
    peak_rss_mb "$CHARLY" -C "$WORK/p$size" box generate --all -q >"$OUT/d-rss-charly-$size"
    peak_rss_mb "$CHARLY" -C "$WORK/p$size" box generate --all -q --no-journal >"$OUT/d-rss-full-$size"
    peak_rss_mb ninja -C "$WORK/p$size" -n >"$OUT/d-rss-ninja-$size"
    unset CHARLY_CACHE_DIR
done

# --- (e) podman -------------------------------------------------------------
EX=$ROOT/examples/hello
E_CA=()
[ -f /etc/ssl/certs/ca-certificates.crt ] && E_CA=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$HOME/.cache/charly/podman/containers.conf}
if part e && have podman && podman image exists localhost/hello:2026.12.1; then
    say "(e) example box no-op: charly box build --all vs podman build (warm layer cache)"
    NB=$WORK/nbctx
    "$CHARLY" -C "$EX" box generate node-builder --out "$NB" -q
    NB_BUILD="podman build -q --layers=true --pull=never -f $NB/.build/node-builder/Containerfile ${E_CA[*]} -t localhost/charly-compare-nb:1 $NB"
    $NB_BUILD >/dev/null # the cold build, once
    # The no-op journal trusts no file changed in the last 2 s.
    sleep 2.1
    "$CHARLY" -C "$EX" box build --all -q
    time_cmds e-podman 5 -- \
        "$CHARLY -C $EX box build --all -q" \
        "$CHARLY -C $EX box build --all -q --no-journal" \
        "$NB_BUILD"
elif part e; then
    say "(e) skipped: build the example first (the README's main command)"
fi

# --- report -----------------------------------------------------------------
{
    echo
    echo "# charly vs ninja / b3sum ($(date -u '+%Y-%m-%d %H:%M UTC'), load average at end: $(cut -d' ' -f1-3 /proc/loadavg))"
    echo
    if [ -f "$OUT/a-noop.csv" ]; then
        cm=$(field a-noop 1 median); nm=$(field a-noop 2 median); dm=$(field a-noop 3 median)
        cmin=$(field a-noop 1 min); nmin=$(field a-noop 2 min)
        echo "## (a) no-op 1000x100 (median / min of $RUNS runs)"
        echo "| command | median ms | min ms | mean ms | CPU ms (user+sys, mean) |"
        echo "|---|---:|---:|---:|---:|"
        echo "| charly box generate --all | $(ms "$cm") | $(ms "$cmin") | $(ms "$(field a-noop 1 mean)") | $(cpu_ms a-noop 1) |"
        echo "| ninja -n | $(ms "$nm") | $(ms "$nmin") | $(ms "$(field a-noop 2 mean)") | $(cpu_ms a-noop 2) |"
        echo "| charly box build --all --dry-run (nothing built: every key computed, every record looked up) | $(ms "$dm") | $(ms "$(field a-noop 3 min)") | $(ms "$(field a-noop 3 mean)") | $(cpu_ms a-noop 3) |"
        echo "| charly box generate --all --no-journal | $(ms "$(field a-noop 4 median)") | $(ms "$(field a-noop 4 min)") | $(ms "$(field a-noop 4 mean)") | $(cpu_ms a-noop 4) |"
        echo "| charly box generate --all --out DIR | $(ms "$(field a-noop 5 median)") | $(ms "$(field a-noop 5 min)") | $(ms "$(field a-noop 5 mean)") | $(cpu_ms a-noop 5) |"
        echo "| charly validate | $(ms "$(field a-noop 6 median)") | $(ms "$(field a-noop 6 min)") | $(ms "$(field a-noop 6 mean)") | $(cpu_ms a-noop 6) |"
        echo "| charly validate --no-journal | $(ms "$(field a-noop 7 median)") | $(ms "$(field a-noop 7 min)") | $(ms "$(field a-noop 7 mean)") | $(cpu_ms a-noop 7) |"
        echo
        echo "charly / ninja -n: $(ratio "$cm" "$nm")x (median), $(ratio "$cmin" "$nmin")x (min). Target: < 50 ms and <= 2x."
        echo "With --out DIR: $(ratio "$(field a-noop 5 median)" "$nm")x (median). Target: <= 2x."
        echo "validate: target <= 60 ms."
        echo
    fi
    if [ -f "$OUT/b-edit-charly.csv" ]; then
        ec=$(field b-edit-charly 1 median); en=$(field b-edit-ninja 1 median)
        tc=$(field b-touch-charly 1 median); tn=$(field b-touch-ninja 1 median)
        echo "## (b) incremental 1000x100: $cand (in $users boxes)"
        echo "| change | charly median ms | ninja median ms | charly / ninja | charly CPU ms | ninja CPU ms |"
        echo "|---|---:|---:|---:|---:|---:|"
        echo "| edit (new content) | $(ms "$ec") | $(ms "$en") | $(ratio "$ec" "$en")x | $(cpu_ms b-edit-charly 1) | $(cpu_ms b-edit-ninja 1) |"
        echo "| touch (same content) | $(ms "$tc") | $(ms "$tn") | $(ratio "$tc" "$tn")x | $(cpu_ms b-touch-charly 1) | $(cpu_ms b-touch-ninja 1) |"
        if [ -f "$OUT/b-manifest-charly.csv" ]; then
            mc=$(field b-manifest-charly 1 median); mn=$(field b-manifest-ninja 1 median)
            echo "| manifest (an env value of charly.yml) | $(ms "$mc") | $(ms "$mn") | $(ratio "$mc" "$mn")x | $(cpu_ms b-manifest-charly 1) | $(cpu_ms b-manifest-ninja 1) |"
        fi
        echo
        echo "Target (edit, manifest): <= 2x; stretch <= 1.5x."
        echo "charly after one edit: $(cat "$OUT/b-edit-charly-summary.txt")"
        echo "ninja after one edit: $(cat "$OUT/b-edit-ninja-summary.txt")"
        echo
    fi
    if part c; then
        echo "## (c) hashing ${HASH_MIB} MiB (best of 5 for charly; median of 10 for b3sum)"
        echo "| data | charly hash_file sequential s | charly, one thread per core s | b3sum s | b3sum --num-threads 1 s | charly (best) / b3sum throughput |"
        echo "|---|---:|---:|---:|---:|---:|"
        for set in one many; do
            seq=$(grep -o 'hash_seq_s=[0-9.]*' "$OUT/c-charly-$set.txt" | cut -d= -f2)
            par=$(grep -o 'hash_par_s=[0-9.]*' "$OUT/c-charly-$set.txt" | cut -d= -f2)
            b=n/a; b1=n/a; r=n/a
            if [ -f "$OUT/c-b3sum-$set.csv" ]; then
                b=$(sec "$(field "c-b3sum-$set" 1 median)")
                best=$(awk -v a="$seq" -v b="$par" 'BEGIN {print (a<b)?a:b}')
                r=$(awk -v b="$b" -v c="$best" 'BEGIN {printf "%.0f %%", 100*b/c}')
            fi
            if [ "$set" = one ] && [ -f "$OUT/c-b3sum-one-1t.csv" ]; then b1=$(sec "$(field c-b3sum-one-1t 1 median)"); fi
            label=$([ "$set" = one ] && echo "1 file of ${HASH_MIB} MiB" || echo "$(( HASH_MIB * 4 )) files of 256 KiB")
            echo "| $label | $seq | $par | $b | $b1 | $r |"
        done
        echo
    fi
    echo "## (d) no-op by size (median; peak RSS of one run)"
    echo "| size | generate-graph nodes | charly ms | ninja -n ms | charly / ninja | charly CPU ms | ninja CPU ms | charly peak RSS MB | ninja peak RSS MB | --no-journal ms | --no-journal peak RSS MB | cold charly ms | cold ninja ms |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for size in $SIZES; do
        [ -f "$OUT/d-noop-$size.csv" ] || continue
        c=$(field "d-noop-$size" 1 median); n=$(field "d-noop-$size" 2 median)
        nodes=$(grep -o '[0-9]* nodes' "$OUT/cold-$size.txt" | head -1 | cut -d' ' -f1)
        echo "| $size | $nodes | $(ms "$c") | $(ms "$n") | $(ratio "$c" "$n")x | $(cpu_ms "d-noop-$size" 1) | $(cpu_ms "d-noop-$size" 2) | $(cat "$OUT/d-rss-charly-$size") | $(cat "$OUT/d-rss-ninja-$size") | $(ms "$(field "d-noop-$size" 3 median)") | $(cat "$OUT/d-rss-full-$size") | $(cat "$OUT/cold-ms-$size") | $(cat "$OUT/ninja-cold-ms-$size") |"
    done
    echo
    echo "Targets: --no-journal at 10000x1000 <= 1.5 s and <= 250 MB peak; time per node not growing with the size."
    echo
    if [ -f "$OUT/e-podman.csv" ]; then
        c=$(field e-podman 1 median)
        echo "## (e) example box no-op (median of 5)"
        echo "| command | median ms |"
        echo "|---|---:|"
        cf=$(field e-podman 2 median); p=$(field e-podman 3 median)
        echo "| charly box build --all (three boxes, journal replay) | $(ms "$c") |"
        echo "| charly box build --all --no-journal | $(ms "$cf") |"
        echo "| podman build of node-builder's build directory (one box, warm layer cache) | $(ms "$p") |"
        echo
        echo "podman / charly: $(ratio "$p" "$c")x, with --no-journal $(ratio "$p" "$cf")x. Target: >= 100x."
        echo
    fi
    echo "Raw hyperfine output and CSVs: $OUT"
} | tee "$OUT/report.md"
