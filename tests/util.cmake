# SPDX-License-Identifier: Apache-2.0
# Tests of the shared helpers (lib/util): error values, cancellation scopes.
vmsnap_c_test(util_unit SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_util.c TIMEOUT 60 LABELS util)
# Cancellation scopes: one operation cancelled, its worker threads included, and not another.
vmsnap_c_test(cancel_scope SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_cancel_scope.c TIMEOUT 60 LABELS util)
