#!/bin/sh
# The decode's software prefetches are in the object code. Twice a harmless-looking
# rewrite of decode.c's prefetch loop (the row pointer or the row's span held in a
# local) let GCC 12 drop every __builtin_prefetch of it, silently: the same bits, a
# cold bf16 cache read ~20% slower (docs/performance.md). This counts the prefetch
# instructions in build/src/decode.o (x86-64 objects; skipped where there is no
# objdump, no such object, or under the sanitizers' builds).
build=${1:-build}
obj="$build/src/decode.o"
if [ -n "${FA_SANITIZED:-}" ]; then echo "skipped under the sanitizers"; exit 0; fi
command -v objdump >/dev/null 2>&1 || { echo "skipped: no objdump"; exit 0; }
[ -f "$obj" ] || { echo "skipped: no $obj"; exit 0; }
case $(objdump -f "$obj" 2>/dev/null) in *x86-64*) ;; *) echo "skipped: $obj is not x86-64"; exit 0 ;; esac
n=$(objdump -d "$obj" | grep -c 'prefetcht0')
if [ "$n" -lt 8 ]; then
    echo "FAIL: $obj holds $n prefetcht0 instructions (expected the unrolled prefetch loop's, >= 8)"
    exit 1
fi
# the address-order ask (decode.c, addr_ask) is the one prefetcht2
n2=$(objdump -d "$obj" | grep -c 'prefetcht2')
if [ "$n2" -lt 1 ]; then
    echo "FAIL: $obj holds no prefetcht2 (addr_ask's ask for the next block in address order)"
    exit 1
fi
echo "ok: $obj holds $n prefetcht0 and $n2 prefetcht2 instructions"
