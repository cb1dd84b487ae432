#!/usr/bin/env bash
# The library's layers only include down: base < {algorithms, transports}
# < select < src.  Each file's quoted includes must name its own layer or a
# lower one (a bare name resolves in its own folder; in src/ that is src).
# Prints the folder graph and each include that points up; fails on any.
set -euo pipefail
cd "$(dirname "$0")/.."
allowed() {
    case "$1" in
    base) echo "base" ;;
    algorithms) echo "base algorithms" ;;
    transports) echo "base transports" ;;
    select) echo "base algorithms transports select" ;;
    src) echo "base algorithms transports select src" ;;
    esac
}
bad=0
declare -A edges=()
for layer in base algorithms transports select src; do
    ok=" $(allowed "$layer") "
    while IFS= read -r f; do
        while IFS= read -r inc; do
            case "$inc" in
            weft.h | config.h) continue ;;
            */*) to=${inc%%/*} ;;
            *) to=$layer ;;
            esac
            [ "$to" = "$layer" ] || edges["$layer -> $to"]=$((${edges["$layer -> $to"]:-0} + 1))
            if [[ "$ok" != *" $to "* ]]; then
                echo "layers: $f includes \"$inc\": $layer may not include $to"
                bad=1
            fi
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
    done < <(find "$layer" -name '*.[ch]' | sort)
done
for e in "${!edges[@]}"; do echo "$e: ${edges[$e]} includes"; done | sort
[ "$bad" = 0 ] && echo "layers: no include points up"
exit "$bad"
