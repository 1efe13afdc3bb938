#!/usr/bin/env bash
# Usage: private_cxx_runtime_check.sh PROBE LIBSMDDP
# PROBE is libsmddp's objects linked with a static libstdc++ and the library's own link options
# (SMDDP_PRIVATE_LINK_OPTIONS), as a toolchain that links libstdc++ statically makes them (the
# GPU machine's did: docs/gpu.md). That copy must stay private: exported, its data would bind to
# the process's own libstdc++.so while its functions bound inside, which crashed the extension
# inside torch. So PROBE must export nothing LIBSMDDP (the same objects, libstdc++ shared) does
# not. The check fails if the copy is absent (then it proves nothing) or exported.
set -euo pipefail
probe=$1 ref=$2
# The copy is there: libstdc++'s classic locale, defined in the probe's own symbol table.
if ! nm --defined-only "$probe" | grep ' _ZNSt6locale10_S_classicE$' >/dev/null; then  # not -q: nm would die of SIGPIPE (pipefail)
  echo "FAIL: $probe holds no static libstdc++ (std::locale::_S_classic is not defined in it): the check proves nothing"
  exit 1
fi
exports() { nm -D --defined-only "$1" | awk '{print $NF}' | sort -u; }
extra=$(comm -13 <(exports "$ref") <(exports "$probe"))
if [ -n "$extra" ]; then
  echo "FAIL: $probe exports $(wc -l <<<"$extra") symbols that $ref does not (its static libstdc++), e.g.:"
  head -5 <<<"$extra" | c++filt
  exit 1
fi
echo "ok: $probe keeps its static libstdc++ private ($(exports "$probe" | wc -l) exports, as $ref)"
