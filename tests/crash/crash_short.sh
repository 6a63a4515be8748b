#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The crash matrix's short, fixed-seed run for the suite (tests/crash/crash.py: the long one is
# `tests/crash/crash.py --kills 50`): a few SIGKILLs of each push and pull over a set, on the
# local store and the RGW, each checked for old-or-new, later commands without --force and
# nothing left after gc. Where the kill lands varies with the machine's speed; every outcome is
# checked the same way.
. "${VMSNAP_SRC:?run through ctest}/tests/lib.sh"
command -v python3 >/dev/null || skip "python3 not installed"
ops=push-local,pushref-local,pull-local,pullmany-local
if [ -n "${VMSNAP_RGW_STATE:-}" ] && [ -f "$VMSNAP_RGW_STATE/env" ]; then
    ops=$ops,push-rgw,pushref-rgw,pull-rgw
else
    skip "no RGW running (the xfer_rgw_up fixture did not start one)"
fi
python3 "$SRC/tests/crash/crash.py" --kills "${CRASH_KILLS:-4}" --seed 7 --ops "$ops" ||
    fail "the crash matrix found a kill that broke the invariant (above)"
done_tests
