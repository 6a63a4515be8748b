# SPDX-License-Identifier: Apache-2.0
# Tests of the shared system helpers (lib/sys): path spelling, and removal of a tree that is
# changed under it.
vmsnap_c_test(sys_unit SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_sys.c TIMEOUT 60 LABELS sys)
vmsnap_c_test(sys_dirswap SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_dirswap.c LABELS sys)
