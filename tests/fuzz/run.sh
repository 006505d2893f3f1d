#!/bin/sh
# tests/fuzz/run.sh - run libFuzzer targets for a set time each (make fuzz).
#
# Usage: run.sh SRCDIR WORKDIR SECONDS JOBS NAME...
# Runs tests/fuzz/fuzz_NAME (in the current build folder) for SECONDS each,
# JOBS at a time, niced. Each gets WORKDIR/NAME/: corpus/ (its seeds from
# SRCDIR/tests/fuzz/corpus/NAME copied in, plus what earlier runs found: the
# source tree is never written), artifacts/ (crashing inputs), tmp/ (its
# TMPDIR: the files the config and templates targets write) and log.
# Prints one line per target as it ends (runs, coverage, result) and exits 1
# when any target crashed or failed to start.
set -u
srcdir=$1 work=$2 secs=$3 jobs=$4
shift 4

one() { # name
    name=$1
    dir=$work/$name
    rm -rf "$dir/artifacts" "$dir/tmp"   # only this run's crashes are reported
    mkdir -p "$dir/corpus" "$dir/artifacts" "$dir/tmp"
    cp "$srcdir/tests/fuzz/corpus/$name"/* "$dir/corpus/" 2>/dev/null
    case $name in
        fastcgi_codec) maxlen=24000 ;;
        config|templates|classify|notify) maxlen=8192 ;;
        *) maxlen=1024 ;;
    esac
    dict=
    [ -f "$srcdir/tests/fuzz/$name.dict" ] && dict=-dict=$srcdir/tests/fuzz/$name.dict
    # libFuzzer sets its own ASan and UBSan behaviour; keep leaks checked
    # the targets that write files do it in a folder under TMPDIR (left there after a crash)
    TMPDIR=$dir/tmp nice -n "${FUZZ_NICE:-10}" ./tests/fuzz/fuzz_"$name" -max_total_time="$secs" -timeout=25 \
        -rss_limit_mb=2048 -max_len=$maxlen -print_final_stats=1 $dict \
        -artifact_prefix="$dir/artifacts/" "$dir/corpus" >"$dir/log" 2>&1
    rc=$?
    # CPU seconds of this subshell's children (the target, niced: it may get less than the wall time)
    times >"$dir/times"   # not in a pipeline: a forked shell has no children's times
    cpu=$(tail -1 "$dir/times" | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, a, "m"); t += a[1] * 60 + a[2] } printf "%.0f", t }')
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
    cov=$(sed -n 's/.*DONE *cov: *\([0-9]*\) *ft: *\([0-9]*\) *corp: *\([0-9]*\).*/cov=\1 ft=\2 corpus=\3/p' "$dir/log" | tail -1)
    [ -n "$cov" ] || cov=$(sed -n 's/^#[0-9]*.*cov: *\([0-9]*\) *ft: *\([0-9]*\) *corp: *\([0-9]*\).*/cov=\1 ft=\2 corpus=\3/p' "$dir/log" | tail -1)
    if [ $rc -eq 0 ]; then
        result=ok
    else
        art=$(ls -t "$dir/artifacts" 2>/dev/null | head -1)
        result="FAILED (exit $rc${art:+, input $dir/artifacts/$art}; log $dir/log)"
    fi
    printf 'fuzz_%-14s %ss cpu=%ss runs=%s %s result=%s\n' "$name" "$secs" "${cpu:-?}" "${runs:-?}" "${cov:-cov=?}" "$result"
    [ $rc -eq 0 ]
}

mkdir -p "$work"
# At most $jobs at a time: when full, poll until one ends (a crash ends a
# target early; its slot goes to the next one at once). Each target leaves
# its exit status in WORKDIR/NAME/rc when it ends.
running=
for name in "$@"; do
    while [ $(set -- $running; echo $#) -ge "$jobs" ]; do
        sleep 1
        left=
        for n in $running; do
            [ -f "$work/$n/rc" ] || left="$left $n"
        done
        running=$left
    done
    mkdir -p "$work/$name"
    rm -f "$work/$name/rc"
    (one "$name"; echo $? >"$work/$name/rc") &
    running="$running $name"
done
wait
fail=0
for name in "$@"; do
    [ "$(cat "$work/$name/rc" 2>/dev/null)" = 0 ] || fail=1
done
[ $fail -eq 0 ] || { echo "make fuzz: a target failed (see its line above)"; exit 1; }
echo "make fuzz: every target ran ${secs}s without a crash"
