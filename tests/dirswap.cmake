# SPDX-License-Identifier: Apache-2.0
# lib/sys's directory swap (all-at-once replacement of a set's files).
vmsnap_c_test(sys_dirswap SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_dirswap.c LABELS sys)
