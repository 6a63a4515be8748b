# SPDX-License-Identifier: Apache-2.0
# Tests of the shared helpers (lib/util): error values.
vmsnap_c_test(util_unit SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_util.c TIMEOUT 60 LABELS util)
