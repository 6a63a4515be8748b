# SPDX-License-Identifier: Apache-2.0
# Disk module: unit test (library API, no root) and integration tests that mount images on loop
# devices (RESOURCE_LOCK "loop": one loop user at a time).
vmsnap_c_test(disk_unit SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/test_disk.c LABELS disk TIMEOUT 300)
vmsnap_sh_test(disk_tree tests/integration/disk_tree.sh LABELS disk TIMEOUT 300 RESOURCE_LOCK loop)
vmsnap_sh_test(disk_limits tests/integration/disk_limits.sh LABELS disk TIMEOUT 300)
vmsnap_sh_test(disk_clone tests/integration/disk_clone.sh LABELS disk TIMEOUT 300 RESOURCE_LOCK loop)
