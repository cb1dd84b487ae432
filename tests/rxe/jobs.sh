# Sourced by matrix.sh and pair.sh inside the guests: one checked job,
# its PASS/FAIL line, and the count of failures.
rs=tests/rxe/ranks.sh
fails=0
export WEFT_TRANSPORT=verbs WEFT_CALIBRATE=0
result() { # name status
    if [ "$2" = 0 ]; then echo "rxe: PASS $1"; else echo "rxe: FAIL $1 (exit $2)"; fails=$((fails + 1)); fi
}
# job NAME M ENV... -- TOOL ARGS...: M ranks per host, every result checked.
job() {
    name=$1 m=$2
    shift 2
    envs=""
    while [ "$1" != -- ]; do envs="$envs $1"; shift; done
    shift
    echo "== $name"
    env $envs sh "$rs" "$m" "$@" -c 1 >/tmp/job.out 2>&1
    st=$?
    grep -E "Out of bounds|weft WARN|failed|^ranks:" /tmp/job.out
    [ "$st" = 0 ] || tail -30 /tmp/job.out
    # The tools count wrong elements themselves; 0 on every rank that reports.
    if [ "$st" = 0 ] && grep -q "Out of bounds" /tmp/job.out && grep "Out of bounds" /tmp/job.out | grep -qv ": 0 OK"; then
        st=1
    fi
    result "$name" "$st"
}
